"""Timing primitives for the cache bookkeeping measurements: ``quantile``, the nearest-rank
quantile of per-request times (the A/B's columns in ``harness.ab`` and the benchmark in
``reports.overhead``), and ``EvictTimer``, which wraps a cache's ``_evict`` to count and
time its eviction calls. A leaf: it imports nothing of the package, so ``harness.ab`` and
the benchmark can both use it."""
from __future__ import annotations

import time


def quantile(xs, q: float) -> float:
    """Nearest-rank quantile: the element at rank ``int(q * n)`` of the sorted ``xs`` (0.0
    for none)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


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


class CallTimer:
    """Wraps the cache methods the scheduler calls (``CALLS``) and keeps the wall time of
    each outermost call (a call made inside another is part of it): ``max`` is the longest
    single cache call, alpha tuning included (it runs inside ``on_release``)."""

    CALLS = ("match_prefix", "lock", "unlock", "checkpoint", "evict", "evict_for_alloc",
             "free_kv_row", "on_release")

    def __init__(self, cache):
        self.seconds = []
        self._depth = 0
        for name in self.CALLS:
            if hasattr(cache, name):
                setattr(cache, name, self._wrap(getattr(cache, name)))

    def _wrap(self, inner):
        def timed(*args, **kwargs):
            if self._depth:
                return inner(*args, **kwargs)
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds.append(time.perf_counter() - t0)
                self._depth -= 1

        return timed

    @property
    def max(self) -> float:
        return max(self.seconds, default=0.0)
