"""``offline``: a reference that knows the future (never call it optimal): Belady-style eviction
weighted by FLOPs saved per byte, end states kept only if a future request reaches them."""
from __future__ import annotations

from bisect import bisect_right

import numpy as np

from sglang_marconi.model.cost import CostModel
from sglang_marconi.policy.cache import PrefixCache
from sglang_marconi.policy.ghost import UnitCost
from sglang_marconi.policy.tree import RadixTree, as_tokens


class FutureIndex:
    """For any prefix: the sorted indices of the requests whose key starts with it."""

    def __init__(self, inputs):
        keys = [as_tokens(t)[:max(0, len(t) - 1)] for t in inputs]
        self.tree = RadixTree(UnitCost())
        for i, key in enumerate(keys):
            if len(key):
                self.tree.insert(key, [len(key)], now=i)  # every key ends at a node boundary
        self.users: dict[int, list] = {}
        for i, key in enumerate(keys):
            for node in self.tree.path_nodes(key):
                self.users.setdefault(node.id, []).append(i)

    def users_of(self, tokens) -> list:
        """Requests whose key starts with ``tokens`` (sorted)."""
        if len(tokens) == 0:
            return []
        m = self.tree.match(tokens)
        if m.kv_len < len(tokens):
            return []
        return self.users.get(m.edge_node.id, [])

    def next_use(self, tokens, after: int, exclude=()) -> int | None:
        users = self.users_of(tokens)
        i = bisect_right(users, after)
        while i < len(users):
            if users[i] not in exclude:
                return users[i]
            i += 1
        return None


class OfflineChooser:
    def __init__(self, future: FutureIndex):
        self.future = future
        self.now = 0

    def node_next_use(self, tree, node) -> int | None:
        path = tree.path_tokens(node)
        exclude = ()
        if len(node.children) == 1:
            (child,) = node.children.values()
            if child.has_state:
                exclude = set(self.future.users_of(np.concatenate([path, child.tokens])))
        return self.future.next_use(path, self.now, exclude)

    def __call__(self, cache: PrefixCache):
        tree = cache.tree
        best, best_value = None, None
        for node in tree.candidates():
            nxt = self.node_next_use(tree, node) if node.has_state else None
            value = tree.efficiency(node) / (nxt - self.now) if nxt is not None else 0.0
            key = (value, -tree.freed_bytes(node), node.id)
            if best_value is None or key < best_value:
                best, best_value = node, key
        return best


def offline_cache(spec: CostModel, capacity, requests, grid: int = 1, max_states: int = 2,
                  ghost_tokens: int | None = None) -> PrefixCache:
    """A cache for ``requests`` (the whole trace, in order) that knows their future."""
    future = FutureIndex([r.input_tokens for r in requests])
    chooser = OfflineChooser(future)

    def admit_end(plan, full, end):
        chooser.now = plan.index - 1
        return future.next_use(full[:end], plan.index - 1) is not None

    # Skipped end states leave no KV behind, so branch points must come from the ghost index
    # (unbounded unless a budget is given).
    cache = PrefixCache(spec, capacity, grid=grid, max_states_per_request=max_states,
                        ghost_tokens=ghost_tokens or 1 << 62, victim_chooser=None,
                        end_admission=admit_end)

    def choose(c):
        chooser.now = c._clock_now - 1
        return chooser(c)

    cache.victim_chooser = choose
    return cache
