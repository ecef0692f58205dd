"""The research routers (``marconi``, ``oracle``) and their replicas' admission model, run
by ``scripts/bench_scale_out.py`` beside ``serve-sim --replicas``' own routers. Not
installed: the scripts put ``scripts/lib`` on ``sys.path``. See README.md."""
