"""Marconi under ``--enable-unified-memory``: ``joint_evict_for_alloc`` ranks KV leaves and SSM
states of the one byte buffer together; Mamba slot ids, locks, freeing and the donor stay
SGLang's, and alpha 0 with the marconi policy takes SGLang's own ``evict_for_alloc``."""
from __future__ import annotations

import bisect
from operator import itemgetter

from sglang.srt.mem_cache.base_prefix_cache import EvictParams, EvictResult
from sglang.srt.mem_cache.unified_cache.components import base as components_base
from sglang.srt.mem_cache.unified_cache.components.base import EvictLayer, LRURefreshPhase

from sglang_marconi.policy.ranking import freed_bytes
from sglang_marconi.policy.scoring import VictimQueue
from sglang_marconi.sglang_integration.components import (FULL, KEYED_WEIGHT, MAMBA, SAVED, STAMP,
                                                          MarconiFullComponent,
                                                          MarconiMambaComponent,
                                                          cached_flops_saved, has_state,
                                                          state_recency)


_first = itemgetter(0)


def droppable_inner_state(node) -> bool:
    """A node holding an unlocked state, not the root: its state may be dropped."""
    cd = node.component_data[MAMBA]
    return cd.value is not None and cd.lock_ref == 0 and node.parent is not None


def is_unified(params) -> bool:
    """The pools are SGLang's unified buffer (a Full donor can fund Mamba states)."""
    donor = getattr(params.token_to_kv_pool_allocator, "mamba_full_cache_donor", None)
    return donor is not None and donor() is not None


class JointMambaComponent(MarconiMambaComponent):
    """Records SGLang's access counter at each match (KV leaves' recency)."""

    def refresh_lru(self, phase, node, root_node) -> None:
        if phase == LRURefreshPhase.MATCH_END:
            log, clock = self.cache.joint_clocks, self.cache.marconi.clock
            if clock not in log.clocks[-1:]:
                log.append(components_base._LAST_ACCESS_TIME_COUNTER_FLOAT, clock)
        super().refresh_lru(phase, node, root_node)


def joint_recency(cache, node) -> float:
    """A candidate's recency on the request clock."""
    return (state_recency(node) if has_state(node)
            else cache.joint_clocks.clock_at(node.last_access_time))


def joint_efficiency(cache, node, leaf: bool) -> float:
    """The policy's FLOP efficiency per byte the eviction frees in the shared buffer."""
    spec = cache.marconi.spec
    freed = freed_bytes(spec.kv_bytes_per_token, spec.ssm_state_bytes, len(node.key), leaf,
                        has_state(node))
    return cache.marconi._efficiency(node, freed)


def joint_rows(cache, bases: dict) -> list:
    """(node, recency, efficiency, aging base) of the joint walk's candidates, oldest first."""
    policy = cache.marconi
    spec = policy.spec
    kv_bytes, state_bytes = spec.kv_bytes_per_token, spec.ssm_state_bytes
    weighed = policy.ranking.weighs_nodes
    leaves = cache.tree_core.evictable_device_leaves
    counters, clocks = cache.joint_clocks.counters, cache.joint_clocks.clocks
    right = bisect.bisect_right
    mamba, saved_attr, stamp, keyed_weight = MAMBA, SAVED, STAMP, KEYED_WEIGHT
    rows = []  # (recency, node, efficiency, base)
    append = rows.append
    for node, base in bases.items():
        cd = node.component_data[mamba]
        leaf = node in leaves
        if cd.value is None:  # KV only: ranks 0 (``ranking.ranked_efficiency``)
            if leaf:  # ``ClockLog.clock_at``
                i = right(counters, node.last_access_time) - 1
                append((clocks[i] if i >= 0 else 0, node, 0.0, base))
            continue
        if leaf:  # ``freed_bytes`` of a leaf with a state: its KV and its state
            freed = len(node.key) * kv_bytes + state_bytes
        elif cd.lock_ref == 0 and node.parent is not None:  # ``droppable_inner_state``
            freed = state_bytes
        else:
            continue
        flops = getattr(node, saved_attr, None)
        if flops is None:
            flops = cached_flops_saved(spec, node)
        e = flops / freed if freed > 0 else 0.0  # ``weighted_efficiency``
        if weighed and e:  # the reuse weight its MAMBA key holds: every state row is an
            # unlocked state, so a live MAMBA candidate, re-keyed wherever its weight moves
            # (``MarconiFullComponent.children_changed``; ``check_queues`` checks it)
            w = getattr(node, keyed_weight, None)
            e = e * (w if w is not None else policy.ranking.weight(node))
        append((cd.metadata.get(stamp, 0), node, e, base))  # ``state_recency``
    # oldest first: equal keys (marconi+'s unhit states all weigh 0) leave in LRU order, as
    # in the persistent queues and the simulator
    rows.sort(key=_first)
    return [(node, recency, efficiency, base) for recency, node, efficiency, base in rows]


class JointWalk:
    """The walk-local ranking of one byte-driven eviction over both kinds of candidate."""

    def __init__(self, cache):
        self.cache = cache
        self.pending_parent = None  # the parent of the leaf just returned for eviction
        mamba, full = cache.components[MAMBA], cache.components[FULL]
        self.queue = VictimQueue(mamba.queue.alpha, mode=mamba.queue.mode, tau=mamba.queue.tau)
        self.queue.clock = max(mamba.queue.clock, full.queue.clock)
        bases = full.queue.bases()
        bases.update(mamba.queue.bases())  # a leaf with a state: the state's aging base
        self.queue.load_aged(joint_rows(cache, bases))

    def is_leaf(self, node) -> bool:
        return node in self.cache.tree_core.evictable_device_leaves

    def valid(self, node) -> bool:
        return self.is_leaf(node) or droppable_inner_state(node)

    def add(self, node, base=None) -> None:
        if not self.valid(node):
            return
        eff = joint_efficiency(self.cache, node, self.is_leaf(node))
        self.queue.add_aged(node, joint_recency(self.cache, node), eff,
                            self.queue.clock if base is None else base)

    def next_node(self, full, tracker, device_frees, host_frees, cache_actions):
        """One victim leaf's id, or None after dropping an inner state here."""
        while True:
            x = self.queue.pop_victim()
            if x is None:
                return None
            if self.valid(x):
                break
        parent = x.parent
        policy = self.cache.marconi
        if self.is_leaf(x):
            if has_state(x):
                policy.state_evicted("unified_leaf")
            self.pending_parent = parent
            return x.id
        mamba = self.cache.components[MAMBA]
        tree = self.cache.tree_core
        tree._evict_component_and_detach_lru(
            x, mamba, target=EvictLayer.DEVICE, tracker=tracker, device_frees=device_frees,
            host_frees=host_frees, cache_actions=cache_actions)
        tree._cascade_evict(x, mamba, tracker, device_frees=device_frees,
                            host_frees=host_frees, cache_actions=cache_actions)
        policy.state_evicted("unified_state")
        if self.is_leaf(x):  # a tombstone leaf now: its KV is a candidate
            self.add(x)
        return None

    def after_step(self) -> None:
        """A leaf was evicted: its parent may have become an evictable leaf."""
        p, self.pending_parent = self.pending_parent, None
        if p is not None and p.parent is not None and p not in self.queue and self.is_leaf(p):
            self.add(p)


class JointFullComponent(MarconiFullComponent):
    """FULL component whose walk follows the joint ranking while one is active."""

    def _evict_device_next_node(self, tracker, device_frees, host_frees, cache_actions):
        walk = self.cache.joint_walk
        if walk is None:
            return super()._evict_device_next_node(tracker, device_frees, host_frees,
                                                   cache_actions)
        walk.after_step()
        return walk.next_node(self, tracker, device_frees, host_frees, cache_actions)


def _add(result: EvictResult, more: EvictResult) -> None:
    result.num_tokens_evicted += more.num_tokens_evicted
    result.swa_num_tokens_evicted += more.swa_num_tokens_evicted
    result.mamba_num_evicted += more.mamba_num_evicted


def joint_evict_for_alloc(cache, params, stock, allocation_reclaim_satisfied=None):
    """``evict_for_alloc`` with one ranking over KV leaves and states (marconi at alpha 0
    ranks as LRU: SGLang's own walk)."""
    if (cache.marconi.ranking.is_lru or allocation_reclaim_satisfied is not None
            or cache.disable):
        return stock(params, allocation_reclaim_satisfied=allocation_reclaim_satisfied)
    allocator = cache.token_to_kv_pool_allocator
    donor = allocator.mamba_full_cache_donor()
    result = EvictResult()
    mamba_target = None
    if params.mamba_num > 0:
        mamba_target = cache._component_available_size(MAMBA) + params.mamba_num
        ids = cache.req_to_token_pool.mamba_allocator.available_size()
        if mamba_target > ids:  # slot ids: only dropping a state recycles one
            _add(result, cache._evict(EvictParams(num_tokens=0, mamba_num=mamba_target - ids)))
    full_target = (cache._component_available_size(FULL) + params.num_tokens
                   if params.num_tokens > 0 else None)

    def satisfied() -> bool:
        if full_target is not None and cache._component_available_size(FULL) < full_target:
            return False
        if mamba_target is not None:
            donor.prepare_mamba_allocation(mamba_target)
            return cache._component_available_size(MAMBA) >= mamba_target
        return True

    if satisfied() or cache.full_evictable_size() + cache.mamba_evictable_size() == 0:
        return result
    cache.joint_walk = JointWalk(cache)
    try:
        _add(result, cache._evict(EvictParams(num_tokens=cache.full_evictable_size() + 1),
                                  allocation_reclaim_satisfied=satisfied))
    finally:
        walk, cache.joint_walk = cache.joint_walk, None
        for comp in (cache.components[MAMBA], cache.components[FULL]):
            comp.queue.clock = max(comp.queue.clock, walk.queue.clock)
    return result
