"""Profile one cache's bookkeeping in a serving run: which cache calls and which functions
under them take the time (issue 19's overhead item).

Runs one ``serve-sim`` run (one cache, one load; every serve-sim flag applies) with
``cProfile`` switched on only inside the cache's entry points (the calls serve-sim's
``CacheTimer`` charges to the clock: ``serving.clock.ENTRY_POINTS``), so the profile is the
cache's own time, not the scheduler's or the replay's. Prints the calls per entry point
and the functions with the most own and cumulative time under them; ``--stats FILE``
keeps the raw profile (``python -m pstats FILE``). The profiler slows every call: read the
shares, not the seconds. A benchmark, not a test.

Usage: .venv/bin/python scripts/profile_bookkeeping.py --trace T --model M --cache marconi+
       [--load 0.8] [--memory unified] [--top 25] [--stats out.prof] [other serve-sim flags]
"""
from __future__ import annotations

import argparse
import cProfile
import functools
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
                self.calls[name] += 1
                self.seconds[name] += time.perf_counter() - t0
        return profiled


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    serve_sim.add_arguments(ap)
    ap.add_argument("--cache", default="marconi+", help="one cache name (serve-sim's)")
    ap.add_argument("--top", type=int, default=25, help="functions listed per ranking")
    ap.add_argument("--stats", help="write the raw profile here")
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
    sched = ServingScheduler(cache, setup.time_model, setup.sched, requests, times)
    prof = EntryProfiler(cache)  # outermost: wraps CacheTimer's wrappers
    t0 = time.perf_counter()
    sched.run()
    wall = time.perf_counter() - t0
    inside = sum(prof.seconds.values())
    print(f"{args.cache} on {len(requests)} requests, {sizes.describe()}, load {load}: "
          f"{wall:.0f} s wall, {inside:.1f} s inside the cache (profiled)")
    for name, s in prof.seconds.most_common():
        print(f"  {name:>14}: {prof.calls[name]:>8,} calls {s:8.2f} s "
              f"{s / inside:6.1%}  {1e3 * s / prof.calls[name]:.3f} ms/call")
    stats = pstats.Stats(prof.profile)
    if args.stats:
        stats.dump_stats(args.stats)
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(prof.profile, stream=out).sort_stats(key).print_stats(args.top)
        text = out.getvalue()
        print(f"\n-- by {key} --")
        print(text[text.index("   ncalls"):].replace(str(ROOT) + "/", "").rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
