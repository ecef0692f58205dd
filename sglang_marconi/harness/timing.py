"""Timing primitives for the bookkeeping measurements: ``quantile`` (nearest rank), ``CallTimer``
(the longest cache call) and ``GCPauses``; a leaf that imports nothing of the package."""
from __future__ import annotations

import gc
import time


def quantile(xs, q: float) -> float:
    """Nearest-rank quantile: element ``int(q * n)`` of the sorted ``xs`` (0.0 for none)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


class GCPauses:
    """The collector's pauses while installed (count, longest, total); ``freeze`` option."""

    def __init__(self, freeze: bool = True):
        self.count = 0
        self.max = 0.0
        self.total = 0.0
        self._start = None
        self._freeze = freeze

    def _callback(self, phase, info) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            pause = time.perf_counter() - self._start
            self._start = None
            self.count += 1
            self.total += pause
            self.max = max(self.max, pause)

    def __enter__(self) -> "GCPauses":
        if self._freeze:
            gc.collect()
            gc.freeze()
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)
        if self._freeze:
            gc.unfreeze()

    def exclude(self, seconds: float, mark: float) -> float:
        """``seconds`` of a span less the pauses since ``mark`` (``total`` at its start)."""
        return max(0.0, seconds - (self.total - mark))

    def as_dict(self) -> dict:
        return {"gc_collections": self.count, "gc_pause_s_max": self.max,
                "gc_pause_s_total": self.total}


class CallTimer:
    """Times each outermost call of the cache methods in ``CALLS``: ``max`` is the longest."""

    CALLS = ("match_prefix", "lock", "unlock", "checkpoint", "evict", "evict_for_alloc",
             "free_kv_row", "on_release")

    def __init__(self, cache, gc_pauses: GCPauses | None = None):
        self.seconds = []
        self._depth = 0
        self._gc = gc_pauses
        for name in self.CALLS:
            if hasattr(cache, name):
                setattr(cache, name, self._wrap(getattr(cache, name)))

    def _wrap(self, inner):
        def timed(*args, **kwargs):
            if self._depth:
                return inner(*args, **kwargs)
            self._depth += 1
            t0 = time.perf_counter()
            gc0 = self._gc.total if self._gc is not None else 0.0
            try:
                return inner(*args, **kwargs)
            finally:
                own = time.perf_counter() - t0
                self.seconds.append(own if self._gc is None else self._gc.exclude(own, gc0))
                self._depth -= 1

        return timed

    @property
    def max(self) -> float:
        return max(self.seconds, default=0.0)
