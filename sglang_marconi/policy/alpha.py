"""The paper's bootstrap choice of alpha: after ``multiplier`` times the requests before the
first eviction, replay that window for alphas 0 to 2 and keep the best (ties: the smallest)."""
from __future__ import annotations

from sglang_marconi.policy import defaults
DEFAULT_GRID = defaults.ALPHA_GRID


class AlphaTuner:
    def __init__(self, replay, grid=DEFAULT_GRID,
                 multiplier: float = defaults.BOOTSTRAP_MULTIPLIER):
        if multiplier <= 0:
            raise ValueError(f"bootstrap multiplier must be positive, got {multiplier}")
        self.replay = replay
        self.grid = tuple(grid)
        self.multiplier = multiplier
        self.alpha = 0.0
        self.window: list = []
        self.first_eviction_at: int | None = None  # requests seen at the first eviction
        self.tuned = False
        self.scores: dict[float, float] = {}

    @property
    def recording(self) -> bool:
        return not self.tuned

    @property
    def window_target(self) -> int | None:
        if self.first_eviction_at is None:
            return None
        return max(1, int(round(self.multiplier * self.first_eviction_at)))

    def observe_eviction(self) -> None:
        if self.first_eviction_at is None:
            self.first_eviction_at = max(1, len(self.window))

    def observe_request(self, request) -> float | None:
        """Record a finished request; the new alpha when tuning completes, else None."""
        if self.tuned:
            return None
        self.window.append(request)
        target = self.window_target
        if target is None or len(self.window) < target:
            return None
        return self.tune()

    def tune(self) -> float:
        self.scores = {a: float(self.replay(self.window, a)) for a in self.grid}
        best = max(self.scores.values())
        self.alpha = min(a for a, s in self.scores.items() if s == best)
        self.tuned = True
        self.window = []  # the recording is no longer needed
        return self.alpha
