"""Serving runs: one (cache, load) pair on fresh pools sized by ``driver.sizing``, with caches
from ``harness.ab.make_cache``, so a serving run and an ``ab`` column differ only in the
scheduler around them; and the grid of them."""
from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from tqdm import tqdm

from sglang_marconi.driver.pools import PoolConfig
from sglang_marconi.harness.ab import ABConfig, OwnAccessClock, make_cache, open_cache
from sglang_marconi.serving.arrivals import arrivals_for_load, arrivals_scaled, decode_batch
from sglang_marconi.serving.cluster import run_cluster
from sglang_marconi.serving.metrics import summarize, ttfts
from sglang_marconi.serving.scheduler import SchedulerConfig, ServerCrash, ServingScheduler


@dataclass
class ServeSetup:
    spec: object                      # HybridModelSpec
    time_model: object                # gpu_model.GpuTimeModel
    pools: PoolConfig
    sched: SchedulerConfig
    settings: object = None           # MarconiSettings (None: defaults)
    timestamps: list = field(default_factory=list)  # the trace's arrival seconds
    seed: int = 0
    unified: object = None            # driver.unified_pools.UnifiedConfig (--memory unified)
    poisson: bool = False             # --arrivals poisson: seeded Poisson, the trace's order
    l3: bool = False                  # host tier: an L3 file store per run (temporary)


def pool_config(sizes, max_context_len: int, chunked_prefill_size: int = 8192,
                mamba_track_interval: int = 256, overlap: bool = True) -> PoolConfig:
    """The CPU pools for SGLang's ``PoolSizes`` (``overlap``: the track buffer's slots)."""
    return PoolConfig(kv_tokens=sizes.kv_tokens, mamba_slots=sizes.mamba_slots,
                      page_size=sizes.page_size, max_context_len=max_context_len,
                      max_running_requests=sizes.max_running_requests,
                      chunked_prefill_size=chunked_prefill_size,
                      mamba_track_interval=mamba_track_interval, overlap_schedule=overlap)


def arrivals(setup: ServeSetup, requests, load: Optional[float], rate_scale: Optional[float]):
    if rate_scale is not None:
        return arrivals_scaled(setup.timestamps, rate_scale)
    return arrivals_for_load(setup.timestamps, requests, setup.time_model, load, setup.seed,
                             offered_batch(setup, requests), setup.pools.chunked_prefill_size,
                             poisson=setup.poisson)


def offered_batch(setup: ServeSetup, requests) -> int:
    """The decode batch ``--load`` counts with (``arrivals.decode_batch``)."""
    return decode_batch(requests, setup.sched.max_running_requests, setup.pools.kv_tokens)


def run_serving(name: str, requests, setup: ServeSetup, load=None, rate_scale=None,
                progress: Optional[Callable] = None, after_step=None, on_launch=None):
    """One run: (summary dict, the scheduler); ``after_step``/``on_launch``: its hooks."""
    cfg = ABConfig(pools=setup.pools, spec=setup.spec, settings=setup.settings,
                   unified=setup.unified, l3=setup.l3)
    with contextlib.ExitStack() as stack:  # the L3 store lives for the run
        cache, _, _ = open_cache(name, cfg, stack, build=make_cache)
        times = arrivals(setup, requests, load, rate_scale)
        sched = ServingScheduler(cache, setup.time_model, setup.sched, requests, times,
                                 after_step=after_step, on_launch=on_launch)
        t0 = time.perf_counter()
        sched.run(progress)
        wall = time.perf_counter() - t0
    return run_summary(name, sched, setup, requests, load, rate_scale, wall), sched


def run_summary(name, sched, setup: ServeSetup, requests, load, rate_scale, wall) -> dict:
    """``metrics.summarize`` of one run, with its rate scale or decode batch."""
    summary = summarize(sched, setup.spec, name, load if rate_scale is None else None, wall)
    if rate_scale is not None:
        summary["rate_scale"] = rate_scale
    else:
        summary["offered_decode_batch"] = offered_batch(setup, requests)
    return summary


def run_interleaved(names, requests, setup: ServeSetup, load=None, rate_scale=None,
                    progress: Optional[Callable] = None) -> list:
    """Every cache of ``names`` at one load, their schedulers stepped in turn in one process:
    [(summary, scheduler)], each run ``run_serving``'s, so that a shared machine's speed
    drift hits every cache's measured time alike."""
    cfg = ABConfig(pools=setup.pools, spec=setup.spec, settings=setup.settings,
                   unified=setup.unified, l3=setup.l3)
    times = arrivals(setup, requests, load, rate_scale)
    with contextlib.ExitStack() as stack:
        scheds, clocks = [], []
        for name in names:
            with OwnAccessClock() as own:
                cache, _, _ = open_cache(name, cfg, stack, build=make_cache)
                scheds.append(ServingScheduler(cache, setup.time_model, setup.sched,
                                               requests, times))
            clocks.append(own)
        for sched in scheds:
            stack.enter_context(sched.gc)
        live = list(range(len(scheds)))
        reported = [0] * len(scheds)
        t0 = time.perf_counter()
        turn = 0
        while live:
            k0 = turn % len(live)
            for k in live[k0:] + live[:k0]:
                sched = scheds[k]
                with clocks[k]:
                    if sched.crash is not None:  # as ``ServingScheduler.run``: stopped there
                        live.remove(k)
                        continue
                    if sched.done():
                        sched.finish()
                        live.remove(k)
                        continue
                    try:
                        sched.step()
                    except ServerCrash:
                        continue
                if progress is not None and sched.completed != reported[k]:
                    progress(sched.completed - reported[k])
                    reported[k] = sched.completed
            turn += 1
        wall = time.perf_counter() - t0
        OwnAccessClock.settle(clocks)
    out = []
    for name, sched in zip(names, scheds):
        summary = run_summary(name, sched, setup, requests, load, rate_scale, wall)
        summary["interleaved"] = len(names)
        out.append((summary, sched))
    return out


def run_grid(requests, setup: ServeSetup, caches, loads, rate_scale=None,
             show_progress: bool = True, interleave: bool = False) -> dict:
    """Every cache at every load (or ``rate_scale``); ``interleave``: side by side."""
    runs, curves = [], {}
    points = [(None, rate_scale)] if rate_scale is not None else [(x, None) for x in loads]
    for load, scale in points:
        at = load if scale is None else f"x{scale:g}"  # the point in labels: "cache@0.8"
        if interleave:
            label = f"{len(caches)} caches@{at}"
            with tqdm(total=len(requests) * len(caches), desc=f"{label:>16}", unit="req",
                      disable=not show_progress, leave=False) as bar:
                pairs = run_interleaved(caches, requests, setup, load, scale, progress=bar.update)
            for name, (summary, sched) in zip(caches, pairs):
                runs.append(summary)
                curves[f"{name}@{at}"] = ttfts(sched)
            pairs = sched = None
            gc.collect()
            continue
        for name in caches:
            label = f"{name}@{at}"
            with tqdm(total=len(requests), desc=f"{label:>16}", unit="req",
                      disable=not show_progress, leave=False) as bar:
                summary, sched = run_serving(name, requests, setup, load, scale,
                                             progress=bar.update)
            runs.append(summary)
            curves[label] = ttfts(sched)
            del sched
            gc.collect()
    return {"runs": runs, "ttft": curves}


def run_cluster_grid(requests, setup: ServeSetup, replicas: int, routers, caches, loads,
                     rate_scale=None, router_options=None, show_progress: bool = True) -> list:
    """Every router x cache at every load (or ``rate_scale``) on ``replicas`` replicas."""
    runs = []
    points = [(None, rate_scale)] if rate_scale is not None else [(x, None) for x in loads]
    for load, scale in points:
        for router in routers:
            options = (router_options or {}).get(router)
            for name in caches:
                label = f"{router}/{name}@{load if scale is None else f'x{scale:g}'}"
                with tqdm(total=len(requests), desc=f"{label:>24}", unit="req",
                          disable=not show_progress, leave=False) as bar:
                    summary, cluster = run_cluster(name, router, requests, setup, replicas,
                                                   load, scale, progress=bar.update,
                                                   router_options=options)
                runs.append(summary)
                del cluster
                gc.collect()
    return runs
