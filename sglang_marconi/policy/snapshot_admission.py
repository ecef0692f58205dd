"""Which of the snapshots SGLang takes for one request the Marconi tree keeps (the rule the
plugin's ``admission_plans`` runs, framework-free).

SGLang (extra_buffer) offers a request's states one at a time: the branch snapshot, one per
chunked-prefill boundary, the last prefill chunk's and the final one. The plan made at the
match keeps the branch point always; chunk-boundary states while the per-request budget
lasts; an end state unless the learned end-state usefulness refuses it (kept when a host tier
backs nodes up on a later insert) or the cap is reached.

``SnapshotAdmission`` is a mixin: the class using it provides ``max_states``, ``grid``,
``ghost``, ``end_usefulness`` and ``reuse`` (or None), ``stats``, ``snapshot_rejected()``
and ``chain_weight_moved()`` (what to do when the learned chain weight moves).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sglang_marconi.policy.admission import branch_checkpoint
from sglang_marconi.policy.defaults import NO_CAP


@dataclass(eq=False)
class SnapshotPlan:
    """One request's admission state, from its match to its release."""
    hit_len: int
    branch: int                # the admitted branch position (0: none)
    chunk_budget: int          # chunk-boundary states still allowed
    ghost: object = None       # marconi+: the ghost index's answer (ghost.GhostAnswer)
    branch_len: Optional[int] = None  # the branch point as the match reported it
    hit_node: object = None    # marconi+: the node whose state its (last) match consumes
    pending: str = ""          # reason of the state being inserted now
    published: int = 0         # states admitted so far (the final one excepted)
    end: int = 0               # marconi+: where its end state is or would be (0: none new)
    counted: bool = False      # marconi+: counted in the end-state reuse rate
    end_offered: int = 0       # the position of the last end state offered (0: none)
    end_admitted: bool = False  # and whether it was admitted
    lost_reuse: int = 0        # prompt tokens whose KV matched past the hit


def new_plan(input_len: int, hit_len: int, branch_len: Optional[int], grid: int,
             max_states: int, **fields) -> SnapshotPlan:
    """The plan of a request that matched ``hit_len`` tokens, with the branch point at
    ``branch_len`` (None: none): the branch position kept and the chunk-state budget."""
    branch = branch_checkpoint(input_len, hit_len, branch_len, grid, max_states)
    reserved = (1 if branch else 0) + 1  # the branch point and the final state
    return SnapshotPlan(hit_len=hit_len, branch=branch,
                        chunk_budget=max(0, max_states - reserved), branch_len=branch_len,
                        **fields)


class SnapshotAdmission:
    """The decisions on the snapshots SGLang offers (see the module doc for what the class
    using it provides)."""

    @property
    def capped(self) -> bool:
        return self.max_states != NO_CAP

    def keeps_tail_for_backup(self) -> bool:
        """Whether end states the learned usefulness would refuse are admitted for a host
        tier that backs nodes up on a later insert (``host_tier.tail_counts_toward_backup``).
        No host tier here."""
        return False

    def offer_intermediate(self, plan: SnapshotPlan, position: int, last_chunk: bool,
                           input_len: int) -> bool:
        """A snapshot taken during the prefill at ``position``; ``last_chunk``: the prefill
        chunk that completes the input (its snapshot is the request's end state unless a
        decode snapshot follows, so the end-state rules apply)."""
        if plan.branch and position == plan.branch:
            plan.pending = "branch"
            plan.published += 1
            return True
        if last_chunk:
            return self._offer_end(plan, position, False, input_len)
        if plan.chunk_budget > 0:
            plan.chunk_budget -= 1
            plan.pending = "chunk"
            plan.published += 1
            return True
        self.snapshot_rejected()
        return False

    def offer_final(self, plan: SnapshotPlan, position: int, input_len: int) -> bool:
        """The finished request's state at ``position`` (the last snapshot under
        extra_buffer, the KV length without it)."""
        if plan.branch and position == plan.branch:
            self.count_end(plan, position, input_len)
            plan.pending = "branch"  # the branch snapshot arrives as the final state
            return True
        if plan.end_offered and position == plan.end_offered:
            # the last prefill chunk offered this very snapshot: same decision, counted once
            return plan.end_admitted
        return self._offer_end(plan, position, True, input_len)

    def count_end(self, plan: SnapshotPlan, position: int, input_len: int) -> None:
        """marconi+: count the request once in the end-state reuse rate and the learned
        chain weight."""
        if self.ghost is None or plan.counted:
            return
        plan.counted = True
        end = position
        if plan.branch and position == plan.branch:
            # the branch snapshot took the last chunk's slot: the end state would
            # have been that chunk's grid-floored end, the input's
            end = input_len // self.grid * self.grid
        plan.end = end if end > plan.hit_len else 0
        # the simulator's moments: reaching a remembered end counts as a reuse, having
        # an end state of one's own as an end, both before the decision
        if self.end_usefulness is not None:
            self.end_usefulness.observe_request(plan.ghost is not None and bool(plan.ghost.end),
                                                bool(plan.end))
        if self.reuse is not None and self.reuse.observe_request(plan.ghost):
            self.chain_weight_moved()

    def _offer_end(self, plan: SnapshotPlan, position: int, final: bool,
                   input_len: int) -> bool:
        """An end-of-request state (the final one, or the last prefill chunk's: an
        intermediate snapshot refused by the cap counts as ``rejected``)."""
        self.count_end(plan, position, input_len)
        plan.end_offered, plan.end_admitted = position, False
        plan.pending = "final"
        if (self.end_usefulness is not None and plan.end
                and not self.end_usefulness.admit() and not self.keeps_tail_for_backup()):
            self.stats.end_states_skipped += 1
            return False  # marconi+: end states are rarely reused on this traffic
        if self.capped and plan.published >= self.max_states:
            if not final:  # a final refused by the cap was never counted as rejected
                self.snapshot_rejected()
            return False
        plan.published += 1
        plan.end_admitted = True
        return True
