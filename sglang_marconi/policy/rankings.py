"""The two rankings a Marconi cache evicts by, behind one interface.

- ``ReuseWeightedRanking`` (``--cache-policy marconi``): a victim's key is its FLOPs saved
  per byte times its reuse weight (``likelihood.ReuseWeight``: hits, branch points, the
  learned chain weight), aged by GDSF in the victim queue; a hit re-keys the node, a lost
  state forgets its hits.
- ``AlphaRanking`` (``--marconi-alpha A``, the paper's): min-max normalised recency plus
  alpha times FLOP efficiency; every node weighs 1 and hits change nothing but recency.

Each answers what the cache asks: the victim queue's mode and alpha, a node's weight, what
a hit and a lost state do to it, how host victims rank. The reuse weight's counters live on
the tree node (``hit_score``, ``last_hit``, ``max_children``).
"""
from __future__ import annotations

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
