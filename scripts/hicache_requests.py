"""Issue 20, per request: where a Marconi cache with SGLang's host tier (HiCache) loses
hits stock gets, or gains hits stock misses. A diagnosis, not a test: exits 0 either way.

Replays one grid cell (``marconi_reports/hicache_bench.py``: model, 100 GB static device pools,
host GB, write policy) through stock (SGLang's python tree core, which ``ab``'s compiled
stock matches hit for hit) and a Marconi cache, request by request. Before each request
it reads, without touching the tree, what the Marconi cache holds along the request's
prompt (KV on either tier, the deepest state on either tier), and it records every
device eviction of a FULL node (demoted to host or dropped, and SGLang's insert count
``hit_count`` then, which write_through_selective backs up at 2). Each request falls in
one class: same hit; the Marconi cache deeper (from device / from host); stock deeper,
stock's hit from device or host, and what the Marconi cache held at stock's depth (the
segment dropped earlier with its insert count, demoted, or never inserted). Per class:
requests and prefill FLOPs saved by each cache (% of the trace's prefill FLOPs).

Usage: python scripts/hicache_requests.py [--model qwen3_next] [--host-gb 200]
       [--policy write_through_selective] [--cache marconi+] [--limit N]
       [--without-tail-rule]

``--without-tail-rule``: the Marconi cache without the admission half of the two-tier rule
(``policy.host_tier.tail_counts_toward_backup``: end states its learned usefulness refuses
are refused under every write policy, the code before that rule).
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.base import (  # noqa: E402
    ComponentType,
    EvictLayer,
)

from sglang_marconi.driver.replay import Replayer  # noqa: E402
from sglang_marconi.harness.ab import instrument_host, make_cache  # noqa: E402
from marconi_reports import cell_runs, hicache_bench  # noqa: E402
from sglang_marconi.sglang_integration.policy_state import MarconiPolicyState  # noqa: E402
from marconi_reports.sweeps import MOONCAKE_TRACE  # noqa: E402

FULL, MAMBA = ComponentType.FULL, ComponentType.MAMBA


def _digest(tokens: np.ndarray) -> bytes:
    return hashlib.blake2b(tokens.tobytes(), digest_size=12).digest()


def path_tokens(node) -> np.ndarray:
    """The token ids from the root to the end of ``node``."""
    parts = []
    while node is not None and node.parent is not None:
        parts.append(np.asarray(node.key.token_ids, dtype=np.int64))
        node = node.parent
    return np.concatenate(parts[::-1]) if parts else np.zeros(0, np.int64)


def held_along(cache, tokens) -> tuple:
    """(deepest KV on either tier, deepest state on either tier) along ``tokens`` (page
    aligned, the last token excepted, as a match), read without touching the tree."""
    core = cache.tree_core
    page = core.page_size
    key = RadixKey(tokens[:(len(tokens) - 1) // page * page])
    node, offset, kv, state = core.root_node, 0, 0, 0
    while offset < len(key):
        child = node.children.get(key.child_key_at(offset, page))
        if child is None or (child.evicted and not child.backuped):
            break
        n = child.key.match_at(key, offset, page_size=page)
        full, mamba = child.component_data[FULL], child.component_data[MAMBA]
        if full.value is None and full.host_value is None:
            break
        kv = offset + n
        if n < len(child.key):
            break
        if mamba.value is not None or mamba.host_value is not None:
            state = kv
        offset, node = kv, child
    return kv, state


def record_device_evictions(cache, now: list) -> dict:
    """Wrap the FULL component's evictions: digest of the node's path -> [(request
    index, start depth, end depth, insert count, "demoted" / "dropped")]."""
    comp = cache.components[FULL]
    evict, seen = comp.evict_component, defaultdict(list)

    def recording(node, *args, target=EvictLayer.DEVICE, **kwargs):
        full = node.component_data[FULL]
        if target in (EvictLayer.DEVICE, EvictLayer.ALL) and full.value is not None:
            tokens = path_tokens(node)
            seen[_digest(tokens)].append(
                (now[0], len(tokens) - len(node.key), len(tokens), node.hit_count,
                 "demoted" if full.host_value is not None else "dropped"))
        return evict(node, *args, target=target, **kwargs)

    comp.evict_component = recording
    return seen


def replay(cell: dict, requests: list, watch: bool) -> tuple:
    """Per request (input, device hit, host hit, KV held, state held); the evictions; the
    A/B configuration; a summary line of what crossed to host and what was admitted."""
    cfg, name, _, _ = hicache_bench.cell_config(cell, requests)
    cache = make_cache("stock-python" if name == "stock" else name, cfg)[0]
    host = instrument_host(cache)  # the host section's counters, as in ``ab``
    now = [0]
    evictions = record_device_evictions(cache, now) if watch else {}
    replayer = Replayer(cache, chunked_prefill_size=cfg.pools.chunked_prefill_size,
                        overlap=cfg.overlap)
    rows = []
    for i, rr in enumerate(requests):
        now[0] = i
        held = held_along(cache, rr.input_ids) if watch else (0, 0)
        out = replayer.run(rr)
        rows.append((out.input_len, out.hit_len, out.host_hit_len) + held)
    summary = (f"{cell['cache']}: device hit tokens {sum(r[1] for r in rows):,}, host hit "
               f"tokens {sum(r[2] for r in rows):,}, KV tokens backed up "
               f"{host.kv_tokens_backed_up:,}, evicted on host {host.kv_tokens_evicted:,}")
    if hasattr(cache, "marconi"):
        st = cache.marconi.stats
        summary += (f"; states admitted {dict(sorted(st.admitted.items()))}, end states "
                    f"skipped {st.end_states_skipped:,}")
    return rows, evictions, cfg, summary


def loss_cause(tokens: np.ndarray, row: tuple, stock_hit: int, evictions: dict,
               index: int, page: int) -> str:
    """What the Marconi cache held at the depth stock hit (``row``: its own record)."""
    kv, state = row[3], row[4]
    if kv >= stock_hit:
        return "KV there, no state at that depth"
    for end in range(kv + page, len(tokens) + 1, page):
        past = [e for e in evictions.get(_digest(tokens[:end]), ()) if e[0] < index
                and e[1] <= kv]
        if past:
            _, _, _, count, kind = past[-1]
            return f"{kind} earlier, insert count {min(count, 3)}{'+' if count >= 3 else ''}"
    return "never in its tree"


def classify(stock: list, other: list, evictions: dict, requests: list, name: str,
             page: int) -> dict:
    classes = defaultdict(lambda: [0, 0, 0])  # requests, stock hit tokens, other's
    keys = {}
    for i, (s, o) in enumerate(zip(stock, other)):
        hs, ho = s[1] + s[2], o[1] + o[2]
        if hs == ho:
            key = "same hit"
        elif ho > hs:
            key = f"{name} deeper, from {'host' if o[2] else 'device'}"
        else:
            tokens = np.frombuffer(requests[i].input_ids, dtype=np.int64)
            cause = loss_cause(tokens, o, hs, evictions, i, page)
            key = f"stock deeper, from {'host' if s[2] else 'device'}: {name} {cause}"
        keys[i] = key
        c = classes[key]
        c[0] += 1
        c[1] += hs
        c[2] += ho
    return classes, keys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(MOONCAKE_TRACE))
    ap.add_argument("--model", default="qwen3_next")
    ap.add_argument("--host-gb", type=int, default=200)
    ap.add_argument("--policy", default="write_through_selective",
                    choices=hicache_bench.WRITE_POLICIES)
    ap.add_argument("--cache", default="marconi+", help="a hicache_bench cache name")
    ap.add_argument("--limit", type=int, default=None, help="first N requests of the trace")
    ap.add_argument("--without-tail-rule", action="store_true")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", category=UserWarning)
    if args.without_tail_rule:
        MarconiPolicyState.keeps_tail_for_backup = lambda self: False
    requests = cell_runs.requests(args.trace, args.limit)
    cell = {"model": args.model, "device_gb": hicache_bench.DEVICE_GB,
            "host_gb": args.host_gb, "policy": args.policy}
    stock, _, _, stock_summary = replay({**cell, "cache": "stock"}, requests, watch=False)
    other, evictions, cfg, other_summary = replay({**cell, "cache": args.cache}, requests,
                                                  watch=True)
    spec = cfg.spec
    classes, keys = classify(stock, other, evictions, requests, args.cache,
                             cfg.pools.page_size)
    total = sum(spec.prefill_flops(r[0]) for r in stock)
    saved = defaultdict(lambda: [0.0, 0.0])
    for i, key in keys.items():
        saved[key][0] += spec.flops_saved(stock[i][1] + stock[i][2], 0) / total
        saved[key][1] += spec.flops_saved(other[i][1] + other[i][2], 0) / total
    tag = " (without the tail rule)" if args.without_tail_rule else ""
    print(f"{args.model}, 100 GB static + {args.host_gb} GB host, {args.policy}, "
          f"{len(requests)} requests: stock vs {args.cache}{tag}")
    print("| class | requests | stock FLOPs saved | "
          f"{args.cache} FLOPs saved | difference (pp) |")
    print("|---|---|---|---|---|")
    for key in sorted(classes, key=lambda k: saved[k][1] - saved[k][0]):
        s, o = saved[key]
        print(f"| {key} | {classes[key][0]:,} | {s:.2%} | {o:.2%} | {100 * (o - s):+.2f} |")
    s_all, o_all = sum(v[0] for v in saved.values()), sum(v[1] for v in saved.values())
    print(f"| all | {len(requests):,} | {s_all:.2%} | {o_all:.2%} | "
          f"{100 * (o_all - s_all):+.2f} |")
    print(stock_summary)
    print(other_summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
