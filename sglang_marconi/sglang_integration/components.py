"""Marconi's tree components: SGLang's MAMBA and FULL components with scored eviction and
Marconi admission. Lock accounting, splitting, matching and the tree walk are stock.

MAMBA (the state pool, one slot per SSM checkpoint): the stock walk takes the least
recently used unlocked state; here every unlocked state is ranked by the shared
``VictimQueue`` (utility = norm(recency) + alpha * norm(FLOP efficiency)) and the lowest
goes first. As in the stock walk, an evictable leaf is deleted (its KV with it) and any
other node only loses its state (it stays as a KV-only tombstone). Recency is when the
state was last inserted or consumed by a hit, the same events that move it in SGLang's
MAMBA LRU list, so alpha = 0 is exactly the stock order. It is read on the cache's request
clock (``MarconiPolicyState.clock``: one tick per request match), the simulator's clock,
not on SGLang's node-event counter, which advances once per node on every matched path, so
min-max normalised recency would depend on the tree's shape rather than on time. A hit is
stamped with the clock, an insert half a tick later (after the latest match, before the
next), so the order of stamps is the order of SGLang's MAMBA LRU list.

FULL (the token pool): the stock walk pops evictable leaves oldest ``last_access_time``
first; here the same leaves are ranked by the same utility with recency =
``last_access_time``.

FLOP efficiency (``scoring.flop_efficiency``) = FLOPs a hit at the node saves over a hit
at its nearest ancestor that still holds a state, per byte freed *in the pool being
evicted*: one SSM state (``ssm_state_bytes``) in the state pool, the node's own KV tokens
(``kv_bytes_per_token * tokens``) in the token pool. SGLang sizes the two pools
separately, so a victim is ranked by what it gives back to the pool that is short.
"""
from __future__ import annotations

from typing import Optional

from sglang.srt.mem_cache.unified_cache.components.base import (
    ComponentType,
    EvictLayer,
    LRURefreshPhase,
)
from sglang.srt.mem_cache.unified_cache.components.full import FullComponent
from sglang.srt.mem_cache.unified_cache.components.mamba import MambaComponent

MAMBA = ComponentType.MAMBA
FULL = ComponentType.FULL
STAMP = "marconi_used"  # ComponentData.metadata key: when the state was last used
INSERT_OFFSET = 0.5  # an insert is stamped after the latest match, before the next one


def _stamp(node, clock: int) -> None:
    node.component_data[MAMBA].metadata[STAMP] = clock


def state_recency(node) -> float:
    """The request clock when the state was last used (0: never stamped, the oldest)."""
    return node.component_data[MAMBA].metadata.get(STAMP, 0)


class PathLengths:
    """Token depth of nodes and of their nearest ancestor holding a state, memoised for
    one eviction walk (the tree does not change shape between two victims' scoring)."""

    def __init__(self, root):
        self.root = root
        self._depth = {id(root): 0}

    def depth(self, node) -> int:
        chain = []
        while id(node) not in self._depth:
            chain.append(node)
            node = node.parent
        d = self._depth[id(node)]
        for n in reversed(chain):
            d += len(n.key)
            self._depth[id(n)] = d
        return d

    def state_ancestor_depth(self, node) -> int:
        p = node.parent
        while p is not None and p is not self.root:
            if p.component_data[MAMBA].value is not None:
                return self.depth(p)
            p = p.parent
        return 0


class MarconiMambaComponent(MambaComponent):
    """MAMBA component: Marconi admission of intermediate states and scored eviction."""

    _queue = None

    # -- recency: the events that move a state in the stock MAMBA LRU ----------------------
    def refresh_lru(self, phase, node, root_node) -> None:
        super().refresh_lru(phase, node, root_node)
        if phase == LRURefreshPhase.MATCH_END and node.component_data[MAMBA].value is not None:
            _stamp(node, self.cache.marconi.clock)

    def commit_insert_component_data(self, node, is_new_leaf, params, result, cache_actions):
        super().commit_insert_component_data(node, is_new_leaf, params, result, cache_actions)
        _stamp(node, self.cache.marconi.clock + INSERT_OFFSET)

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

    def cleanup_after_caching_req(self, req, is_finished, insert_result=None,
                                  insert_params=None):
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
        policy = self.cache.marconi
        lengths = PathLengths(self.tree_core.root_node)
        lru = self.tree_core.lru_lists[MAMBA]
        candidates = []
        x = lru.get_lru_no_lock()
        while x is not None:
            candidates.append((x, state_recency(x), policy.state_pool_efficiency(x, lengths)))
            x = lru.get_prev_no_lock(x)
        self._queue = policy.victim_queue(candidates)

    def _evict_device_next_node(self, tracker, device_frees, host_frees, cache_actions):
        ct = MAMBA
        if self._queue is None or tracker[ct] >= self._evict_device_request_cnt:
            return None
        lru = self.tree_core.lru_lists[ct]
        while True:
            x = self._queue.pop_victim()
            if x is None:
                return None
            cd = x.component_data[ct]
            if cd.value is not None and cd.lock_ref == 0 and lru.in_list(x):
                break
        if x in self.tree_core.evictable_device_leaves:
            self.cache.marconi.state_evicted("state_pool_leaf")
            return x.id
        self.tree_core._evict_component_and_detach_lru(
            x, self, target=EvictLayer.DEVICE, tracker=tracker, device_frees=device_frees,
            host_frees=host_frees, cache_actions=cache_actions)
        self.tree_core._cascade_evict(x, self, tracker, device_frees=device_frees,
                                      host_frees=host_frees, cache_actions=cache_actions)
        self.cache.marconi.state_evicted("state_pool_drop")
        return None

    def _evict_device_end(self) -> None:
        self._queue = None
        self._evict_device_cursor = None


class MarconiFullComponent(FullComponent):
    """FULL component: evictable leaves leave in utility order instead of LRU order."""

    _queue = None
    _lengths: Optional[PathLengths] = None

    def _evict_device_start(self, request_cnt: int) -> None:
        if self.cache.enable_session_radix_cache:
            raise NotImplementedError("Marconi does not support --enable-session-radix-cache")
        self._evict_device_request_cnt = request_cnt
        self._evict_device_last_node = None
        policy = self.cache.marconi
        self._lengths = PathLengths(self.tree_core.root_node)
        self._queue = policy.victim_queue(
            (n, n.last_access_time, policy.kv_pool_efficiency(n, self._lengths))
            for n in self.tree_core.evictable_device_leaves)

    def _evict_device_next_node(self, tracker, device_frees, host_frees, cache_actions):
        ct = FULL
        leaves = self.tree_core.evictable_device_leaves
        policy = self.cache.marconi
        last = self._evict_device_last_node
        if last is not None and last.parent is not None and last.parent in leaves:
            parent = last.parent
            self._queue.update(parent, parent.last_access_time,
                               policy.kv_pool_efficiency(parent, self._lengths))
        self._evict_device_last_node = None
        while tracker[ct] < self._evict_device_request_cnt:
            x = self._queue.pop_victim()
            if x is None:
                return None
            if x not in leaves:
                continue
            self._evict_device_last_node = x
            if x.component_data[MAMBA].value is not None:
                policy.state_evicted("kv_pool_leaf")
            return x.id
        return None

    def _evict_device_end(self) -> None:
        self._queue = None
        self._lengths = None
        self._evict_device_last_node = None
