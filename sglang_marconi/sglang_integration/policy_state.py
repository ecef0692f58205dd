"""``MarconiPolicyState``: what the Marconi components consult while SGLang runs the tree.

One per cache: the cost model, alpha (fixed, or tuned once by ``policy.alpha.AlphaTuner``
on shadow replays, see ``shadow``), the per-request admission plans and the counters.

Admission, in SGLang terms. A match reports ``mamba_branching_seqlen`` when the request's
KV hit runs past the deepest state (SGLang's own branch detection, the paper's speculative
insertion); SGLang snapshots that position during the prefill. With a cap of N states per
request, ``policy.admission`` decides which states the tree keeps: the branch point and the
final state (the last one SGLang tracked) first, then chunk-boundary snapshots, earliest
first, while fewer than N; the others stay in the request's own ping-pong slot and are
never published. Without a cap (the default) every state SGLang takes is admitted and
FLOP-aware eviction decides which to keep.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

from sglang_marconi.policy.admission import (
    branch_checkpoint,
    cached_length,
    plan_checkpoints,
)
from sglang_marconi.policy.scoring import VictimQueue, flop_efficiency
from sglang_marconi.sglang_integration.options import MarconiSettings
from sglang_marconi.sglang_integration.stats import MarconiStats

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

    log_every = LOG_EVERY
    max_tracked_requests = 1 << 16  # plans of requests that matched but never finished

    def __init__(self, settings: MarconiSettings, spec, grid: int, kv_tokens: int,
                 state_slots: int, page_size: int = 1, extra_buffer: bool = False):
        self.settings = settings
        self.spec = spec
        self.grid = max(1, grid)
        self.max_states = (NO_CAP if settings.max_states_per_request < 0
                           else settings.max_states_per_request)
        self.stats = MarconiStats()
        self.exporter = None
        self._requests: dict[str, RequestAdmission] = {}
        self.alpha = 0.0 if settings.auto_alpha else float(settings.alpha)
        self.capacity_bytes = (kv_tokens * spec.kv_bytes_per_token
                               + state_slots * spec.ssm_state_bytes)
        self.tuner = None
        self.shadow = None
        if settings.auto_alpha:
            from sglang_marconi.policy.alpha import AlphaTuner
            from sglang_marconi.sglang_integration.shadow import TUNING_GRID, ShadowReplay

            self.shadow = ShadowReplay(spec, settings, kv_tokens, state_slots, page_size,
                                       extra_buffer)
            self.tuner = AlphaTuner(self._replay_window, grid=TUNING_GRID,
                                    multiplier=settings.bootstrap_multiplier)
        self.stats.alpha = self.alpha
        self.stats.alpha_tuned = not settings.auto_alpha

    # -- alpha ---------------------------------------------------------------------------
    def _replay_window(self, window, alpha: float) -> float:
        """FLOPs saved on the recorded window by a shadow SGLang cache with this alpha;
        the simulator's cache (same byte budget) if the shadow cannot be built here."""
        if self.shadow is not None:
            try:
                return self.shadow(window, alpha)
            except Exception as exc:  # e.g. SGLang's test kit missing on a server
                logger.warning("Marconi: shadow replay failed (%s); tuning alpha on the "
                               "simulator instead", exc)
                self.shadow = None
        import numpy as np

        from sglang_marconi.policy.cache import PrefixCache

        shadow = PrefixCache(self.spec, self.capacity_bytes, alpha=alpha, grid=self.grid,
                             max_states_per_request=self.max_states)
        for input_ids, output_ids in window:
            inp = np.asarray(input_ids, dtype=np.int64)
            full = np.concatenate([inp, np.asarray(output_ids[:-1], dtype=np.int64)])
            shadow.process(inp, full)
        return shadow.stats.flops_saved

    def _set_alpha(self, alpha: float) -> None:
        self.alpha = float(alpha)
        self.stats.alpha = self.alpha
        self.stats.alpha_tuned = True
        self.stats.tuning_seconds = getattr(self.shadow, "seconds", 0.0)
        logger.info("Marconi alpha tuned to %g in %.1f s (FLOPs saved by alpha: %s)",
                    self.alpha, getattr(self.shadow, "seconds", 0.0),
                    {a: f"{v:.3g}" for a, v in getattr(self.tuner, "scores", {}).items()})
        if self.exporter is not None:
            self.exporter.set_alpha(self.alpha)

    def victim_queue(self, candidates) -> VictimQueue:
        """A ``VictimQueue`` over (node, recency, efficiency), normalised over all of them."""
        queue = VictimQueue(self.alpha)
        for node, recency, efficiency in candidates:
            queue.update(node, recency, efficiency)
        queue.refresh()  # min-max bounds of these candidates, as the paper normalises
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
        if len(self._requests) >= self.max_tracked_requests:  # aborted while waiting
            self._requests.pop(next(iter(self._requests)))
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
        adm.pending = "final"
        if self.max_states == NO_CAP:
            return True  # no cap: SGLang's own admission, state for state
        input_len, output_len = len(req.origin_input_ids), len(req.output_ids)
        plan = plan_checkpoints(input_len, output_len, adm.hit_len, adm.branch_len, self.grid,
                                self.max_states)
        end = cached_length(input_len, output_len, self.grid)
        return bool(plan.positions) and plan.positions[-1] == end

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
            from sglang_marconi.sglang_integration.shadow import window_item

            new_alpha = self.tuner.observe_request(window_item(req))
            if new_alpha is not None:
                self._set_alpha(new_alpha)
        if st.requests % self.log_every == 0:
            logger.info(st.summary_line())
