"""``MarconiHiCache``: marconi+ as the ``--cache-policy marconi`` plugin runs it in SGLang's
static pools with HiCache's host tier behind them, as a simulator (``sim --cache-gb G
--hicache-size H --policies marconi+:materialise=sglang``).

It is ``in_sglang.MarconiSGLangCache`` (the plugin's admission and its static FULL and
MAMBA walks) over ``stock_host.StockHiCache`` (SGLang's host tier: write_through or
write_through_selective backups, demotion of a backed-up device leaf, host hits loaded
back, the host pools) with the plugin's two-tier rule (``host_tier``) in place of SGLang's
host LRU:

- on the device, a leaf whose KV the host holds too is ranked by the load a later hit
  would pay once it is demoted (``host_tier.demoted_efficiency``, per device byte, times
  the reuse weight), the smaller of that and what a hit saves;
- on the host, KV leaves and host-only states are ranked by ``host_tier.host_efficiency``
  (a hit's FLOPs over its nearest state on either tier, less the load of the node's KV and
  state, per host byte, times the reuse weight) with GDSF aging on each host pool's own
  clock (``HostClock``: a node's base is the clock when its access stamp last moved);
- a state loaded back from the host is used like a hit (stamped on the request clock), but
  the hit is not counted in its reuse weight (the plugin counts the state a match consumes
  on the device); a demoted state keeps its hit count while the host holds it;
- under write_through_selective the end states the learned rule refuses are admitted, so
  the tail's first insert happens (``host_tier.tail_counts_toward_backup``).

Equal to ``ab --memory static --hicache-size H``'s marconi+ request for request and in every
host field on the bundled trace (``scripts/bench_baseline_agreement.py --hicache-size H
--caches marconi+``). Not modelled: write_back and the L3 store (refused by ``sim``),
marconi with a fixed alpha (its host ranking is the alpha utility: refused).
"""
from __future__ import annotations

import heapq

from sglang_marconi.policy.host_tier import (HostClock, HostLink, HostRanking,
                                             demoted_efficiency, host_efficiency,
                                             host_link_preset, tail_counts_toward_backup)
from sglang_marconi.policy.in_sglang import JOINT, KV, MarconiSGLangCache, _MarconiNode, _Tree
from sglang_marconi.policy.stock_host import HostPools, StockHiCache


class _MarconiHostNode(_MarconiNode):
    """A node with the plugin's counters (``_MarconiNode``) and the host tier's flags
    (``stock_host._HostNode``'s), and the two host clocks' stamps."""

    __slots__ = ("dev", "hkv", "hstate", "inserts", "host_stamp_kv", "host_stamp_state")

    def __init__(self, node_id: int, parent, key):
        super().__init__(node_id, parent, key)
        self.dev = True
        self.hkv = False
        self.hstate = False
        self.inserts = 0
        self.host_stamp_kv = None
        self.host_stamp_state = None


class _TierTree(_Tree):
    """The two-tier view: a state on the device or the host can end a hit."""

    @staticmethod
    def has_state(node) -> bool:
        return node.state or node.hstate


TIER_TREE = _TierTree()


class MarconiHiCache(MarconiSGLangCache, StockHiCache):
    """marconi+ (``reuse_weight`` given) in SGLang's static pools with a host tier
    (``host``: ``stock_host.HostPools``); ``link``: the two-tier rule's cost of a load
    (the plugin's default, ``host_tier.host_link_preset()``)."""

    def __init__(self, spec, *, host: HostPools, kv_tokens: int, state_slots: int,
                 link: HostLink | None = None, **kwargs):
        if kwargs.get("reuse_weight") is None:
            raise ValueError("the simulator's host tier with the two-tier rule is marconi+'s")
        self.host = host  # read by StockHiCache's constructor on the way up
        super().__init__(spec, None, kv_tokens=kv_tokens, state_slots=state_slots, **kwargs)
        self.link = link or host_link_preset()
        self.host_clock_kv = HostClock("host_stamp_kv")
        self.host_clock_state = HostClock("host_stamp_state")
        self._device_hit = False

    @staticmethod
    def _new_node(node_id: int, parent, key) -> _MarconiHostNode:
        return _MarconiHostNode(node_id, parent, key)

    # ---- the two halves' hooks, both run -------------------------------------------------------
    def _evictable_leaf(self, node) -> bool:
        """A device leaf: its KV on the device, unlocked, no child on the device."""
        return (node is not self.root and node.alive and node.dev and node.lock == 0
                and not any(c.dev for c in node.children.values()))

    def _state_inserted(self, node) -> None:
        MarconiSGLangCache._state_inserted(self, node)
        self._host_state_lru.pop(node, None)

    def _child_added(self, node) -> None:
        MarconiSGLangCache._child_added(self, node)
        self._host_leaf_update(node)

    def _match_end(self, best) -> None:
        self._inserted_len = 0  # a new request (StockHiCache)
        # the plugin counts a hit on the state its match consumed on the device; a state
        # loaded back from the host is not one (MATCH_END sees no device state there)
        self._device_hit = best.state
        MarconiSGLangCache._match_end(self, best)

    def _finished(self, full, hit_node) -> None:
        MarconiSGLangCache._finished(self, full, hit_node if self._device_hit else self.root)

    def _admit(self, snapshot: int, kind: str) -> bool:
        self._insert_kind = kind  # the insert it precedes (StockHiCache)
        return MarconiSGLangCache._admit(self, snapshot, kind)

    def keeps_tail_for_backup(self) -> bool:
        return tail_counts_toward_backup(False, self.threshold)

    def _drop_state(self, node) -> None:
        """The MAMBA walk tombstones an inner state; a host copy keeps its hit count."""
        kept = (node.hit_score, node.last_hit, node.max_children) if node.hstate else None
        MarconiSGLangCache._drop_state(self, node)
        if kept is not None:
            node.hit_score, node.last_hit, node.max_children = kept
        self._state_tombstoned(node)

    def _evict_leaf(self, node) -> None:
        """A walk's leaf victim: demoted when the host holds its KV, deleted otherwise
        (``StockHiCache``); it leaves both queues, and its state's hits go unless the host
        keeps a copy of the state."""
        self._leaves_live.pop(node, None)
        self._states_live.pop(node, None)
        lost = node.state and not node.hstate
        StockHiCache._evict_leaf(self, node)
        if lost:
            node.hit_score, node.last_hit = 0.0, 0
            node.max_children = len(node.children)

    def _load_back(self, best, device_best) -> None:
        had = best.state
        StockHiCache._load_back(self, best, device_best)
        if not had and best.state:  # on the device again: stamped like a hit
            self._use_state(best, self.clock)

    # ---- the device half of the two-tier rule ---------------------------------------------------
    def _efficiency(self, node, leaf: bool, pool: str = JOINT) -> float:
        e = MarconiSGLangCache._efficiency(self, node, leaf, pool)
        if pool == KV and node.hkv:
            freed = self.kv_bytes * len(node.key)
            e = demoted_efficiency(self.link, e, freed, self.state_bytes, self._weight(node))
        return e

    # ---- the host half: victims ranked by the two-tier rule -------------------------------------
    def _host_efficiency(self, node, held_bytes: float) -> float:
        return host_efficiency(self.spec, self.link, TIER_TREE, node, len(node.key),
                               held_bytes, self._weight)

    def _host_kv_efficiency(self, node) -> float:
        held = self.kv_bytes * len(node.key) + (self.state_bytes if node.hstate else 0)
        return self._host_efficiency(node, held)

    def _host_kv_heap(self, candidates) -> list:
        """The FULL host walk's heap (``StockHiCache._host_room_kv``): host leaves by the
        two-tier rule's GDSF keys, ties in node-id order."""
        self._host_kv_ranking = HostRanking("gdsf", self._host_kv_efficiency, recency=_stamp,
                                            clock=self.host_clock_kv)
        return self._host_kv_ranking.heap(sorted(candidates, key=_node_id))

    def _host_kv_entry(self, node) -> tuple:
        return self._host_kv_ranking.entry(node)

    def _host_kv_evicted(self, node, key) -> None:
        self.host_clock_kv.evicted(node, key)

    def _host_state_victims(self):
        """The MAMBA host walk's order: host-only states by the two-tier rule's GDSF keys.
        Every one is keyed when the walk starts, locked or not (the plugin's candidates are
        those without a host lock), so each takes its aging base then."""
        ranking = HostRanking("gdsf", lambda n: self._host_efficiency(n, self.state_bytes),
                              recency=_stamp, clock=self.host_clock_state)
        heap = ranking.heap(list(self._host_state_lru))
        while heap:
            key, _, node = heapq.heappop(heap)
            yield key, node

    def _host_state_dropped(self, node) -> None:
        node.hit_score, node.last_hit = 0.0, 0  # the last copy of the state went

    def _host_state_evicted(self, node, key) -> None:
        self.host_clock_state.evicted(node, key)


def _stamp(node) -> float:
    return node.stamp


def _node_id(node) -> int:
    return node.id
