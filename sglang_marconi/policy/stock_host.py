"""``StockHiCache``: stock SGLang 0.5.23's cache with its host tier (HiCache,
``--enable-hierarchical-cache``) as a simulator: ``StockSGLangCache``'s static pools plus a
KV host pool and a state host pool, write_through or write_through_selective.

What SGLang does and this models (paths relative to the installed
``sglang/srt/mem_cache/``; ``utc`` = ``unified_cache/unified_tree_core.py``):

- Host pools (``hybrid_cache/hybrid_pool_assembler.py`` ``_split_hicache_size``): the host
  bytes are split between the KV and the state host pools in proportion to the device
  pools' bytes, so each holds ``ratio`` times its device pool's slots, plus one page
  (``HostPools``).
- Backups (``utc`` ``_finish_insert_walk_node``, ``_should_backup_after_insert``,
  ``_build_backup_kv_action``, ``_advance_insert``; ``unified_radix_cache.py``
  ``_execute_kv_backup``): an insert counts itself on every node it walks through (past
  what the same request inserted already) or creates; a node the host does not hold is
  backed up when its count reaches the write policy's threshold (write_through 1,
  write_through_selective 2), its not yet backed-up ancestors first, KV and the node's
  device state together. A backup is a barrier of the insert walk (run at once, before
  the insert attaches its state to the node it ends on); the insert's tail backs up the
  end node's new state alone when the host holds its KV and no backup of it awaits its
  acknowledgement (the incremental backup). When the KV host pool is short, host leaves
  are evicted first; a backup that still does not fit is not made (and the rest of its
  chain with it).
- Device eviction (``utc`` ``evict_device_leaf``, 1788-1823): a device leaf is a node whose
  KV is on the device and none of whose children's is (``_is_device_leaf``); the FULL walk
  (KV shortage, least recently stamped first) and the MAMBA walk (state shortage, a leaf)
  demote a backed-up leaf (device KV and state freed, the node stays with its host copy)
  and delete one that is not backed up. A tombstoned inner state stays on host if it was
  backed up.
- Host eviction (``components/full.py`` ``drive_host_eviction``, ``utc`` ``_evict_host_leaf``):
  host leaves (device-evicted, backed up, no children, unlocked), least recently stamped
  first (SGLang's LRU over ``last_access_time``); the node goes with its host KV and host
  state, and a parent left without children becomes a host leaf.
- Match (``utc`` ``_match_prefix_helper``): the walk goes on through device-evicted nodes
  that are backed up; the hit ends at the deepest node holding a state on either tier
  (the MAMBA validator with host values), the device hit at the deepest node whose KV and
  state are both on the device. What lies between is the host hit: the scheduler's
  ``init_load_back`` loads the evicted nodes' KV (making device room first, the path
  locked) and the state at the hit's end when only the host holds it. Its FLOPs saved
  count as a device hit's; ``HostStats`` adds the bytes loaded.
- An insert that walks through a device-evicted node restores its device KV from the
  request's own KV (``_unevict_node_on_insert``).

Not modelled: write_back (refused), the L3 store, host locks and the in-flight
write-through lock (the replay acknowledges every backup before the next request, and the
nodes a backup locks meanwhile are on the running request's locked path already, so
neither changes a decision there; only the in-flight mark itself is kept, ``_pending``),
the unified buffer (SGLang's host tier is built over the static pools only here, as
``ab`` builds it), marconi / marconi+.
"""
from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass

import numpy as np

from sglang_marconi.policy.stock import StockSGLangCache, _Node

# what this simulator builds, and the inserts that back a node up under each
# (``unified_radix_cache.py`` 558-560: ``write_through_threshold``)
WRITE_THROUGH_THRESHOLD = {"write_through": 1, "write_through_selective": 2}
WRITE_POLICIES = tuple(WRITE_THROUGH_THRESHOLD)


HICACHE_GB = 1e9  # --hicache-size is in 10**9 bytes (pool_host/mamba.py, mha.py)


def ratio_for_size(size_gb: float, spec, kv_tokens: int, mamba_slots: int) -> float:
    """Host slots per device slot for ``--hicache-size size_gb``, the same for both pools
    (SGLang's proportional split, ``hybrid_pool_assembler.py`` ``_split_hicache_size``)."""
    device_bytes = kv_tokens * spec.kv_bytes_per_token + mamba_slots * spec.ssm_state_bytes
    return size_gb * HICACHE_GB / device_bytes


DEFAULT_HICACHE_RATIO = 2.0  # SGLang's --hicache-ratio default in the host-cache mode


def host_ratio(size_gb, ratio, spec, kv_tokens: int, mamba_slots: int) -> float:
    """Host slots per device slot: from ``--hicache-size`` when given, else
    ``--hicache-ratio`` (SGLang's default when neither)."""
    if size_gb is None:
        return ratio or DEFAULT_HICACHE_RATIO
    return ratio_for_size(size_gb, spec, kv_tokens, mamba_slots)


@dataclass(frozen=True)
class HostPools:
    """The host tier's two pools: KV token slots and state slots."""

    kv_tokens: int
    state_slots: int
    write_policy: str = "write_through"

    @classmethod
    def from_ratio(cls, ratio: float, kv_tokens: int, state_slots: int,
                   write_policy: str = "write_through", page: int = 64) -> "HostPools":
        """``ratio`` host slots per device slot (SGLang's split of ``--hicache-size``),
        sized as SGLang sizes a host pool (``pool_host/base.py`` 226-229, ``pool_host/
        mamba.py`` 171-174): ``int(device slots x ratio)`` floored to its page, plus one
        page (KV: ``page`` tokens; states: one slot)."""
        kv = (int(kv_tokens * ratio) // page + 1) * page
        return cls(kv, int(state_slots * ratio) + 1, write_policy)


@dataclass
class HostStats:
    """What the host tier did (``ab``'s ``host`` section, the same names)."""

    hit_tokens: int = 0          # tokens of hits that continued on host
    flops_saved: float = 0.0     # of the FLOPs saved, what the host segments added
    kv_tokens_loaded: int = 0
    states_loaded: int = 0
    kv_tokens_backed_up: int = 0
    states_backed_up: int = 0
    kv_tokens_evicted: int = 0   # from the host pool
    states_evicted: int = 0      # from the state host pool (a full state pool only)
    bytes_loaded: float = 0.0
    bytes_backed_up: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


class _HostNode(_Node):
    __slots__ = ("dev", "hkv", "hstate", "inserts")

    def __init__(self, node_id: int, parent, key: np.ndarray):
        super().__init__(node_id, parent, key)
        self.dev = True      # KV on the device (False: evicted from it)
        self.hkv = False     # KV on the host (backed up)
        self.hstate = False  # the state on the host
        self.inserts = 0     # inserts through or ending on it (SGLang's ``hit_count``)


class StockHiCache(StockSGLangCache):
    """Stock SGLang with HiCache (write_through or write_through_selective), static pools,
    one request at a time."""

    def __init__(self, spec, capacity_bytes=None, *, host: HostPools | None = None,
                 kv_tokens: int, state_slots: int, **kwargs):
        host = host if host is not None else self.host  # a subclass may set it first
        if host.write_policy not in WRITE_POLICIES:
            raise ValueError(f"host tier: write policy {host.write_policy!r} is not built "
                             f"(built: {', '.join(WRITE_POLICIES)})")
        if host.kv_tokens < 0 or host.state_slots < 0:
            raise ValueError("host tier: pool sizes must be >= 0")
        super().__init__(spec, None, kv_tokens=kv_tokens, state_slots=state_slots, **kwargs)
        self.host = host
        self.host_stats = HostStats()
        self.host_kv_tokens = 0   # KV tokens the host pool holds
        self.host_states = 0      # states the host pool holds
        self._host_leaves: set = set()
        self._slot_loaded = False  # the load-back allocated the running request's slot
        self.threshold = WRITE_THROUGH_THRESHOLD[host.write_policy]
        self._inserted_len = 0  # what the running request inserted so far
        self._walked = None     # the last node an insert walked
        self._insert_kind = ""  # the running insert's snapshot kind (``_admit``)
        self._pending: set = set()  # backed up, not yet acknowledged
        # nodes whose state only the host holds, least recently demoted first (the MAMBA
        # component's host LRU list)
        self._host_state_lru: dict = {}

    @staticmethod
    def _new_node(node_id: int, parent, key: np.ndarray) -> _HostNode:
        return _HostNode(node_id, parent, key)

    # ---- device side ------------------------------------------------------------------------
    def _is_leaf(self, node) -> bool:
        return (node.dev and node.lock == 0
                and not any(c.dev for c in node.children.values()))

    @staticmethod
    def _device_kv(node) -> int:
        return len(node.key) if node.dev else 0

    def _evict_leaf(self, node) -> None:
        """A device leaf: demoted when the host holds its KV, deleted otherwise."""
        if not node.hkv and not node.children:
            self._delete(node)
            return
        node.dev = False  # demote (or, unbacked over host-only children, drop its KV)
        self.tree_kv_tokens -= len(node.key)
        st = self.stats
        st.evictions += 1
        st.kv_tokens_evicted += len(node.key)
        if node.state:
            node.state = False
            self.tree_states -= 1
            st.states_evicted += 1
            self._state_tombstoned(node)
        self._host_leaf_update(node)
        self._maybe_leaf(node.parent)

    def _state_tombstoned(self, node) -> None:
        if node.hstate:  # only the host holds it now: the state host pool's LRU takes it
            self._host_state_lru[node] = None

    def _state_inserted(self, node) -> None:
        super()._state_inserted(node)
        self._host_state_lru.pop(node, None)

    def _delete(self, node) -> None:
        super()._delete(node)
        self._host_leaf_update(node.parent)

    def _split(self, child, m: int):
        mid = super()._split(child, m)
        mid.dev, mid.hkv, mid.inserts = child.dev, child.hkv, child.inserts
        return mid

    def _child_added(self, node) -> None:
        self._host_leaf_update(node)

    # ---- the match and the load-back ----------------------------------------------------------
    def _matchable(self, node) -> bool:
        return node.dev or node.hkv  # a dead node (dropped, not backed up) ends the walk

    def _hit_can_end(self, node) -> bool:
        return node.state or node.hstate

    def _cow_slot(self, hit_node) -> None:
        if self._slot_loaded:  # the load-back gave the request its slot
            self._slot_loaded = False
            return
        super()._cow_slot(hit_node)

    def _match_end(self, best) -> None:
        self._inserted_len = 0  # a new request (its match opens it)
        if best is not self.root and best.state:
            self._mru_state(best)

    def _load_back(self, best, device_best) -> None:
        """``init_load_back``: the evicted nodes' KV and the state at ``best`` to device."""
        path, x = [], best
        while x is not self.root and not x.dev:
            path.append(x)
            x = x.parent
        tokens = sum(len(n.key) for n in path)
        loaded_state = not best.state
        self._lock(best)
        if loaded_state:  # ``prepare_load_back``: the request's own slot first
            self._make_room_states(1)
            self._run.slots += 1
            self._slot_loaded = True
        self._make_room_kv(tokens)  # ``_load_back_transfers``: the KV, then the node's slot
        for n in path:
            n.dev = True
            self.tree_kv_tokens += len(n.key)
            self._host_leaves.discard(n)
        if loaded_state:
            self._make_room_states(1)
            best.state = True
            self.tree_states += 1
            self._mru_state(best)
            self._host_state_lru.pop(best, None)
        self._unlock(best)
        hs = self.host_stats
        hs.hit_tokens += best.depth - device_best.depth
        hs.flops_saved += self.spec.flops_saved(best.depth, device_best.depth)
        hs.kv_tokens_loaded += tokens
        # a state only the host holds is copied twice: into the node's device slot and
        # into the request's own slot (``components/mamba.py`` build_hicache_transfers,
        # LOAD_BACK: both read its host value)
        states = 2 * loaded_state
        hs.states_loaded += states
        hs.bytes_loaded += tokens * self.kv_bytes + states * self.state_bytes

    # ---- inserts and backups ------------------------------------------------------------------
    def _insert_walked(self, node) -> None:
        if not node.dev:  # ``_unevict_node_on_insert``: the request's KV takes its place
            node.dev = True
            self.tree_kv_tokens += len(node.key)
            self._host_leaves.discard(node)
        self._walked = node
        # ``_finish_insert_walk_node``: nodes this request inserted already are not
        # counted; a backup is a barrier of the insert walk, run at once (before the
        # insert attaches its state to the node it ends on)
        if node.depth > self._inserted_len and self._counts_to_backup(node):
            self._backup_chain(node)

    def _insert_ended(self, node) -> None:
        """The insert's tail (``_should_backup_after_insert``): a new leaf counts too; an
        end node the host holds already backs up its new state alone, unless a backup of
        it is still in flight (``write_through_pending_id``: acknowledged by the next
        ``check_hicache_events``, which the replay calls after every insert but the
        last prefill chunk's publish)."""
        if node is not self._walked:  # a new leaf
            if self._counts_to_backup(node):
                self._backup_chain(node)
        elif node.hkv and node.state and not node.hstate and node not in self._pending:
            self._backup_chain(node)
        self._inserted_len = max(self._inserted_len, node.depth)
        if self._insert_kind != "prefill_end":
            self._pending.clear()

    def _admit(self, snapshot: int, kind: str) -> bool:
        self._insert_kind = kind  # the insert it precedes (stock takes every snapshot)
        return super()._admit(snapshot, kind)

    def _counts_to_backup(self, node) -> bool:
        """``_inc_hit_count_and_check``: one more insert through ``node``; whether that
        reaches the write policy's threshold on a node the host does not hold."""
        if not node.dev:
            return False
        node.inserts += 1
        return not node.hkv and node.inserts >= self.threshold

    def _backup_chain(self, target) -> None:
        """``_write_backup``: ``target`` and its unbacked ancestors, top-down, each node
        whatever the host lacks of it; the first failure ends the chain."""
        chain, x = [target], target.parent
        while x is not self.root and not x.hkv:
            chain.append(x)
            x = x.parent
        for x in reversed(chain):
            if (not x.hkv or (x.state and not x.hstate)) and not self._backup(x):
                return

    def _backup(self, node) -> bool:
        """Back up ``node``'s KV (unless the host holds it) and its device state (unless
        the host holds it): all or nothing (``_execute_kv_backup``, the host pools'
        ``resolve_host_transfers``)."""
        kv = 0 if node.hkv else len(node.key)
        state = node.state and not node.hstate
        if kv and not self._host_room_kv(kv):
            return False
        if state and not self._host_room_state():
            return False
        hs = self.host_stats
        if kv:
            node.hkv = True
            self.host_kv_tokens += kv
            hs.kv_tokens_backed_up += kv
        if state:
            node.hstate = True
            self.host_states += 1
            hs.states_backed_up += 1
        hs.bytes_backed_up += kv * self.kv_bytes + state * self.state_bytes
        self._pending.add(node)
        return True

    # ---- host side ----------------------------------------------------------------------------
    def _host_leaf_update(self, node) -> None:
        if node is not self.root and node.alive and not node.dev and node.hkv \
                and not node.children:
            self._host_leaves.add(node)
        else:
            self._host_leaves.discard(node)

    def _host_room_kv(self, tokens: int) -> bool:
        """Evict host leaves (unlocked), lowest ``_host_kv_entry`` first, until ``tokens``
        fit; a parent left a host leaf joins."""
        short = self.host_kv_tokens + tokens - self.host.kv_tokens
        if short <= 0:
            return True
        heap = self._host_kv_heap([n for n in self._host_leaves if n.lock == 0])
        while short > 0 and heap:
            key, _, node = heapq.heappop(heap)
            if node not in self._host_leaves:
                continue
            short -= len(node.key)
            self.host_stats.kv_tokens_evicted += len(node.key)
            parent = node.parent
            self._evict_host_leaf(node)
            self._host_kv_evicted(node, key)
            if parent in self._host_leaves and parent.lock == 0:  # a host leaf now
                heapq.heappush(heap, self._host_kv_entry(parent))
        return short <= 0

    def _host_room_state(self) -> bool:
        """A free state host slot; when the pool is full, the MAMBA host walk
        (``components/mamba.py`` ``drive_host_eviction``) frees host-only states (unlocked)
        in ``_host_state_victims`` order: a host leaf goes whole, any other node keeps its
        KV."""
        if self.host_states < self.host.state_slots:
            return True
        for key, victim in self._host_state_victims():
            if self.host_states < self.host.state_slots:
                break
            if victim not in self._host_state_lru or victim.lock:
                continue
            self.host_stats.states_evicted += 1
            if victim in self._host_leaves:
                self._evict_host_leaf(victim)
            else:
                del self._host_state_lru[victim]
                victim.hstate = False
                self.host_states -= 1
                self._host_state_dropped(victim)
            self._host_state_evicted(victim, key)
        return self.host_states < self.host.state_slots

    # ---- the host walks' order: SGLang's host LRU (a subclass ranks them its own way) ----------
    def _host_kv_heap(self, candidates) -> list:
        """A heap of ``_host_kv_entry``s: least recently stamped first."""
        heap = [self._host_kv_entry(n) for n in candidates]
        heapq.heapify(heap)
        return heap

    @staticmethod
    def _host_kv_entry(node) -> tuple:
        return (node.stamp, node.id, node)

    def _host_kv_evicted(self, node, key) -> None:
        """A host leaf went (``key``: its entry's key)."""

    def _host_state_victims(self):
        """(key, node) of the host-only states, the next victim first: least recently
        demoted first (the MAMBA component's host LRU list)."""
        return [(None, n) for n in self._host_state_lru]

    def _host_state_dropped(self, node) -> None:
        """The host state walk dropped ``node``'s host state and kept its KV."""

    def _host_state_evicted(self, node, key) -> None:
        """The host state walk freed ``node``'s host state slot (``key``: its rank)."""

    def _evict_host_leaf(self, node) -> None:
        node.alive = False
        self._host_leaves.discard(node)
        parent = node.parent
        del parent.children[self._child_key(node.key, 0)]
        self.num_nodes -= 1
        self.host_kv_tokens -= len(node.key)
        if node.hstate:
            self.host_states -= 1
            self._host_state_lru.pop(node, None)
        if parent is not self.root and not (parent.dev or parent.hkv or parent.children):
            self._evict_host_leaf_dead(parent)  # a dead node (unbacked, dropped) goes too
        else:
            self._host_leaf_update(parent)

    def _evict_host_leaf_dead(self, node) -> None:
        node.alive = False
        parent = node.parent
        del parent.children[self._child_key(node.key, 0)]
        self.num_nodes -= 1
        self._host_leaf_update(parent)

    # ---- checks -------------------------------------------------------------------------------
    def check(self) -> None:
        super().check()
        host_kv = host_states = 0
        stack = list(self.root.children.values())
        while stack:
            x = stack.pop()
            stack.extend(x.children.values())
            assert x.dev or x.hkv or x.children, x  # a dead node keeps only host children
            assert not x.dev or x.parent is self.root or x.parent.dev, x  # device: rooted
            assert not x.hkv or x.parent is self.root or x.parent.hkv, x  # host: rooted
            assert not x.state or x.dev, x
            host_kv += len(x.key) if x.hkv else 0
            host_states += x.hstate
            assert (x in self._host_state_lru) == (x.hstate and not x.state), x
            assert (x in self._host_leaves) == (not x.dev and x.hkv and not x.children), x
        assert (host_kv, host_states) == (self.host_kv_tokens, self.host_states)
        assert self.host_kv_tokens <= self.host.kv_tokens
        assert self.host_states <= self.host.state_slots
