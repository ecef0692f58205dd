"""sglang-marconi: Marconi prefix caching (MLSys 2025) for hybrid attention+SSM models.

Modules, one home per idea:
- ``model``: the hybrid-model cost model (bytes per KV token / SSM checkpoint, prefill FLOPs).
- ``policy``: the framework-free policy (radix tree, admission, eviction scoring, alpha tuning).
- ``sim``: the trace-driven simulator and trace readers/generators.
- ``sglang_integration``: the SGLang cache backend, plugin and A/B harness.
"""

__version__ = "0.1.0"
