"""The CPU harness around the SGLang cache: the A/B against stock SGLang (``ab``) and the
timing pieces it shares with serve-sim and the overhead benchmark (``timing``). SGLang's
cache invariants, which only the tests check, are ``scripts/lib/marconi_checks``.
Nothing here runs in a server."""
