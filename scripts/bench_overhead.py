"""Benchmark: cache bookkeeping overhead of the Marconi cache against stock SGLang (issue 6).

1. Replay. The same requests of the shared Mooncake trace go through stock
   ``UnifiedRadixCache`` with its compiled tree core ("stock") and with its python core
   ("stock-python"), and through ``MarconiUnifiedRadixCache`` ("marconi", a fixed alpha, so
   the one-off alpha tuning is not mixed in; with ``--auto`` "marconi-auto" runs
   alpha=auto alongside and is reported apart). All caches are built first and the requests
   are interleaved: request i goes through every cache (in rotating order) before request
   i+1, so load from other processes on the machine falls on every cache alike; each cache
   keeps its own copy of SGLang's process-global access-time counter, so every cache makes
   the decisions it makes when run alone. Bookkeeping time per request is the
   CPU A/B's (``replay.Replayer``): the wall time of all the scheduler's cache calls for the
   request (match, lock, allocation with eviction, checkpoints, release). Printed: mean,
   P50 and P99 ms per request, the ratio to each stock core, and PASS/MISS for the target
   (marconi mean within 1.15x of stock-python). Peak Python memory comes from a separate,
   untimed pass per cache under ``tracemalloc`` over the first ``--memory-limit`` requests
   (Python allocations only: the pools' torch tensors, the same for every cache, and the
   compiled core's tree are not traced).
2. Scaling. Trees of about 1K, 10K and 100K nodes (distinct 128-token sequences, one node
   and one SSM state each, inserted through the cache's ``insert``), pools sized so that
   every further request evicts: "state" = the state pool is full (MAMBA component's
   walk), "kv" = the token pool is full (FULL component's walk). Then short distinct
   requests (130 tokens) run through the same ``Replayer``; printed per request and per
   eviction call (``_evict``), so a reader sees whether eviction cost grows with the tree.
3. The simulator's ``policy.cache.PrefixCache`` at the same sizes: time per request and per
   eviction (heap with lazy invalidation: should stay about flat).

A benchmark, not a test: exits 0 either way (1 with ``--strict`` on a MISS).

Usage: .venv/bin/python scripts/bench_overhead.py [--quick] [--limit N] [--auto]
       [--sizes 1000,10000,100000] [--json PATH] [--strict]
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import sys
import time
import tracemalloc
import warnings
from array import array
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "synthetic_trace.jsonl"
REPLAY_CACHES = ("stock", "stock-python", "marconi")
SCALE_CACHES = ("stock", "stock-python", "marconi")
SCENARIOS = ("state", "kv")
SEQ = 128          # tokens each tree node holds (two 64-token pages, one state at the end)
REQ_LEN = 130      # scaling requests: 130 prompt tokens (state at 128), one output token


# -- helpers ---------------------------------------------------------------------------------
def quantile(xs, q: float) -> float:
    """Nearest-rank quantile (the A/B's convention)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _base(name: str) -> str:
    return "marconi" if name.startswith("marconi") else name


def _settings(name: str, alpha: float):
    from sglang_marconi.sglang_integration.options import MarconiSettings

    if name == "marconi+":
        return MarconiSettings(alpha=0.0, plus=True)
    return MarconiSettings(alpha="auto" if name == "marconi-auto" else float(alpha))


def _node_count(cache):
    """Live nodes of a python tree core (root excluded); None for the compiled core."""
    arena = getattr(cache.tree_core, "_node_arena", None)
    return None if arena is None else len(arena) - 1


class EvictTimer:
    """Wraps a cache's ``_evict``: calls, seconds inside, states and tokens freed."""

    def __init__(self, cache):
        self.calls = 0
        self.seconds = []
        self.states = 0
        self.tokens = 0
        inner = cache._evict

        def timed(params, *args, **kwargs):
            t0 = time.perf_counter()
            result = inner(params, *args, **kwargs)
            self.seconds.append(time.perf_counter() - t0)
            self.calls += 1
            self.states += result.mamba_num_evicted
            self.tokens += result.num_tokens_evicted
            return result

        cache._evict = timed


# -- 1. replay ---------------------------------------------------------------------------
def load_requests(trace: Path, limit):
    from sglang_marconi.harness.ab import to_replay_requests
    from sglang_marconi.sim.traces import read_trace

    return to_replay_requests(read_trace(trace), limit)


def replay_config(requests, model: str = "qwen3_next", kv_tokens: int = 1_500_000,
                  mamba_slots: int = 200, page_size: int = 64, chunk: int = 8192,
                  track_interval: int = 256, alpha: float = 1.0):
    """The CPU A/B's configuration (docs/sglang.md) for these requests."""
    from sglang_marconi.model import HybridModelSpec
    from sglang_marconi.harness.ab import ABConfig
    from sglang_marconi.driver.pools import PoolConfig

    longest = max(len(r.input_ids) + max(1, r.output_len) for r in requests)
    pools = PoolConfig(kv_tokens=max(kv_tokens, longest + 2 * page_size),
                       mamba_slots=mamba_slots, page_size=page_size,
                       max_context_len=longest + 2 * page_size, chunked_prefill_size=chunk,
                       mamba_track_interval=track_interval)
    return ABConfig(pools=pools, spec=HybridModelSpec.from_preset(model),
                    settings=_settings("marconi", alpha))


def replay_timing(requests, cfg, names=REPLAY_CACHES, alpha: float = 1.0,
                  progress: bool = False) -> dict:
    """Every cache of ``names`` built up front, the requests interleaved across them.
    Returns {name: column}."""
    from sglang_marconi.harness.ab import instrument, make_cache
    from sglang_marconi.driver.replay import Replayer

    from sglang.srt.mem_cache.unified_cache.components import base as clock

    runs = []
    for name in names:
        c = dataclasses.replace(cfg, settings=_settings(name, alpha))
        cache, _, _ = make_cache(_base(name), c)
        counters = instrument(cache)
        runs.append(dict(name=name, cache=cache, counters=counters, evict=EvictTimer(cache),
                         clock=clock._LAST_ACCESS_TIME_COUNTER_FLOAT, times=[], hit=0, inp=0,
                         saved=0.0, replayer=Replayer(
                             cache, chunked_prefill_size=cfg.pools.chunked_prefill_size)))
    spec = cfg.spec
    gc.collect()
    t_start = time.perf_counter()
    for i, rr in enumerate(requests):
        k = i % len(runs)
        for run in runs[k:] + runs[:k]:
            # SGLang's access-time counter is process-global; each cache keeps its own, so
            # its recency values are spaced as in a run of that cache alone (Marconi
            # normalises recency by its range: other caches' ticks would change its order)
            clock._LAST_ACCESS_TIME_COUNTER_FLOAT = run["clock"]
            out = run["replayer"].run(rr)
            run["clock"] = clock._LAST_ACCESS_TIME_COUNTER_FLOAT
            run["times"].append(out.seconds)
            run["hit"] += out.hit_len
            run["inp"] += out.input_len
            run["saved"] += spec.flops_saved(out.hit_len, 0)
        if progress and (i + 1) % 500 == 0:
            print(f"  replay: {i + 1}/{len(requests)} requests "
                  f"({time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)
    clock._LAST_ACCESS_TIME_COUNTER_FLOAT = max(run["clock"] for run in runs)
    results = {}
    for run in runs:
        times, counters, cache = run["times"], run["counters"], run["cache"]
        col = {
            "cache": type(cache).__name__,
            "tree_core": type(cache.tree_core).__name__,
            "requests": len(times),
            "input_tokens": run["inp"],
            "hit_tokens": run["hit"],
            "token_hit_rate": run["hit"] / run["inp"] if run["inp"] else 0.0,
            "flops_saved": run["saved"],
            "states_admitted": counters.states_admitted,
            "states_evicted": counters.states_evicted,
            "evict_calls": counters.evict_calls,
            "evict_calls_per_request": counters.evict_calls / len(times),
            # time inside the cache's _evict (the eviction walks), per request
            "evict_ms": 1000 * sum(run["evict"].seconds) / len(times),
            "total_s": sum(times),
            "mean_ms": 1000 * statistics.fmean(times),
            "p50_ms": 1000 * quantile(times, 0.50),
            "p99_ms": 1000 * quantile(times, 0.99),
            "max_ms": 1000 * max(times),
        }
        if hasattr(cache, "marconi"):
            m = cache.marconi.stats
            col["alpha"] = m.alpha
            col["tuning_s"] = m.tuning_seconds
            # the mean without the one request that ran the tuning replay
            col["mean_ms_without_tuning"] = 1000 * (sum(times) - m.tuning_seconds) / len(times)
        results[run["name"]] = col
    del runs
    gc.collect()
    return results


def ratios(timing: dict, name: str = "marconi") -> dict:
    """{stock core: {"mean": x, "p99": y}} of ``name`` over each stock cache present."""
    m = timing[name]
    return {s: {"mean": m["mean_ms"] / timing[s]["mean_ms"],
                "p99": m["p99_ms"] / timing[s]["p99_ms"]}
            for s in ("stock", "stock-python") if s in timing}


def replay_memory(requests, cfg, names=REPLAY_CACHES, alpha: float = 1.0) -> dict:
    """A separate, untimed pass per cache under tracemalloc: {name: {peak_mib, end_mib}},
    Python allocations from just before the cache is built (requests already loaded)."""
    from sglang_marconi.harness.ab import make_cache
    from sglang_marconi.driver.replay import Replayer

    out = {}
    for name in names:
        gc.collect()
        tracemalloc.start()
        try:
            c = dataclasses.replace(cfg, settings=_settings(name, alpha))
            cache, _, _ = make_cache(_base(name), c)
            replayer = Replayer(cache, chunked_prefill_size=cfg.pools.chunked_prefill_size)
            for rr in requests:
                replayer.run(rr)
            current, peak = tracemalloc.get_traced_memory()
            out[name] = {"peak_mib": peak / 2**20, "end_mib": current / 2**20,
                         "requests": len(requests)}
        finally:
            tracemalloc.stop()
            cache = replayer = None
            gc.collect()
    return out


# -- 2. scaling (SGLang caches) --------------------------------------------------------------
def _tokens(i: int, n: int) -> array:
    return array("q", range(i * 1000, i * 1000 + n))


def scale_point(name: str, nodes: int, scenario: str, spec, alpha: float = 1.0,
                max_requests: int = 50, budget_s: float = 5.0, warmup: int = 2) -> dict:
    """A tree of ``nodes`` distinct 128-token sequences (a state at the end of each) in
    ``name``; pools full in ``scenario`` ("state" or "kv"); then short distinct requests,
    each of which evicts. Returns per-request and per-eviction times."""
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    from sglang_marconi.harness.ab import ABConfig, make_cache
    from sglang_marconi.driver.pools import PoolConfig
    from sglang_marconi.driver.replay import Replayer, ReplayRequest

    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}")
    page = 64
    running = 3 * page  # a running 130-token request holds three pages
    if scenario == "state":  # a running request holds 3 state slots (extra_buffer)
        pools = PoolConfig(kv_tokens=nodes * SEQ + 64 * page, mamba_slots=nodes + 3,
                           page_size=page, max_context_len=4 * page)
    else:
        pools = PoolConfig(kv_tokens=nodes * SEQ + running, mamba_slots=nodes + 64,
                           page_size=page, max_context_len=4 * page)
    cfg = ABConfig(pools=pools, spec=spec, settings=_settings(name, alpha))
    cache, allocator, req_to_token = make_cache(_base(name), cfg)
    t0 = time.perf_counter()
    for i in range(nodes):
        kv = allocator.alloc(SEQ)
        state = req_to_token.mamba_allocator.alloc(1)
        if kv is None or state is None:
            raise RuntimeError(f"pools too small to hold {nodes} nodes")
        cache.insert(InsertParams(key=RadixKey(_tokens(i, SEQ)), value=kv, mamba_value=state))
    fill_s = time.perf_counter() - t0
    timer = EvictTimer(cache)
    replayer = Replayer(cache, chunked_prefill_size=8192)
    seq = nodes
    for _ in range(warmup):  # the pools still had the headroom of the last insert
        replayer.run(ReplayRequest(f"w{seq}", _tokens(seq, REQ_LEN), [7]))
        seq += 1
    timer.calls, timer.seconds, timer.states, timer.tokens = 0, [], 0, 0
    times = []
    t0 = time.perf_counter()
    while len(times) < max_requests and (len(times) < 3 or time.perf_counter() - t0 < budget_s):
        times.append(replayer.run(ReplayRequest(f"r{seq}", _tokens(seq, REQ_LEN), [7])).seconds)
        seq += 1
    result = {
        "cache": name, "scenario": scenario, "nodes_target": nodes,
        "nodes": _node_count(cache), "fill_s": fill_s, "requests": len(times),
        "ms_per_request": 1000 * statistics.fmean(times),
        "p50_ms_per_request": 1000 * quantile(times, 0.5),
        "evict_calls": timer.calls,
        "states_evicted": timer.states,
        "kv_tokens_evicted": timer.tokens,
        "ms_per_evict_call": 1000 * statistics.fmean(timer.seconds) if timer.seconds else 0.0,
        "ms_evict_per_request": 1000 * sum(timer.seconds) / len(times),
    }
    del cache, replayer, allocator, req_to_token, timer
    gc.collect()
    return result


def scaling(sizes, spec, names=SCALE_CACHES, scenarios=SCENARIOS, alpha: float = 1.0,
            max_requests: int = 50, budget_s: float = 5.0, progress: bool = False) -> list:
    rows = []
    for scenario in scenarios:
        for n in sizes:
            for name in names:
                rows.append(scale_point(name, n, scenario, spec, alpha, max_requests, budget_s))
                if progress:
                    r = rows[-1]
                    print(f"  scaling: {scenario} {n:,} {name}: {r['ms_per_request']:.2f} ms/req",
                          file=sys.stderr, flush=True)
    return rows


# -- 3. the simulator --------------------------------------------------------------------
def sim_scale_point(nodes: int, spec, alpha: float = 1.0, max_requests: int = 100_000) -> dict:
    """``PrefixCache`` holding ``nodes`` distinct 128-token sequences (a state each, byte
    budget exactly full), then min(nodes, max_requests) more: each evicts one node."""
    import numpy as np

    from sglang_marconi.policy.cache import PrefixCache

    per_node = SEQ * spec.kv_bytes_per_token + spec.ssm_state_bytes
    cache = PrefixCache(spec, nodes * per_node, alpha=alpha, grid=64, max_states_per_request=2)

    def request(i):
        x = np.arange(i * 1000, i * 1000 + REQ_LEN, dtype=np.int64)
        return x, x  # one output token: KV exists for the prompt only

    t0 = time.perf_counter()
    for i in range(nodes):
        cache.process(*request(i))
    fill_s = time.perf_counter() - t0
    evict_s = []
    inner = cache._evict_one

    def timed():
        t = time.perf_counter()
        ok = inner()
        evict_s.append(time.perf_counter() - t)
        return ok

    cache._evict_one = timed
    rebuilds = cache.tree.queue.rebuilds
    m = min(nodes, max_requests)
    times = []
    for i in range(nodes, nodes + m):
        t = time.perf_counter()
        cache.process(*request(i))
        times.append(time.perf_counter() - t)
    return {
        "nodes": cache.tree.num_nodes - 1, "fill_s": fill_s, "requests": m,
        "us_per_request": 1e6 * statistics.fmean(times),
        "evictions": len(evict_s),
        "us_per_eviction": 1e6 * statistics.fmean(evict_s) if evict_s else 0.0,
        "us_eviction_p99": 1e6 * quantile(evict_s, 0.99),
        "us_eviction_max": 1e6 * max(evict_s) if evict_s else 0.0,
        "queue_rebuilds": cache.tree.queue.rebuilds - rebuilds,
    }


def sim_scaling(sizes, spec, alpha: float = 1.0, max_requests: int = 100_000) -> list:
    return [sim_scale_point(n, spec, alpha, max_requests) for n in sizes]


# -- output ----------------------------------------------------------------------------------
def format_replay(timing: dict, memory: dict, target: float) -> str:
    def f(x, fmt):
        return "-" if x is None else fmt.format(x)

    names = list(timing)
    lines = [f"{'cache':<14}{'alpha':>6}{'mean ms':>9}{'P50 ms':>8}{'P99 ms':>8}"
             f"{'evict ms':>9}{'evicts':>7}{'mean/stock':>11}{'P99/stock':>10}"
             f"{'mean/py':>8}{'P99/py':>7}"]
    for n in names:
        t = timing[n]
        r = ratios(timing, n)
        rs = r.get("stock", {}) if n != "stock" else {}
        rp = r.get("stock-python", {}) if n not in ("stock", "stock-python") else {}
        alpha = f"{t['alpha']:g}" if "alpha" in t and n != "marconi+" else "-"
        lines.append(
            f"{n:<14}{alpha:>6}{t['mean_ms']:>9.2f}{t['p50_ms']:>8.2f}{t['p99_ms']:>8.2f}"
            f"{t['evict_ms']:>9.2f}{t['evict_calls_per_request']:>7.2f}"
            f"{f(rs.get('mean'), '{:.3f}'):>11}{f(rs.get('p99'), '{:.3f}'):>10}"
            f"{f(rp.get('mean'), '{:.3f}'):>8}{f(rp.get('p99'), '{:.3f}'):>7}")
    lines.append("(ms per request; evict ms = time inside the cache's _evict per request, "
                 "evicts = _evict calls per request; /py = over stock-python)")
    for n in names:
        t = timing[n]
        if t.get("tuning_s"):
            lines.append(f"{n}: tuned alpha to {t['alpha']:g} in {t['tuning_s']:.1f} s (inside "
                         f"one request's bookkeeping); mean without it "
                         f"{t['mean_ms_without_tuning']:.2f} ms")
    if "marconi" in timing and "stock-python" in timing:
        r = ratios(timing)["stock-python"]["mean"]
        lines.append(f"target: marconi mean within {target:g}x of stock-python: "
                     f"{r:.3f}x -> {'PASS' if r <= target else 'MISS'}")
    lines.append("")
    lines.append(f"{'cache':<14}{'peak MiB':>9}{'end MiB':>8}{'hit rate':>9}"
                 f"{'states in':>10}{'states out':>11}")
    for n in names:
        t, mem = timing[n], memory.get(n, {})
        lines.append(f"{n:<14}{f(mem.get('peak_mib'), '{:.1f}'):>9}"
                     f"{f(mem.get('end_mib'), '{:.1f}'):>8}{t['token_hit_rate']:>9.2%}"
                     f"{t['states_admitted']:>10,}{t['states_evicted']:>11,}")
    return "\n".join(lines)


def format_scaling(rows: list) -> str:
    lines = [f"{'scenario':<9}{'nodes':>9}{'cache':>14}{'tree nodes':>11}{'reqs':>6}"
             f"{'ms/req':>9}{'evict calls':>12}{'ms/evict call':>14}{'evicted/call':>13}"]
    for r in rows:
        per_call = ((r["states_evicted"] if r["scenario"] == "state"
                     else r["kv_tokens_evicted"] / SEQ) / r["evict_calls"]
                    if r["evict_calls"] else 0.0)
        nodes = "-" if r["nodes"] is None else f"{r['nodes']:,}"
        lines.append(f"{r['scenario']:<9}{r['nodes_target']:>9,}{r['cache']:>14}{nodes:>11}"
                     f"{r['requests']:>6}{r['ms_per_request']:>9.2f}{r['evict_calls']:>12}"
                     f"{r['ms_per_evict_call']:>14.3f}{per_call:>13.2f}")
    return "\n".join(lines)


def format_sim(rows: list) -> str:
    lines = [f"{'nodes':>9}{'requests':>10}{'us/request':>12}{'evictions':>11}"
             f"{'us/eviction':>13}{'P99 us':>9}{'max us':>10}{'rebuilds':>10}"]
    for r in rows:
        lines.append(f"{r['nodes']:>9,}{r['requests']:>10,}{r['us_per_request']:>12.1f}"
                     f"{r['evictions']:>11,}{r['us_per_eviction']:>13.1f}"
                     f"{r['us_eviction_p99']:>9.1f}{r['us_eviction_max']:>10.0f}"
                     f"{r['queue_rebuilds']:>10}")
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------
def _sizes(text: str) -> tuple:
    return tuple(int(float(x)) for x in text.split(",") if x.strip())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--limit", type=int, default=None, help="replay the first N requests")
    ap.add_argument("--model", default="qwen3_next")
    ap.add_argument("--kv-tokens", type=int, default=1_500_000)
    ap.add_argument("--mamba-slots", type=int, default=200)
    ap.add_argument("--alpha", type=float, default=1.0, help="marconi's fixed alpha")
    ap.add_argument("--auto", action="store_true",
                    help="add a marconi-auto column (alpha=auto: its one-off tuning replay "
                         "takes about 30 s on the full trace)")
    ap.add_argument("--plus", action="store_true",
                    help="add a marconi+ column (--cache-policy marconi+)")
    ap.add_argument("--memory-limit", type=int, default=500,
                    help="requests of the tracemalloc pass (0: skip it)")
    ap.add_argument("--sizes", default="1000,10000,100000", help="tree sizes for scaling")
    ap.add_argument("--scale-requests", type=int, default=50,
                    help="most measured requests per scaling point")
    ap.add_argument("--scale-budget-s", type=float, default=4.0,
                    help="stop measuring a scaling point after this long (3 requests at least)")
    ap.add_argument("--sim-requests", type=int, default=100_000,
                    help="simulator: measured requests per size, at most the tree size")
    ap.add_argument("--skip", default="", help="comma list of replay,scaling,sim to skip")
    ap.add_argument("--quick", action="store_true",
                    help="--limit 300 --memory-limit 300 --sizes 1000,10000 "
                         "--scale-requests 20 --sim-requests 10000")
    ap.add_argument("--target", type=float, default=1.15)
    ap.add_argument("--json", metavar="PATH", help="also write every number as JSON")
    ap.add_argument("--strict", action="store_true", help="exit 1 on a MISS")
    args = ap.parse_args(argv)
    if args.quick:
        args.limit = args.limit or 300
        args.memory_limit = min(args.memory_limit, 300)
        args.sizes = "1000,10000"
        args.scale_requests = 20
        args.sim_requests = 10_000
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    warnings.filterwarnings("ignore", category=UserWarning)

    from sglang_marconi.model import HybridModelSpec

    t_all = time.perf_counter()
    out = {"config": {k: v for k, v in vars(args).items()}, "cpus": os.cpu_count()}
    spec = HybridModelSpec.from_preset(args.model)
    verdict = None
    if "replay" not in skip:
        t0 = time.perf_counter()
        requests = load_requests(Path(args.trace), args.limit)
        cfg = replay_config(requests, args.model, args.kv_tokens, args.mamba_slots,
                            alpha=args.alpha)
        names = (REPLAY_CACHES + (("marconi-auto",) if args.auto else ())
                 + (("marconi+",) if args.plus else ()))
        print(f"replay: {args.trace}: {len(requests):,} requests, "
              f"{sum(len(r.input_ids) for r in requests):,} input tokens, model {spec.name}, "
              f"{cfg.pools.kv_tokens:,} KV token slots, {cfg.pools.mamba_slots} state slots, "
              f"page {cfg.pools.page_size}; caches interleaved request by request; "
              f"{os.cpu_count()} CPUs", flush=True)
        timing = replay_timing(requests, cfg, names, args.alpha, progress=True)
        memory = {}
        if args.memory_limit:
            memory = replay_memory(requests[:args.memory_limit], cfg, names, args.alpha)
        print(format_replay(timing, memory, args.target))
        if memory:
            print(f"peak / end MiB: tracemalloc, a separate untimed pass over the first "
                  f"{min(args.memory_limit, len(requests)):,} requests, one cache at a time, "
                  "counted from just before the cache is built; Python allocations only (the "
                  "pools' torch tensors and the compiled core's tree are not traced)")
        print(f"replay part: {time.perf_counter() - t0:.0f} s", flush=True)
        if "marconi" in timing and "stock-python" in timing:
            verdict = ("PASS" if ratios(timing)["stock-python"]["mean"] <= args.target
                       else "MISS")
        out["replay"] = {"timing": timing, "memory": memory,
                         "ratios": ratios(timing) if "marconi" in timing else {},
                         "verdict": verdict}
        del requests
        gc.collect()
    if "scaling" not in skip:
        t0 = time.perf_counter()
        sizes = _sizes(args.sizes)
        rows = scaling(sizes, spec, alpha=args.alpha, max_requests=args.scale_requests,
                       budget_s=args.scale_budget_s, progress=True)
        print(f"\nscaling (SGLang caches, alpha {args.alpha:g}): trees of distinct {SEQ}-token "
              f"sequences (one node and one state each); requests of {REQ_LEN} tokens; "
              "state = state pool full (MAMBA walk), kv = token pool full (FULL walk); "
              "'tree nodes' = live nodes of the python core after the run")
        print(format_scaling(rows))
        print(f"scaling part: {time.perf_counter() - t0:.0f} s", flush=True)
        out["scaling"] = rows
    if "sim" not in skip:
        t0 = time.perf_counter()
        rows = sim_scaling(_sizes(args.sizes), spec, args.alpha, args.sim_requests)
        print(f"\nsimulator PrefixCache (alpha {args.alpha:g}): byte budget full of distinct "
              f"{SEQ}-token sequences; each measured request evicts")
        print(format_sim(rows))
        print(f"simulator part: {time.perf_counter() - t0:.0f} s", flush=True)
        out["sim"] = rows
    total = time.perf_counter() - t_all
    print(f"\ntotal {total:.0f} s")
    out["total_s"] = total
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str) + "\n")
    return 1 if args.strict and verdict == "MISS" else 0


if __name__ == "__main__":
    sys.exit(main())
