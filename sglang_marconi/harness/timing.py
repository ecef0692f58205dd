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
