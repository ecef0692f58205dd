"""Alpha that follows the traffic (``marconi:alpha=online``): shadow caches, one per alpha; every
``period`` requests move to the best one if it beats the current by ``hysteresis``."""
from __future__ import annotations

from sglang_marconi.policy import defaults
from collections import deque

DEFAULT_ALPHAS = defaults.ONLINE_ALPHAS
_HASH_MULT = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


def in_sample(first_token: int, rate: float) -> bool:
    """Deterministic spatial sampling by the first token (Fibonacci hashing)."""
    if rate >= 1.0:
        return True
    return ((int(first_token) * _HASH_MULT) & _MASK) < rate * (1 << 64)


class OnlineAlpha:
    def __init__(self, make_shadow, alphas=DEFAULT_ALPHAS, window: int = defaults.ONLINE_WINDOW,
                 period: int = defaults.ONLINE_PERIOD,
                 hysteresis: float = defaults.ONLINE_HYSTERESIS,
                 sample: float = defaults.ONLINE_SAMPLE, initial: float = 0.0):
        if not alphas or window <= 0 or period <= 0 or not 0 < sample <= 1:
            raise ValueError("online alpha: need alphas, window > 0, period > 0, 0 < sample <= 1")
        self.alphas = tuple(float(a) for a in alphas)
        self.shadows = {a: make_shadow(a, sample) for a in self.alphas}
        self.window, self.period, self.hysteresis, self.sample = window, period, hysteresis, sample
        self.alpha = float(initial) if float(initial) in self.shadows else self.alphas[0]
        self._recent = {a: deque() for a in self.alphas}
        self._sums = {a: 0.0 for a in self.alphas}
        self.seen = 0
        self.history: list[tuple[int, float]] = [(0, self.alpha)]  # (request, alpha) switches

    def observe(self, input_tokens, full_tokens) -> float | None:
        """Feed one finished request; returns the new alpha when the real cache should move."""
        self.seen += 1
        sampled = len(input_tokens) > 0 and in_sample(input_tokens[0], self.sample)
        for a, shadow in self.shadows.items():
            saved = 0.0
            if sampled:
                before = shadow.stats.flops_saved
                shadow.process(input_tokens, full_tokens)
                saved = shadow.stats.flops_saved - before
            q = self._recent[a]
            q.append(saved)
            self._sums[a] += saved
            if len(q) > self.window:
                self._sums[a] -= q.popleft()
        if self.seen % self.period:
            return None
        best = max(self.alphas, key=lambda a: (self._sums[a], -a))
        current = self._sums[self.alpha]
        if best != self.alpha and self._sums[best] > current * (1 + self.hysteresis):
            self.alpha = best
            self.history.append((self.seen, best))
            return best
        return None

