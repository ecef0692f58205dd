"""Drives SGLang's real cache objects on CPU: pools built with SGLang's own fixtures
(``pools``) and the scheduler's call sequence for one request (``replay``). Used by the
CPU harness (``ab``) and the tests."""
