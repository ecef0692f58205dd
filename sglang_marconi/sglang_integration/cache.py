"""``MarconiUnifiedRadixCache``: SGLang's ``UnifiedRadixCache`` with Marconi's policy.

The tree, locks, pools and the scheduler interface are SGLang's; the subclass swaps in
the Marconi MAMBA and FULL components (see ``components``) and keeps, in
``MarconiPolicyState``, what they consult: the cost model, alpha (fixed or tuned), the
per-request admission plans and the statistics. Admission and scoring rules come from
``sglang_marconi.policy``; nothing here re-implements them.

Admission, in SGLang terms. A match reports ``mamba_branching_seqlen`` when the request's
KV hit runs past the deepest state (SGLang's own branch detection, the paper's speculative
insertion); SGLang snapshots that position during the prefill. ``plan_checkpoints`` decides
which of the request's states the tree keeps: the branch point and the final state (the
last one SGLang tracked), at most ``max_states_per_request`` in all. Any states left under
that cap may go to chunk-boundary snapshots (earliest first); the others stay in the
request's own ping-pong slot and are never published.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Optional

from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from sglang_marconi.policy.admission import branch_checkpoint, plan_checkpoints
from sglang_marconi.policy.scoring import VictimQueue, flop_efficiency
from sglang_marconi.sglang_integration.components import (
    MarconiFullComponent,
    MarconiMambaComponent,
)
from sglang_marconi.sglang_integration.options import MarconiSettings
from sglang_marconi.sglang_integration.stats import MarconiStats, make_exporter

logger = logging.getLogger("sglang_marconi.cache")

NO_CAP = 1 << 30
LOG_EVERY = 200  # requests between two summary log lines


@dataclass
class RequestAdmission:
    hit_len: int
    branch_len: Optional[int]  # as the match reported it
    branch: int                # the admitted branch position (0: none)
    chunk_budget: int          # chunk-boundary states still allowed
    pending: str = ""          # reason of the state being inserted now


class MarconiPolicyState:
    """Cost model, alpha, admission plans and counters of one Marconi cache."""

    def __init__(self, settings: MarconiSettings, spec, grid: int, kv_tokens: int,
                 state_slots: int):
        self.settings = settings
        self.spec = spec
        self.grid = max(1, grid)
        self.max_states = (NO_CAP if settings.max_states_per_request < 0
                           else settings.max_states_per_request)
        self.stats = MarconiStats()
        self.exporter = None
        self._requests: dict[str, RequestAdmission] = {}
        self.alpha = 0.0 if settings.auto_alpha else float(settings.alpha)
        self.tuner = None
        if settings.auto_alpha:
            from sglang_marconi.policy.alpha import AlphaTuner

            self.capacity_bytes = (kv_tokens * spec.kv_bytes_per_token
                                   + state_slots * spec.ssm_state_bytes)
            self.tuner = AlphaTuner(self._replay_window,
                                    multiplier=settings.bootstrap_multiplier)
        self.stats.alpha = self.alpha
        self.stats.alpha_tuned = not settings.auto_alpha

    # -- alpha ---------------------------------------------------------------------------
    def _replay_window(self, window, alpha: float) -> float:
        """FLOPs saved by the simulator's cache on the recorded window (same byte budget)."""
        from sglang_marconi.policy.cache import PrefixCache

        shadow = PrefixCache(self.spec, self.capacity_bytes, alpha=alpha, grid=self.grid,
                             max_states_per_request=self.max_states)
        for input_tokens, full_tokens in window:
            shadow.process(input_tokens, full_tokens)
        return shadow.stats.flops_saved

    def _set_alpha(self, alpha: float) -> None:
        self.alpha = float(alpha)
        self.stats.alpha = self.alpha
        self.stats.alpha_tuned = True
        logger.info("Marconi alpha tuned to %g (scores: %s)", self.alpha,
                    getattr(self.tuner, "scores", {}))
        if self.exporter is not None:
            self.exporter.set_alpha(self.alpha)

    def victim_queue(self, candidates) -> VictimQueue:
        """A ``VictimQueue`` over (node, recency, efficiency), normalised over all of them."""
        queue = VictimQueue(0.0)
        for node, recency, efficiency in candidates:
            queue.update(node, recency, efficiency)
        queue.set_alpha(self.alpha)  # rebuilds with min-max bounds of these candidates
        return queue

    # -- scoring -------------------------------------------------------------------------
    def _efficiency(self, node, lengths, freed_bytes: float) -> float:
        has_state = node.component_data[ComponentType.MAMBA].value is not None
        if self.alpha == 0.0:
            return 0.0  # plain LRU: skip the path walks
        return flop_efficiency(self.spec, lengths.depth(node),
                               lengths.state_ancestor_depth(node), freed_bytes, has_state)

    def state_pool_efficiency(self, node, lengths) -> float:
        return self._efficiency(node, lengths, self.spec.ssm_state_bytes)

    def kv_pool_efficiency(self, node, lengths) -> float:
        return self._efficiency(node, lengths, self.spec.kv_bytes_per_token * len(node.key))

    # -- admission -----------------------------------------------------------------------
    def on_match(self, req, result) -> None:
        """A request matched (possibly again, while it waits): plan its branch state."""
        hit = result.device_prefix_len
        branch_len = result.mamba_branching_seqlen
        input_len = len(req.origin_input_ids)
        branch = branch_checkpoint(input_len, hit, branch_len, self.grid, self.max_states)
        reserved = (1 if branch else 0) + 1  # the branch point and the final state
        self._requests[req.rid] = RequestAdmission(
            hit_len=hit, branch_len=branch_len, branch=branch,
            chunk_budget=max(0, self.max_states - reserved))

    def _admission(self, req) -> RequestAdmission:
        adm = self._requests.get(req.rid)
        if adm is None:  # a request that never matched with req= (should not happen)
            adm = RequestAdmission(req.prefix_len, None, 0, max(0, self.max_states - 1))
            self._requests[req.rid] = adm
        return adm

    def admit_intermediate(self, req, position: int) -> bool:
        adm = self._admission(req)
        if adm.branch and position == adm.branch:
            adm.pending = "branch"
            return True
        if adm.chunk_budget > 0:
            adm.chunk_budget -= 1
            adm.pending = "chunk"
            return True
        self.stats.rejected += 1
        return False

    def admit_final(self, req) -> bool:
        adm = self._admission(req)
        plan = plan_checkpoints(len(req.origin_input_ids), len(req.output_ids), adm.hit_len,
                                adm.branch_len, self.grid, self.max_states)
        keeps_end = len(plan.positions) > (1 if plan.branch_len else 0)
        adm.pending = "final"
        return keeps_end

    def state_admitted(self, req, finished: bool) -> None:
        adm = self._requests.get(req.rid)
        reason = "final" if finished else (adm.pending if adm and adm.pending else "chunk")
        self.stats.admitted[reason] += 1
        if self.exporter is not None:
            self.exporter.state("admitted", reason)

    def state_evicted(self, reason: str) -> None:
        self.stats.evicted[reason] += 1
        if self.exporter is not None:
            self.exporter.state("evicted", reason)

    def on_eviction(self) -> None:
        if self.tuner is not None:
            self.tuner.observe_eviction()

    # -- request end ---------------------------------------------------------------------
    def on_release(self, req, finished: bool) -> None:
        adm = self._requests.pop(req.rid, None)
        if not finished or adm is None:
            return
        st = self.stats
        st.requests += 1
        st.input_tokens += len(req.origin_input_ids)
        st.hit_tokens += adm.hit_len
        saved = self.spec.flops_saved(adm.hit_len, 0)
        st.flops_saved += saved
        st.prefill_flops += self.spec.prefill_flops(len(req.origin_input_ids))
        if self.exporter is not None:
            self.exporter.request(adm.hit_len, saved)
        if self.tuner is not None and self.tuner.recording:
            import numpy as np

            inp = np.asarray(req.origin_input_ids, dtype=np.int64)
            out = np.asarray(req.output_ids[:-1], dtype=np.int64)
            new_alpha = self.tuner.observe_request((inp, np.concatenate([inp, out])))
            if new_alpha is not None:
                self._set_alpha(new_alpha)
        if st.requests % LOG_EVERY == 0:
            logger.info(st.summary_line())


class MarconiUnifiedRadixCache(UnifiedRadixCache):
    """``UnifiedRadixCache`` (FULL + MAMBA) whose eviction and admission follow Marconi."""

    def __init__(self, params, *, settings: Optional[MarconiSettings] = None, spec=None):
        from sglang.srt.runtime_context import mamba_checkpoint_grid

        if params.tree_components is None or ComponentType.MAMBA not in params.tree_components:
            raise ValueError("MarconiUnifiedRadixCache needs a hybrid model (FULL + MAMBA "
                             f"components), got {params.tree_components}")
        if spec is None:
            raise ValueError("MarconiUnifiedRadixCache needs the model's HybridModelSpec")
        params = dataclasses.replace(params, component_registry_override={
            **(params.component_registry_override or {}),
            ComponentType.MAMBA: MarconiMambaComponent,
            ComponentType.FULL: MarconiFullComponent,
        })
        self.marconi = MarconiPolicyState(
            settings or MarconiSettings(), spec, grid=mamba_checkpoint_grid(params.page_size),
            kv_tokens=params.token_to_kv_pool_allocator.size,
            state_slots=params.req_to_token_pool.mamba_pool.size)
        super().__init__(params)
        self.marconi.exporter = make_exporter(self)
        if self.marconi.exporter is not None:
            self.marconi.exporter.set_alpha(self.marconi.alpha)
        logger.info("Marconi cache: spec=%s alpha=%s max_states_per_request=%s",
                    spec.name, self.marconi.settings.alpha,
                    self.marconi.settings.max_states_per_request)

    @property
    def marconi_stats(self) -> MarconiStats:
        return self.marconi.stats

    def _finalize_match_result(self, params, result):
        result = super()._finalize_match_result(params, result)
        if params.req is not None:
            self.marconi.on_match(params.req, result)
        return result

    def on_release(self, req, *, checkpointed: bool) -> None:
        super().on_release(req, checkpointed=checkpointed)
        self.marconi.on_release(req, finished=checkpointed)

    def _evict(self, params, *args, **kwargs):
        result = super()._evict(params, *args, **kwargs)
        if result.num_tokens_evicted or result.mamba_num_evicted:
            self.marconi.on_eviction()
        return result
