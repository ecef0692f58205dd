"""verify-exact: prove that resuming a request from a cached checkpoint is exact.

Real hybrid model code (transformers' Bamba, NemotronH, Falcon-H1, Zamba2, Qwen3-Next, Jamba,
tiny random-weight fp32 configs on CPU) serves a request sequence through the project's own
prefix tree and admission; checkpoints hold the real tensors (KV sliced to the prefix, SSM
states taken at exactly that position) and later requests resume from them. Their logits and
greedy continuations must match an uncached full forward.

Modules: ``archs`` (tiny configs and per-arch quirks), ``snapshot`` (take / restore cache
tensors), ``runner`` (segmented prefill, decode, uncached reference), ``store`` (tensor store
keyed by tree node), ``scenario`` (the request sequence and the check), ``ssd_reference``
(independent Mamba2 state cross-check with mamba-ssm's reference scan), ``cli``.
"""
