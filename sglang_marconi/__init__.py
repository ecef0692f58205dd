"""sglang-marconi: Marconi prefix caching (MLSys 2025) for hybrid attention+SSM models.

Modules, one home per idea:
- ``model``: the hybrid-model cost model (bytes per KV token / SSM checkpoint, prefill FLOPs).
- ``policy``: the framework-free policy (radix tree, admission, eviction scoring, alpha tuning).
- ``sim``: the paper's planning simulator and trace readers/generators.
- ``sglang_integration``: the SGLang cache backend and plugin; ``driver`` and ``harness``: SGLang's
  own cache objects on CPU (``ab``, ``sim``); ``serving``: its scheduler loop (``serve-sim``).
"""

__version__ = "0.1.0"
