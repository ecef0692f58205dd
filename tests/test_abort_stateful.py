"""Aborts at every stage leak nothing: a hypothesis state machine drives the real CPU
Marconi cache (SGLang's pools, ``driver``) through the calls a scheduler makes for several
requests at once, interleaved at random: match (and re-match while waiting), admit (lock +
first prefill chunk), further chunks, decode steps, finish, retraction back to the waiting
queue, and aborts while waiting, during a chunked prefill, while decoding and after a
retraction, following ``Scheduler.abort_request`` / ``release_req``
(``sglang.test.kits.abort_timeout_kit`` exercises the same paths on a server).

After every step SGLang's size invariants hold (``marconi_checks.invariants.check_sizes``)
and no released request keeps an admission plan; at teardown every request still alive is
aborted and then: no lock, every KV and state slot free or held by the tree (``check_idle``), and
no admission plan reachable (``policy.live_plans``).

CI budget: ``MAX_EXAMPLES`` x ``STEPS`` below (about 40 s on 2 cores). The long run
(``STEPS`` is a maximum: hypothesis ends some examples earlier; each policy prints the
operations it ran):

    MARCONI_STATEFUL_EXAMPLES=100 MARCONI_STATEFUL_STEPS=200 PYTHONPATH=. \\
        python -m pytest -q -s -p no:cacheprovider tests/test_abort_stateful.py

ran, for issue 13, 85,659 operations over the five policies with 0 leaks (counts per
policy in docs/sglang.md); 10^5 needs ``MARCONI_STATEFUL_EXAMPLES=120``.
"""
import functools
import gc
import os
import random
from array import array

import pytest

pytest.importorskip("sglang")
pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (  # noqa: E402
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from sglang_marconi.driver.pools import PoolConfig, build_cache  # noqa: E402
from sglang_marconi.driver.replay import Replayer  # noqa: E402
from marconi_checks.invariants import (  # noqa: E402
    check_idle,
    check_sizes,
    guard_locked_evictions,
)
from sglang_marconi.model import preset_spec  # noqa: E402
from sglang_marconi.sglang_integration.cache import MarconiUnifiedRadixCache  # noqa: E402
from sglang_marconi.sglang_integration.options import MarconiSettings  # noqa: E402

SPEC = preset_spec("paper-7b")
PC = PoolConfig(kv_tokens=2048, mamba_slots=16, page_size=16, max_context_len=1024,
                max_running_requests=4, chunked_prefill_size=128, mamba_track_interval=32)
MAX_RUNNING = 3
MAX_EXAMPLES = int(os.environ.get("MARCONI_STATEFUL_EXAMPLES", 8))
STEPS = int(os.environ.get("MARCONI_STATEFUL_STEPS", 40))
BASES = [[1000 * b + i for i in range(300)] for b in range(3)]
POLICIES = {
    "marconi-a0": dict(alpha=0.0),
    "marconi-a1-cap2": dict(alpha=1.0, max_states_per_request=2),
    "marconi-a2": dict(alpha=2.0),
    "marconi": dict(),  # the reuse-weighted ranking
}


class Scheduler(RuleBasedStateMachine):
    """One scheduler over one cache; ``policy`` is set by the parametrised test."""

    policy = "marconi-a2"
    operations = 0  # rules run, all machines (reported by the test)

    def __init__(self):
        super().__init__()
        from sglang.srt.managers.schedule_batch import Req  # noqa: F401

        cls = functools.partial(MarconiUnifiedRadixCache, spec=SPEC,
                                settings=MarconiSettings(**POLICIES[self.policy]))
        self.cache = build_cache(PC, cache_class=cls, tree_core="python")[0]
        guard_locked_evictions(self.cache)
        self.replayer = Replayer(self.cache, chunked_prefill_size=PC.chunked_prefill_size)
        self.waiting, self.prefilling, self.decoding = [], [], []
        self.outputs = {}  # rid -> the output tokens still to produce
        self.released = []  # requests released (their plans must be gone)
        self.n = 0

    # -- helpers -------------------------------------------------------------------------
    @property
    def running(self):
        return len(self.prefilling) + len(self.decoding)

    def _release(self, req, checkpoint: bool):
        from sglang.srt.mem_cache.common import release_kv_cache

        holds_kv = req.kv.holds_kv
        release_kv_cache(req, self.cache, checkpoint=checkpoint)
        if holds_kv:  # released through on_release (a waiting request is just dropped)
            assert self.cache.marconi.plan(req) is None, "released request keeps its plan"

    def _match_waiting(self, req):
        """A scheduling round's match of a request it does not admit: the match may take a
        state slot (copy-on-write of the hit), which ``get_new_batch_prefill`` reverts."""
        req.init_next_round_input(self.cache)
        req.kv.mamba_cow_src_index = None
        req.kv.mamba_needs_clear = False
        if req.kv.holds_mamba:
            self.cache.req_to_token_pool.mamba_allocator.free(req.kv.mamba_pool_idx.unsqueeze(-1))
            req.kv.mamba_pool_idx = None

    def _extend(self, req):
        self.replayer._extend(req, len(req.full_untruncated_fill_ids))
        if req.extend_end >= len(req.full_untruncated_fill_ids):
            req.prefix_len = req.extend_end
            self.prefilling.remove(req)
            self.decoding.append(req)

    # -- rules ---------------------------------------------------------------------------
    @rule(base=st.integers(0, 2), shared=st.integers(0, 300), fresh=st.integers(1, 60),
          out=st.integers(1, 40))
    def new_request(self, base, shared, fresh, out):
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        rng = random.Random(self.n)
        ids = BASES[base][:shared] + [rng.randrange(10**6, 2 * 10**6) for _ in range(fresh)]
        rid = f"r{self.n}"
        self.n += 1
        req = Req(rid=rid, origin_input_text="", origin_input_ids=array("q", ids),
                  sampling_params=SamplingParams(temperature=0, max_new_tokens=out))
        self._match_waiting(req)  # the waiting queue's first round
        self.outputs[rid] = [3 * 10**6 + 1000 * self.n + j for j in range(out)]
        self.waiting.append(req)

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 100))
    def rematch(self, i):
        """A scheduling round re-matches a waiting request (LPM)."""
        self._match_waiting(self.waiting[i % len(self.waiting)])

    @precondition(lambda self: self.waiting and self.running < MAX_RUNNING)
    @rule(i=st.integers(0, 100))
    def admit(self, i):
        req = self.waiting.pop(i % len(self.waiting))
        req.init_next_round_input(self.cache)
        req.lock = self.cache.lock(req.last_node)
        self.prefilling.append(req)
        self._extend(req)

    @precondition(lambda self: self.prefilling)
    @rule(i=st.integers(0, 100))
    def next_chunk(self, i):
        from sglang.srt.mem_cache.common import checkpoint_kv_cache

        req = self.prefilling[i % len(self.prefilling)]
        checkpoint_kv_cache(req, self.cache)
        req.init_next_round_input()
        self._extend(req)

    @precondition(lambda self: self.decoding)
    @rule(i=st.integers(0, 100))
    def decode(self, i):
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH

        req = self.decoding[i % len(self.decoding)]
        todo = self.outputs[req.rid]
        req.output_ids.append(todo.pop(0))
        if not todo:
            req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
            self.decoding.remove(req)
            self._release(req, checkpoint=True)
            self.released.append(req)
        else:
            self.replayer._decode_step(req)

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 100))
    def abort_waiting(self, i):
        """``abort_request``: popped from the waiting queue; released only if it holds a
        state slot (it holds no KV: ``release_kv_cache`` returns before ``on_release``)."""
        req = self.waiting.pop(i % len(self.waiting))
        if req.kv.holds_mamba:
            self._release(req, checkpoint=False)

    @precondition(lambda self: self.prefilling)
    @rule(i=st.integers(0, 100))
    def abort_prefilling(self, i):
        """The chunked request's abort (``_pending_chunked_abort_req``)."""
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        req = self.prefilling.pop(i % len(self.prefilling))
        req.finished_reason = FINISH_ABORT("aborted")
        self._release(req, checkpoint=False)
        self.released.append(req)

    @precondition(lambda self: self.decoding)
    @rule(i=st.integers(0, 100), checkpoint=st.booleans())
    def abort_decoding(self, i, checkpoint):
        """A running request marked aborted finishes at the next batch result
        (``checkpoint=True``), or is released without caching (``checkpoint=False``)."""
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        req = self.decoding.pop(i % len(self.decoding))
        req.finished_reason = FINISH_ABORT("aborted")
        self._release(req, checkpoint=checkpoint)
        self.released.append(req)

    @precondition(lambda self: self.decoding)
    @rule(i=st.integers(0, 100))
    def retract(self, i):
        """``release_req``: KV released without caching, back to the waiting queue."""
        req = self.decoding.pop(i % len(self.decoding))
        self._release(req, checkpoint=False)
        req.reset_for_retract()
        self._match_waiting(req)
        self.waiting.append(req)

    # -- checks --------------------------------------------------------------------------
    @invariant()
    def sizes_hold(self):
        Scheduler.operations += 1  # the invariant runs once after every rule
        check_sizes(self.cache)
        for req in self.released:
            assert self.cache.marconi.plan(req) is None

    def teardown(self):
        self._abort_all()
        policy = self.cache.marconi
        check_idle(self.cache)
        gc.collect()
        assert len(policy.live_plans) == 0, f"{len(policy.live_plans)} plans leaked"

    def _abort_all(self):
        """Every request still alive is aborted and dropped, as the scheduler does."""
        for req in self.prefilling + self.decoding:
            self._release(req, checkpoint=False)
        for req in self.waiting:
            if req.kv.holds_mamba:
                self._release(req, checkpoint=False)
        self.waiting, self.prefilling, self.decoding, self.released = [], [], [], []


@pytest.mark.parametrize("policy", list(POLICIES))
def test_aborts_at_every_stage_leak_nothing(policy):
    machine = type(f"Scheduler_{policy}", (Scheduler,), {"policy": policy})
    machine.TestCase.settings = settings(
        max_examples=MAX_EXAMPLES, stateful_step_count=STEPS, deadline=None,
        derandomize=True, suppress_health_check=list(HealthCheck),
        phases=(Phase.explicit, Phase.generate))  # shrinking a long run takes minutes
    before = Scheduler.operations
    machine.TestCase().runTest()
    print(f"{policy}: {Scheduler.operations - before} operations, 0 leaks")
