"""One "tensor-parallel rank" for ``test_tp_determinism``: replays a fixed request stream
through a fresh cache of each policy and returns, per request, the decisions a rank must
share with every other (hit, alpha, the paths that hold a state, the KV the tree holds).
Run as a script it prints a digest per policy (for runs under other hash seeds)."""
from __future__ import annotations

import functools
import hashlib
import json
import random
import sys
from array import array

from marconi_checks.invariants import walk
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

from sglang_marconi.driver.pools import PoolConfig, build_cache
from sglang_marconi.driver.replay import Replayer, ReplayRequest
from sglang_marconi.model import preset_spec
from sglang_marconi.sglang_integration.cache import MarconiUnifiedRadixCache
from sglang_marconi.sglang_integration.options import MarconiSettings

SPEC = preset_spec("paper-7b")
PC = PoolConfig(kv_tokens=1024, mamba_slots=10, page_size=16, max_context_len=1024,
                chunked_prefill_size=128, mamba_track_interval=64)
POLICIES = {
    "lru": None,
    "marconi-a1": dict(alpha=1.0),
    "marconi": dict(),
}


def sglang_path(node, root) -> tuple:
    """The tokens from the root to the end of ``node`` (a state's name: two branches may
    hold states at one length)."""
    parts = []
    while node is not root:
        parts.append(node.key.raw_token_ids()[:len(node.key)])
        node = node.parent
    return tuple(t for part in reversed(parts) for t in part)


def sglang_state_nodes(cache) -> dict:
    root = cache.tree_core.root_node
    return {sglang_path(n, root): n for n in walk(cache)
            if n.component_data[ComponentType.MAMBA].value is not None}


def stream(n=48, seed=7):
    rng = random.Random(seed)
    bases = [[1000 * b + i for i in range(320)] for b in range(5)]
    out = []
    for i in range(n):
        ids = bases[rng.randrange(5)][:rng.randrange(16, 320)]
        ids += [rng.randrange(10**6, 2 * 10**6) for _ in range(rng.randrange(1, 60))]
        outs = [3 * 10**6 + 1000 * i + j for j in range(rng.randrange(1, 90))]
        out.append(ReplayRequest(f"r{i}", array("q", ids), outs))
    return out


def make(policy: str):
    settings = POLICIES[policy]
    cls = (None if settings is None else functools.partial(
        MarconiUnifiedRadixCache, spec=SPEC, settings=MarconiSettings(**settings)))
    cache = build_cache(PC, cache_class=cls, tree_core="python")[0]
    return cache, Replayer(cache, chunked_prefill_size=PC.chunked_prefill_size)


def decisions(cache, out) -> tuple:
    policy = getattr(cache, "marconi", None)
    return (out.hit_len, policy.alpha if policy else None,
            tuple(sorted(sglang_state_nodes(cache))),
            cache.full_evictable_size() + cache.full_protected_size())


def digest(trace) -> str:
    return hashlib.sha256(json.dumps(trace).encode()).hexdigest()


if __name__ == "__main__":
    # allocation noise that differs with the hash seed: object addresses move
    junk = [object() for _ in range(hash("noise") % 5000)]
    result = {}
    for policy in POLICIES:
        cache, replayer = make(policy)
        result[policy] = digest([decisions(cache, replayer.run(rr)) for rr in stream()])
    print(json.dumps(result))
    sys.stdout.flush()
