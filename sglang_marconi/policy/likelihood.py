"""Reuse likelihood: how likely a cached node is to be hit again (the reuse-weighted ranking).

- ``ReuseWeight``: weight = 1 + decayed hit count + a bonus once the node was a branch point;
  a chain state (one child, never a branch) weighs ``chain_weight``, learned by
  ``ChainUsefulness`` on the ghost index unless fixed.
- ``ChainUsefulness``: the Beta(1, 1)-smoothed share of requests reusing a remembered prefix
  that leave it mid-edge, put on a power-of-two scale that moves only past a band (so chain
  states are re-keyed a few times a run).
- ``EndStateUsefulness``: the rate at which end-of-request positions are reached again,
  measured on the ghost index; end states are admitted while it is at least ``threshold``.
"""
from __future__ import annotations

import math

from typing import Optional

from sglang_marconi.policy import defaults


class ChainUsefulness:
    """How often a request that reuses a remembered prefix leaves it at a fresh point."""

    def __init__(self):
        self.reusing = 0
        self.fresh = 0

    def observe_request(self, ghost) -> None:
        """A finished request's ghost answer (``ghost.GhostAnswer``), counted once."""
        if ghost is not None and ghost.reused:
            self.reusing += 1
            self.fresh += bool(ghost.fresh)

    @property
    def rate(self) -> float:
        return (self.fresh + 1) / (self.reusing + 2)


def weight_level(rate: float) -> float:
    """``rate`` on the chain weight's scale: the nearest power of two in [1/64, 1], 0 below
    1/128."""
    if rate < CHAIN_LEVEL_FLOOR:
        return 0.0
    return 2.0 ** max(-6, min(0, round(math.log2(rate))))


CHAIN_LEVEL_FLOOR = 2.0 ** -7
CHAIN_BAND = 2.0 ** 0.75  # the weight moves when the rate leaves [w / band, w * band]


class ReuseWeight:
    """``chain_weight`` None (the default): learned by ``ChainUsefulness`` from the
    requests ``observe_request`` is given; a number: fixed."""

    def __init__(self, branch_bonus: float = defaults.BRANCH_BONUS, half_life: float = math.inf,
                 chain_weight: Optional[float] = defaults.CHAIN_WEIGHT):
        if branch_bonus < 0 or half_life <= 0 or (chain_weight is not None and chain_weight < 0):
            raise ValueError("branch_bonus and chain_weight must be >= 0, half_life > 0")
        self.branch_bonus = branch_bonus
        self.half_life = half_life
        self.chains = ChainUsefulness() if chain_weight is None else None
        self.chain_weight = (chain_weight if self.chains is None
                             else weight_level(self.chains.rate))

    def observe_request(self, ghost) -> bool:
        """A finished request's ghost answer (None without a ghost index). True when the
        learned chain weight moved: the caller re-keys the chain states it ranks."""
        if self.chains is None:
            return False
        self.chains.observe_request(ghost)
        rate, w = self.chains.rate, self.chain_weight
        if w:
            outside = rate > w * CHAIN_BAND or rate < w / CHAIN_BAND
        else:
            outside = rate >= CHAIN_LEVEL_FLOOR * CHAIN_BAND / 2  # a quarter step past 0's edge
        new = weight_level(rate)
        if not outside or new == w:
            return False
        self.chain_weight = new
        return True

    @staticmethod
    def is_chain(node) -> bool:
        """One child, never a branch point: weighed ``chain_weight``."""
        return len(node.children) == 1 and node.max_children < 2

    def record_hit(self, node, now: float) -> None:
        """A hit ended at ``node`` (its state was consumed) at time ``now``."""
        if self.half_life != math.inf and node.hit_score:
            node.hit_score *= 2.0 ** (-(now - node.last_hit) / self.half_life)
        node.hit_score += 1.0
        node.last_hit = now

    def __call__(self, node) -> float:
        if self.is_chain(node):
            return self.chain_weight
        branch = node.max_children >= 2
        return 1.0 + node.hit_score + (self.branch_bonus if branch else 0.0)


class EndStateUsefulness:
    """Beta(1, 1)-smoothed rate at which end-of-request positions are reached again."""

    def __init__(self, threshold: float = defaults.END_THRESHOLD):
        self.threshold = threshold
        self.ends = 0
        self.reused = 0

    def observe_request(self, reaches_end: bool, has_end: bool) -> None:
        """A finished request, counted before its own end state is admitted or not: it
        reached a remembered end (one reuse) and / or has an end state of its own beyond
        its hit (one end). The simulator and the SGLang cache both count here."""
        self.reused += bool(reaches_end)
        self.ends += bool(has_end)

    @property
    def rate(self) -> float:
        return (self.reused + 1) / (self.ends + 2)

    def admit(self) -> bool:
        return self.rate >= self.threshold
