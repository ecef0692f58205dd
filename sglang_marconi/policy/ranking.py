"""The ranking inputs of a victim, computed once for every tree (the simulator's, SGLang's).

A tree is seen through a ``TreeAdapter``. ``nearest_state_depth``: the nearest proper
ancestor holding a state (a hit saves the FLOPs from there); ``ranked_efficiency``: FLOPs
saved per byte freed times the reuse weight; ``states_below``: the states to re-key when a
node gains or loses its state (down to the next state on each path).
"""
from __future__ import annotations

from typing import Callable, Iterator, Optional, Protocol

from sglang_marconi.model.cost import CostModel
from sglang_marconi.policy.scoring import per_byte


class TreeAdapter(Protocol):
    """What the ranking rules ask of a tree."""

    def depth(self, node) -> int:
        """Tokens from the root to the end of ``node``."""

    def has_state(self, node) -> bool:
        """Whether ``node`` holds an SSM-state checkpoint."""

    def parent(self, node):
        """``node``'s parent, or None for the root."""

    def children(self, node):
        """``node``'s children (an iterable)."""


class LinkedTree:
    """The ``TreeAdapter`` half every tree here shares: nodes with ``parent`` (None for the
    root) and a ``children`` dict (SGLang's nodes, ``stock``'s)."""

    @staticmethod
    def parent(node):
        return node.parent

    @staticmethod
    def children(node):
        return node.children.values()


def nearest_state_depth(tree: TreeAdapter, node) -> int:
    """Depth of the nearest proper ancestor of ``node`` holding a state (0: the root)."""
    p = tree.parent(node)
    while p is not None and tree.parent(p) is not None:
        if tree.has_state(p):
            return tree.depth(p)
        p = tree.parent(p)
    return 0


def ranked_efficiency(spec: CostModel, tree: TreeAdapter, node, freed_bytes: float,
                      weight: Optional[Callable] = None,
                      ancestor_depth: Callable = nearest_state_depth,
                      saved: Optional[Callable] = None) -> float:
    """FLOPs a hit at ``node`` saves over its nearest checkpointed ancestor per byte freed,
    times ``weight(node)`` (marconi+'s reuse likelihood) when given. ``ancestor_depth``
    answers ``nearest_state_depth(tree, node)`` (a tree may keep the answers); ``saved``
    answers ``spec.flops_saved(depth, ancestor depth)`` of a node with a state (a tree may
    keep those too)."""
    if not tree.has_state(node):
        return 0.0  # cannot end a hit (``flop_efficiency``'s rule): no walk to its ancestors
    flops = (saved(node) if saved is not None
             else spec.flops_saved(tree.depth(node), ancestor_depth(tree, node)))
    return weighted_efficiency(flops, freed_bytes, node, weight)


def weighted_efficiency(flops_saved: float, freed_bytes: float, node,
                        weight: Optional[Callable] = None) -> float:
    """``ranked_efficiency`` of a node with a state from the FLOPs its hit saves:
    ``scoring.flop_efficiency``'s quotient, times ``weight(node)`` when given and the
    quotient is not 0. (Inlined, with ``freed_bytes``, in the unified joint walk's build,
    ``sglang_integration.unified.joint_rows``; ``check_joint_build`` of
    ``scripts/lib/marconi_checks/invariants.py`` holds the two equal.)"""
    e = per_byte(flops_saved, freed_bytes)
    return e * weight(node) if weight is not None and e else e


def freed_bytes(kv_bytes_per_token: float, state_bytes: float, own_tokens: int, leaf: bool,
                state: bool) -> float:
    """Bytes one eviction frees in a single budget (the simulator's, SGLang's unified
    buffer): a leaf its own KV tokens and its state, an inner node its state."""
    held = state_bytes if state else 0
    return own_tokens * kv_bytes_per_token + held if leaf else held


def states_below(tree: TreeAdapter, node) -> Iterator:
    """The states to re-key after ``node`` gained or lost its state (see the module doc)."""
    stack = list(tree.children(node))
    while stack:
        x = stack.pop()
        if tree.has_state(x):
            yield x
        else:
            stack.extend(tree.children(x))
