"""``MarconiPolicyState``: what the Marconi components consult while SGLang runs the tree.

One per cache: the cost model, alpha (fixed; tuned once by ``policy.alpha.AlphaTuner``
on shadow replays, see ``shadow``; or followed online by ``policy.online.OnlineAlpha``),
the per-request admission plans and the counters.

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

Recency of states is read on ``clock``: one tick per request match (the simulator's
request clock).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from sglang_marconi.policy.admission import branch_checkpoint
from sglang_marconi.policy.defaults import PAPER_MAX_STATES_PER_REQUEST, running_state_slots
from sglang_marconi.policy.mirror import state_pool_image
from sglang_marconi.policy.ranking import ranked_efficiency
from sglang_marconi.sglang_integration.components import SGLANG_TREE, has_state
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
    published: int = 0         # intermediate states admitted so far
    ghost_end: bool = False    # marconi+: the input reaches a remembered request end
    end: int = 0               # marconi+: where its end state is or would be (0: none new)
    hit_node: object = None    # marconi+: the node whose state its (last) match consumes
    counted: bool = False      # marconi+: counted in the end-state reuse rate


class MarconiPolicyState:
    """Cost model, alpha, admission plans and counters of one Marconi cache."""

    log_every = LOG_EVERY
    max_tracked_requests = 1 << 16  # plans of requests that matched but never finished

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
        self._requests: dict[str, RequestAdmission] = {}
        self._matched_node = None  # set by the MAMBA component during a match walk
        self.rekey = None  # callable(node): re-key a node in both victim queues (the cache)
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
            from sglang_marconi.policy.online import OnlineAlpha

            self.online = OnlineAlpha(self.make_shadow, alphas=settings.online_alphas,
                                      window=settings.online_window,
                                      period=settings.online_period,
                                      sample=settings.online_sample)
            self.alpha = self.online.alpha
        if settings.auto_alpha:
            from sglang_marconi.policy.alpha import AlphaTuner
            from sglang_marconi.sglang_integration.shadow import TUNING_GRID, ShadowReplay

            # the auto tuner replays the window through shadow caches of the live class
            self.shadow = ShadowReplay(cache_class, spec, settings, kv_tokens, state_slots,
                                       page_size, extra_buffer)
            self.tuner = AlphaTuner(self._replay_window, grid=TUNING_GRID,
                                    multiplier=settings.bootstrap_multiplier)
        self.reuse = self.ghost = self.end_usefulness = None
        if settings.plus:
            from sglang_marconi.policy.ghost import GhostIndex
            from sglang_marconi.policy.likelihood import EndStateUsefulness, ReuseWeight

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
        limit = self.settings.renormalise_limit  # the real cache's normalisation rule
        slots = max(1, self.state_slots - running_state_slots(self.extra_buffer))
        return state_pool_image(
            self.spec, self.state_slots, extra_buffer=self.extra_buffer, grid=self.grid,
            alpha=alpha, sample=sample, renormalise=limit < 0 or slots <= limit,
            max_states_per_request=(self.max_states if self.capped
                                    else PAPER_MAX_STATES_PER_REQUEST))

    @staticmethod
    def _finished_tokens(req):
        """(prompt, the tokens whose KV exists at finish: prompt + output minus the last)."""
        import numpy as np

        inp = np.asarray(req.origin_input_ids, dtype=np.int64)
        return inp, np.concatenate([inp, np.asarray(req.output_ids[:-1], dtype=np.int64)])

    def _observe_online(self, req) -> None:
        import time

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

    def _observe_ghost(self, req, adm: RequestAdmission) -> None:
        """marconi+: remember the finished sequence and where its end state would be (the
        reuse rate is counted in ``admit_final``)."""
        _, full = self._finished_tokens(req)
        # the end marker goes where the request's end state is or would have been
        # (``admit_final``): under extra_buffer its last snapshot (the input's grid-floored
        # end or a decode snapshot), not the end of the KV
        self.ghost.record(full, adm.end, self.clock)

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
        if self.online is not None:
            logger.info("Marconi alpha moved to %g online after %d requests (FLOPs saved "
                        "by each shadow over the window: %s)", self.alpha, self.online.seen,
                        {a: f"{v:.3g}" for a, v in self.online.window_scores().items()})
        else:
            self.stats.tuning_seconds = getattr(self.shadow, "seconds", 0.0)
            logger.info("Marconi alpha tuned to %g in %.1f s (FLOPs saved by alpha: %s)",
                        self.alpha, getattr(self.shadow, "seconds", 0.0),
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
                                 self.reuse_weight if self.reuse is not None else None)

    def reuse_weight(self, node) -> float:
        """marconi+: ``ReuseWeight`` of a tree node (its hit score and the most children it
        was seen with are kept on the node)."""
        if not hasattr(node, "hit_score"):
            node.hit_score, node.last_hit, node.max_children = 0.0, 0, 0
        node.max_children = max(node.max_children, len(node.children))
        return self.reuse(node)

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
        """FLOP efficiency of the node per byte of the token pool (its own KV tokens)."""
        return self._efficiency(node, self.spec.kv_bytes_per_token * len(node.key))

    # -- admission -----------------------------------------------------------------------
    @property
    def capped(self) -> bool:
        return self.max_states != NO_CAP

    def tick(self, rid=None) -> None:
        """A request is matched: the request clock advances, once per request (SGLang
        re-matches a waiting request every scheduling round; those re-matches are not
        new requests, so a queue under load does not speed up the clock)."""
        if rid is None or rid not in self._requests:
            self.clock += 1
        self._matched_node = None

    def ghost_branch(self, req, result):
        """marconi+: where the input leaves the sequences the ghost index remembers (past
        evictions), on the checkpoint grid, as the branch SGLang snapshots in the prefill
        when it lies beyond both the hit and SGLang's own branch (extra_buffer only); and
        whether the input reaches a remembered end (any mode). Returns (result, reaches)."""
        if self.ghost is None:
            return result, False
        tokens = req.origin_input_ids
        branch, end = self.ghost.lookup(tokens, max(0, len(tokens) - 1))
        if not self.extra_buffer:
            return result, bool(end)  # no prefill snapshots a branch
        branch = branch // self.grid * self.grid
        current = result.mamba_branching_seqlen or 0
        if branch > max(current, result.device_prefix_len):
            result = result._replace(mamba_branching_seqlen=branch)
        return result, bool(end)

    def on_match(self, req, result, reaches_end: bool = False) -> None:
        """A request matched (possibly again, while it waits): plan its branch state.
        ``reaches_end`` (marconi+): its input reaches a remembered request end."""
        hit = result.device_prefix_len
        # without the extra buffer no prefill snapshots a branch: the plan has none
        branch_len = result.mamba_branching_seqlen if self.extra_buffer else None
        input_len = len(req.origin_input_ids)
        branch = branch_checkpoint(input_len, hit, branch_len, self.grid, self.max_states)
        reserved = (1 if branch else 0) + 1  # the branch point and the final state
        if len(self._requests) >= self.max_tracked_requests:  # aborted while waiting
            self._requests.pop(next(iter(self._requests)))
        self._requests[req.rid] = RequestAdmission(
            hit_len=hit, branch_len=branch_len, branch=branch,
            chunk_budget=max(0, self.max_states - reserved),
            ghost_end=reaches_end,
            hit_node=self._matched_node if hit else None)

    def plan(self, rid: str) -> Optional[RequestAdmission]:
        """The admission plan of request ``rid`` (matched, not yet released), or None."""
        return self._requests.get(rid)

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
            adm.published += 1
            return True
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
        if self.ghost is not None and not adm.counted:
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
                self.end_usefulness.observe_request(adm.ghost_end, bool(adm.end))
        if adm.branch and position == adm.branch:
            adm.pending = "branch"  # the branch snapshot arrives as the final state
            return True
        adm.pending = "final"
        if (self.end_usefulness is not None and adm.end
                and not self.end_usefulness.admit()):
            self.stats.end_states_skipped += 1
            return False  # marconi+: end states are rarely reused on this traffic
        if not self.capped:
            return True  # no cap: SGLang's own admission, state for state
        return adm.published < self.max_states

    def state_admitted(self, req, finished: bool) -> None:
        adm = self._requests.get(req.rid)
        reason = adm.pending if adm and adm.pending else ("final" if finished else "chunk")
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
        if self.online is not None:
            self._observe_online(req)
        if self.ghost is not None:
            self._observe_ghost(req, adm)
        if adm.hit_node is not None and has_state(adm.hit_node):
            self.record_hit(adm.hit_node)
        if st.requests % self.log_every == 0:
            logger.info(st.summary_line())
