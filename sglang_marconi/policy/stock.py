"""``StockSGLangCache``: stock SGLang 0.5.23's hybrid prefix cache as a simulator.

The simulator's ``sglang`` baseline: what a stock server keeps with ``--mamba-radix-cache-
strategy extra_buffer`` (its default for hybrid models) in one byte budget (the unified
buffer of ``--enable-unified-memory``), requests served one at a time as ``ab`` replays
them (``driver/replay.py``). It takes SGLang's decisions without SGLang: on the bundled
Mooncake trace (paper-7b, 100 GiB) every request's hit, every eviction and the free
buffer after every request equal ``ab``'s stock cache (``scripts/bench_baseline_
agreement.py``, ``tests/test_sglang_baseline.py``).

Where states are taken: ``policy.admission``'s ``sglang_*`` rules (chunk boundaries, branch
point, the last chunk's state, the last decode-track snapshot). What the cache adds is
SGLang's tree and allocator (paths relative to the installed ``sglang/srt/mem_cache/``):

- The tree (``unified_cache/unified_tree_core.py``): page-aligned keys; a node holds its
  edge's KV and at most one state, at its end. A match (the input minus its last token,
  floored to the page) stops at the deepest node with a state (the hit); where the KV
  match ends inside an edge the edge is split, and the split refreshes the suffix's
  recency. After a match the hit node and its ancestors are stamped most recent (ancestors
  slightly older); an insert stamps every node it walks, then the node it ends on. Nodes
  are never merged back.
- Eviction (``components/full.py``, ``unified_radix_cache.py::evict_for_alloc``): in the
  unified buffer every shortfall, of KV or of state bytes, runs the FULL walk: unlocked
  leaves, least recently stamped first, each deleted with its state; a parent left without
  children becomes a leaf with its own stamp. States on inner nodes are never freed for
  room. A lock (the running request's path) keeps a node out.
- The buffer (``allocator/unified_mamba.py``, ``unified_memory_pool.py``): KV in pages of
  ``page`` tokens, a state ``state bytes``; the KV side can use ``floor(free / page bytes)``
  pages, the state side ``floor(free / state bytes)`` slots. ``capacity_bytes`` is the
  buffer less SGLang's reserved slot 0: ``floor(unified bytes / page bytes) * page bytes -
  state bytes``.
- The running request (``driver/replay.py``'s calls): a copy-on-write slot for its hit, then
  per prefill chunk the working and tracking slots it lacks and its KV (evicting until
  ``chunk tokens + one page`` fit, SGLang's conservative demand); after every unfinished
  chunk, and after the last one when it goes on to decode, a new slot and the insert of
  the chunk's snapshot (the tree takes the state and the KV up to it); a page whenever
  decode fills one; at finish the insert of the last decode snapshot, then everything the
  request still held is freed. ``tracking_slots``: 1 without the overlap scheduler (``ab``'s
  unified pools), 2 under it (SGLang's default, and ``ab``'s static pools: the test kit's
  ``HybridReqToTokenPool`` keeps it on, its ping-pong track buffer takes 2 slots).

Static pools (SGLang's default layout, ``kv_tokens`` and ``state_slots`` given: ``ab
--memory static`` or ``--kv-tokens K --mamba-slots S``): a KV token pool of ``kv_tokens``
slots (whole pages) and a state pool of ``state_slots`` slots; the byte budget is then
ignored. A KV shortage runs the FULL walk as above. A state shortage runs the MAMBA walk
(``components/mamba.py``, ``_evict_device_next_node``): SGLang's MAMBA LRU list, a list of
its own over the nodes holding a state, least recent first, skipping the node the running
request's lock is anchored on (a MAMBA lock pins that node only; the FULL lock pins the
path). A node there enters the list (most recent) when an insert ends on it, and moves to
its head when a match consumes its state; ancestors are not refreshed, and a split leaves
the state (and its place) with the suffix. The victim, if it is an unlocked leaf, is
deleted with its KV; otherwise only its state is dropped (a tombstone: its KV stays).

Not modelled: several requests running at once (the simulator replays one at a time),
``--mamba-max-states-per-path``, HiCache (``sim`` without ``--paper`` drives SGLang's own).
"""
from __future__ import annotations

import heapq
import itertools

import numpy as np

from sglang_marconi.model.cost import CostModel
from sglang_marconi.policy.admission import (sglang_branch_point, sglang_chunk_end,
                                             sglang_chunk_snapshot, sglang_decode_snapshot,
                                             sglang_grid, sglang_track_grid)
from sglang_marconi.policy.cache import CacheStats
from sglang_marconi.policy.tree import as_tokens

MATCH_STAMP_STEP = 0.00001  # an ancestor's stamp after a match: the child's minus this


class _Node:
    __slots__ = ("id", "parent", "children", "key", "depth", "state", "lock", "stamp",
                 "alive", "anchor", "mstamp")

    def __init__(self, node_id: int, parent, key: np.ndarray):
        self.id = node_id
        self.parent = parent
        self.children: dict = {}
        self.key = key
        self.depth = (parent.depth if parent is not None else 0) + len(key)
        self.state = False
        self.lock = 0
        self.stamp = 0.0
        self.alive = True
        self.anchor = 0  # MAMBA locks: the running request's lock is anchored here
        self.mstamp = 0  # its place in the MAMBA LRU list (static pools)

    def __repr__(self) -> str:
        return (f"_Node(id={self.id}, depth={self.depth}, edge={len(self.key)}, "
                f"state={self.state}, children={len(self.children)}, lock={self.lock})")


class _Running:
    """What the running request holds outside the tree."""

    __slots__ = ("pages", "slots")

    def __init__(self):
        self.pages = 0  # KV pages of its row not owned by the tree
        self.slots = 0  # state slots (working, tracking, a fresh one before a publish)


class StockSGLangCache:
    """Stock SGLang's cache (``extra_buffer``, unified buffer) driven one request at a time.

    ``process(input_tokens, full_tokens)`` replays one request and returns its hit;
    ``full_tokens`` = input + output minus the last sampled token (the simulator's
    ``Request.full_tokens``), so the output length is ``len(full) - len(input) + 1``.
    ``capacity_bytes=None`` is unlimited. ``chunk`` = ``--chunked-prefill-size`` (<= 0: off),
    ``track`` = ``--mamba-track-interval``, ``page`` = ``--page-size``; the checkpoint grid
    is ``lcm(64, page)``. ``kv_tokens`` and ``state_slots`` (both or neither): SGLang's
    static two pools instead of one byte budget (``capacity_bytes`` is then ignored)."""

    alpha = 0.0  # LRU (the runner reports it)

    def __init__(self, spec: CostModel, capacity_bytes: int | None = None, *,
                 chunk: int = 8192, track: int = 256, page: int = 64,
                 tracking_slots: int = 1, record_hits: bool = False,
                 kv_tokens: int | None = None, state_slots: int | None = None):
        if min(track, page) < 1 or tracking_slots < 0:
            raise ValueError("track and page must be >= 1, tracking_slots >= 0")
        if (kv_tokens is None) != (state_slots is None):
            raise ValueError("static pools need both kv_tokens and state_slots")
        self.static = kv_tokens is not None
        if self.static:
            if kv_tokens < page or state_slots < 1:
                raise ValueError("static pools: kv_tokens >= page, state_slots >= 1")
            capacity_bytes = None
            self.kv_tokens = kv_tokens // page * page  # the paged allocator's whole pages
            self.state_slots = state_slots
        else:
            self.kv_tokens = self.state_slots = None
        self.spec, self.capacity = spec, capacity_bytes
        self.kv_bytes = int(spec.kv_bytes_per_token)
        self.state_bytes = int(spec.ssm_state_bytes)
        self.page, self.chunk = page, chunk
        self.grid = sglang_grid(page)
        self.track_grid = sglang_track_grid(self.grid, track)
        self.tracking_slots = tracking_slots
        self.record_hits = record_hits
        self.stats = CacheStats()
        self.root = self._new_node(0, None, np.empty(0, np.int64))
        self.root.lock = 1  # never evicted
        self._ids = itertools.count(1)
        self._clock = 0.0
        self._leaves: list = []  # (stamp, id, node) of leaves, stale entries skipped
        self._mclock = 0
        self._states_lru: list = []  # static: (mstamp, id, node) of states, stale skipped
        self.num_nodes = 1
        self.tree_kv_tokens = 0
        self.tree_states = 0
        self._run = _Running()
        self.stuck = 0  # allocations short of room, nothing left to evict (SGLang: OOM)

    # ---- bytes ------------------------------------------------------------------------------
    @property
    def tree_bytes(self) -> int:
        return self.tree_kv_tokens * self.kv_bytes + self.tree_states * self.state_bytes

    def _used(self) -> int:
        run = self._run
        return (self.tree_bytes + run.pages * self.page * self.kv_bytes
                + run.slots * self.state_bytes)

    def free_bytes(self) -> float:
        return float("inf") if self.capacity is None else self.capacity - self._used()

    def kv_available(self) -> float:
        """KV tokens the buffer (static: the KV pool) can hand out now (whole pages)."""
        if self.static:
            return self.kv_tokens - self.tree_kv_tokens - self._run.pages * self.page
        if self.capacity is None:
            return float("inf")
        page_bytes = self.page * self.kv_bytes
        return self.free_bytes() // page_bytes * self.page

    def states_available(self) -> float:
        """State slots the buffer (static: the state pool) can hand out now."""
        if self.static:
            return self.state_slots - self.tree_states - self._run.slots
        return self.free_bytes() // self.state_bytes

    def _make_room_kv(self, tokens: int) -> None:
        if self.capacity is None and not self.static:
            return
        while self.kv_available() < tokens:
            if not self._evict_one():
                self.stuck += 1
                return

    def _make_room_states(self, slots: int) -> None:
        if self.capacity is None and not self.static:
            return
        evict = self._evict_state if self.static else self._evict_one
        while self.states_available() < slots:
            if not evict():
                self.stuck += 1
                return

    def _note_peak(self) -> None:
        self.stats.peak_bytes = max(self.stats.peak_bytes, self._used())

    # ---- hooks a policy run inside SGLang's cache overrides (``policy.in_sglang``) -----------
    @staticmethod
    def _new_node(node_id: int, parent, key: np.ndarray) -> _Node:
        return _Node(node_id, parent, key)

    def _child_added(self, node: _Node) -> None:
        """``node`` got a new child (an insert)."""

    def _match_end(self, best: _Node) -> None:
        """The match ends at ``best`` (the root: no hit), before its path is stamped."""
        if best is not self.root:
            self._mru_state(best)  # MATCH_END: the consumed state only

    def _state_inserted(self, node: _Node) -> None:
        """An insert ended on ``node``, which holds a state now (new or not)."""
        self._mru_state(node)

    def _branch(self, tokens: np.ndarray, hit: int, kv: int) -> int:
        """The branch point the match reports (``mamba_branching_seqlen``; 0: none)."""
        return sglang_branch_point(kv, hit, self.grid)

    def _admit(self, snapshot: int, kind: str) -> bool:
        """Whether the tree takes the request's snapshot at ``snapshot``; ``kind``: "chunk"
        (an unfinished prefill chunk), "prefill_end" (the last chunk, the request goes on to
        decode), "final" (the last tracked snapshot not yet published, at finish; 0: none).
        Stock SGLang takes all."""
        return True

    def _finished(self, full: np.ndarray, hit_node: _Node) -> None:
        """The request is released (after its final insert and unlock)."""

    def _is_leaf(self, node: _Node) -> bool:
        """A leaf the FULL walk may evict (besides not the root): no children, unlocked."""
        return not node.children and node.lock == 0

    def _evict_leaf(self, node: _Node) -> None:
        """Evict a leaf the FULL or MAMBA walk chose: delete it with its state."""
        self._delete(node)

    @staticmethod
    def _device_kv(node: _Node) -> int:
        """KV tokens ``node`` holds in the device pool."""
        return len(node.key)

    # ---- recency ----------------------------------------------------------------------------
    def _tick(self) -> float:
        t = self._clock
        self._clock += 1.0
        return t

    def _stamp(self, node: _Node, t: float) -> None:
        node.stamp = t
        self._maybe_leaf(node)

    def _maybe_leaf(self, node: _Node) -> None:
        if node is not self.root and self._is_leaf(node):
            heapq.heappush(self._leaves, (node.stamp, node.id, node))
            if len(self._leaves) > 2 * self.num_nodes + 1024:
                self._leaves = [e for e in self._leaves if self._is_victim(e)]
                heapq.heapify(self._leaves)

    def _is_victim(self, entry) -> bool:
        stamp, _, node = entry
        return node.alive and node.stamp == stamp and self._is_leaf(node)

    # ---- locks (the running request's path) -------------------------------------------------
    def _lock(self, node: _Node) -> None:
        node.anchor += 1
        while node is not self.root:
            node.lock += 1
            node = node.parent

    def _unlock(self, node: _Node) -> None:
        node.anchor -= 1
        while node is not self.root:
            node.lock -= 1
            if node.lock == 0:
                self._maybe_leaf(node)
            node = node.parent

    # ---- the tree ---------------------------------------------------------------------------
    def _child_key(self, tokens: np.ndarray, pos: int) -> bytes:
        return tokens[pos:pos + self.page].tobytes()

    def _common_pages(self, a: np.ndarray, b: np.ndarray) -> int:
        """Length of the common prefix of ``a`` and ``b`` in whole pages (tokens)."""
        n = min(len(a), len(b))
        if n == 0:
            return 0
        neq = a[:n] != b[:n]
        i = int(neq.argmax())
        c = n if not neq[i] else i
        return c // self.page * self.page

    def _split(self, child: _Node, m: int) -> _Node:
        """``_split_node``: a new parent holds the first ``m`` tokens of ``child``'s edge."""
        parent = child.parent
        old_key = self._child_key(child.key, 0)
        mid = self._new_node(next(self._ids), parent, child.key[:m])
        mid.stamp = self._tick()
        self._tick()  # its creation time
        mid.lock = child.lock
        child.key = child.key[m:]
        child.parent = mid
        mid.children[self._child_key(child.key, 0)] = child
        parent.children[old_key] = mid
        self.num_nodes += 1
        self._stamp(child, self._tick())  # the split stamps the suffix
        return mid

    def _match(self, key: np.ndarray):
        """(hit node, KV match length) of a page-aligned key; stamps the hit's path."""
        node, pos, best, kv = self.root, 0, self.root, 0
        while pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            m = self._common_pages(child.key, key[pos:])
            kv += m
            if m < len(child.key):
                self._split(child, m)
                break
            node = child
            if node.state:
                best = node
            pos += m
        self._match_end(best)
        t = self._tick()
        x = best
        while x is not self.root:
            self._stamp(x, t)
            t -= MATCH_STAMP_STEP
            x = x.parent
        return best, kv

    def _insert(self, tokens: np.ndarray, length: int):
        """``tokens[:length]`` with a state at ``length``: (its node, whether it held one)."""
        node, pos = self.root, 0
        while pos < length:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            self._stamp(child, self._tick())
            m = self._common_pages(child.key, tokens[pos:length])
            if m < len(child.key):
                child = self._split(child, m)
            node, pos = child, pos + m
        if pos < length:
            leaf = self._new_node(next(self._ids), node, tokens[pos:length].copy())
            node.children[self._child_key(leaf.key, 0)] = leaf
            self._child_added(node)
            self.num_nodes += 1
            self.tree_kv_tokens += length - pos
            leaf.state = True
            self.tree_states += 1
            self.stats.states_admitted += 1
            self._stamp(leaf, self._tick())
            self._tick()  # its creation time
            self._state_inserted(leaf)
            return leaf, False
        existed = node.state
        if not existed:
            node.state = True
            self.tree_states += 1
            self.stats.states_admitted += 1
        self._stamp(node, self._tick())
        self._state_inserted(node)
        return node, existed

    def _evict_one(self) -> bool:
        """Delete the least recently stamped unlocked leaf (with its state)."""
        heap = self._leaves
        while heap:
            entry = heapq.heappop(heap)
            if self._is_victim(entry):
                self._evict_leaf(entry[2])
                return True
        return False

    # ---- the MAMBA LRU list (static pools) --------------------------------------------------
    def _mru_state(self, node: _Node) -> None:
        if not self.static:
            return
        self._mclock += 1
        node.mstamp = self._mclock
        heapq.heappush(self._states_lru, (node.mstamp, node.id, node))
        if len(self._states_lru) > 2 * self.num_nodes + 1024:
            self._states_lru = [e for e in self._states_lru
                                if e[2].alive and e[2].state and e[2].mstamp == e[0]]
            heapq.heapify(self._states_lru)

    def _evict_state(self) -> bool:
        """One step of the MAMBA walk: the least recent state not anchoring a lock; an
        unlocked leaf goes with its KV, any other node keeps its KV (a tombstone)."""
        heap, held = self._states_lru, []
        victim = None
        while heap:
            entry = heapq.heappop(heap)
            stamp, _, node = entry
            if not (node.alive and node.state and node.mstamp == stamp):
                continue
            if node.anchor:
                held.append(entry)
                continue
            victim = node
            break
        for entry in held:
            heapq.heappush(heap, entry)
        if victim is None:
            return False
        if self._is_leaf(victim):
            self._evict_leaf(victim)
        else:
            victim.state = False
            self.tree_states -= 1
            self.stats.states_evicted += 1
        return True

    def _delete(self, node: _Node) -> None:
        node.alive = False
        parent = node.parent
        del parent.children[self._child_key(node.key, 0)]
        self.num_nodes -= 1
        self.tree_kv_tokens -= len(node.key)
        st = self.stats
        st.evictions += 1
        st.nodes_deleted += 1
        st.kv_tokens_evicted += len(node.key)
        if node.state:
            self.tree_states -= 1
            st.states_evicted += 1
        self._maybe_leaf(parent)

    # ---- one request ------------------------------------------------------------------------
    def process(self, input_tokens, full_tokens) -> int:
        tokens = as_tokens(input_tokens)
        full = as_tokens(full_tokens)
        n = len(tokens)
        out = max(1, len(full) - n + 1)
        st = self.stats
        st.requests += 1
        st.input_tokens += n
        st.prefill_flops += self.spec.prefill_flops(n)

        # the match: the input minus its last token, page-aligned
        hit_node, kv = self._match(tokens[:(n - 1) // self.page * self.page])
        hit = hit_node.depth
        if hit:
            st.hit_tokens += hit
            st.hit_requests += 1
            st.flops_saved += self.spec.flops_saved(hit, 0)
        if self.record_hits:
            st.per_request_hits.append(hit)
        branch = self._branch(tokens, hit, kv)

        run = self._run
        working = hit_node is not self.root
        if working:  # copy-on-write of the hit's state into the request's slot (hit locked)
            self._lock(hit_node)
            self._make_room_states(1)
            self._unlock(hit_node)
            self._run.slots += 1
        locked = hit_node
        self._lock(locked)
        tracking = False
        prefix = hit
        snapshot = 0
        while True:  # the prefill, chunk by chunk
            end = sglang_chunk_end(prefix, n, self.chunk, self.page, self.grid)
            need = (0 if working else 1) + (0 if tracking else self.tracking_slots)
            if need:
                self._make_room_states(need)
                run.slots += need
            working = tracking = True
            self._make_room_kv(end - prefix + self.page)
            run.pages += self._pages(end) - self._pages(prefix)
            self._note_peak()
            snapshot = sglang_chunk_snapshot(prefix, end, branch, self.grid) or snapshot
            if end >= n:
                break
            if snapshot and self._admit(snapshot, "chunk"):
                locked = self._publish(full, snapshot, locked, end)
            snapshot = 0
            prefix = end
        last = snapshot  # the last prefill chunk's snapshot
        published = out > 1 and last and self._admit(last, "prefill_end")
        if published:  # the prefill completes and the request goes on to decode
            locked = self._publish(full, last, locked, n)
        # decode: KV for each output token but the last, a page whenever one fills up
        for _ in range(self._pages(n + out - 1) - self._pages(n)):
            self._make_room_kv(self.page)
            run.pages += 1
            self._note_peak()
        # at finish the last tracked snapshot not yet published goes to the tree with its
        # KV (``_select_finished_checkpoint``): the last decode snapshot, else the last
        # chunk's; 0: none, the tree is still asked (``prepare_for_caching_req``)
        final = sglang_decode_snapshot(n, out, self.track_grid) or (0 if published else last)
        if self._admit(final, "final") and final:
            node, _ = self._insert(full, final)
            self._unlock(locked)
            locked = node
            self._lock(locked)
        run.pages = run.slots = 0
        self._unlock(locked)
        self._finished(full, hit_node)
        return hit

    def _pages(self, tokens: int) -> int:
        return -(-tokens // self.page)

    def _publish(self, full: np.ndarray, snapshot: int, locked: _Node, allocated: int) -> _Node:
        """``checkpoint_kv_cache`` of a running request: a fresh slot replaces the tracking
        slot the tree takes (freed instead if the tree holds that state already), the tree
        takes the KV up to the snapshot, and the request's lock moves there."""
        run = self._run
        self._make_room_states(1)
        run.slots += 1
        self._note_peak()
        node, _ = self._insert(full, snapshot)
        run.slots -= 1  # the tracking slot went to the tree (or was freed: it had one)
        run.pages = self._pages(allocated) - snapshot // self.page
        self._unlock(locked)
        self._lock(node)
        return node

    # ---- checks -----------------------------------------------------------------------------
    def check(self) -> None:
        """Recompute the accounting from the nodes; raise AssertionError on a mismatch."""
        kv = states = nodes = 0
        stack = [self.root]
        while stack:
            x = stack.pop()
            nodes += 1
            stack.extend(x.children.values())
            if x is self.root:
                continue
            assert len(x.key) and len(x.key) % self.page == 0, x
            assert x.parent.children.get(self._child_key(x.key, 0)) is x, x
            assert x.depth == x.parent.depth + len(x.key), x
            assert x.lock >= 0, x
            kv += self._device_kv(x)
            states += x.state
        assert (kv, states, nodes) == (self.tree_kv_tokens, self.tree_states, self.num_nodes)
        if self.static:
            assert min(self.kv_available(), self.states_available()) >= 0 or self.stuck
        elif self.capacity is not None:
            assert self._used() <= self.capacity or self.stuck
