"""SGLang's cache invariants on a python-core tree (``invariants``) and on its host tier
(``host_invariants``), checked by the tests after every request. Not installed: the tests
put ``scripts/lib`` on ``sys.path``. See README.md."""
