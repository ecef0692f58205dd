"""The rankings a Marconi cache evicts by, behind one interface.

- ``ReuseWeightedRanking`` (``--cache-policy marconi``): a victim's key is its FLOPs saved
  per byte times its reuse weight (``likelihood.ReuseWeight``: hits, branch points, the
  learned chain weight), aged by GDSF in the victim queue; a hit re-keys the node, a lost
  state forgets its hits.
- ``AlphaRanking`` (``--marconi-alpha A``, the paper's): min-max normalised recency plus
  alpha times FLOP efficiency; every node weighs 1 and hits change nothing but recency.

- ``DecayRanking`` (``MarconiSettings(decay=True)``, a candidate under study): the same
  weights, discounted by exp(-age / tau) with tau learned from the hits' reuse distances,
  instead of GDSF aging.

Each answers what the cache asks: the victim queue's mode and alpha, a node's weight, what
a hit and a lost state do to it, how host victims rank. The reuse weight's counters live on
the tree node (``hit_score``, ``last_hit``, ``max_children``).
"""
from __future__ import annotations

import math
from typing import Optional

from sglang_marconi.policy.likelihood import ReuseWeight


class AlphaRanking:
    """The paper's rule: utility = norm(recency) + alpha * norm(FLOP efficiency)."""

    queue_mode = "marconi"
    name = "alpha"
    weighs_nodes = False  # every node weighs 1: keys need no weight
    reuse: Optional[ReuseWeight] = None

    def __init__(self, alpha: float):
        self.alpha = float(alpha)

    def weight(self, node) -> float:
        return 1.0

    @property
    def weight_fn(self):
        """The weight ``ranking.ranked_efficiency`` multiplies by (None: none)."""
        return None

    def record_hit(self, node, clock: int) -> bool:
        """A finished request's hit consumed ``node``'s state; True if its key moved."""
        return False

    def forget_hits(self, node) -> None:
        """``node`` lost its state but stays in the tree."""

    def host_mode(self, host_rule: str) -> Optional[str]:
        """How host victims rank: by the alpha utility, or SGLang's host LRU (``lru``, or
        alpha 0, where the utility is LRU)."""
        return "marconi" if host_rule != "lru" and self.alpha else None

    @property
    def is_lru(self) -> bool:
        """Alpha 0 ranks exactly as SGLang's LRU: SGLang's own walks can run."""
        return self.alpha == 0


class ReuseWeightedRanking:
    """FLOPs saved per byte times the reuse weight, GDSF-aged (no alpha)."""

    queue_mode = "gdsf"
    name = "reuse-weighted"
    weighs_nodes = True
    alpha = 0.0
    is_lru = False

    def __init__(self, reuse: Optional[ReuseWeight] = None):
        self.reuse = reuse or ReuseWeight()

    def weight(self, node) -> float:
        """``ReuseWeight`` of a tree node (its hit score and the most children it was seen
        with are kept on the node)."""
        if not hasattr(node, "hit_score"):
            node.hit_score, node.last_hit, node.max_children = 0.0, 0, 0
        node.max_children = max(node.max_children, len(node.children))
        return self.reuse(node)

    @property
    def weight_fn(self):
        return self.weight

    def record_hit(self, node, clock: int) -> bool:
        self.weight(node)  # make sure the node carries the counters
        self.reuse.record_hit(node, clock)
        return True

    def forget_hits(self, node) -> None:
        """The hit count goes with the state (GDSF's in-cache frequency): a state inserted
        there later starts from none."""
        if hasattr(node, "hit_score"):
            node.hit_score, node.last_hit = 0.0, 0
            node.max_children = len(node.children)

    def host_mode(self, host_rule: str) -> Optional[str]:
        return None if host_rule == "lru" else "gdsf"


class DecayRanking(ReuseWeightedRanking):
    """FLOPs saved per byte times the reuse weight, discounted by exp(-age / tau): a
    victim's key is its last use on the request clock plus tau x ln(weighted efficiency),
    tau the mean reuse distance (request ticks between a state's last use and its hit)
    observed on the cache's hits, moved in steps of 2^0.5."""

    queue_mode = "decay"
    name = "reuse-weighted-decay"
    PRIOR_TICKS, PRIOR_COUNT = 64.0, 8  # the mean reuse distance before any hit is seen
    STEP = 2.0 ** 0.5

    def __init__(self, reuse: Optional[ReuseWeight] = None):
        super().__init__(reuse)
        self.distance_sum, self.distances = self.PRIOR_TICKS * self.PRIOR_COUNT, self.PRIOR_COUNT
        self.tau = self.PRIOR_TICKS

    def observe_distance(self, ticks: float) -> bool:
        """A hit consumed a state last used ``ticks`` ago; True when tau moved."""
        self.distance_sum, self.distances = self.distance_sum + max(0.0, ticks), self.distances + 1
        mean = self.distance_sum / self.distances
        if self.tau / self.STEP <= mean <= self.tau * self.STEP:
            return False
        self.tau = self.STEP ** round(math.log(max(mean, 1.0), self.STEP))
        return True
