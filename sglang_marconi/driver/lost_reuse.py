"""Reuse a hybrid cache loses: the prompt tokens whose KV matched past the deepest usable state,
counted alike for stock and Marconi in ``ab``, ``serve-sim`` and the server's metrics."""
from __future__ import annotations


def lost_reuse_tokens(result, input_len: int) -> int:
    """Prompt tokens whose KV matched beyond the hit ``result`` reports."""
    matched = min(int(getattr(result, "full_kv_hit_length", 0) or 0), max(0, input_len - 1))
    hit = result.device_prefix_len + getattr(result, "host_hit_length", 0)
    return max(0, matched - hit)


def track_lost_reuse(cache) -> dict:
    """Wrap ``cache.match_prefix``: rid -> the reuse its last match lost."""
    lost: dict = {}
    match = cache.match_prefix

    def remember_match(params):
        result = match(params)
        if params.req is not None:
            lost[params.req.rid] = lost_reuse_tokens(result, len(params.req.origin_input_ids))
        return result

    cache.match_prefix = remember_match
    return lost
