"""The reports the benchmark scripts write (results/results.md, the overhead
tables): analysis of the runs, markdown and plain-text tables, PNG plots. Not installed: the
scripts put ``scripts/lib`` on ``sys.path``. See README.md."""
