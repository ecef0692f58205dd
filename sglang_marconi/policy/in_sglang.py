"""``MarconiSGLangCache``: marconi / marconi+ as the ``--cache-policy marconi`` plugin runs
them in SGLang's unified buffer or its static pools, as a simulator (``sim --policies
marconi+:materialise=sglang[:kv_tokens=K:state_slots=S]``).

Why a cache of its own. The planning simulator (``cache.PrefixCache``) makes room when a
request's states are inserted, to a fixed budget, with the request's matched path locked.
Inside SGLang (``sglang_integration.unified``) room is made while the request *allocates*:
a copy-on-write slot for its hit, per prefill chunk its working and tracking slots and
its KV (the whole chunk, plus a page), a fresh slot before each publish, a page whenever
decode fills one; only the hit node's state is locked (SGLang's MAMBA lock), the path's
KV is (its FULL lock). So SGLang evicts for KV the request will not keep (a prompt tail
beyond its last admitted state), before it knows which states it keeps, and may drop the
states of the hit's ancestors. That was the eviction gap of issue 18 (measured by
``scripts/bench_baseline_agreement.py --caches marconi+``): the first divergence on the
bundled trace was a 32K-token request for which SGLang evicted 13 chain states to hold
its prompt while the planning simulator, inserting only up to its last chunk state,
evicted none.

So this cache is ``stock.StockSGLangCache`` (SGLang's tree, buffer, running request and
call sequence, held equal to ``ab``'s stock SGLang request for request) with the plugin's
two halves in place of stock's:

- admission (``_admit``): the plugin's decision on each snapshot SGLang offers
  (``sglang_integration.admission_plans``): the planned branch state always; an unfinished
  chunk's snapshot while the per-request budget lasts (none by default: no cap); the last
  prefill chunk's snapshot and the final decode snapshot as end states, under marconi+'s
  learned end-state rule (``likelihood.EndStateUsefulness``, counted once per request when
  the first end state is offered); a snapshot declined stays with the request (no fresh
  slot, its KV freed at finish). Branch points: SGLang's rule, or the ghost index's
  (marconi+) on the grid when it lies further.
- eviction (``_evict_for``): the joint walk (``unified.JointWalk``): every unlocked leaf
  (its KV and its state) and every unlocked state on an inner node (its state only),
  ranked together by the shared rules (``ranking.ranked_efficiency`` per byte freed in the
  buffer, marconi+'s ``ReuseWeight``, ``VictimQueue`` in GDSF or normalised mode), in a
  walk-local queue built at the start of each allocation's walk; a parent that becomes a
  leaf joins it. The aging base of a candidate is the GDSF clock when its persistent
  queue entry was last re-stamped, as in the plugin's two persistent queues: a state when
  it is inserted or consumed by a hit (stamped on the request clock, an insert half a
  tick after the hit), a leaf when it becomes an evictable leaf or its recency moves
  (released by the running request, split, walked by an insert); their insertion order
  (the queues' entry order, leaves first) and recency break ties as the walk's sort does.

Static pools (``kv_tokens`` and ``state_slots``: SGLang's default layout, ``ab --memory
static``): the plugin's two persistent queues walk separately. A KV shortage runs the FULL
walk: evictable leaves, ranked by the FLOPs a hit there saves per byte of the leaf's own
KV (``kv_pool_efficiency``), keyed on SGLang's FULL queue, whose GDSF clock advances with
each victim it hands over, so a parent left a leaf joins from the clock of that moment. A
state shortage runs the MAMBA walk on the MAMBA queue's own clock: unlocked states ranked
by the FLOPs per state (``state_pool_efficiency``); a leaf goes with its KV, an inner node
keeps its KV (a tombstone). Ties go to the earlier entry (a leaf re-stamped is re-keyed
last). Equal to ``ab --memory static``'s marconi+ request for request and victim for
victim on the bundled trace (``scripts/bench_baseline_agreement.py --memory static
--caches marconi+``, ``tests/test_parity_pressure.py``).

Not modelled: SGLang's Mamba slot ids (4,006 for paper-7b at 100 GiB: never short before
bytes are), alpha tuning (``alpha=auto|online`` keep the planning simulator, and refuse
static pools), the plugin's amortised renormalisation of a fixed alpha's static queues
above ``renormalise_limit`` candidates (the simulator renormalises at every walk), and the
re-keys the plugin's persistent MAMBA queue makes during a walk (the states below a
dropped state, a chain parent left without children): the static MAMBA walk here keys its
candidates once per walk (a review patched them in and found no request with a different
hit over 12 to 100 state slots, both models, marconi+ and marconi at alpha 1).
"""
from __future__ import annotations

import bisect

import numpy as np

from sglang_marconi.model.cost import CostModel
from sglang_marconi.policy.admission import SGLangGrids, sglang_branch_point
from sglang_marconi.policy.defaults import INSERT_CLOCK_OFFSET, NO_CAP
from sglang_marconi.policy.ghost import GhostIndex
from sglang_marconi.policy.likelihood import EndStateUsefulness, ReuseWeight
from sglang_marconi.policy.ranking import LinkedTree, freed_bytes, ranked_efficiency
from sglang_marconi.policy.scoring import VictimQueue
from sglang_marconi.policy.snapshot_admission import SnapshotAdmission, SnapshotPlan, new_plan
from sglang_marconi.policy.stock import StockSGLangCache, _Node


class _MarconiNode(_Node):
    """A tree node with what the plugin keeps on SGLang's nodes: the state's stamp on the
    request clock, the aging bases of its two queue entries, marconi+'s hit counters."""

    __slots__ = ("used", "state_base", "leaf_base", "leaf_stamp", "hit_score", "last_hit",
                 "max_children")

    def __init__(self, node_id: int, parent, key: np.ndarray):
        super().__init__(node_id, parent, key)
        self.used = 0.0          # request clock of the state's last insert / hit
        self.state_base = 0.0    # GDSF clock when ``used`` last moved
        self.leaf_base = 0.0     # GDSF clock when it last became a leaf / its stamp moved
        self.leaf_stamp = None   # the SGLang stamp its leaf entry was keyed with
        self.hit_score = 0.0
        self.last_hit = 0
        self.max_children = 0


class _Tree(LinkedTree):
    """``ranking.TreeAdapter`` over ``_MarconiNode``s."""

    @staticmethod
    def depth(node) -> int:
        return node.depth

    @staticmethod
    def has_state(node) -> bool:
        return node.state


TREE = _Tree()
JOINT, KV, STATES = "joint", "kv", "states"  # what a walk frees: the buffer, or one pool


class MarconiSGLangCache(SnapshotAdmission, StockSGLangCache):
    """marconi (fixed ``alpha``) or marconi+ (``reuse_weight`` given) inside SGLang's
    unified buffer of ``capacity_bytes`` (see the module doc). ``grids``: SGLang's chunk,
    page and decode-track grids; ``tracking_slots``: 2 under the overlap scheduler (``ab``'s
    default loop), 1 without."""

    def __init__(self, spec: CostModel, capacity_bytes: int | None, *,
                 grids: SGLangGrids = SGLangGrids(), alpha: float = 0.0,
                 reuse_weight: ReuseWeight | None = None, ghost_tokens: int | None = None,
                 end_threshold: float | None = None, max_states_per_request: int = NO_CAP,
                 tracking_slots: int = 2, record_hits: bool = False,
                 kv_tokens: int | None = None, state_slots: int | None = None):
        super().__init__(spec, capacity_bytes, chunk=grids.chunk, page=grids.page,
                         track=grids.track_grid, tracking_slots=tracking_slots,
                         record_hits=record_hits, kv_tokens=kv_tokens,
                         state_slots=state_slots)
        if (self.grid, self.track_grid) != (grids.grid, grids.track_grid):
            raise ValueError(f"grids {grids} are not SGLang's for page {grids.page}")
        self.alpha = float(alpha)
        self.reuse = reuse_weight
        self.mode = "gdsf" if reuse_weight is not None else "marconi"
        self.max_states = max_states_per_request
        self.ghost = GhostIndex(ghost_tokens) if ghost_tokens else None
        if end_threshold is not None and self.ghost is None:
            raise ValueError("learned end-state admission needs the ghost index")
        self.end_usefulness = (EndStateUsefulness(end_threshold)
                               if end_threshold is not None else None)
        self.clock = 0            # the request clock: one tick per request's match
        self.gdsf_clock = 0.0     # the persistent queues' aging clock (static: FULL's)
        self.mamba_clock = 0.0    # static pools: the MAMBA queue's own aging clock
        self._counters = ([], [])  # (SGLang stamp, request clock) at each request's match
        # the persistent queues' live entries, in their insertion order
        self._leaves_live: dict = {}
        self._states_live: dict = {}
        self._plan: SnapshotPlan | None = None
        self._input_len = 0
        self._lru = self.mode == "marconi" and self.alpha == 0.0  # the plugin runs SGLang's

    # ---- the tree's events -------------------------------------------------------------------
    @staticmethod
    def _new_node(node_id: int, parent, key: np.ndarray) -> _MarconiNode:
        return _MarconiNode(node_id, parent, key)

    def _evictable_leaf(self, node) -> bool:
        return (node is not self.root and node.alive and not node.children
                and node.lock == 0)

    def _maybe_leaf(self, node) -> None:
        """A node became a leaf or was stamped: the FULL queue's entry (``_LeafSet``)."""
        if self._lru:  # SGLang's own walk: stock's leaf heap
            super()._maybe_leaf(node)
            return
        if not self._evictable_leaf(node):
            return
        if node not in self._leaves_live:
            self._leaves_live[node] = None
            node.leaf_base, node.leaf_stamp = self.gdsf_clock, node.stamp
        elif node.leaf_stamp != node.stamp:
            node.leaf_base, node.leaf_stamp = self.gdsf_clock, node.stamp
            if self.static:  # re-keyed in SGLang's FULL queue: last among equal keys
                del self._leaves_live[node]
                self._leaves_live[node] = None

    def _child_added(self, node) -> None:
        self._leaves_live.pop(node, None)
        if node.state:
            node.max_children = max(node.max_children, len(node.children))

    def _use_state(self, node, stamp: float) -> None:
        """The MAMBA queue's entry of ``node``'s state, re-stamped at ``stamp``."""
        if node.used != stamp:
            node.used = stamp
            node.state_base = self.mamba_clock if self.static else self.gdsf_clock
        node.max_children = max(node.max_children, len(node.children))
        if node.anchor == 0 and node not in self._states_live:
            self._states_live[node] = None

    def _match_end(self, best) -> None:
        stamps, clocks = self._counters
        if not clocks or clocks[-1] != self.clock:
            stamps.append(self._clock)  # the stamp this match gives its hit path
            clocks.append(self.clock)
        if best is not self.root:
            self._use_state(best, self.clock)
            if self._lru:
                self._mru_state(best)  # static pools: SGLang's own MAMBA walk

    def _state_inserted(self, node) -> None:
        self._use_state(node, self.clock + INSERT_CLOCK_OFFSET)
        if self._lru:
            self._mru_state(node)

    def _lock(self, node) -> None:
        super()._lock(node)
        if node.anchor == 1:  # SGLang's MAMBA lock: the state leaves the ranking
            self._states_live.pop(node, None)
        x = node
        while x is not self.root:
            if x.lock == 1:
                self._leaves_live.pop(x, None)
            x = x.parent

    def _unlock(self, node) -> None:
        super()._unlock(node)  # a node whose FULL lock ends is a leaf again: _maybe_leaf
        if node.anchor == 0 and node.state and node is not self.root:
            self._states_live[node] = None  # resumed: its place among equal keys is new

    def _delete(self, node) -> None:
        self._leaves_live.pop(node, None)
        self._states_live.pop(node, None)
        super()._delete(node)

    def _drop_state(self, node) -> None:
        """The joint walk frees an inner node's state; its KV stays (a tombstone)."""
        node.state = False
        self.tree_states -= 1
        self._states_live.pop(node, None)
        node.hit_score, node.last_hit = 0.0, 0  # the plugin's ``forget_hits``
        node.max_children = len(node.children)
        st = self.stats
        st.evictions += 1
        st.states_evicted += 1
        st.states_dropped += 1

    # ---- the joint walk ------------------------------------------------------------------
    def _recency(self, node) -> float:
        """``unified.joint_recency``: a state's stamp, else the request clock of the match
        that last stamped the node."""
        if node.state:
            return node.used
        stamps, clocks = self._counters
        i = bisect.bisect_right(stamps, node.stamp) - 1
        return clocks[i] if i >= 0 else 0

    def _weight(self, node) -> float:
        node.max_children = max(node.max_children, len(node.children))
        return self.reuse(node)

    def _efficiency(self, node, leaf: bool, pool: str = JOINT) -> float:
        """Ranked FLOP efficiency per byte the eviction frees: in the unified buffer
        (``JOINT``: a leaf's KV and state, an inner node's state), in the static token pool
        (``KV``: the node's own KV tokens, ``kv_pool_efficiency``) or in the static state
        pool (``STATES``: one state, ``state_pool_efficiency``)."""
        if pool == KV:
            freed = self.kv_bytes * len(node.key)
        elif pool == STATES:
            freed = self.state_bytes
        else:
            freed = freed_bytes(self.kv_bytes, self.state_bytes, len(node.key), leaf,
                                node.state)
        return ranked_efficiency(self.spec, TREE, node, freed,
                                 self._weight if self.reuse is not None else None)

    def _state_candidate(self, node) -> bool:
        return node.alive and node.state and node.anchor == 0 and node is not self.root

    def _valid(self, node, pool: str = JOINT) -> bool:
        if pool == KV:
            return self._evictable_leaf(node)
        if pool == STATES:
            return self._state_candidate(node)
        return self._evictable_leaf(node) or self._state_candidate(node)

    def _add(self, queue: VictimQueue, node, base: float, pool: str = JOINT) -> None:
        if self._valid(node, pool):
            # SGLang's FULL queue ranks leaves by their last access (the tree's stamp)
            recency = node.stamp if pool == KV else self._recency(node)
            queue.add_aged(node, recency,
                           self._efficiency(node, self._evictable_leaf(node), pool), base)

    def _candidates(self, pool: str) -> list:
        """(node, aging base) of a walk's candidates, in the order its queue takes them
        (ties in it go to the earlier): the unified joint walk sorts both persistent
        queues' entries by recency; a static pool's walk takes its own queue's entries in
        the order they were last re-stamped (``VictimQueue``'s insertion order)."""
        if pool == STATES:
            return sorted(((n, n.state_base) for n in self._states_live),
                          key=lambda e: e[0].used)
        if pool == KV:
            return [(n, n.leaf_base) for n in self._leaves_live]
        bases = {node: node.leaf_base for node in self._leaves_live}
        bases.update((node, node.state_base) for node in self._states_live)
        return [(node, bases[node]) for node in sorted(bases, key=self._recency)]

    def _evict_for(self, enough, pool: str = JOINT) -> None:
        """One allocation's walk: evict in the ranking of ``pool`` until ``enough()``:
        ``JOINT`` (unified buffer: leaves and inner states together), ``KV`` (static
        pools, SGLang's FULL walk: evictable leaves, each deleted with its state) or
        ``STATES`` (static pools, the MAMBA walk: unlocked states; a leaf goes with its
        KV, an inner node keeps its KV as a tombstone)."""
        if enough():
            return
        if self._lru:
            evict = self._evict_state if pool == STATES else self._evict_one
            while not enough():
                if not evict():
                    self.stuck += 1
                    return
            return
        queue = VictimQueue(self.alpha, mode=self.mode)
        queue.clock = self.mamba_clock if pool == STATES else self.gdsf_clock
        for node, base in self._candidates(pool):
            self._add(queue, node, base, pool)
        queue.refresh()
        pending = None
        while not enough():
            if (pending is not None and pending is not self.root
                    and pending not in queue and self._evictable_leaf(pending)):
                self._add(queue, pending, queue.clock, pool)
            pending = None
            while (x := queue.pop_victim()) is not None and not self._valid(x, pool):
                pass
            if x is None:
                self.stuck += 1
                break
            if pool == KV:
                # the static FULL walk ages SGLang's FULL queue itself: a parent left a
                # leaf by this deletion joins it from the clock as it is now
                self.gdsf_clock = queue.clock
            if self._evictable_leaf(x):
                pending = x.parent if pool != STATES else None
                self._evict_leaf(x)
            else:
                self._drop_state(x)
        if pool == STATES:
            self.mamba_clock = max(self.mamba_clock, queue.clock)
        else:
            self.gdsf_clock = max(self.gdsf_clock, queue.clock)

    def _make_room_kv(self, tokens: int) -> None:
        if self.static:
            self._evict_for(lambda: self.kv_available() >= tokens, KV)
        elif self.capacity is not None:
            self._evict_for(lambda: self.kv_available() >= tokens)

    def _make_room_states(self, slots: int) -> None:
        if self.static:
            self._evict_for(lambda: self.states_available() >= slots, STATES)
        elif self.capacity is not None:
            self._evict_for(lambda: self.states_available() >= slots)

    # ---- admission (the plugin's ``admission_plans``) ---------------------------------------
    def _branch(self, tokens: np.ndarray, hit: int, kv: int) -> int:
        n = len(tokens)
        branch = sglang_branch_point(kv, hit, self.grid)
        answer = None
        if self.ghost is not None:
            answer = self.ghost.lookup(tokens, max(0, n - 1))
            ghost_branch = answer.branch // self.grid * self.grid
            if ghost_branch > max(branch, hit):
                branch = ghost_branch
        self._plan = new_plan(n, hit, branch or None, self.grid, self.max_states, ghost=answer)
        self._input_len = n
        return branch

    def _admit(self, snapshot: int, kind: str) -> bool:
        """The plugin's decision (``policy.snapshot_admission``) on the offer."""
        if kind == "final":
            return self.offer_final(self._plan, snapshot, self._input_len)
        return self.offer_intermediate(self._plan, snapshot, kind == "prefill_end",
                                       self._input_len)

    def snapshot_rejected(self) -> None:
        """The simulator's statistics count no refused snapshot (the plugin's do)."""

    def chain_weight_moved(self) -> None:
        """The learned chain weight moved: nothing to do here. The walk weighs every
        candidate afresh, and a re-key keeps a state's aging base (its recency is
        unchanged)."""

    def _finished(self, full: np.ndarray, hit_node) -> None:
        plan, self._plan = self._plan, None
        if self.ghost is not None:
            self.ghost.record(full, plan.end, self.clock)
        if self.reuse is not None and hit_node is not self.root and hit_node.state:
            self._weight(hit_node)
            self.reuse.record_hit(hit_node, self.clock)

    def process(self, input_tokens, full_tokens) -> int:
        self.clock += 1
        return super().process(input_tokens, full_tokens)
