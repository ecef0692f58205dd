"""Marconi's eviction scoring: FLOP efficiency and the utility-ordered victim queue.

``VictimQueue`` orders candidates by one of three keys, lowest evicted first: the paper's
norm(recency) + alpha * norm(efficiency) (min-max bounds frozen between refreshes, so a heap
with lazy invalidation orders them exactly; a rebuild when pushes exceed live candidates
keeps an eviction amortised O(log n)); ``gdsf``, L + efficiency with L the last victim's key
at the node's last touch; ``decay``, ticks of last use + tau * ln(efficiency).
"""
from __future__ import annotations

import heapq
import itertools

import math

from sglang_marconi.model.cost import CostModel

ZERO_KEY = 1e12  # decay: a candidate worth 0 ranks this many ticks below any other

def flop_efficiency(spec: CostModel, prefix_len: int, ancestor_prefix_len: int, freed_bytes: float,
                    has_state: bool = True) -> float:
    """FLOPs saved by a hit at this node over a hit at the nearest checkpointed ancestor,
    divided by the bytes its eviction frees. A node without a state cannot end a hit: 0."""
    if not has_state or freed_bytes <= 0:
        return 0.0
    return per_byte(spec.flops_saved(prefix_len, ancestor_prefix_len), freed_bytes)


def per_byte(flops_saved: float, freed_bytes: float) -> float:
    """``flop_efficiency`` of a state from the FLOPs its hit saves (0 when nothing is freed)."""
    return flops_saved / freed_bytes if freed_bytes > 0 else 0.0


def utility(recency_norm: float, efficiency_norm: float, alpha: float) -> float:
    """The paper's utility S = norm(R) + alpha * norm(E)."""
    return recency_norm + alpha * efficiency_norm


class VictimQueue:
    """Candidates ordered by utility; ``pop_victim`` returns the lowest. O(log n) amortised.

    Nodes may be any hashable objects. ``update(node, recency, efficiency)`` inserts or
    re-keys a candidate, ``discard(node)`` removes one. ``suspend(node)`` takes a candidate
    out of the ranking while it cannot be evicted (locked) and ``resume(node)`` puts it
    back with its place among equal keys (its insertion order) kept; ``update`` on a
    suspended node changes what ``resume`` restores.
    """

    def __init__(self, alpha: float = 0.0, mode: str = "marconi", tau: float = 1.0,
                 to_ticks=None):
        if mode not in ("marconi", "gdsf", "decay"):
            raise ValueError(f"unknown scoring mode {mode!r}")
        self.mode = mode
        self.alpha = float(alpha)
        # decay: key = ticks(recency) + tau * ln(efficiency), the log of efficiency x
        # exp(-age / tau), ordered without knowing the present
        self.tau = float(tau)
        self.to_ticks = to_ticks
        self.clock = 0.0  # gdsf: the inflation value L
        self._live: dict = {}  # node -> (version, recency, efficiency, seq, base)
        self._suspended: dict = {}  # node -> its entry while suspended
        self._heap: list = []
        self._version = itertools.count()
        self._seq = itertools.count()  # insertion order: LRU tie-break
        self._pushes = 0
        self._bounds = (0.0, 1.0, 0.0, 1.0)  # r_lo, r_span, e_lo, e_span
        self._normalised = False  # bounds not yet computed from candidates
        self.rebuilds = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, node) -> bool:
        return node in self._live

    @property
    def heap_size(self) -> int:
        """Entries in the heap, stale ones included (what compaction keeps bounded)."""
        return len(self._heap)

    def set_alpha(self, alpha: float) -> None:
        if float(alpha) != self.alpha:
            self.alpha = float(alpha)
            self._rebuild()

    def set_tau(self, tau: float) -> None:
        if float(tau) != self.tau:
            self.tau = float(tau)
            self._rebuild()

    def _decay_key(self, recency: float, efficiency: float) -> float:
        t = recency if self.to_ticks is None else self.to_ticks(recency)
        return t + self.tau * math.log(efficiency) if efficiency > 0 else t - ZERO_KEY

    def _key(self, recency: float, efficiency: float, base: float = 0.0) -> float:
        if self.mode == "gdsf":
            return base + efficiency
        if self.mode == "decay":
            return self._decay_key(recency, efficiency)
        if self.alpha == 0.0:
            return recency
        r_lo, r_span, e_lo, e_span = self._bounds
        return utility((recency - r_lo) / r_span, (efficiency - e_lo) / e_span, self.alpha)

    def key_of(self, node) -> float:
        """The utility the queue currently ranks ``node`` by."""
        _, r, e, _, base = self._live[node]
        return self._key(r, e, base)

    def entry(self, node):
        """(recency, efficiency) the queue holds for ``node`` (live or suspended), or None."""
        old = self._live.get(node) or self._suspended.get(node)
        return None if old is None else (old[1], old[2])

    def update(self, node, recency: float, efficiency: float) -> None:
        suspended = node in self._suspended
        old = self._suspended[node] if suspended else self._live.get(node)
        if old is not None and old[1] == recency and old[2] == efficiency:
            return
        same_touch = old is not None and old[1] == recency
        seq = old[3] if same_touch else next(self._seq)
        base = old[4] if same_touch else self.clock
        version = next(self._version)
        if suspended:
            self._suspended[node] = (version, recency, efficiency, seq, base)
            return
        self._live[node] = (version, recency, efficiency, seq, base)
        heapq.heappush(self._heap, (self._key(recency, efficiency, base), seq, version, node))
        self._pushes += 1
        self._maybe_compact()

    def discard(self, node) -> None:
        self._live.pop(node, None)
        self._suspended.pop(node, None)

    def nodes(self) -> list:
        """Every node the queue holds an entry for, live or suspended (in insertion order)."""
        return list(self._live) + list(self._suspended)

    def candidates(self):
        """(node, recency, efficiency, base) of every live candidate (unordered)."""
        return [(n, e[1], e[2], e[4]) for n, e in self._live.items()]

    def bases(self) -> dict:
        """node -> aging base of every live candidate, in the queue's insertion order."""
        return {n: e[4] for n, e in self._live.items()}

    def add_aged(self, node, recency: float, efficiency: float, base: float) -> None:
        """``update`` a new candidate keyed from aging base ``base`` (gdsf), not the clock."""
        clock, self.clock = self.clock, base
        try:
            self.update(node, recency, efficiency)
        finally:
            self.clock = clock

    def load_aged(self, rows: list) -> None:
        """``add_aged`` every (node, recency, efficiency, base) of ``rows`` in order, then
        ``refresh``: the queue that makes, with one heap build instead of a push per row.
        For nodes the queue does not hold yet (each once)."""
        live, version, seq = self._live, self._version, self._seq
        nodes = {row[0] for row in rows}
        if (len(nodes) != len(rows) or not live.keys().isdisjoint(nodes)
                or not self._suspended.keys().isdisjoint(nodes)):
            raise ValueError("load_aged: a node the queue already holds")  # nothing changed
        live.update([(node, (next(version), recency, efficiency, next(seq), base))
                     for node, recency, efficiency, base in rows])
        self._rebuild()

    def is_suspended(self, node) -> bool:
        return node in self._suspended

    def suspend(self, node) -> None:
        entry = self._live.pop(node, None)
        if entry is not None:
            self._suspended[node] = entry

    def resume(self, node) -> None:
        entry = self._suspended.pop(node, None)
        if entry is not None:
            _, r, e, seq, base = entry
            version = next(self._version)
            self._live[node] = (version, r, e, seq, base)
            heapq.heappush(self._heap, (self._key(r, e, base), seq, version, node))
            self._pushes += 1
            self._maybe_compact()

    def _maybe_compact(self) -> None:
        # Stale entries are skipped when they surface; without a renormalising rebuild
        # (alpha 0, gdsf) they would pile up in a long-running cache. Dropping them keeps
        # every key (same bounds), so the order, and every decision, is unchanged.
        heap = self._heap
        if len(heap) > 2 * len(self._live) + 1024:
            live = self._live
            self._heap = [item for item in heap
                          if (entry := live.get(item[3])) is not None and entry[0] == item[2]]
            heapq.heapify(self._heap)

    def refresh(self) -> None:
        """Re-normalise over the current candidates now (e.g. after loading many at once)."""
        self._rebuild()

    def _rebuild(self) -> None:
        live = self._live
        if live:
            rs = [v[1] for v in live.values()]
            es = [v[2] for v in live.values()]
            r_lo, e_lo = min(rs), min(es)
            self._bounds = (r_lo, (max(rs) - r_lo) or 1.0, e_lo, (max(es) - e_lo) or 1.0)
            self._normalised = True
        # ``_key`` of every entry, its arithmetic inlined per mode (the same operations in
        # the same order, so the same floats): one rebuild keys every candidate
        if self.mode == "gdsf":
            self._heap = [(b + e, seq, ver, node) for node, (ver, r, e, seq, b) in live.items()]
        elif self.mode == "decay":
            key = self._decay_key
            self._heap = [(key(r, e), seq, ver, node) for node, (ver, r, e, seq, b) in live.items()]
        elif self.alpha == 0.0:
            self._heap = [(r, seq, ver, node) for node, (ver, r, e, seq, b) in live.items()]
        else:
            r_lo, r_span, e_lo, e_span = self._bounds
            alpha = self.alpha
            self._heap = [((r - r_lo) / r_span + alpha * ((e - e_lo) / e_span), seq, ver, node)
                          for node, (ver, r, e, seq, b) in live.items()]
        heapq.heapify(self._heap)
        self._pushes = 0
        self.rebuilds += 1

    def _maybe_rebuild(self) -> None:
        # Rebuild once more keys were pushed since the last rebuild than there are live
        # candidates (so its O(n) is paid for by those pushes), and before the first victim
        # is chosen (the initial bounds are placeholders).
        if (self.mode == "marconi" and self.alpha != 0.0
                and (self._pushes > len(self._live) or not self._normalised)):
            self._rebuild()

    def peek_victim(self):
        """The lowest-utility live candidate, or None (does not remove it)."""
        self._maybe_rebuild()
        heap, live = self._heap, self._live
        while heap:
            _, _, version, node = heap[0]
            entry = live.get(node)
            if entry is not None and entry[0] == version:
                return node
            heapq.heappop(heap)
        return None

    def pop_victim(self):
        node = self.peek_victim()
        if node is not None:
            key = heapq.heappop(self._heap)[0]
            del self._live[node]
            if self.mode == "gdsf":
                self.clock = max(self.clock, key)
        return node

    def suspend_victim(self):
        """``pop_victim`` for an eviction the caller may not carry out: the victim's entry
        is suspended (``resume`` restores it) instead of dropped; the GDSF clock advances
        as for a pop, so an eviction that happens ages the queue as in the simulator."""
        node = self.peek_victim()
        if node is not None:
            key = heapq.heappop(self._heap)[0]
            self._suspended[node] = self._live.pop(node)
            if self.mode == "gdsf":
                self.clock = max(self.clock, key)
        return node

    def ordered(self) -> list:
        """All live candidates, lowest utility first (for tests and debugging; O(n log n)).
        Applies a due refresh first, so this is the order ``pop_victim`` will follow."""
        self._maybe_rebuild()
        return sorted(self._live, key=lambda n: (self.key_of(n), self._live[n][3]))
