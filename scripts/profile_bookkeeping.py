"""Profile one cache's bookkeeping in a serving run: which cache calls and which functions
under them take the time (issue 19's overhead item).

Runs one ``serve-sim`` run (one cache, one load; every serve-sim flag applies) with
``cProfile`` switched on only inside the cache's entry points (the calls serve-sim's
``CacheTimer`` charges to the clock: ``serving.clock.ENTRY_POINTS``), so the profile is the
cache's own time, not the scheduler's or the replay's. Prints the calls per entry point
and the functions with the most own and cumulative time under them; ``--stats FILE``
keeps the raw profile (``python -m pstats FILE``). The profiler slows every call: read the
shares, not the seconds. A benchmark, not a test.

``--longest N`` profiles each scheduler step apart and prints, for the N steps with the
most cache time (the step's ``cache_s``, GC apart, as ``bookkeeping_ms_per_step_max``
reads it), what the step was (kind, batch, requests admitted to their first prefill), its calls
per entry point and the functions with the most cumulative time in those N steps together.

Usage: .venv/bin/python scripts/profile_bookkeeping.py --trace T --model M --cache marconi+
       [--load 0.8] [--memory unified] [--top 25] [--stats out.prof] [--longest 10]
       [other serve-sim flags]
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import heapq
import io
import pstats
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_marconi.cli import serve_sim  # noqa: E402
from sglang_marconi.cli.common import run_with_sglang  # noqa: E402
from sglang_marconi.serving.clock import ENTRY_POINTS  # noqa: E402


class EntryProfiler:
    """cProfile enabled only inside the outermost call of a cache's entry points."""

    def __init__(self, cache):
        self.profile = cProfile.Profile()
        self.calls, self.seconds = Counter(), Counter()
        self.step_calls, self.step_seconds = Counter(), Counter()  # since new_step()
        self._depth = 0
        for name in ENTRY_POINTS:
            if hasattr(cache, name):
                setattr(cache, name, self._wrap(name, getattr(cache, name)))

    def _wrap(self, name, fn):
        @functools.wraps(fn)
        def profiled(*args, **kwargs):
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            t0 = time.perf_counter()
            self.profile.enable()
            try:
                return fn(*args, **kwargs)
            finally:
                self.profile.disable()
                self._depth -= 1
                dt = time.perf_counter() - t0
                self.calls[name] += 1
                self.seconds[name] += dt
                self.step_calls[name] += 1
                self.step_seconds[name] += dt
        return profiled

    def new_step(self):
        """Start a fresh profile for the next step; returns the finished step's
        (profile, calls, seconds)."""
        out = (self.profile, self.step_calls, self.step_seconds)
        self.profile = cProfile.Profile()
        self.step_calls, self.step_seconds = Counter(), Counter()
        return out


class LongestSteps:
    """Per-step profiles: keeps the ``n`` steps with the most cache time and adds every
    step's profile into one total (``after_step`` of the serving scheduler)."""

    def __init__(self, prof: EntryProfiler, n: int):
        self.prof, self.n = prof, n
        self.kept: list = []  # heap of (cache_s, index, description, profile, calls, secs)
        self.total = None
        self.admitted = 0

    def __call__(self, sched) -> None:
        profile, calls, secs = self.prof.new_step()
        step = sched.steps[-1]
        if calls:
            stats = pstats.Stats(profile)
            if self.total is None:
                self.total = stats
            else:
                self.total.add(stats)
        admitted = sum(1 for r in sched.records.values() if r.hit_len is not None)
        new, self.admitted = admitted - self.admitted, admitted
        desc = (f"step {len(sched.steps) - 1} {step.kind} batch {step.batch}, "
                f"{new} request(s) admitted (first prefill)")
        item = (step.cache_s, len(sched.steps), desc, profile, calls, secs)
        if len(self.kept) < self.n:
            heapq.heappush(self.kept, item)
        elif item[0] > self.kept[0][0]:
            heapq.heapreplace(self.kept, item)

    def report(self, top: int) -> None:
        longest = sorted(self.kept, reverse=True)
        print(f"\n== the {len(longest)} steps with the most cache time (cache_s, GC apart) ==")
        together = None
        for cache_s, _, desc, profile, calls, secs in longest:
            per = ", ".join(f"{name} {calls[name]}x {1e3 * s:.1f} ms"
                            for name, s in secs.most_common())
            print(f"  {1e3 * cache_s:7.1f} ms  {desc}: {per}")
            stats = pstats.Stats(profile)
            together = stats if together is None else together.add(stats)
        if together is not None:
            _print_stats(together, "cumulative", top,
                         f"the {len(longest)} longest steps together")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    serve_sim.add_arguments(ap)
    ap.add_argument("--cache", default="marconi+", help="one cache name (serve-sim's)")
    ap.add_argument("--top", type=int, default=25, help="functions listed per ranking")
    ap.add_argument("--stats", help="write the raw profile here")
    ap.add_argument("--longest", type=int, default=0, metavar="N",
                    help="profile each step apart; report the N steps with the most cache time")
    args = ap.parse_args(argv)
    args.caches = args.cache
    return run_with_sglang(lambda a: _run(a), args)


def _run(args) -> int:
    from sglang_marconi.harness.ab import ABConfig, make_cache
    from sglang_marconi.serving.run import arrivals
    from sglang_marconi.serving.scheduler import ServingScheduler

    load = serve_sim._loads(args.load)[0]
    requests, setup, sizes = serve_sim.build_setup(args)
    cache, _, _ = make_cache(args.cache, ABConfig(pools=setup.pools, spec=setup.spec,
                                                  settings=setup.settings,
                                                  unified=setup.unified))
    times = arrivals(setup, requests, load, args.rate_scale)
    steps = None
    sched = ServingScheduler(cache, setup.time_model, setup.sched, requests, times,
                             after_step=lambda s: steps(s) if steps is not None else None)
    prof = EntryProfiler(cache)  # outermost: wraps CacheTimer's wrappers
    if args.longest > 0:
        steps = LongestSteps(prof, args.longest)
    t0 = time.perf_counter()
    sched.run()
    wall = time.perf_counter() - t0
    inside = sum(prof.seconds.values())
    print(f"{args.cache} on {len(requests)} requests, {sizes.describe()}, load {load}: "
          f"{wall:.0f} s wall, {inside:.1f} s inside the cache (profiled)")
    for name, s in prof.seconds.most_common():
        print(f"  {name:>14}: {prof.calls[name]:>8,} calls {s:8.2f} s "
              f"{s / inside:6.1%}  {1e3 * s / prof.calls[name]:.3f} ms/call")
    stats = steps.total if steps is not None else pstats.Stats(prof.profile)
    if stats is None:
        return 0
    if args.stats:
        stats.dump_stats(args.stats)
    for key in ("tottime", "cumulative"):
        _print_stats(stats, key, args.top, f"by {key}")
    if steps is not None:
        steps.report(args.top)
    return 0


def _print_stats(stats: pstats.Stats, key: str, top: int, title: str) -> None:
    out = io.StringIO()
    stats.stream = out
    stats.sort_stats(key).print_stats(top)
    text = out.getvalue()
    print(f"\n-- {title} --")
    print(text[text.index("   ncalls"):].replace(str(ROOT) + "/", "").rstrip())


if __name__ == "__main__":
    raise SystemExit(main())
