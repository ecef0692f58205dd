"""Reuse likelihood: how likely a cached node is to be hit again (``marconi+``).

Two online estimators, both from what the cache itself observes:

- ``ReuseWeight``: a per-node weight that multiplies the node's FLOP efficiency, so victims
  are ranked by expected FLOPs saved per byte. weight = 1 + decayed hit count + a bonus if
  the node ever was a branch point (had two or more children). The hit count decays with a
  half-life in requests (``inf``: plain counts). A *chain* state (exactly one child, never a
  branch point) is hit only by a request that leaves its path between it and its child's
  state at a point no earlier request branched at. How often that happens is a property of
  the traffic, learned by ``ChainUsefulness`` on the ghost index: on chat traffic a chain
  state is a conversation turn the next turn has already extended (only a regenerated or
  edited turn would hit it: the rate falls towards 0); on document traffic that shares
  partial prefixes it is a chunk-boundary state SGLang took on a shared document, and later
  requests leave such paths at fresh points all the time. A fixed ``chain_weight``
  replaces the learned one.
- ``ChainUsefulness``: among requests that share a prefix with a remembered sequence, the
  Beta(1, 1)-smoothed fraction that leave it in the middle of an edge of the ghost index (a
  point no earlier request branched at). The chain weight is that rate on a power-of-two
  scale (1, 1/2, ... 1/64, then 0), moved only when the rate leaves the band
  [w / 2^0.75, w * 2^0.75] around the current weight w (a quarter of a step past the
  rounding edge): victim keys hold the weight, and a move re-keys the chain
  states (``ReuseWeight.observe_request`` says when), which then happens a few times per
  run, not per request.
- ``EndStateUsefulness``: how often the state after a request's last token is later reused
  (a later request extends the whole cached sequence). Measured on the ghost index, so it
  is learned whether or not the cache kept those states: each request with an end state
  of its own (beyond its hit) counts one end, marked in the ghost index where that state
  is or would have been (with one state per request, also when the branch point took the
  slot), and each request that reaches a marked end counts one reuse, both before the
  request's own end state is admitted or not. ``marconi+`` admits end-of-request
  states only while this rate is at least ``threshold``; on traffic whose outputs are never
  part of a later input (the Mooncake traces) it falls to ~0 and the end state, and the KV
  of the request's unique tail, are not kept.
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
