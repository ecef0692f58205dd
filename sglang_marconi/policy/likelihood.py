"""Reuse likelihood: how likely a cached node is to be hit again (``marconi+``).

Two online estimators, both from what the cache itself observes:

- ``ReuseWeight``: a per-node weight that multiplies the node's FLOP efficiency, so victims
  are ranked by expected FLOPs saved per byte. weight = 1 + decayed hit count + a bonus if
  the node ever was a branch point (had two or more children). The hit count decays with a
  half-life in requests (``inf``: plain counts). A *chain* state (exactly one child, never a
  branch point: a conversation turn the next turn has already extended) gets
  ``chain_weight`` (0): only a regenerated or edited turn would hit it again. Counting hits
  on chain states put marconi+ below LRU on the chat generator, weighting them 0 above it
  (the ablation in docs/beyond.md measures ``chain=1``).
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

from sglang_marconi.policy import defaults


class ReuseWeight:
    def __init__(self, branch_bonus: float = defaults.BRANCH_BONUS, half_life: float = math.inf,
                 chain_weight: float = defaults.CHAIN_WEIGHT):
        if branch_bonus < 0 or half_life <= 0 or chain_weight < 0:
            raise ValueError("branch_bonus and chain_weight must be >= 0, half_life > 0")
        self.branch_bonus = branch_bonus
        self.half_life = half_life
        self.chain_weight = chain_weight

    def record_hit(self, node, now: float) -> None:
        """A hit ended at ``node`` (its state was consumed) at time ``now``."""
        if self.half_life != math.inf and node.hit_score:
            node.hit_score *= 2.0 ** (-(now - node.last_hit) / self.half_life)
        node.hit_score += 1.0
        node.last_hit = now

    def __call__(self, node) -> float:
        branch = node.max_children >= 2
        if len(node.children) == 1 and not branch:
            return self.chain_weight
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
