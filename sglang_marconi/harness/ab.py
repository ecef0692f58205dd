"""The CPU A/B: one trace replayed through stock SGLang caches and the Marconi cache on fresh
pools of one size, each measured from outside the same way."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import statistics
import tempfile
import time
from array import array
from dataclasses import dataclass
from typing import Callable, Optional

from sglang.srt.mem_cache.unified_cache.components import base as access_clock
from tqdm import tqdm

from sglang_marconi.driver import host_tier
from sglang_marconi.driver.pools import PoolConfig, build_cache
from sglang_marconi.driver.replay import Replayer, ReplayRequest
from sglang_marconi.errors import UserError, sglang_oom
from sglang_marconi.harness.timing import CallTimer, GCPauses, quantile
from sglang_marconi.policy import defaults
from sglang_marconi.sglang_integration.options import MarconiSettings

# name -> (tree core, marconi?)
CACHES = {
    "stock": ("rust", False),         # UnifiedRadixCache, compiled tree core (SGLang's default)
    "stock-python": ("python", False),  # UnifiedRadixCache, python tree core
    "marconi": ("python", True),      # MarconiUnifiedRadixCache (components force python)
    "marconi+": ("python", True),     # deprecated alias: marconi without an alpha
    "marconi-paper": ("python", True),  # the paper's ranking (an alpha) and admission (2 states)
}


class OwnAccessClock:
    """One cache's copy of SGLang's process-global access-time counter."""

    def __init__(self):
        self.value = access_clock._LAST_ACCESS_TIME_COUNTER_FLOAT

    def __enter__(self) -> "OwnAccessClock":
        access_clock._LAST_ACCESS_TIME_COUNTER_FLOAT = self.value
        return self

    def __exit__(self, *exc) -> None:
        self.value = access_clock._LAST_ACCESS_TIME_COUNTER_FLOAT

    @staticmethod
    def settle(clocks) -> None:
        """After the side-by-side runs: the process counter past every copy's."""
        access_clock._LAST_ACCESS_TIME_COUNTER_FLOAT = max(c.value for c in clocks)


@dataclass
class ABConfig:
    pools: PoolConfig
    spec: object                       # HybridModelSpec
    settings: object = None            # MarconiSettings (None: defaults)
    caches: tuple = ("stock", "stock-python", "marconi")
    unified: object = None             # driver.unified_pools.UnifiedConfig: one byte buffer
    l3: bool = False                   # host tier: an L3 file store per cache (temporary)
    # SGLang's scheduler loop: overlap (its default) or normal (--disable-overlap-schedule);
    # what differs for one request at a time: driver.replay.Replayer(overlap=...)
    overlap: bool = True
    # SGLang's page-per-request eviction on every decode step (driver.replay.Replayer)
    evict_every_decode_step: bool = False


@dataclass
class CacheCounters:
    """Counts taken by wrapping the cache instance's ``insert`` and ``_evict``."""

    states_admitted: int = 0
    states_evicted: int = 0
    kv_tokens_evicted: int = 0
    evict_calls: int = 0


def instrument(cache) -> CacheCounters:
    counters = CacheCounters()
    insert, evict = cache.insert, cache._evict

    @functools.wraps(insert)
    def counting_insert(params):
        result = insert(params)
        if getattr(params, "mamba_value", None) is not None and not result.mamba_exist:
            counters.states_admitted += 1
        return result

    @functools.wraps(evict)
    def counting_evict(params, *args, **kwargs):
        result = evict(params, *args, **kwargs)
        counters.evict_calls += 1
        counters.states_evicted += result.mamba_num_evicted
        counters.kv_tokens_evicted += result.num_tokens_evicted
        return result

    cache.insert = counting_insert
    cache._evict = counting_evict
    return counters


@dataclass
class HostCounters:
    """What crossed between the tiers (SGLang's HiCache), counted at the controller."""

    kv_tokens_loaded: int = 0
    states_loaded: int = 0       # state copies host -> device (the node's and the request's)
    kv_tokens_backed_up: int = 0
    states_backed_up: int = 0
    kv_tokens_evicted: int = 0   # freed on the host tier
    states_evicted: int = 0


def _states(extra_pools) -> int:
    from sglang.srt.mem_cache.hicache_storage import PoolName  # heavy: sglang, runs only

    return sum(int(t.host_indices.numel()) for t in extra_pools or ()
               if t.name == PoolName.MAMBA and t.host_indices is not None)


def instrument_host(cache) -> Optional[HostCounters]:
    """Wrap the cache's controller ``load`` / ``write`` and its ``evict_host``."""
    if not host_tier.enabled(cache):
        return None
    from sglang.srt.mem_cache.unified_cache.components.base import (  # heavy: sglang
        ComponentType,
    )

    counters, controller = HostCounters(), cache.cache_controller
    evict_host = cache.evict_host

    def counted(transfer, indices: str, tokens: str, states: str):
        """``transfer`` (the controller's load or write, whose first argument is named
        ``indices``) adding what it queued."""
        def wrapper(*args, **kwargs):
            out = transfer(*args, **kwargs)
            if out is not None:
                moved = args[0] if args else kwargs[indices]
                extra = kwargs.get("extra_pools", args[3] if len(args) > 3 else None)
                setattr(counters, tokens, getattr(counters, tokens) + len(moved))
                setattr(counters, states, getattr(counters, states) + _states(extra))
            return out
        return wrapper

    def counting_evict_host(num_tokens, component_type=ComponentType.FULL):
        freed = evict_host(num_tokens, component_type)
        if component_type == ComponentType.MAMBA:
            counters.states_evicted += freed
        else:
            counters.kv_tokens_evicted += freed
        return freed

    controller.load = counted(controller.load, "host_indices", "kv_tokens_loaded", "states_loaded")
    controller.write = counted(controller.write, "device_indices", "kv_tokens_backed_up",
                               "states_backed_up")
    cache.evict_host = counting_evict_host
    return counters


def host_section(counters: HostCounters, spec, host_hits: int, host_flops: float,
                 fetched: int) -> dict:
    kv, state = spec.kv_bytes_per_token, spec.ssm_state_bytes
    return {
        "hit_tokens": host_hits,
        "flops_saved": host_flops,
        **dataclasses.asdict(counters),
        "bytes_loaded": counters.kv_tokens_loaded * kv + counters.states_loaded * state,
        "bytes_backed_up": (counters.kv_tokens_backed_up * kv
                            + counters.states_backed_up * state),
        "storage_hit_tokens": fetched,
    }


def to_replay_requests(trace, limit: Optional[int] = None) -> list:
    """``sim.traces.Trace`` requests as ``ReplayRequest``s (token ids as array('q'))."""
    out = []
    for i, r in enumerate(trace.requests[:limit] if limit else trace.requests):
        ids = array("q")
        ids.frombytes(r.input_tokens.astype("int64").tobytes())
        out.append(ReplayRequest(f"req-{i}", ids, r.output_tokens.tolist()))
    return out


def make_cache(name: str, cfg: ABConfig):
    core, is_marconi = CACHES[name]
    cache_class = None
    if is_marconi:
        from sglang_marconi.sglang_integration.cache import MarconiUnifiedRadixCache

        settings = cfg.settings or MarconiSettings()
        if name == "marconi+":
            settings = dataclasses.replace(settings, alpha=None)
        elif name == "marconi-paper":
            settings = dataclasses.replace(
                settings, max_states_per_request=defaults.PAPER_MAX_STATES_PER_REQUEST,
                alpha=defaults.PAPER_ALPHA if settings.alpha is None else settings.alpha)
        cache_class = functools.partial(MarconiUnifiedRadixCache, settings=settings, spec=cfg.spec)
    if cfg.unified is not None:
        from sglang_marconi.driver.unified_pools import build_unified_cache

        return build_unified_cache(cfg.pools, cfg.unified, cache_class=cache_class, tree_core=core)
    return build_cache(cfg.pools, cache_class=cache_class, tree_core=core)


def open_cache(name: str, cfg: ABConfig, stack: contextlib.ExitStack, build=None):
    """``build(name, cfg)``; with ``cfg.l3`` a temporary L3 file store closed with ``stack``."""
    if cfg.l3:
        store = stack.enter_context(tempfile.TemporaryDirectory(prefix="ab-l3-"))
        cfg = dataclasses.replace(cfg, pools=dataclasses.replace(
            cfg.pools, hicache_storage_dir=store))
    built = (build or make_cache)(name, cfg)
    if cfg.l3:
        stack.callback(built[0].cache_controller._stop_storage_threads)
    return built


def run_one(name: str, requests: list, cfg: ABConfig,
            progress: Optional[Callable] = None, per_request: bool = False) -> dict:
    """Replay ``requests`` through a fresh cache ``name``; returns its column of numbers."""
    with contextlib.ExitStack() as stack:
        cache, _, _ = open_cache(name, cfg, stack)
        result = _run_one(name, cache, requests, cfg, progress, per_request)
        del cache
        gc.collect()
        return result


def _run_one(name, cache, requests, cfg, progress, per_request) -> dict:
    counters = instrument(cache)
    host = instrument_host(cache)
    host_hits = fetched = 0
    host_flops = 0.0
    pauses = GCPauses()
    calls = CallTimer(cache, pauses)
    replayer = Replayer(cache, chunked_prefill_size=cfg.pools.chunked_prefill_size,
                        overlap=cfg.overlap, evict_every_decode_step=cfg.evict_every_decode_step)
    spec = cfg.spec
    hit = inp = lost = 0
    saved = total_flops = 0.0
    peak_kv = peak_mamba = 0
    times, hits, losts = [], [], []
    with pauses:
        t0 = time.perf_counter()
        for i, rr in enumerate(requests):
            gc0 = pauses.total
            try:
                out = replayer.run(rr)
            except RuntimeError as exc:  # a server's scheduler would exit here
                if (oom := sglang_oom(exc)) is None:
                    raise
                raise UserError(f"{name}: {oom} at request {i + 1:,}: the pools "
                                "are too small for this trace: give more memory") from None
            if cfg.l3:
                host_tier.settle(cache)  # later scheduler iterations ack the L3 backups
            # the cache's own time: the collector's pauses during the request are reported
            # apart (gc_*), not as bookkeeping
            times.append(pauses.exclude(out.seconds, gc0))
            skipped = out.hit_len + out.host_hit_len  # device hit + what came from host
            hits.append(skipped)
            losts.append(out.lost_reuse)
            lost += out.lost_reuse
            inp += out.input_len
            hit += skipped
            host_hits += out.host_hit_len
            fetched += out.storage_hit_len
            saved += spec.flops_saved(skipped, 0)
            # the host segment follows the device hit: what it saves beyond it
            host_flops += spec.flops_saved(skipped, out.hit_len) if out.host_hit_len else 0.0
            total_flops += spec.prefill_flops(out.input_len)
            peak_kv = max(peak_kv, out.peak_kv_used)
            peak_mamba = max(peak_mamba, out.peak_mamba_used)
            if progress is not None:
                progress(1)
        wall = time.perf_counter() - t0
    result = {
        "cache": type(cache).__name__,
        "tree_core": type(cache.tree_core).__name__,
        "requests": len(requests),
        "input_tokens": inp,
        "hit_tokens": hit,
        "token_hit_rate": hit / inp if inp else 0.0,
        # KV matched past the deepest usable state (driver.lost_reuse)
        "lost_reuse_tokens": lost,
        "flops_saved": saved,
        "flops_saved_fraction": saved / total_flops if total_flops else 0.0,
        "states_admitted": counters.states_admitted,
        "states_evicted": counters.states_evicted,
        "kv_tokens_evicted": counters.kv_tokens_evicted,
        "states_in_tree": counters.states_admitted - counters.states_evicted,
        "peak_kv_slots_used": peak_kv,
        "peak_state_slots_used": peak_mamba,
        "bookkeeping_ms_per_request": 1000 * statistics.fmean(times) if times else 0.0,
        "bookkeeping_ms_p50": 1000 * quantile(times, 0.50),
        "bookkeeping_ms_p95": 1000 * quantile(times, 0.95),
        "bookkeeping_ms_p99": 1000 * quantile(times, 0.99),
        "bookkeeping_ms_max_request": 1000 * max(times, default=0.0),
        # the longest single cache call (harness.timing.CallTimer)
        "bookkeeping_ms_max": 1000 * calls.max,
        "bookkeeping_call_ms_p99": 1000 * quantile(calls.seconds, 0.99),
        "wall_seconds": wall,
        **pauses.as_dict(),
    }
    if per_request:
        result["hit_tokens_per_request"] = hits
        result["lost_reuse_tokens_per_request"] = losts
    if host is not None:
        result["host"] = host_section(host, spec, host_hits, host_flops, fetched)
    if hasattr(cache, "marconi"):
        result["marconi"] = cache.marconi.stats.as_dict()
    return result


def run_ab(requests: list, cfg: ABConfig, show_progress: bool = True,
           per_request: bool = False) -> dict:
    """All caches of ``cfg`` on the same requests: ``{"caches": {name: column}}``."""
    results = {}
    for name in cfg.caches:
        with tqdm(total=len(requests), desc=f"{name:>12}", unit="req",
                  disable=not show_progress, leave=False) as bar:
            results[name] = run_one(name, requests, cfg, progress=bar.update,
                                    per_request=per_request)
    return {"caches": results}
