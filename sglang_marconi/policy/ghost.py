"""A ghost index: token ids of recent sequences without their KV or states.

Speculative insertion finds a branch point only against what the tree still holds; once
LRU (or any policy) has evicted a request's unique tail, a later request that shares part of
it looks brand new, and the shared prefix is never checkpointed. The ghost index remembers
the token ids of the last ``max_tokens`` tokens' worth of sequences (8 bytes a token in host
memory, against tens of kilobytes of KV on the GPU), so branch points are found even after
eviction, and records where end-of-request states would have been, so the cache can measure
whether such states are ever reused. It holds no tensors and no bytes of the cache budget.

It is a ``RadixTree`` over a unit-cost model (one "byte" per token, no state bytes, no
FLOPs), evicting least-recently-used leaves.
"""
from __future__ import annotations

from typing import NamedTuple

from sglang_marconi.policy.tree import RadixTree


class GhostAnswer(NamedTuple):
    """What the ghost index knows of an input."""
    branch: int    # where the input leaves the remembered sequences (0: it does not branch)
    end: int       # the longest remembered end-of-request position it reaches (0: none)
    reused: bool   # it shares a prefix with a remembered sequence
    fresh: bool    # it leaves one in the middle of an edge: a point no earlier input
                   # branched at (a state there would be a chain state's kind of hit)


class UnitCost:
    """A ``CostModel`` that counts tokens: one byte a token, states free, no FLOPs (the
    ghost index's budget is in tokens)."""

    name = "unit"
    kv_bytes_per_token = 1
    ssm_state_bytes = 0

    @staticmethod
    def prefill_flops(L):
        return 0.0

    @staticmethod
    def flops_saved(T, P=0):
        return 0.0


class GhostIndex:
    def __init__(self, max_tokens: int):
        if max_tokens <= 0:
            raise ValueError("the ghost index needs a positive token budget")
        self.max_tokens = int(max_tokens)
        self.tree = RadixTree(UnitCost())
        self.version = 0  # bumped by every record: a lookup's answer holds until then

    def lookup(self, tokens, limit: int) -> GhostAnswer:
        """Where ``tokens`` leave the remembered sequences, the longest remembered
        end-of-request position (<= limit) they reach, and how they leave (``GhostAnswer``)."""
        m = self.tree.match(tokens, limit=limit)
        fresh = m.edge_node is not m.kv_node and m.kv_len < min(len(tokens), limit)
        return GhostAnswer(m.branch_len, m.hit_len, m.kv_len > 0, fresh)

    def record(self, tokens, end_position: int, now: float) -> None:
        """Remember ``tokens`` with an end marker at ``end_position``; forget old leaves."""
        self.version += 1
        self.tree.insert(tokens, [end_position] if end_position else [], now)
        while self.tree.num_kv_tokens > self.max_tokens:
            if self.tree.evict_one() is None:
                break
