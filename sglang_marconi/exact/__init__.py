"""verify-exact: prove that resuming a request from a cached checkpoint is exact.

Real hybrid model code (transformers, tiny random-weight fp32 configs on CPU) serves a
request sequence through the project's prefix tree and admission; checkpoints hold the real
tensors and later requests resume from them, matching an uncached full forward."""
