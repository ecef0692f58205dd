"""sglang-marconi: Marconi prefix caching (MLSys 2025) for hybrid attention+SSM models: the cost
model (``model``), the policy (``policy``), the planning simulator (``sim``), the SGLang cache
and plugin (``sglang_integration``) and its CPU harness (``driver``, ``harness``, ``serving``)."""

__version__ = "0.1.0"
