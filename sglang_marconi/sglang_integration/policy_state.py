"""``MarconiPolicyState``: what the Marconi components consult while SGLang runs the tree.

One per cache: the cost model, the ranking (``policy.rankings``), the ghost index and
learned end-state admission, the per-request admission plans and the counters. Admission
keeps the branch point and the final state first, then chunk-boundary snapshots, while under
the per-request cap (default: no cap, eviction decides). Recency is read on ``clock``, one
tick per request at its first match since it arrived or was retracted; re-matches of a
waiting request neither tick it nor repeat the ghost lookup.
"""
from __future__ import annotations

import logging

import numpy as np

from sglang.srt.mem_cache.unified_cache.components import base as components_base

from sglang_marconi.policy.clock_log import ClockLog
from sglang_marconi.policy.defaults import NO_CAP
from sglang_marconi.policy.ghost import GhostIndex
from sglang_marconi.policy.host_tier import (HostLink, demoted_efficiency, host_efficiency,
                                             host_link_preset, tail_counts_toward_backup)
from sglang_marconi.policy.likelihood import EndStateUsefulness, ReuseWeight
from sglang_marconi.policy.ranking import ranked_efficiency
from sglang_marconi.policy.rankings import AlphaRanking, DecayRanking, ReuseWeightedRanking
from sglang_marconi.policy.snapshot_admission import SnapshotPlan
from sglang_marconi.sglang_integration.admission_plans import AdmissionPlans
from sglang_marconi.sglang_integration.components import MAMBA as SGLANG_MAMBA
from sglang_marconi.sglang_integration.components import FULL as SGLANG_FULL
from sglang_marconi.sglang_integration.components import (SGLANG_TREE, TIER_TREE,
                                                           cached_flops_saved,
                                                           cached_state_depth, has_state)
from sglang_marconi.sglang_integration.options import MarconiSettings
from sglang_marconi.sglang_integration.stats import MarconiStats

logger = logging.getLogger("sglang_marconi.cache")

LOG_EVERY = 200  # requests between two summary log lines


class MarconiPolicyState(AdmissionPlans):
    """Cost model, ranking, admission plans and counters of one Marconi cache."""

    log_every = LOG_EVERY

    def __init__(self, settings: MarconiSettings, spec, grid: int, kv_tokens: int,
                 state_slots: int, owner, extra_buffer: bool = False):
        self.settings = settings
        self.spec = spec
        self.grid = max(1, grid)
        self.max_states = (NO_CAP if settings.max_states_per_request < 0
                           else settings.max_states_per_request)
        self.stats = MarconiStats()
        # the cache: re-keys its victim queues, knows the host write policy and the exporter
        self.owner = owner
        self._init_plans()
        self.clock = 0  # request clock: ticks once per request match (state recency)
        self.extra_buffer = extra_buffer
        # the ranking (``policy.rankings``): the product's reuse-weighted one, or the
        # paper's with a fixed alpha
        weighted = DecayRanking if settings.decay else ReuseWeightedRanking
        self.ranking = (weighted(ReuseWeight(settings.branch_bonus,
                                             chain_weight=settings.chain_weight))
                        if settings.plus else AlphaRanking(settings.alpha))
        # the decay ranking: SGLang's access counter at each tick
        self.tick_log = ClockLog() if settings.decay and settings.plus else None
        self.alpha = self.ranking.alpha
        self.capacity_bytes = (kv_tokens * spec.kv_bytes_per_token
                               + state_slots * spec.ssm_state_bytes)
        self.state_slots = state_slots
        self.stats.ranking = self.ranking.name
        self.ghost = self.end_usefulness = None
        if settings.plus:  # learned end-state admission, with the reuse-weighted ranking
            ghost_tokens = int(settings.ghost_factor * kv_tokens)
            if ghost_tokens > 0:
                self.ghost = GhostIndex(ghost_tokens)
                self.end_usefulness = EndStateUsefulness(settings.end_threshold)
        self.stats.alpha = self.alpha

    def _observe_ghost(self, req, adm: SnapshotPlan) -> None:
        """marconi+: remember the finished sequence and where its end state would be (the
        reuse rate is counted in ``admit_final``)."""
        # the tokens whose KV exists at finish: prompt + output minus the last
        full = np.concatenate([np.asarray(req.origin_input_ids, dtype=np.int64),
                               np.asarray(req.output_ids[:-1], dtype=np.int64)])
        # the end marker goes where the request's end state is or would have been
        # (``admit_final``): under extra_buffer its last snapshot (the input's grid-floored
        # end or a decode snapshot), not the end of the KV
        self.ghost.record(full, adm.end, self.clock)

    # -- scoring -------------------------------------------------------------------------
    @property
    def reuse(self):
        """The reuse weight's estimator (``likelihood.ReuseWeight``), None for the paper's
        ranking; the learned end-state admission reads it (``snapshot_admission``)."""
        return self.ranking.reuse

    @reuse.setter
    def reuse(self, estimator) -> None:  # tests fix the chain weight
        self.ranking.reuse = estimator

    @property
    def queue_mode(self) -> str:
        """The ``VictimQueue`` mode: ``gdsf`` (reuse-weighted, aged) or ``marconi``."""
        return self.ranking.queue_mode

    def _efficiency(self, node, freed_bytes: float) -> float:
        return ranked_efficiency(self.spec, SGLANG_TREE, node, freed_bytes,
                                 self.ranking.weight_fn,
                                 ancestor_depth=cached_state_depth, saved=self._saved)

    def _saved(self, node) -> float:
        """FLOPs a hit at ``node`` saves over its nearest checkpointed ancestor (kept on
        the node: ``components.cached_flops_saved``)."""
        return cached_flops_saved(self.spec, node)

    def chain_weight_moved(self) -> None:
        """marconi+: the learned chain weight moved: re-key the chain states (queued or
        suspended while locked) with it."""
        self.owner.rekey_chains(self.reuse.is_chain)

    def matched(self, node) -> None:
        """The match walk under way ends at ``node``, which holds a state."""
        self._matched_node = node

    def record_hit(self, node) -> None:
        """marconi+: a finished request's hit consumed ``node``'s state. Counted once per
        request, at its release: SGLang re-matches a waiting request every scheduling
        round (and ``touch_prefix`` matches without one), which must not count as reuse.
        The node was locked by the request until then, so the weight it ranks by after
        the unlock is the one a count at match time would have given."""
        if getattr(self.ranking, "tau", None) is not None and self.ranking.observe_distance(
                getattr(node, "marconi_reuse_distance", 0)):
            self.owner.set_tau(self.ranking.tau)
        if self.ranking.record_hit(node, self.clock):
            self.owner.rekey(node)

    def forget_hits(self, node) -> None:
        """marconi+: ``node`` lost its state but stays in the tree (a tombstone). Its hit
        count goes with the state (GDSF's in-cache frequency): a state inserted there later
        starts from none, as in the simulator, whose tree deletes or merges such a node."""
        self.ranking.forget_hits(node)

    def state_pool_efficiency(self, node) -> float:
        """FLOP efficiency of the node's state per byte of the state pool (one state)."""
        return self._efficiency(node, self.spec.ssm_state_bytes)

    def kv_pool_efficiency(self, node) -> float:
        """FLOP efficiency of the node per byte of the token pool (its own KV tokens); with
        the two-tier rule, a node whose KV is on the host too is worth the load its
        demotion would cost a later hit (``host_tier.demoted_efficiency``)."""
        freed = self.spec.kv_bytes_per_token * len(node.key)
        e = self._efficiency(node, freed)
        if self.host_mode is not None and node.component_data[SGLANG_FULL].host_value is not None:
            weight = self.ranking.weight(node)
            e = demoted_efficiency(self.host_link, e, freed, self.spec.ssm_state_bytes, weight)
        return e

    # -- the host tier (HiCache): the two-tier rule (policy/host_tier.py) -----------------
    host_link: HostLink = host_link_preset()

    @property
    def host_mode(self):
        """How host victims are ranked: ``gdsf`` (marconi+), ``marconi`` (the alpha
        utility), or None for SGLang's host LRU (``--marconi-host-rule lru``, or marconi at
        alpha 0, where the utility is LRU)."""
        return self.ranking.host_mode(self.settings.host_rule)

    @property
    def exporter(self):
        """The cache's Prometheus exporter, None without ``--enable-metrics``."""
        return self.owner.marconi_exporter

    def keeps_tail_for_backup(self) -> bool:
        """The admission half of the two-tier rule (``host_tier.tail_counts_toward_backup``):
        under a host tier that backs nodes up on a later insert, marconi+ admits the end
        states its learned usefulness would refuse. Off with ``--marconi-host-rule lru``."""
        if self.host_mode is None:
            return False
        policy = self.owner.host_write_policy()
        return policy is not None and tail_counts_toward_backup(*policy)

    def _host_efficiency(self, node, held_bytes: float) -> float:
        return host_efficiency(self.spec, self.host_link, TIER_TREE, node, len(node.key),
                               held_bytes,
                               self.ranking.weight_fn)

    def host_kv_efficiency(self, node) -> float:
        """A host leaf's worth per host byte it frees: its own KV (and its host state)."""
        state = self.spec.ssm_state_bytes if node.component_data[
            SGLANG_MAMBA].host_value is not None else 0
        return self._host_efficiency(node, self.spec.kv_bytes_per_token * len(node.key) + state)

    def host_state_efficiency(self, node) -> float:
        """A host state's worth per byte of the host state pool (one state)."""
        return self._host_efficiency(node, self.spec.ssm_state_bytes)

    # -- admission (the plans: admission_plans.AdmissionPlans) ---------------------------
    def tick(self, req) -> None:
        """A request is matched: the request clock advances on its first match since it
        arrived or was retracted (a waiting request re-matched every scheduling round
        does not advance it again; its release resets the mark)."""
        self._matched_node = None
        if not getattr(req, "marconi_ticked", False):
            req.marconi_ticked = True
            self.clock += 1
            if self.tick_log is not None:
                self.tick_log.append(components_base._LAST_ACCESS_TIME_COUNTER_FLOAT, self.clock)

    def _ghost_lookup(self, req):
        """The ghost index's answer for ``req``'s input, kept on the request until the
        index changes (a waiting request is re-matched every scheduling round)."""
        cached = getattr(req, "marconi_ghost", None)
        if cached is not None and cached[0] == self.ghost.version:
            return cached[1]
        tokens = req.origin_input_ids
        answer = self.ghost.lookup(tokens, max(0, len(tokens) - 1))
        req.marconi_ghost = (self.ghost.version, answer)
        return answer

    def ghost_branch(self, req, result):
        """marconi+: where the input leaves the sequences the ghost index remembers (past
        evictions), on the checkpoint grid, as the branch SGLang snapshots in the prefill
        when it lies beyond the hit and SGLang's own branch (``ghost_branch`` beyond), or
        where SGLang's match found no branch (fill); extra_buffer only; and
        the ghost index's answer (``ghost.GhostAnswer``: whether the input reaches a
        remembered end, any mode; how it leaves the remembered sequences). Returns
        (result, answer), answer None without a ghost index."""
        if self.ghost is None:
            return result, None
        answer = self._ghost_lookup(req)
        rule, current = self.settings.ghost_branch, result.mamba_branching_seqlen or 0
        branch = answer.branch // self.grid * self.grid
        if self.extra_buffer and (rule == "beyond" or rule == "fill" and not current) and (
                branch > max(current, result.device_prefix_len)):  # else no prefill snapshots it
            result = result._replace(mamba_branching_seqlen=branch)
        return result, answer

    def state_evicted(self, reason: str) -> None:
        self.stats.evicted[reason] += 1
        if self.exporter is not None:
            self.exporter.state("evicted", reason)

    # -- request end ---------------------------------------------------------------------
    def on_release(self, req, finished: bool) -> None:
        adm = self.take_plan(req)
        req.marconi_ticked = False  # a retracted request's next match is a new admission
        if not finished or adm is None:
            return
        st = self.stats
        st.requests += 1
        st.input_tokens += len(req.origin_input_ids)
        st.hit_tokens += adm.hit_len
        st.lost_reuse_tokens += adm.lost_reuse
        saved = self.spec.flops_saved(adm.hit_len, 0)
        st.flops_saved += saved
        st.prefill_flops += self.spec.prefill_flops(len(req.origin_input_ids))
        if self.exporter is not None:
            self.exporter.request(adm.hit_len, saved, adm.lost_reuse)
        if self.ghost is not None:
            self._observe_ghost(req, adm)
        if adm.hit_node is not None and has_state(adm.hit_node):
            self.record_hit(adm.hit_node)
        if st.requests % self.log_every == 0:
            logger.info(st.summary_line())
