"""``MarconiPolicyState``: what the Marconi components consult while SGLang runs the tree.

One per cache: the cost model, alpha (fixed; tuned once by ``policy.alpha.AlphaTuner``
on shadow replays, see ``shadow``; or followed online by ``policy.online.OnlineAlpha``),
the per-request admission plans (``admission_plans.AdmissionPlans``, kept on the request
objects) and the counters.

alpha = auto. After the bootstrap window, one tuning slice per finished request (a fixed
token budget of shadow replay, ``policy.defaults.TUNE_SLICE_TOKENS``); the tuned alpha
applies from the request whose slice completes the replay, the same index on every TP
rank. A failing replay is logged as an error and counted (``tuner_failures``); the alpha
stays, no other tuner runs.

alpha = online. ``OnlineAlpha`` keeps one shadow cache per candidate alpha: a simulator
``PrefixCache`` (tree metadata only, no tensors) configured as the simulator's image of
this cache's state pool, the configuration in which ``tests/test_parity.py`` shows the
simulator making SGLang's eviction decisions: a budget of the state slots a running
request leaves to the tree, KV free (``policy.mirror``), SGLang's eviction timing,
normalisation, recency stamps and branch rule (none without the extra buffer), this
cache's checkpoint grid and state cap (2, the paper's, when uncapped). Every finished
request (its prompt and the tokens whose KV exists at finish: prompt + output minus the
last token) goes to every shadow; every quarter window the alpha whose shadow saved the
most prefill FLOPs over the last ``--marconi-online-window`` requests becomes this cache's
alpha if it beats the current one's shadow by 2% (hysteresis). The shadows model neither
the token pool nor chunk and decode snapshots, so they rank alphas, they do not reproduce
this cache's hits. Their CPU time and the token ids they hold are counted against this
cache's own bookkeeping (``MarconiStats.online_*``).

Admission, in SGLang terms. A match reports ``mamba_branching_seqlen`` when the request's
KV hit runs past the deepest state (SGLang's own branch detection, the paper's speculative
insertion); SGLang snapshots that position during the prefill. With a cap of N states per
request, ``policy.admission`` decides which states the tree keeps: the branch point and the
final state (the last one SGLang tracked) first, then chunk-boundary snapshots, earliest
first, while fewer than N; the others stay in the request's own ping-pong slot and are
never published. The final state is admitted while the request has published fewer than N
states, and always when it *is* the branch state (a branch in the last prefill chunk with
no decode snapshot after it: SGLang's final state is then the branch snapshot). With a cap
a KV-only leaf that the request merely extends (left behind when eviction took the state
of a path's last node) is not a branch point (Marconi's speculative insertion would not
split anything there), so the prefill snapshots the chunk end instead of that leaf's end
(``MarconiUnifiedRadixCache``). Without a cap (the default) every state SGLang takes is
admitted and FLOP-aware eviction decides which to keep.

Recency of states is read on ``clock``: one tick per request, at its first match after
it arrived or was retracted (the simulator's request clock); re-matches of a waiting
request (one per scheduling round) neither tick it nor repeat the marconi+ ghost lookup
while the ghost index is unchanged (``_ghost_lookup``), so their cost stays SGLang's match.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from sglang_marconi.policy import defaults
from sglang_marconi.policy.alpha import AlphaTuner
from sglang_marconi.policy.defaults import NO_CAP, PAPER_MAX_STATES_PER_REQUEST
from sglang_marconi.policy.ghost import GhostIndex
from sglang_marconi.policy.host_tier import (HostLink, demoted_efficiency, host_efficiency,
                                             host_link_preset, tail_counts_toward_backup)
from sglang_marconi.policy.likelihood import EndStateUsefulness, ReuseWeight
from sglang_marconi.policy.mirror import state_pool_image
from sglang_marconi.policy.online import OnlineAlpha
from sglang_marconi.policy.ranking import ranked_efficiency
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
    """Cost model, alpha, admission plans and counters of one Marconi cache."""

    log_every = LOG_EVERY
    tune_slice_tokens = defaults.TUNE_SLICE_TOKENS  # tokens replayed per tuning slice

    def __init__(self, settings: MarconiSettings, spec, grid: int, kv_tokens: int,
                 state_slots: int, page_size: int = 1, extra_buffer: bool = False,
                 cache_class=None):
        self.settings = settings
        self.spec = spec
        self.grid = max(1, grid)
        self.max_states = (NO_CAP if settings.max_states_per_request < 0
                           else settings.max_states_per_request)
        self.stats = MarconiStats()
        self.exporter = None
        self._init_plans()
        self.rekey = None  # callable(node): re-key a node in both victim queues (the cache)
        self.rekey_chains = None  # callable(is_chain): re-key the chain states (the cache)
        self.clock = 0  # request clock: ticks once per request match (state recency)
        self.extra_buffer = extra_buffer
        self.alpha = (float(settings.alpha)
                      if not (settings.auto_alpha or settings.online_alpha) else 0.0)
        self.capacity_bytes = (kv_tokens * spec.kv_bytes_per_token
                               + state_slots * spec.ssm_state_bytes)
        self.state_slots = state_slots
        self.tuner = None
        self.shadow = None
        self.online = None
        self.tree_tokens = None  # callable: token ids the real tree holds (set by the cache)
        self.stats.alpha_mode = ("auto" if settings.auto_alpha else
                                 "online" if settings.online_alpha else "fixed")
        if settings.online_alpha:
            self.online = OnlineAlpha(self.make_shadow, alphas=settings.online_alphas,
                                      window=settings.online_window,
                                      period=settings.online_period,
                                      sample=settings.online_sample)
            self.alpha = self.online.alpha
        if settings.auto_alpha:
            from sglang_marconi.sglang_integration.shadow import TUNING_GRID, ShadowReplay

            # the auto tuner replays the window through shadow caches of the live class
            self.shadow = ShadowReplay(cache_class, spec, settings, kv_tokens, state_slots,
                                       page_size, extra_buffer)
            # tuned in slices of a fixed token budget, one per finished request, so no
            # cache call carries the whole replay (policy.alpha)
            self.tuner = AlphaTuner(self.shadow, grid=TUNING_GRID,
                                    multiplier=settings.bootstrap_multiplier,
                                    steps=self.shadow.steps,
                                    slice_cost=self.tune_slice_tokens)
        self.reuse = self.ghost = self.end_usefulness = None
        if settings.plus:
            self.stats.alpha_mode = "marconi+"  # settings.alpha is 0: no tuner, no shadows
            self.reuse = ReuseWeight()
            ghost_tokens = int(settings.ghost_factor * kv_tokens)
            if ghost_tokens > 0:
                self.ghost = GhostIndex(ghost_tokens)
                self.end_usefulness = EndStateUsefulness(settings.end_threshold)
        self.stats.alpha = self.alpha
        self.stats.alpha_tuned = not settings.auto_alpha

    # -- alpha ---------------------------------------------------------------------------
    def make_shadow(self, alpha: float, sample: float):
        """A metadata-only simulator cache mirroring this one's state pool, fixed alpha."""
        return state_pool_image(
            self.spec, self.state_slots, extra_buffer=self.extra_buffer, grid=self.grid,
            alpha=alpha, sample=sample, renormalise_limit=self.settings.renormalise_limit,
            max_states_per_request=(self.max_states if self.capped
                                    else PAPER_MAX_STATES_PER_REQUEST))

    @staticmethod
    def _finished_tokens(req):
        """(prompt, the tokens whose KV exists at finish: prompt + output minus the last)."""
        inp = np.asarray(req.origin_input_ids, dtype=np.int64)
        return inp, np.concatenate([inp, np.asarray(req.output_ids[:-1], dtype=np.int64)])

    def _observe_online(self, req) -> None:
        t0 = time.perf_counter()
        inp, full = self._finished_tokens(req)
        new_alpha = self.online.observe(inp, full)
        st = self.stats
        st.online_seconds += time.perf_counter() - t0
        shadows = self.online.shadows.values()
        st.shadow_tokens = sum(s.tree.num_kv_tokens for s in shadows)
        st.shadow_nodes = sum(s.tree.num_nodes for s in shadows)
        if self.tree_tokens is not None:
            st.tree_tokens = self.tree_tokens()
        if new_alpha is not None:
            st.online_switches += 1
            self._set_alpha(new_alpha)

    def _observe_ghost(self, req, adm: SnapshotPlan) -> None:
        """marconi+: remember the finished sequence and where its end state would be (the
        reuse rate is counted in ``admit_final``)."""
        _, full = self._finished_tokens(req)
        # the end marker goes where the request's end state is or would have been
        # (``admit_final``): under extra_buffer its last snapshot (the input's grid-floored
        # end or a decode snapshot), not the end of the KV
        self.ghost.record(full, adm.end, self.clock)

    def _observe_tuner(self, req) -> None:
        """alpha = auto: record the finished request, or run one tuning slice. A failing
        replay is an error (logged, counted in ``tuner_failures``): the alpha stays where
        it is, and no other tuner takes over."""
        from sglang_marconi.sglang_integration.shadow import window_item

        try:
            new_alpha = self.tuner.observe_request(window_item(req))
        except Exception:
            logger.exception("Marconi: alpha tuning failed after %d requests; alpha stays "
                             "%g (no retry)", self.stats.requests, self.alpha)
            self.tuner.abandon()
            self.stats.tuner_failures += 1
            if self.exporter is not None:
                self.exporter.tuner_failure()
            return
        self.stats.tuning_slices = self.tuner.slices
        if new_alpha is not None:
            self._set_alpha(new_alpha)

    def _set_alpha(self, alpha: float) -> None:
        self.alpha = float(alpha)
        self.stats.alpha = self.alpha
        self.stats.alpha_tuned = True
        if self.online is not None:
            logger.info("Marconi alpha moved to %g online after %d requests (FLOPs saved "
                        "by each shadow over the window: %s)", self.alpha, self.online.seen,
                        {a: f"{v:.3g}" for a, v in self.online.window_scores().items()})
        else:
            self.stats.tuning_seconds = getattr(self.shadow, "seconds", 0.0)
            self.stats.tuned_at = self.tuner.tuned_at
            logger.info("Marconi alpha tuned to %g at request %d in %d slices, %.1f s in "
                        "all (FLOPs saved by alpha: %s)", self.alpha, self.tuner.tuned_at,
                        self.tuner.slices, getattr(self.shadow, "seconds", 0.0),
                        {a: f"{v:.3g}" for a, v in getattr(self.tuner, "scores", {}).items()})
        if self.exporter is not None:
            self.exporter.set_alpha(self.alpha)

    # -- scoring -------------------------------------------------------------------------
    @property
    def queue_mode(self) -> str:
        """The ``VictimQueue`` mode: ``gdsf`` (reuse-weighted, aged) for marconi+."""
        return "gdsf" if self.reuse is not None else "marconi"

    def _efficiency(self, node, freed_bytes: float) -> float:
        return ranked_efficiency(self.spec, SGLANG_TREE, node, freed_bytes,
                                 self.reuse_weight if self.reuse is not None else None,
                                 ancestor_depth=cached_state_depth, saved=self._saved)

    def _saved(self, node) -> float:
        """FLOPs a hit at ``node`` saves over its nearest checkpointed ancestor (kept on
        the node: ``components.cached_flops_saved``)."""
        return cached_flops_saved(self.spec, node)

    def reuse_weight(self, node) -> float:
        """marconi+: ``ReuseWeight`` of a tree node (its hit score and the most children it
        was seen with are kept on the node)."""
        if not hasattr(node, "hit_score"):
            node.hit_score, node.last_hit, node.max_children = 0.0, 0, 0
        node.max_children = max(node.max_children, len(node.children))
        return self.reuse(node)

    def chain_weight_moved(self) -> None:
        """marconi+: the learned chain weight moved: re-key the chain states (queued or
        suspended while locked) with it."""
        if self.rekey_chains is not None:
            self.rekey_chains(self.reuse.is_chain)

    def matched(self, node) -> None:
        """The match walk under way ends at ``node``, which holds a state."""
        self._matched_node = node

    def record_hit(self, node) -> None:
        """marconi+: a finished request's hit consumed ``node``'s state. Counted once per
        request, at its release: SGLang re-matches a waiting request every scheduling
        round (and ``touch_prefix`` matches without one), which must not count as reuse.
        The node was locked by the request until then, so the weight it ranks by after
        the unlock is the one a count at match time would have given."""
        if self.reuse is not None:
            self.reuse_weight(node)  # make sure the node carries the counters
            self.reuse.record_hit(node, self.clock)
            if self.rekey is not None:
                self.rekey(node)

    def forget_hits(self, node) -> None:
        """marconi+: ``node`` lost its state but stays in the tree (a tombstone). Its hit
        count goes with the state (GDSF's in-cache frequency): a state inserted there later
        starts from none, as in the simulator, whose tree deletes or merges such a node."""
        if self.reuse is not None and hasattr(node, "hit_score"):
            node.hit_score, node.last_hit = 0.0, 0
            node.max_children = len(node.children)

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
            weight = self.reuse_weight(node) if self.reuse is not None else 1.0
            e = demoted_efficiency(self.host_link, e, freed, self.spec.ssm_state_bytes, weight)
        return e

    # -- the host tier (HiCache): the two-tier rule (policy/host_tier.py) -----------------
    host_link: HostLink = host_link_preset()

    @property
    def host_mode(self):
        """How host victims are ranked: ``gdsf`` (marconi+), ``marconi`` (the alpha
        utility), or None for SGLang's host LRU (``--marconi-host-rule lru``, or marconi at
        alpha 0, where the utility is LRU)."""
        if self.settings.host_rule == "lru":
            return None
        if self.reuse is not None:
            return "gdsf"
        return "marconi" if self.alpha else None

    # callable: SGLang's host write policy as (is_write_back, write_through_threshold), or
    # None without a host tier (set by the cache: SGLang attaches HiCache after __init__)
    host_write_policy = None

    def keeps_tail_for_backup(self) -> bool:
        """The admission half of the two-tier rule (``host_tier.tail_counts_toward_backup``):
        under a host tier that backs nodes up on a later insert, marconi+ admits the end
        states its learned usefulness would refuse. Off with ``--marconi-host-rule lru``."""
        if self.host_mode is None or self.host_write_policy is None:
            return False
        policy = self.host_write_policy()
        return policy is not None and tail_counts_toward_backup(*policy)

    def _host_efficiency(self, node, held_bytes: float) -> float:
        return host_efficiency(self.spec, self.host_link, TIER_TREE, node, len(node.key),
                               held_bytes,
                               self.reuse_weight if self.reuse is not None else None)

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
        when it lies beyond both the hit and SGLang's own branch (extra_buffer only); and
        the ghost index's answer (``ghost.GhostAnswer``: whether the input reaches a
        remembered end, any mode; how it leaves the remembered sequences). Returns
        (result, answer), answer None without a ghost index."""
        if self.ghost is None:
            return result, None
        answer = self._ghost_lookup(req)
        if not self.extra_buffer:
            return result, answer  # no prefill snapshots a branch
        branch = answer.branch // self.grid * self.grid
        current = result.mamba_branching_seqlen or 0
        if branch > max(current, result.device_prefix_len):
            result = result._replace(mamba_branching_seqlen=branch)
        return result, answer

    def state_evicted(self, reason: str) -> None:
        self.stats.evicted[reason] += 1
        if self.exporter is not None:
            self.exporter.state("evicted", reason)

    def on_eviction(self) -> None:
        if self.tuner is not None:
            self.tuner.observe_eviction()

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
        saved = self.spec.flops_saved(adm.hit_len, 0)
        st.flops_saved += saved
        st.prefill_flops += self.spec.prefill_flops(len(req.origin_input_ids))
        if self.exporter is not None:
            self.exporter.request(adm.hit_len, saved)
        if self.tuner is not None and self.tuner.recording:
            self._observe_tuner(req)
        if self.online is not None:
            self._observe_online(req)
        if self.ghost is not None:
            self._observe_ghost(req, adm)
        if adm.hit_node is not None and has_state(adm.hit_node):
            self.record_hit(adm.hit_node)
        if st.requests % self.log_every == 0:
            logger.info(st.summary_line())
