"""``PrefixCache``: a byte-budgeted hybrid prefix cache driven one request at a time (``begin``,
then ``finish``), holding no tensors; the budget is never exceeded."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from sglang_marconi.model.cost import CostModel
from sglang_marconi.policy import defaults
from sglang_marconi.policy.admission import (branch_checkpoint, cached_length,
                                             plan_block_checkpoints, plan_checkpoints)
from sglang_marconi.policy.alpha import DEFAULT_GRID, AlphaTuner
from sglang_marconi.policy.ghost import GhostAnswer, GhostIndex
from sglang_marconi.policy.likelihood import EndStateUsefulness, ReuseWeight
from sglang_marconi.policy.online import OnlineAlpha
from sglang_marconi.policy.scoring import VictimQueue
from sglang_marconi.policy.tree import RadixTree, as_tokens


@dataclass
class CacheStats:
    requests: int = 0
    input_tokens: int = 0
    hit_tokens: int = 0
    hit_requests: int = 0
    prefill_flops: float = 0.0   # FLOPs of all prefills without any cache
    flops_saved: float = 0.0
    states_admitted: int = 0
    states_evicted: int = 0        # all states freed by eviction
    states_dropped: int = 0        # ... of which by dropping the state of a one-child node
    nodes_deleted: int = 0
    kv_tokens_evicted: int = 0
    admissions_truncated: int = 0  # admitted only the branch-point state
    admissions_rejected: int = 0   # admitted nothing: eviction could not make room
    end_states_skipped: int = 0    # marconi+: end-of-request states not admitted (learned)
    peak_bytes: int = 0
    evictions: int = 0

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def request_hit_rate(self) -> float:
        return self.hit_requests / self.requests if self.requests else 0.0

    @property
    def flops_saved_fraction(self) -> float:
        return self.flops_saved / self.prefill_flops if self.prefill_flops else 0.0


@dataclass
class RequestPlan:
    index: int
    input_tokens: np.ndarray
    hit_len: int
    hit_node: object
    kv_len: int
    branch_len: int
    checkpoint_positions: tuple  # positions inside the input to capture during prefill
    ghost: GhostAnswer | None = None  # marconi+: what the ghost index knew of the input

    @property
    def reaches_end(self) -> bool:
        """marconi+: the input reaches a remembered request end."""
        return self.ghost is not None and bool(self.ghost.end)


class PrefixCache:
    """A hybrid prefix cache with Marconi (or vLLM+ ``block``) admission and scored eviction;
    ``alpha``: a number (0 = LRU), ``"auto"`` or ``"online"``; ``capacity_bytes=None``:
    unlimited; marconi+: ``reuse_weight``, ``ghost_tokens``, ``end_threshold``."""

    def __init__(self, spec: CostModel, capacity_bytes: int | None = None, alpha=0.0,
                 admission: str = "marconi", grid: int = 1, block: int = 32,
                 max_states_per_request: int = defaults.PAPER_MAX_STATES_PER_REQUEST,
                 bootstrap_multiplier: float = defaults.BOOTSTRAP_MULTIPLIER,
                 alpha_grid=DEFAULT_GRID, reuse_weight: ReuseWeight | None = None,
                 ghost_tokens: int | None = None, end_threshold: float | None = None,
                 online: dict | None = None, victim_chooser=None, end_admission=None):
        if admission not in ("marconi", "block"):
            raise ValueError(f"unknown admission {admission!r}")
        self.spec, self.capacity, self.admission = spec, capacity_bytes, admission
        self.grid, self.block, self.max_states = grid, block, max_states_per_request
        self.stats = CacheStats()
        self.auto_alpha = alpha == "auto"
        self.online_alpha = alpha == "online"
        self.reuse_weight = reuse_weight
        queue = VictimQueue(0.0 if alpha in ("auto", "online") else float(alpha),
                            mode="gdsf" if reuse_weight is not None else "marconi")
        self.tree = RadixTree(spec, queue=queue, value_weight=reuse_weight)
        self.ghost = GhostIndex(ghost_tokens) if ghost_tokens else None
        if end_threshold is not None and self.ghost is None:
            raise ValueError("learned end-state admission needs the ghost index")
        self.end_usefulness = (EndStateUsefulness(end_threshold)
                               if end_threshold is not None else None)
        self.tree.on_state_dropped = self._state_dropped
        self.on_evict = None  # callback(node) when a node's state is freed
        # hooks of the offline reference: choose(cache) -> node; admit_end(plan, full, end)
        self.victim_chooser = victim_chooser
        self.end_admission = end_admission
        self._clock = itertools.count(1)
        self._clock_now = 0  # the index (from 1) of the request being processed
        self._config = dict(capacity_bytes=capacity_bytes, admission=admission, grid=grid,
                            block=block, max_states_per_request=max_states_per_request,
                            reuse_weight=reuse_weight,
                            ghost_tokens=ghost_tokens, end_threshold=end_threshold)
        self.tuner = (AlphaTuner(self._replay_alpha, alpha_grid, bootstrap_multiplier)
                      if self.auto_alpha else None)
        self.online = (OnlineAlpha(self._make_shadow, **(online or {}))
                       if self.online_alpha else None)
        if self.online is not None:
            self.set_alpha(self.online.alpha)

    # ---- alpha ------------------------------------------------------------------------------
    @property
    def alpha(self) -> float:
        return self.tree.queue.alpha

    def set_alpha(self, alpha: float) -> None:
        self.tree.queue.set_alpha(alpha)

    def _make_shadow(self, alpha: float, sample: float) -> "PrefixCache":
        """A metadata-only copy of this cache's configuration with a fixed alpha."""
        config = dict(self._config)
        if config["capacity_bytes"] is not None:
            config["capacity_bytes"] = int(config["capacity_bytes"] * sample)
        return PrefixCache(self.spec, alpha=alpha, **config)

    def _replay_alpha(self, window, alpha: float) -> float:
        shadow = PrefixCache(self.spec, alpha=alpha, **self._config)
        for input_tokens, full_tokens in window:
            shadow.process(input_tokens, full_tokens)
        return shadow.stats.flops_saved

    # ---- the request path -------------------------------------------------------------------
    def begin(self, input_tokens) -> RequestPlan:
        tokens = as_tokens(input_tokens)
        n = len(tokens)
        now = next(self._clock)
        self._clock_now = now
        m = self.tree.match(tokens, limit=max(0, n - 1))
        st = self.stats
        st.requests += 1
        st.input_tokens += n
        st.prefill_flops += self.spec.prefill_flops(n)
        if m.hit_node is not None:
            m.hit_node.last_access = now
            m.hit_node.hits += 1
            if self.reuse_weight is not None:
                self.reuse_weight.record_hit(m.hit_node, now)
            self.tree.refresh(m.hit_node)
            st.hit_tokens += m.hit_len
            st.hit_requests += 1
            st.flops_saved += self.spec.flops_saved(m.hit_len, 0)
        branch_len = m.branch_len
        if self.ghost is not None:
            ghost = self.ghost.lookup(tokens, max(0, n - 1))
            branch_len = max(branch_len, ghost.branch)
        positions = ()
        if self.admission == "marconi":
            b = branch_checkpoint(n, m.hit_len, branch_len, self.grid, self.max_states)
            positions = (b,) if b else ()
        return RequestPlan(now, tokens, m.hit_len, m.hit_node, m.kv_len, branch_len, positions,
                           ghost=ghost if self.ghost is not None else None)

    def _plan(self, plan: RequestPlan, full_len: int):
        n = len(plan.input_tokens)
        output_len = full_len - n + 1
        if self.admission == "block":
            return plan_block_checkpoints(n, output_len, plan.hit_len, self.block)
        return plan_checkpoints(n, output_len, plan.hit_len, plan.branch_len, self.grid,
                                self.max_states)

    def _end_position(self, plan: RequestPlan, full_len: int, adm) -> int:
        """Where the end-of-request state is or would be (0: none)."""
        if self.admission != "marconi":
            return adm.cached_len
        n = len(plan.input_tokens)
        end = cached_length(n, full_len - n + 1, self.grid)
        return end if end > plan.hit_len else 0

    def _observe_ghost_answer(self, plan: RequestPlan, end: int) -> None:
        """marconi+: count the finished request in the learned rates."""
        if self.end_usefulness is not None:
            self.end_usefulness.observe_request(plan.reaches_end, bool(end))
        if self.reuse_weight is not None and self.reuse_weight.observe_request(plan.ghost):
            for node in self.tree.queue.nodes():  # the learned chain weight moved
                if self.reuse_weight.is_chain(node):
                    self.tree.refresh(node)

    def finish(self, plan: RequestPlan, full_tokens) -> dict:
        """Admit the request's states and KV; returns {position: node} of stored states."""
        full = as_tokens(full_tokens)
        adm = self._plan(plan, len(full))
        if self.ghost is not None:
            end = self._end_position(plan, len(full), adm)
            self.ghost.record(full, end, plan.index)
            self._observe_ghost_answer(plan, end)
        if adm.positions and adm.positions[-1] != adm.branch_len:
            admit = (self.end_usefulness.admit() if self.end_usefulness is not None else True)
            if self.end_admission is not None:
                admit = self.end_admission(plan, full, adm.positions[-1])
            if not admit:
                self.stats.end_states_skipped += 1
                adm = type(adm)(adm.positions[:-1], adm.branch_len, adm.branch_len)
        if not adm.positions:
            self._after_request(plan, full)
            return {}
        attempts = [adm.positions]
        if adm.branch_len:
            attempts.append((adm.branch_len,))
        elif self.admission == "block":  # vLLM+: fall back to shorter prefixes of its blocks
            k = len(adm.positions) // 2
            while k:
                attempts.append(adm.positions[:k])
                k //= 2
        out = self._insert_first_fitting(plan, full, attempts)
        self._after_request(plan, full)
        return out

    def _insert_first_fitting(self, plan: RequestPlan, full: np.ndarray, attempts) -> dict:
        """Insert the first of ``attempts`` that fits once room is made ({}: none)."""
        out: dict = {}
        for i, positions in enumerate(attempts):
            seq = full[:positions[-1]]
            if self._make_room(seq, positions):
                out, new = self.tree.insert(seq, positions, plan.index)
                self.stats.states_admitted += new
                if i > 0:
                    self.stats.admissions_truncated += 1
                break
        else:
            self.stats.admissions_rejected += 1
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.tree.bytes_used)
        return out

    def process(self, input_tokens, full_tokens) -> int:
        """begin + finish for a simulator: returns the hit length."""
        plan = self.begin(input_tokens)
        self.finish(plan, full_tokens)
        return plan.hit_len

    def _after_request(self, plan: RequestPlan, full: np.ndarray) -> None:
        if self.online is not None:
            new_alpha = self.online.observe(plan.input_tokens, full)
            if new_alpha is not None:
                self.set_alpha(new_alpha)
        if self.tuner is not None and self.tuner.recording:
            new_alpha = self.tuner.observe_request((plan.input_tokens, full))
            if new_alpha is not None:
                self.set_alpha(new_alpha)

    # ---- capacity ---------------------------------------------------------------------------
    def _make_room(self, seq: np.ndarray, positions) -> bool:
        tree = self.tree
        needed = tree.bytes_to_insert(seq, positions)
        if self.capacity is None:
            return True
        if needed > self.capacity:
            return False
        if tree.bytes_used + needed <= self.capacity:
            return True
        # Protect the matched path up to the last fully matched node (the hit is on it)
        guard = tree.match(seq).kv_node
        tree.lock(guard)
        try:
            # Evicting can only raise ``needed``: evict against the last value and recompute
            # only when it says there is room (the same victims as recomputing every time).
            while True:
                while tree.bytes_used + needed > self.capacity:
                    if not self._evict_one():
                        return False
                needed = tree.bytes_to_insert(seq, positions)
                if tree.bytes_used + needed <= self.capacity:
                    return True
        finally:
            tree.unlock(guard)

    def _evict_one(self) -> bool:
        kv_before = self.tree.num_kv_tokens
        if self.victim_chooser is not None:
            node = self.victim_chooser(self) if len(self.tree.queue) else None
            res = self.tree.evict_node(node) if node is not None else None
        else:
            res = self.tree.evict_one()
        if res is None:
            return False
        action, _node = res
        st = self.stats
        st.evictions += 1
        if action == "delete":
            st.nodes_deleted += 1
        st.kv_tokens_evicted += kv_before - self.tree.num_kv_tokens
        if self.tuner is not None:
            self.tuner.observe_eviction()
        return True

    def _state_dropped(self, node) -> None:
        self.stats.states_evicted += 1
        if node.children:
            self.stats.states_dropped += 1
        if self.on_evict is not None:
            self.on_evict(node)
