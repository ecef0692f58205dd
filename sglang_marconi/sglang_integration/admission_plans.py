"""Per-request admission plans of the Marconi cache, tied to the request's lifetime.

A match (``on_match``) plans which of the request's states the tree will keep
(``policy.admission.branch_checkpoint`` and the per-request cap); the MAMBA component asks
``admit_intermediate`` / ``admit_final`` when SGLang inserts one. The plan lives on the
request object itself (``req.marconi_plan``), never in a table of the cache: a request that
SGLang drops without releasing its KV (aborted while waiting: ``scheduler.abort_request``
pops it from the waiting queue, and ``release_kv_cache`` returns before ``on_release``
when it holds no KV) takes its plan with it. A release (finish, abort while running,
retraction) detaches the plan (``take_plan``); a retracted request re-matches and gets a
new one. ``live_plans`` (a weak set) counts the plans still reachable, for the leak tests.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Optional

from sglang_marconi.policy.admission import branch_checkpoint
from sglang_marconi.policy.defaults import NO_CAP
PLAN_ATTR = "marconi_plan"  # the attribute a request carries its plan in


@dataclass(eq=False)
class RequestAdmission:
    hit_len: int
    branch_len: Optional[int]  # as the match reported it
    branch: int                # the admitted branch position (0: none)
    chunk_budget: int          # chunk-boundary states still allowed
    pending: str = ""          # reason of the state being inserted now
    published: int = 0         # intermediate states admitted so far
    ghost: object = None       # marconi+: the ghost index's answer (ghost.GhostAnswer)
    end: int = 0               # marconi+: where its end state is or would be (0: none new)
    hit_node: object = None    # marconi+: the node whose state its (last) match consumes
    counted: bool = False      # marconi+: counted in the end-state reuse rate
    end_offered: int = 0       # the position of the last end state offered (0: none)
    end_admitted: bool = False  # and whether it was admitted


class AdmissionPlans:
    """The admission half of ``MarconiPolicyState`` (a mixin: it reads ``max_states``,
    ``extra_buffer``, ``grid``, ``ghost``, ``end_usefulness``, ``stats``, ``exporter``)."""

    def _init_plans(self) -> None:
        self.live_plans = weakref.WeakSet()  # plans still reachable (leak tests)
        self._matched_node = None  # set by the MAMBA component during a match walk

    @property
    def capped(self) -> bool:
        return self.max_states != NO_CAP

    def on_match(self, req, result, ghost=None) -> None:
        """A request matched (possibly again, while it waits): plan its branch state.
        ``ghost`` (marconi+): the ghost index's answer for its input (``GhostAnswer``)."""
        hit = result.device_prefix_len
        # without the extra buffer no prefill snapshots a branch: the plan has none
        branch_len = result.mamba_branching_seqlen if self.extra_buffer else None
        input_len = len(req.origin_input_ids)
        branch = branch_checkpoint(input_len, hit, branch_len, self.grid, self.max_states)
        reserved = (1 if branch else 0) + 1  # the branch point and the final state
        self._attach(req, RequestAdmission(
            hit_len=hit, branch_len=branch_len, branch=branch,
            chunk_budget=max(0, self.max_states - reserved),
            ghost=ghost,
            hit_node=self._matched_node if hit else None))

    def _attach(self, req, adm: RequestAdmission) -> RequestAdmission:
        setattr(req, PLAN_ATTR, adm)
        self.live_plans.add(adm)
        return adm

    @staticmethod
    def plan(req) -> Optional[RequestAdmission]:
        """The admission plan of ``req`` (matched, not yet released), or None."""
        return getattr(req, PLAN_ATTR, None)

    @staticmethod
    def take_plan(req) -> Optional[RequestAdmission]:
        """Detach and return ``req``'s plan (its release)."""
        adm = getattr(req, PLAN_ATTR, None)
        if adm is not None:
            setattr(req, PLAN_ATTR, None)
        return adm

    def _admission(self, req) -> RequestAdmission:
        adm = self.plan(req)
        if adm is None:  # a request that never matched with req= (should not happen)
            adm = self._attach(req, RequestAdmission(req.prefix_len, None, 0,
                                                     max(0, self.max_states - 1)))
        return adm

    def admit_intermediate(self, req, position: int) -> bool:
        adm = self._admission(req)
        if adm.branch and position == adm.branch:
            adm.pending = "branch"
            adm.published += 1
            return True
        if req.extend_end >= len(req.origin_input_ids):
            # the last prefill chunk of a request that decodes: SGLang publishes its
            # snapshot now (checkpoint_kv_cache after every unfinished prefill), not only
            # at finish: it is the request's end state unless a decode snapshot follows,
            # so the end-state rules and the place reserved for the final state apply
            return self._admit_end(req, adm, position, final=False)
        if adm.chunk_budget > 0:
            adm.chunk_budget -= 1
            adm.pending = "chunk"
            adm.published += 1
            return True
        self.stats.rejected += 1
        return False

    def admit_final(self, req, position: int) -> bool:
        """The finished request's state, which SGLang inserts at ``position`` (the last
        snapshot under extra_buffer, the KV length without it)."""
        adm = self._admission(req)
        if adm.branch and position == adm.branch:
            self._observe_end(req, adm, position)
            adm.pending = "branch"  # the branch snapshot arrives as the final state
            return True
        if adm.end_offered and position == adm.end_offered:
            # the last prefill chunk offered this very snapshot: same decision, counted once
            return adm.end_admitted
        return self._admit_end(req, adm, position, final=True)

    def _observe_end(self, req, adm: RequestAdmission, position: int) -> None:
        """marconi+: count the request in the end-state reuse rate, once."""
        if self.ghost is None or adm.counted:
            return
        adm.counted = True
        end = position
        if adm.branch and position == adm.branch:
            # the branch snapshot took the last chunk's slot: the end state would
            # have been that chunk's grid-floored end, the input's
            end = len(req.origin_input_ids) // self.grid * self.grid
        adm.end = end if end > adm.hit_len else 0
        # the simulator's moments: reaching a remembered end counts as a reuse, having
        # an end state of one's own as an end, both before the decision below
        if self.end_usefulness is not None:
            self.end_usefulness.observe_request(adm.ghost is not None and bool(adm.ghost.end),
                                                bool(adm.end))
        if self.reuse is not None and self.reuse.observe_request(adm.ghost):
            self.chain_weight_moved()

    def _admit_end(self, req, adm: RequestAdmission, position: int, final: bool) -> bool:
        """An end-of-request state (the final one, or the last prefill chunk's: an
        intermediate snapshot refused by the cap counts as ``rejected``)."""
        self._observe_end(req, adm, position)
        adm.end_offered, adm.end_admitted = position, False
        adm.pending = "final"
        if (self.end_usefulness is not None and adm.end
                and not self.end_usefulness.admit()):
            self.stats.end_states_skipped += 1
            return False  # marconi+: end states are rarely reused on this traffic
        if self.capped and adm.published >= self.max_states:
            if not final:  # a final refused by the cap was never counted as rejected
                self.stats.rejected += 1
            return False
        adm.published += 1
        adm.end_admitted = True
        return True

    def state_admitted(self, req, finished: bool) -> None:
        adm = self.plan(req)
        reason = adm.pending if adm and adm.pending else ("final" if finished else "chunk")
        self.stats.admitted[reason] += 1
        if self.exporter is not None:
            self.exporter.state("admitted", reason)
