"""The cache bookkeeping benchmark's measurements (``scripts/bench_overhead.py``,
docs/overhead.md); ``marconi_reports.overhead_report`` prints them.

1. Replay (``replay_timing``). The same requests go through stock ``UnifiedRadixCache``
   with its compiled tree core ("stock") and with its python core ("stock-python"), and
   through ``MarconiUnifiedRadixCache`` ("marconi", what ``--cache-policy marconi`` runs;
   "marconi-paper", the paper's ranking at a fixed alpha). All caches are built first and the requests are interleaved:
   request i goes through every cache (in rotating order) before request i+1, so load from
   other processes on the machine falls on every cache alike; each cache keeps its own copy
   of SGLang's process-global access-time counter, so every cache makes the decisions it
   makes when run alone. Bookkeeping time per request is the CPU A/B's
   (``replay.Replayer``): the wall time of all the scheduler's cache calls for the request
   (match, lock, allocation with eviction, checkpoints, release). Peak Python memory comes
   from a separate, untimed pass per cache under ``tracemalloc`` (``replay_memory``).
2. Scaling (``scaling``). Trees of distinct 128-token sequences (one node and one SSM state
   each, inserted through the cache's ``insert``), pools sized so that every further request
   evicts: "state" = the state pool is full (MAMBA component's walk), "kv" = the token pool
   is full (FULL component's walk); then short distinct requests (130 tokens) through the
   same ``Replayer``, timed per request and per eviction call (``_evict``).
3. The simulator's ``policy.cache.PrefixCache`` at the same sizes (``sim_scaling``): time
   per request and per eviction.

SGLang is imported inside the functions that need it.
"""
from __future__ import annotations

import dataclasses
import gc
import statistics
import sys
import time
import tracemalloc
from array import array
from pathlib import Path

import numpy as np
from sglang.srt.mem_cache.base_prefix_cache import InsertParams
from sglang.srt.mem_cache.radix_cache import RadixKey

from sglang_marconi.driver.pools import PoolConfig
from sglang_marconi.driver.replay import Replayer, ReplayRequest
from sglang_marconi.harness.ab import (ABConfig, OwnAccessClock, instrument, make_cache,
                                       to_replay_requests)
from sglang_marconi.harness.timing import CallTimer, quantile
from sglang_marconi.model import preset_spec
from sglang_marconi.policy.cache import PrefixCache
from sglang_marconi.sglang_integration.options import MarconiSettings
from sglang_marconi.sim.traces import read_trace

REPLAY_CACHES = ("stock", "stock-python", "marconi")
SCALE_CACHES = ("stock", "stock-python", "marconi")
SCENARIOS = ("state", "kv")
SEQ = 128          # tokens each tree node holds (two 64-token pages, one state at the end)
REQ_LEN = 130      # scaling requests: 130 prompt tokens (state at 128), one output token


# -- helpers ---------------------------------------------------------------------------------
def _base(name: str) -> str:
    return "marconi" if name.startswith("marconi") else name


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



def _settings(name: str, alpha: float):
    """``marconi``: the product's settings; ``marconi-paper``: the paper's ranking at
    ``alpha``."""
    return MarconiSettings(alpha=float(alpha)) if name == "marconi-paper" else MarconiSettings()


def _node_count(cache):
    """Live nodes of a python tree core (root excluded); None for the compiled core."""
    arena = getattr(cache.tree_core, "_node_arena", None)
    return None if arena is None else len(arena) - 1


# -- 1. replay ---------------------------------------------------------------------------
def load_requests(trace: Path, limit):
    return to_replay_requests(read_trace(trace), limit)


def replay_config(requests, model: str = "qwen3_next", kv_tokens: int = 1_500_000,
                  mamba_slots: int = 200, page_size: int = 64, chunk: int = 8192,
                  track_interval: int = 256, alpha: float = 1.0):
    """The CPU A/B's configuration (docs/sglang.md) for these requests."""
    longest = max(len(r.input_ids) + max(1, r.output_len) for r in requests)
    pools = PoolConfig(kv_tokens=max(kv_tokens, longest + 2 * page_size),
                       mamba_slots=mamba_slots, page_size=page_size,
                       max_context_len=longest + 2 * page_size, chunked_prefill_size=chunk,
                       mamba_track_interval=track_interval)
    return ABConfig(pools=pools, spec=preset_spec(model),
                    settings=_settings("marconi", alpha))


def replay_timing(requests, cfg, names=REPLAY_CACHES, alpha: float = 1.0,
                  progress: bool = False) -> dict:
    """Every cache of ``names`` built up front, the requests interleaved across them.
    Returns {name: column}."""
    runs = []
    for name in names:
        c = dataclasses.replace(cfg, settings=_settings(name, alpha))
        cache, _, _ = make_cache(_base(name), c)
        counters = instrument(cache)
        runs.append(dict(name=name, cache=cache, counters=counters, evict=EvictTimer(cache),
                         calls=CallTimer(cache),
                         clock=OwnAccessClock(), times=[], hit=0, inp=0,
                         saved=0.0, replayer=Replayer(
                             cache, chunked_prefill_size=cfg.pools.chunked_prefill_size)))
    spec = cfg.spec
    gc.collect()
    t_start = time.perf_counter()
    for i, rr in enumerate(requests):
        k = i % len(runs)
        for run in runs[k:] + runs[:k]:
            with run["clock"]:  # its own copy of SGLang's access-time counter
                out = run["replayer"].run(rr)
            run["times"].append(out.seconds)
            run["hit"] += out.hit_len
            run["inp"] += out.input_len
            run["saved"] += spec.flops_saved(out.hit_len, 0)
        if progress and (i + 1) % 500 == 0:
            print(f"  replay: {i + 1}/{len(requests)} requests "
                  f"({time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)
    OwnAccessClock.settle(run["clock"] for run in runs)
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
            # each cache call the scheduler makes
            "call_mean_ms": 1000 * statistics.fmean(run["calls"].seconds),
            "call_p99_ms": 1000 * quantile(run["calls"].seconds, 0.99),
            "call_max_ms": 1000 * run["calls"].max,
        }
        if hasattr(cache, "marconi"):
            m = cache.marconi.stats
            col["alpha"] = m.alpha
            col["ranking"] = m.ranking
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
