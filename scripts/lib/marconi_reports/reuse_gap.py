"""Where a cache's FLOPs saved fall short of a cache that never evicts, by kind of reuse
(``scripts/gap_to_offline.py``).

A request of a Mooncake trace (``hash_ids``: 512-token blocks) reuses the deepest prefix,
in whole blocks, that some earlier request also had. That prefix has been seen k times
before (k = 1: the first reuse of a prompt seen once) and was last seen some distinct new
tokens ago (the tokens first seen in the trace between its previous use and this
request). ``classify`` gives every request that pair (None: nothing reused).

``losses`` then sets each policy's per-request FLOPs saved against the never-evicting
ceiling's (the simulator's ``sglang`` with room for everything, the same measure as every
"FLOPs saved" figure) and sums, per (k, distance) cell, what the ceiling saves and what the
policy misses, both as fractions of all prefill FLOPs. The cells say where an online
policy loses to the future-knowing reference (``offline:materialise=sglang``) and where
both lose: popular prefixes reused soon (k >= 4, close) are within any policy's reach;
first reuses far away only knowledge of the future keeps.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Optional

import numpy as np

from sglang_marconi.sim.policies import build_cache, parse_policy

DISTANCE_EDGES = (200_000, 500_000, 1_000_000, 2_000_000, 4_000_000)  # new tokens
MAX_ORDER = 4  # 4: the fourth reuse or later


def classify(requests: list, block: int = 512) -> list:
    """(reuse order k, new tokens since the prefix's previous use) per request of
    ``requests`` (dicts with ``hash_ids``), or None where it reuses no whole block."""
    ids: dict = {}
    uses = defaultdict(list)  # prefix node -> request indices, in order
    paths = []
    for i, r in enumerate(requests):
        parent, path = 0, []
        for h in r["hash_ids"]:
            node = ids.setdefault((parent, h), len(ids) + 1)
            path.append(node)
            parent = node
        paths.append(path)
        for node in path:
            uses[node].append(i)
    new_tokens = [0]  # tokens first seen before request i
    seen: set = set()
    for path in paths:
        fresh = sum(1 for n in path if n not in seen)
        seen.update(path)
        new_tokens.append(new_tokens[-1] + fresh * block)
    out: list = []
    for i, path in enumerate(paths):
        deepest = None
        for node in path:
            if uses[node][0] >= i:
                break
            deepest = node
        if deepest is None:
            out.append(None)
            continue
        seen_at = uses[deepest]
        k = seen_at.index(i)
        out.append((min(k, MAX_ORDER), new_tokens[i] - new_tokens[seen_at[k - 1] + 1]))
    return out


def distance_bin(distance: int) -> int:
    """Index of ``distance`` among ``DISTANCE_EDGES`` (0: closer than the first edge)."""
    return int(np.searchsorted(DISTANCE_EDGES, distance, side="right"))


def per_request_flops(policy: str, trace, spec, capacity: Optional[int]) -> np.ndarray:
    """FLOPs each request's hit saves under ``policy`` (a ``sim --policies`` string)."""
    cache = build_cache(parse_policy(policy), spec, capacity, 1, trace)
    return np.array([spec.flops_saved(int(cache.process(r.input_tokens, r.full_tokens)))
                     for r in trace.requests])


def losses(kinds: list, ceiling: np.ndarray, policies: dict, prefill: float) -> dict:
    """{policy: {(k, bin): (ceiling saves, policy misses, misses on requests the policy hit
    nothing for)}} as fractions of ``prefill``; ``policies``: name -> per-request FLOPs
    saved."""
    out = {}
    for name, saved in policies.items():
        cells = defaultdict(lambda: [0.0, 0.0, 0.0])
        for i, kind in enumerate(kinds):
            if kind is None:
                continue
            cell = cells[(kind[0], distance_bin(kind[1]))]
            cell[0] += ceiling[i] / prefill
            cell[1] += (ceiling[i] - saved[i]) / prefill
            if not saved[i]:
                cell[2] += ceiling[i] / prefill
        out[name] = {key: tuple(v) for key, v in cells.items()}
    return out


def totals(table: dict) -> dict:
    """{k: (ceiling saves, policy misses, misses on zero hits)} summed over the distances."""
    out = defaultdict(lambda: [0.0, 0.0, 0.0])
    for (k, _), cell in table.items():
        for j, v in enumerate(cell):
            out[k][j] += v
    return {k: tuple(v) for k, v in sorted(out.items())}
