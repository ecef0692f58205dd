"""Marconi's tree components: SGLang's MAMBA and FULL components with scored eviction
(``VictimQueue``: recency on the request clock, so alpha 0 is SGLang's LRU order) and
Marconi admission; persistent queues re-keyed only where a candidate's inputs change."""
from __future__ import annotations

import heapq
from operator import attrgetter

from sglang.srt.mem_cache.unified_cache.components.base import (CacheTransferPhase, ComponentType,
                                                                EvictLayer, InternalStateBackup,
                                                                LRURefreshPhase)
from sglang.srt.mem_cache.unified_cache.components.full import FullComponent
from sglang.srt.mem_cache.unified_cache.components.mamba import MambaComponent

from sglang_marconi.policy.host_tier import HostClock, HostRanking
from sglang_marconi.policy.ranking import LinkedTree, nearest_state_depth, states_below
from sglang_marconi.policy.scoring import VictimQueue

MAMBA = ComponentType.MAMBA
FULL = ComponentType.FULL
STAMP = "marconi_used"  # ComponentData.metadata key: when the state was last used
DEPTH = "_marconi_depth"  # node attribute: tokens from the root to the node's end
STATE_DEPTH = "_marconi_state_depth"  # node attribute: ``cached_state_depth``'s answer
SAVED = "_marconi_saved"  # node attribute: ``cached_flops_saved``'s answer
KEYED_WEIGHT = "_marconi_keyed_weight"  # node attribute: marconi+'s reuse weight in its MAMBA key
INSERT_OFFSET = 0.5  # an insert is stamped after the latest match, before the next one


def _stamp(node, clock: float) -> None:
    node.component_data[MAMBA].metadata[STAMP] = clock


def state_recency(node) -> float:
    """The request clock when the state was last used (0: never stamped, the oldest)."""
    return node.component_data[MAMBA].metadata.get(STAMP, 0)


def has_state(node) -> bool:
    return node.component_data[MAMBA].value is not None


def token_depth(node) -> int:
    """Tokens from the root to the end of ``node``, cached on the nodes it walks."""
    chain = []
    while node is not None and getattr(node, DEPTH, None) is None:
        chain.append(node)
        node = node.parent
    d = 0 if node is None else getattr(node, DEPTH)
    for n in reversed(chain):
        d += len(n.key) if n.parent is not None else 0
        setattr(n, DEPTH, d)
    return d


def cached_state_depth(tree, node) -> int:
    """``ranking.nearest_state_depth`` of ``node``, kept on it until a state moves."""
    d = getattr(node, STATE_DEPTH, None)
    if d is None:
        d = nearest_state_depth(tree, node)
        setattr(node, STATE_DEPTH, d)
    return d


def cached_flops_saved(spec, node) -> float:
    """FLOPs a hit at ``node`` saves over its nearest state, kept on the node."""
    f = getattr(node, SAVED, None)
    if f is None:
        f = spec.flops_saved(token_depth(node), cached_state_depth(SGLANG_TREE, node))
        setattr(node, SAVED, f)
    return f


def forget_state_depth(node) -> None:
    """Forget ``cached_state_depth``'s and ``cached_flops_saved``'s answers for ``node``."""
    if getattr(node, STATE_DEPTH, None) is not None:
        setattr(node, STATE_DEPTH, None)
        setattr(node, SAVED, None)


class _SGLangTree(LinkedTree):
    """The ranking rules' view of SGLang's tree (``policy.ranking.TreeAdapter``)."""

    depth = staticmethod(token_depth)
    has_state = staticmethod(has_state)


SGLANG_TREE = _SGLangTree()


def has_state_either_tier(node) -> bool:
    cd = node.component_data[MAMBA]
    return cd.value is not None or cd.host_value is not None


class _TierTree(_SGLangTree):
    """The two-tier view (HiCache): a state on the device or the host can end a hit."""

    has_state = staticmethod(has_state_either_tier)


TIER_TREE = _TierTree()


_node_id = attrgetter("id")


def by_id(nodes) -> list:
    """``nodes`` in creation order (the same on every TP rank, unlike a set's)."""
    return sorted(nodes, key=_node_id)


def rekey_state_change(cache, node) -> None:
    """``node`` gained or lost its state: re-key it and the states below it."""
    mamba, full = cache.components[MAMBA], cache.components[FULL]
    forget_state_depth(node)
    full.track(node)
    for x in states_below(SGLANG_TREE, node):
        forget_state_depth(x)
        mamba.track(x)
        full.track(x)


class _ScoredQueue:
    """The persistent victim queue of one component and the walk-start refresh."""

    queue = None

    def reset_queue(self) -> None:
        policy = self.cache.marconi
        # FULL leaves' recency is SGLang's access counter, read on the request clock
        log = policy.tick_log if self.component_type == FULL else None
        self.queue = VictimQueue(policy.alpha, mode=policy.queue_mode,
                                 tau=getattr(policy.ranking, "tau", 1.0),
                                 to_ticks=log and log.clock_at)

    def _walk_start(self) -> None:
        policy = self.cache.marconi
        if self.queue.mode in ("gdsf", "decay"):
            return  # aged keys need no normalisation
        self.queue.set_alpha(policy.alpha)
        limit = policy.settings.renormalise_limit
        if self.queue.alpha and (limit < 0 or len(self.queue) <= limit):
            self._resync()
            self.queue.refresh()

    def _resync(self) -> None:
        """Before a per-walk renormalisation: inputs that move without a hook."""

    # A victim handed to SGLang's walk is suspended, not popped (under write_back its
    # eviction can be declined); evicted ones leave through ``evict_component`` / the leaf
    # set, the rest are resumed at the walk's end with the keys they had.
    def _hand_over(self, node) -> None:
        if self.queue.peek_victim() is node:
            self.queue.suspend_victim()  # the queue's top: aged as a pop (GDSF clock)
        else:
            self.queue.suspend(node)     # a victim SGLang's tree core re-selected
        self._handed.append(node)

    def _resume_handed(self) -> None:
        handed, self._handed = getattr(self, "_handed", []), []
        for node in handed:
            if self.queue.is_suspended(node) and self._still_candidate(node):
                self.queue.resume(node)

    def _still_candidate(self, node) -> bool:
        raise NotImplementedError

    # -- HiCache: the host tier's victims, ranked by the two-tier rule ----------------------
    host_clock = None

    def _host_ranking(self, efficiency):
        """The ``HostRanking`` of this component's host victims, or None for SGLang's LRU."""
        policy = self.cache.marconi
        mode = policy.host_mode
        if mode is None:
            return None
        if self.host_clock is None:
            self.host_clock = HostClock(f"_marconi_host_{self.component_type.name.lower()}")
        return HostRanking(mode, efficiency, recency=lambda n: n.last_access_time,
                           alpha=policy.alpha, clock=self.host_clock)

    def _evict_host_node(self, x, key, tracker, device_frees, host_frees, cache_actions) -> None:
        """A host leaf goes whole (SGLang's ``_evict_host_leaf``); anything else loses
        this component's host value (MAMBA: a host tombstone, as in SGLang's host walk)."""
        core = self.tree_core
        if x in core.evictable_host_leaves:
            core._evict_host_leaf(x, tracker, device_frees, host_frees,
                                  cache_actions=cache_actions)
        else:
            core._evict_component_and_detach_lru(
                x, self, target=EvictLayer.HOST, tracker=tracker, device_frees=device_frees,
                host_frees=host_frees, cache_actions=cache_actions)
            core._cascade_evict(x, self, tracker, device_frees=device_frees, host_frees=host_frees,
                                target=EvictLayer.HOST, cache_actions=cache_actions)
            core._update_evictable_leaf_sets(x)
        self.host_clock.evicted(x, key)
        self.cache.marconi.stats.host_evicted[self.component_type.name.lower()] += 1


class MarconiMambaComponent(_ScoredQueue, MambaComponent):
    """MAMBA component: Marconi admission of intermediate states and scored eviction."""

    def track(self, node) -> None:
        """(Re-)key ``node``'s state, or drop it from the queue if it has none."""
        if self.queue is None:
            return
        cd = node.component_data[MAMBA]
        if cd.value is None:
            self.queue.discard(node)
            return
        policy = self.cache.marconi
        if policy.ranking.weighs_nodes:
            # the reuse weight this key is computed with (``children_changed``)
            setattr(node, KEYED_WEIGHT, policy.ranking.weight(node))
        self.queue.update(node, state_recency(node), policy.state_pool_efficiency(node))
        if cd.lock_ref > 0:
            self.queue.suspend(node)

    # -- recency: the events that move a state in the stock MAMBA LRU ----------------------
    def refresh_lru(self, phase, node, root_node) -> None:
        super().refresh_lru(phase, node, root_node)
        if phase == LRURefreshPhase.MATCH_END and has_state(node):
            policy = self.cache.marconi  # the decay ranking learns from reuse distances
            if policy.ranking.queue_mode == "decay" and state_recency(node) < policy.clock:
                node.marconi_reuse_distance = policy.clock - state_recency(node)  # 1st match
            _stamp(node, self.cache.marconi.clock)
            self.cache.marconi.matched(node)
            self.track(node)

    def commit_insert_component_data(self, node, is_new_leaf, params, result, cache_actions):
        had = has_state(node)
        super().commit_insert_component_data(node, is_new_leaf, params, result, cache_actions)
        if not had:
            forget_state_depth(node)  # kept while it had none would be stale
        _stamp(node, self.cache.marconi.clock + INSERT_OFFSET)
        self.track(node)
        if not had:
            rekey_state_change(self.cache, node)

    def evict_component(self, node, device_frees, host_frees, cache_actions,
                        target=EvictLayer.DEVICE):
        had = has_state(node)
        out = super().evict_component(node, device_frees, host_frees, cache_actions, target=target)
        if had and not has_state(node):
            if self.queue is not None:
                self.queue.discard(node)
            rekey_state_change(self.cache, node)
        if not has_state_either_tier(node) and (had or target is not EvictLayer.DEVICE):
            # the hits go with the last copy of the state: a demoted state keeps them
            self.cache.marconi.forget_hits(node)
        return out

    # -- locks: a locked state is not a candidate -------------------------------------------
    def acquire_component_lock(self, node, result, lock_host=False):
        out = super().acquire_component_lock(node, result, lock_host)
        if (not lock_host and self.queue is not None and node.component_data[MAMBA].lock_ref == 1):
            self.queue.suspend(node)
        return out

    def release_component_lock(self, node, params, lock_host=False):
        super().release_component_lock(node, params, lock_host)
        cd = node.component_data[MAMBA]
        if not lock_host and self.queue is not None and cd.lock_ref == 0:
            if self.queue.is_suspended(node):
                self.queue.resume(node)
            else:
                self.track(node)

    # -- admission ---------------------------------------------------------------------------
    def prepare_for_caching_req(self, req, insert_params, token_ids_len, is_finished):
        policy = self.cache.marconi
        if is_finished:
            if self.cache.enable_mamba_extra_buffer:
                checkpoint = self._select_finished_checkpoint(req, token_ids_len)
                position = checkpoint[0] if checkpoint is not None else 0
            else:
                position = token_ids_len
            if not policy.admit_final(req, position):
                return 0  # nothing is inserted; cleanup frees the request's slots
        else:
            position = (req.kv.mamba_last_track_seqlen if self.cache.enable_mamba_extra_buffer
                        else token_ids_len)
            if position and not policy.admit_intermediate(req, position):
                return 0  # the snapshot stays in the request's ping-pong slot, unpublished
        return super().prepare_for_caching_req(req, insert_params, token_ids_len, is_finished)

    def cleanup_after_caching_req(self, req, is_finished, insert_result=None, insert_params=None):
        inserted = (insert_result is not None and not insert_result.mamba_exist
                    and insert_params is not None and insert_params.mamba_value is not None)
        if inserted:
            self.cache.marconi.state_admitted(req, is_finished)
        super().cleanup_after_caching_req(req, is_finished, insert_result, insert_params)

    # -- eviction ----------------------------------------------------------------------------
    def _evict_device_start(self, request_cnt: int) -> None:
        if self.tree_core.enable_session_radix_cache:
            raise NotImplementedError("Marconi does not support --enable-session-radix-cache")
        self._evict_device_request_cnt = request_cnt
        self._evict_device_cursor = None
        self._handed = []
        self._walk_start()

    def _still_candidate(self, node) -> bool:
        cd = node.component_data[MAMBA]
        return cd.value is not None and cd.lock_ref == 0

    def _needs_state_backup(self, x) -> bool:
        """write_back: an internal state without a host copy is backed up first."""
        return (self.tree_core.enable_hicache and self.tree_core.is_write_back
                and x.component_data[MAMBA].host_value is None and not x.backuped
                and x.component_data[FULL].value is not None)

    def _evict_device_next_node(self, tracker, device_frees, host_frees, cache_actions):
        ct = MAMBA
        lru = self.tree_core.lru_lists[ct]
        # After a state backup SGLang's tree core names a victim that became a leaf (or
        # lost its KV) meanwhile for the walk to take again (``_evict_device_cursor``).
        x, self._evict_device_cursor = self._evict_device_cursor, None
        reselected = x is not None and self._still_candidate(x) and lru.in_list(x)
        if tracker[ct] >= self._evict_device_request_cnt:
            return None
        if not reselected:
            while True:
                x = self.queue.peek_victim()
                if x is None:
                    return None
                if self._still_candidate(x) and lru.in_list(x):
                    break
                self.queue.pop_victim()
        if x in self.tree_core.evictable_device_leaves:
            self._hand_over(x)
            self.cache.marconi.state_evicted("state_pool_leaf")
            return x.id
        if not reselected and self._needs_state_backup(x):
            self._hand_over(x)
            return InternalStateBackup(node_id=x.id, num_tokens=1)
        if not reselected:
            # an inner state dropped here is an eviction like a leaf's: popped, so the GDSF
            # clock ages to its key (the simulator's ``evict_one``); the discard below then
            # finds it gone
            self.queue.pop_victim()
        self.tree_core._evict_component_and_detach_lru(
            x, self, target=EvictLayer.DEVICE, tracker=tracker, device_frees=device_frees,
            host_frees=host_frees, cache_actions=cache_actions)
        self.tree_core._cascade_evict(x, self, tracker, device_frees=device_frees,
                                      host_frees=host_frees, cache_actions=cache_actions)
        self.cache.marconi.state_evicted("state_pool_drop")
        return None

    def _evict_device_end(self) -> None:
        self._evict_device_cursor = None
        self._resume_handed()

    # -- HiCache: host states ranked by the two-tier rule -----------------------------------
    def _host_candidates(self) -> list:
        """The host-unlocked states of SGLang's MAMBA host LRU list."""
        lru = self.tree_core.host_lru_lists[MAMBA]
        out, x = [], lru.get_lru_no_host_lock()
        while x is not None:
            out.append(x)
            x = lru.get_prev_no_host_lock(x)
        return out

    def drive_host_eviction(self, num_tokens, tracker, device_frees, host_frees,
                            cache_actions) -> None:
        ranking = (None if self.tree_core.enable_session_radix_cache
                   else self._host_ranking(self.cache.marconi.host_state_efficiency))
        if ranking is None:
            return super().drive_host_eviction(num_tokens, tracker, device_frees,
                                               host_frees, cache_actions)
        lru = self.tree_core.host_lru_lists[MAMBA]
        heap = ranking.heap(self._host_candidates())
        while tracker[MAMBA] < num_tokens and heap:
            key, _, x = heapq.heappop(heap)
            cd = x.component_data[MAMBA]
            if not lru.in_list(x) or cd.host_value is None or cd.host_lock_ref > 0:
                continue
            self._evict_host_node(x, key, tracker, device_frees, host_frees, cache_actions)

    # -- HiCache: a state loaded back from host is on the device again ---------------------
    def commit_hicache_transfer(self, node, phase, transfers=(), *, cache_actions,
                                insert_result=None, pool_storage_result=None):
        had = has_state(node)
        super().commit_hicache_transfer(node, phase, transfers, cache_actions=cache_actions,
                                        insert_result=insert_result,
                                        pool_storage_result=pool_storage_result)
        if phase == CacheTransferPhase.LOAD_BACK and not had and has_state(node):
            # SGLang's load-back (``set_component_device_value``) puts it at the MRU end
            # of the MAMBA LRU list: a use, stamped like a hit
            forget_state_depth(node)
            _stamp(node, self.cache.marconi.clock)
            self.track(node)
            rekey_state_change(self.cache, node)
            self.cache.marconi.stats.loaded_back += 1


class _LeafSet(set):
    """``evictable_device_leaves`` that tells the FULL component who enters and leaves."""

    def __init__(self, component, items=()):
        super().__init__(items)
        self._component = component

    def add(self, node) -> None:
        super().add(node)
        self._component.track(node)
        self._component.children_changed(node)

    def discard(self, node) -> None:
        super().discard(node)
        self._component.untrack(node)
        self._component.children_changed(node)

    def remove(self, node) -> None:
        super().remove(node)
        self._component.untrack(node)

    def clear(self) -> None:
        super().clear()
        self._component.reset_queue()


class MarconiFullComponent(_ScoredQueue, FullComponent):
    """FULL component: evictable leaves leave in utility order instead of LRU order."""

    def reset_queue(self) -> None:
        super().reset_queue()
        self._backed_up_in_walk = []  # victims backed up while handed to the walk
        leaves = self.tree_core.evictable_device_leaves
        if not isinstance(leaves, _LeafSet):
            self.tree_core.evictable_device_leaves = _LeafSet(self, leaves)
        for node in by_id(self.tree_core.evictable_device_leaves):
            self.track(node)

    def track(self, node) -> None:
        if self.queue is None or node not in self.tree_core.evictable_device_leaves:
            return
        self.queue.update(node, node.last_access_time, self.cache.marconi.kv_pool_efficiency(node))

    def untrack(self, node) -> None:
        if self.queue is not None:
            self.queue.discard(node)

    def children_changed(self, node) -> None:
        """Re-key a state when marconi+'s weight by its children moved."""
        policy = self.cache.marconi
        if not policy.ranking.weighs_nodes or not has_state(node):
            return
        mamba = self.cache.components[MAMBA]
        weight = policy.ranking.weight(node)  # records the child count, as a re-key would
        if (mamba.queue is not None and mamba.queue.entry(node) is not None
                and getattr(node, KEYED_WEIGHT, None) == weight):
            return
        mamba.track(node)

    def _resync(self) -> None:
        """Leaves matched since they were keyed get their current time."""
        queue = self.queue
        # in node-id order, never the set's (object-address) order: a key pushed gets the
        # next sequence number, which breaks ties, and every TP rank must break them alike
        for node in by_id(self.tree_core.evictable_device_leaves):
            entry = queue.entry(node)
            if entry is None:
                self.track(node)
            elif entry[0] != node.last_access_time:
                queue.update(node, node.last_access_time, entry[1])

    def _evict_device_start(self, request_cnt: int) -> None:
        if self.cache.enable_session_radix_cache:
            raise NotImplementedError("Marconi does not support --enable-session-radix-cache")
        self._evict_device_request_cnt = request_cnt
        self._handed = []
        self._walk_start()

    def _still_candidate(self, node) -> bool:
        return node in self.tree_core.evictable_device_leaves

    def _evict_device_next_node(self, tracker, device_frees, host_frees, cache_actions):
        ct = FULL
        leaves = self.tree_core.evictable_device_leaves
        queue = self.queue
        while tracker[ct] < self._evict_device_request_cnt:
            x = queue.peek_victim()
            if x is None:
                return None
            if x not in leaves:  # not reported by the set (cannot happen): drop it
                queue.discard(x)
                continue
            if queue.entry(x)[0] != x.last_access_time:  # matched since: re-key, look again
                self.track(x)
                continue
            self._hand_over(x)
            if has_state(x):
                self.cache.marconi.state_evicted("kv_pool_leaf")
            return x.id
        return None

    def _evict_device_end(self) -> None:
        self._resume_handed()
        backed_up, self._backed_up_in_walk = self._backed_up_in_walk, []
        for node in backed_up:
            self.track(node)

    def evict_component(self, node, device_frees, host_frees, cache_actions,
                        target=EvictLayer.DEVICE):
        had = node.component_data[FULL].host_value is not None
        out = super().evict_component(node, device_frees, host_frees, cache_actions, target=target)
        if (had and node.component_data[FULL].host_value is None
                and self.cache.marconi.host_mode is not None):
            self.track(node)  # its host copy is gone: its eviction would drop it now
        return out

    def commit_hicache_transfer(self, node, phase, transfers=(), *, cache_actions,
                                insert_result=None, pool_storage_result=None):
        super().commit_hicache_transfer(node, phase, transfers, cache_actions=cache_actions,
                                        insert_result=insert_result,
                                        pool_storage_result=pool_storage_result)
        if phase == CacheTransferPhase.BACKUP_HOST and self.cache.marconi.host_mode is not None:
            # on the host too now: its eviction only demotes it. A victim handed to the
            # walk (write_back backs it up there) is re-keyed once it is resumed
            if self.queue is not None and self.queue.is_suspended(node):
                self._backed_up_in_walk.append(node)
            else:
                self.track(node)

    def drive_host_eviction(self, num_tokens, tracker, device_frees, host_frees,
                            cache_actions) -> None:
        """SGLang's FULL host walk with the two-tier rule's keys instead of LRU."""
        ranking = (None if self.cache.enable_session_radix_cache
                   else self._host_ranking(self.cache.marconi.host_kv_efficiency))
        if ranking is None:
            return super().drive_host_eviction(num_tokens, tracker, device_frees,
                                               host_frees, cache_actions)
        leaves = self.tree_core.evictable_host_leaves
        heap = ranking.heap(by_id(leaves))
        while tracker[FULL] < num_tokens and heap:
            key, _, x = heapq.heappop(heap)
            if x not in leaves:
                continue
            self._evict_host_node(x, key, tracker, device_frees, host_frees, cache_actions)
            if x.parent is not None and x.parent in leaves:
                heapq.heappush(heap, ranking.entry(x.parent))
