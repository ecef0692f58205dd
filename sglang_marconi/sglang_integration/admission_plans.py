"""Per-request admission plans of the Marconi cache, kept on the request (``req.marconi_plan``)
so a request dropped unreleased takes its plan along; ``live_plans`` counts those reachable."""
from __future__ import annotations

import weakref
from typing import Optional

from sglang_marconi.driver.lost_reuse import lost_reuse_tokens
from sglang_marconi.policy.snapshot_admission import SnapshotAdmission, SnapshotPlan, new_plan

PLAN_ATTR = "marconi_plan"  # the attribute a request carries its plan in


class AdmissionPlans(SnapshotAdmission):
    """The admission half of ``MarconiPolicyState`` (a mixin: it reads ``max_states``,
    ``extra_buffer``, ``grid``, ``ghost``, ``end_usefulness``, ``stats``, ``exporter``)."""

    def _init_plans(self) -> None:
        self.live_plans = weakref.WeakSet()  # plans still reachable (leak tests)
        self._matched_node = None  # set by the MAMBA component during a match walk

    def on_match(self, req, result, ghost=None) -> None:
        """A request matched (maybe again): plan its branch state."""
        hit = result.device_prefix_len
        # without the extra buffer no prefill snapshots a branch: the plan has none
        branch_len = result.mamba_branching_seqlen if self.extra_buffer else None
        input_len = len(req.origin_input_ids)
        self._attach(req, new_plan(input_len, hit, branch_len, self.grid,
                                   self.max_states, ghost=ghost,
                                   hit_node=self._matched_node if hit else None,
                                   lost_reuse=lost_reuse_tokens(result, input_len)))

    def _attach(self, req, adm: SnapshotPlan) -> SnapshotPlan:
        setattr(req, PLAN_ATTR, adm)
        self.live_plans.add(adm)
        return adm

    @staticmethod
    def plan(req) -> Optional[SnapshotPlan]:
        """The admission plan of ``req`` (matched, not yet released), or None."""
        return getattr(req, PLAN_ATTR, None)

    @staticmethod
    def take_plan(req) -> Optional[SnapshotPlan]:
        """Detach and return ``req``'s plan (its release)."""
        adm = getattr(req, PLAN_ATTR, None)
        if adm is not None:
            setattr(req, PLAN_ATTR, None)
        return adm

    def _admission(self, req) -> SnapshotPlan:
        adm = self.plan(req)
        if adm is None:  # a request that never matched with req= (should not happen)
            adm = self._attach(req, SnapshotPlan(hit_len=req.prefix_len, branch=0,
                                                 chunk_budget=max(0, self.max_states - 1)))
        return adm

    def admit_intermediate(self, req, position: int) -> bool:
        """A snapshot SGLang inserts during the prefill (``policy.snapshot_admission``)."""
        input_len = len(req.origin_input_ids)
        return self.offer_intermediate(self._admission(req), position,
                                       req.extend_end >= input_len, input_len)

    def admit_final(self, req, position: int) -> bool:
        """The finished request's state, which SGLang inserts at ``position``."""
        return self.offer_final(self._admission(req), position, len(req.origin_input_ids))

    def snapshot_rejected(self) -> None:
        self.stats.rejected += 1

    def state_admitted(self, req, finished: bool) -> None:
        adm = self.plan(req)
        reason = adm.pending if adm and adm.pending else ("final" if finished else "chunk")
        self.stats.admitted[reason] += 1
        if self.exporter is not None:
            self.exporter.state("admitted", reason)
