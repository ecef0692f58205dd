"""Choosing alpha (the weight of FLOP efficiency against recency) from the live trace.

The paper's bootstrap: record requests until the first eviction; once k times that many
requests have been seen (k = ``multiplier``, 5 by default, 15 for short-turn chat), replay the
recorded window on fresh copies of the cache for a grid of alphas (0 to 2 step 0.1) and keep
the alpha that saves the most prefill FLOPs (ties: the smallest alpha, i.e. closest to LRU).
It is fitted once. The replay itself is supplied by the caller (``replay(window, alpha) ->
FLOPs saved``), so the simulator and the SGLang cache share this tuner.

Sliced tuning (a live server). Replaying the whole window for every alpha at once blocks
the caller for seconds. Given ``steps(window, alpha)`` (an iterator yielding ``(FLOPs saved,
cost)`` per replayed request) and a ``slice_cost`` budget, the tuner instead does one slice
per recorded request after the window completes: it replays requests, alpha after alpha,
until the costs it replayed in this slice reach ``slice_cost`` (at least one request). The
slices' sizes depend only on the requests (their token counts), never on wall time, so the
new alpha takes effect at the same request index on every tensor-parallel rank.
"""
from __future__ import annotations

from sglang_marconi.policy import defaults
DEFAULT_GRID = defaults.ALPHA_GRID


class AlphaTuner:
    def __init__(self, replay, grid=DEFAULT_GRID, multiplier: float = defaults.BOOTSTRAP_MULTIPLIER,
                 initial: float = 0.0, steps=None, slice_cost: float = 0.0):
        if multiplier <= 0:
            raise ValueError(f"bootstrap multiplier must be positive, got {multiplier}")
        if steps is not None and slice_cost <= 0:
            raise ValueError(f"sliced tuning needs a positive slice cost, got {slice_cost}")
        self.replay = replay
        self.steps = steps  # steps(window, alpha) -> iterator of (saved, cost): sliced tuning
        self.slice_cost = slice_cost
        self.grid = tuple(grid)
        self.multiplier = multiplier
        self.alpha = float(initial)
        self.window: list = []
        self.first_eviction_at: int | None = None  # requests seen at the first eviction
        self.tuned = False
        self.scores: dict[float, float] = {}
        self.slices = 0          # slices run so far (sliced tuning)
        self.tuned_at: int | None = None  # requests observed when the alpha took effect
        self._seen = 0
        self._pending: list | None = None  # alphas still to replay (sliced tuning)
        self._current = None               # (alpha, iterator) being replayed

    @property
    def recording(self) -> bool:
        return not self.tuned

    @property
    def tuning(self) -> bool:
        """The window is complete and the sliced replay is under way."""
        return self._pending is not None

    @property
    def window_target(self) -> int | None:
        if self.first_eviction_at is None:
            return None
        return max(1, int(round(self.multiplier * self.first_eviction_at)))

    def observe_eviction(self) -> None:
        if self.first_eviction_at is None:
            self.first_eviction_at = max(1, len(self.window))

    def observe_request(self, request) -> float | None:
        """Record a finished request; returns the new alpha when the tuning completes with
        this request (at once, or after the last slice when sliced), else None."""
        if self.tuned:
            return None
        self._seen += 1
        if self.tuning:
            return self._slice()
        self.window.append(request)
        target = self.window_target
        if target is None or len(self.window) < target:
            return None
        if self.steps is None:
            return self.tune()
        self._pending = list(self.grid)
        self.scores = {a: 0.0 for a in self.grid}
        return self._slice()

    def _slice(self) -> float | None:
        """Replay requests until this slice's cost reaches ``slice_cost`` (at least one)."""
        self.slices += 1
        spent = 0.0
        while spent < self.slice_cost:
            if self._current is None:
                if not self._pending:
                    return self._finish()
                alpha = self._pending.pop(0)
                self._current = (alpha, iter(self.steps(self.window, alpha)))
            alpha, it = self._current
            step = next(it, None)
            if step is None:
                self._current = None
                continue
            saved, cost = step
            self.scores[alpha] += float(saved)
            spent += max(1.0, float(cost))
        if self._current is None and not self._pending:
            return self._finish()
        return None

    def _finish(self) -> float:
        self._pending = None
        return self._choose()

    def tune(self) -> float:
        self.scores = {a: float(self.replay(self.window, a)) for a in self.grid}
        return self._choose()

    def _choose(self) -> float:
        best = max(self.scores.values())
        self.alpha = min(a for a, s in self.scores.items() if s == best)
        self.tuned = True
        self.tuned_at = self._seen
        self.window = []  # the recording is no longer needed
        return self.alpha

