"""The CPU harness around the SGLang cache: the A/B against stock SGLang (``ab``), SGLang's
cache invariants (``invariants``) and the timing pieces they share (``timing``).
Nothing here runs in a server."""
