"""What one KV token and one cached state weigh in the pools a server actually built, read from
SGLang's tensors (``None`` for another layout: unified memory, MLA; the cost model stands)."""
from __future__ import annotations

import math


def _row_bytes(tensor, row_dim: int) -> int:
    return math.prod(tensor.shape[row_dim + 1:]) * tensor.element_size()


def state_bytes_per_slot(mamba_pool):
    """Bytes of one state slot (conv + temporal, every layer), or None."""
    cache = getattr(mamba_pool, "mamba_cache", None)
    conv, temporal = getattr(cache, "conv", None), getattr(cache, "temporal", None)
    if conv is None or temporal is None or getattr(temporal, "dim", lambda: 0)() < 3:
        return None
    layers = temporal.shape[0]
    return layers * (sum(_row_bytes(c, 1) for c in conv) + _row_bytes(temporal, 1))


def checkpoint_bytes_per_slot(ckpt_pool):
    """Bytes of one slot of SGLang's int8 checkpoint pool (``MambaCheckpointPool``: int8
    temporal values, their scales, the conv windows; slot 0 reserved), or None."""
    return None if ckpt_pool is None else ckpt_pool.mem_usage_bytes() // (ckpt_pool.num_slots + 1)


def kv_bytes_per_token(kv_pool):
    """Bytes of one token's K and V over every full-attention layer, or None."""
    pool = getattr(kv_pool, "full_kv_pool", kv_pool)
    k, v = getattr(pool, "k_buffer", None), getattr(pool, "v_buffer", None)
    if not isinstance(k, list) or not isinstance(v, list) or not k:
        return None
    return sum(_row_bytes(t, 0) for t in (*k, *v))
