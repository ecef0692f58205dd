"""The contract every cache keeps, simulator and SGLang alike (one suite, every subject).

Each subject is one cache behind a small driver that replays (input, output) requests one
after another and reports the hit of each: every policy the simulator builds by name
(``sim.policies``) and the SGLang caches on CPU pools (stock ``UnifiedRadixCache`` on the
python tree core; ``MarconiUnifiedRadixCache`` at alpha 0 and 1, and marconi+), driven
through the scheduler's calls (``driver.replay``). Every check below runs on every subject:

- an empty cache has no hits, and prompts that share no token with anything seen never hit;
- a sequence the cache has seen hits when a request extends it (the next chat turn), and a
  prefix shared by several prompts hits by its third occurrence (the first shows nothing,
  the second shows the branch), up to the subject's checkpoint granularity. (An exact
  repeat of a prompt is no such check: the paper's admission keeps a state at the end of
  prompt + output, which a repeated prompt never reaches, so Marconi does not hit it.)
- a hit never exceeds the input minus its last token, nor the longest prefix the input
  shares with a sequence seen before;
- FLOPs saved never exceed the prefill FLOPs, per request and in total, and the cache's own
  counters (where it keeps them) agree with the hits the driver saw;
- the cache stays within its budget (simulator: bytes; SGLang: pool slots) while the budget
  binds (it evicts), and an unbounded cache evicts nothing;
- the cache's invariants hold after every request (simulator: ``RadixTree.check``; SGLang:
  ``marconi_checks.invariants.check_idle``: sizes, locks, leaks, Marconi's victim queues);
- the same request stream through two fresh caches gives the same hits and evictions.
"""
from __future__ import annotations

import functools
import random
from array import array
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pytest

from sglang_marconi.model import preset_spec
from sglang_marconi.policy.tree import as_tokens, common_prefix_len
from sglang_marconi.sim.policies import build_cache as build_sim_cache
from sglang_marconi.sim.policies import parse_policy
from sglang_marconi.sim.traces import Request, Trace

SPEC = preset_spec("paper-7b")
KV, STATE = SPEC.kv_bytes_per_token, SPEC.ssm_state_bytes
NEVER = 1 << 20  # a chunk size / track interval no request here reaches
SGLANG_GRID = 16  # SGLang's checkpoint grid here (mamba cache chunk 16, page 1)


# -- request streams ------------------------------------------------------------------------
class Fresh:
    """Token ids never used before, ``n`` at a time."""

    def __init__(self, start=10**6):
        self.next = start

    def __call__(self, n):
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def random_mix(seed, n=40, base_len=200, max_output=20):
    """Shared bases, chat continuations, exact repeats and prefixes of cached sequences."""
    rng = random.Random(seed)
    t = Fresh()
    bases = [t(base_len) for _ in range(3)]
    hist, reqs = [], []
    for _ in range(n):
        kind = rng.random()
        if hist and kind < 0.15:
            inp = list(rng.choice(hist)[0])
        elif hist and kind < 0.3:
            i, o = rng.choice(hist)
            inp = (i + o)[:rng.randint(1, len(i) + len(o))]
        elif hist and kind < 0.55:
            i, o = rng.choice(hist)
            inp = i + o + t(rng.randint(1, 25))
        else:
            inp = rng.choice(bases)[:rng.randint(0, base_len)] + t(rng.randint(1, 30))
        out = t(rng.randint(1, max_output))
        hist.append((inp, out))
        reqs.append((inp, out))
    return reqs


def mixed_stream(seed=0, n=30):
    """Shared bases, chat continuations, exact repeats and prefixes of seen sequences."""
    return random_mix(seed, n, base_len=120, max_output=12)


def disjoint_stream(n=6):
    t = Fresh()
    return [(t(40 + 10 * i), t(4)) for i in range(n)]


def continuation_stream():
    """A turn, two unrelated requests, then the next turn: the whole first turn + more."""
    t = Fresh()
    prompt, out = t(100), t(8)
    return [(prompt, out), (t(50), t(3)), (t(60), t(3)), (prompt + out + t(12), t(4))]


SYSTEM_LEN = 96


def shared_prefix_stream():
    """One system prompt, three questions."""
    t = Fresh()
    system = t(SYSTEM_LEN)
    return [(system + t(20 + 3 * i), t(5)) for i in range(3)]


def full_tokens(inp, out) -> list:
    """The tokens whose KV exists when the request finishes (the last output has none)."""
    return list(inp) + list(out[:-1])


def common_prefix(a, b) -> int:
    return common_prefix_len(as_tokens(a), as_tokens(b))


# -- the subjects ---------------------------------------------------------------------------
class SimDriver:
    """A simulator ``PrefixCache`` built by ``sim.policies`` from a policy name."""

    def __init__(self, policy: str, requests, tight: bool):
        longest = max(len(i) + len(o) for i, o in requests)
        total = sum(len(i) + len(o) for i, o in requests)
        self.budget = (3 * longest * KV + 3 * STATE if tight
                       else 10 * (total * KV + 8 * len(requests) * STATE))
        trace = Trace("contract", [Request(np.asarray(i, dtype=np.int64),
                                           np.asarray(o, dtype=np.int64))
                                   for i, o in requests])
        self.cache = build_sim_cache(parse_policy(policy), SPEC, self.budget, 1, trace)
        if self.cache.capacity is None:  # "infinite": no budget
            self.budget = None

    def request(self, inp, out) -> int:
        return self.cache.process(np.asarray(inp, dtype=np.int64),
                                  np.asarray(full_tokens(inp, out), dtype=np.int64))

    def check(self) -> None:
        self.cache.tree.check()

    def check_budget(self) -> None:
        assert self.cache.tree.bytes_used <= self.budget
        assert self.cache.stats.peak_bytes <= self.budget

    def evictions(self) -> int:
        st = self.cache.stats
        return st.states_evicted + st.kv_tokens_evicted

    def own_counts(self):
        """(requests, hit tokens, FLOPs saved, prefill FLOPs) as the cache counts them."""
        st = self.cache.stats
        return st.requests, st.hit_tokens, st.flops_saved, st.prefill_flops


class SGLangDriver:
    """An SGLang cache on CPU pools, replayed through the scheduler's calls."""

    def __init__(self, settings: Optional[dict], requests, tight: bool):
        pytest.importorskip("sglang")
        from sglang_marconi.driver.pools import PoolConfig, build_cache
        from sglang_marconi.driver.replay import Replayer
        from sglang_marconi.harness.ab import instrument

        longest = max(len(i) + len(o) for i, o in requests)
        total = sum(len(i) + len(o) for i, o in requests)
        self.pc = PoolConfig(
            kv_tokens=3 * longest if tight else total + 4 * longest + 64,
            mamba_slots=6 if tight else 2 * len(requests) + 8, page_size=1,
            max_context_len=longest + 8, chunked_prefill_size=NEVER,
            mamba_track_interval=NEVER, mamba_cache_chunk_size=SGLANG_GRID)
        cache_class = None
        if settings is not None:
            from sglang_marconi.sglang_integration.cache import MarconiUnifiedRadixCache
            from sglang_marconi.sglang_integration.options import MarconiSettings

            cache_class = functools.partial(MarconiUnifiedRadixCache, spec=SPEC,
                                            settings=MarconiSettings(**settings))
        self.cache = build_cache(self.pc, cache_class=cache_class, tree_core="python")[0]
        self.counters = instrument(self.cache)
        self.replayer = Replayer(self.cache, chunked_prefill_size=NEVER)
        self.budget = (self.pc.kv_tokens, self.pc.mamba_slots)
        self.peak = (0, 0)
        self.hits = []
        self.inputs = []

    def request(self, inp, out) -> int:
        from sglang_marconi.driver.replay import ReplayRequest

        outcome = self.replayer.run(ReplayRequest(f"r{len(self.hits)}", array("q", inp),
                                                  list(out)))
        self.peak = (max(self.peak[0], outcome.peak_kv_used),
                     max(self.peak[1], outcome.peak_mamba_used))
        self.hits.append(outcome.hit_len)
        self.inputs.append(len(inp))
        return outcome.hit_len

    def check(self) -> None:
        from marconi_checks.invariants import check_idle

        check_idle(self.cache)

    def check_budget(self) -> None:
        from marconi_checks.invariants import tree_holdings

        kv_slots, state_slots = self.budget
        held = tree_holdings(self.cache)
        assert held["kv"] <= kv_slots and held["states"] <= state_slots, held
        assert self.peak[0] <= kv_slots and self.peak[1] <= state_slots, self.peak

    def evictions(self) -> int:
        return self.counters.states_evicted + self.counters.kv_tokens_evicted

    def own_counts(self):
        if not hasattr(self.cache, "marconi"):  # stock SGLang keeps no such counters
            return None
        st = self.cache.marconi.stats
        return st.requests, st.hit_tokens, st.flops_saved, st.prefill_flops


@dataclass(frozen=True)
class Subject:
    name: str
    build: Callable  # (requests, tight) -> driver
    granularity: int  # tokens a hit may fall short of a cached prefix (grid, block)

    def __str__(self) -> str:
        return self.name


def sim_subject(policy: str, granularity: int = 1) -> Subject:
    return Subject(policy, functools.partial(SimDriver, policy), granularity)


def sglang_subject(name: str, settings: Optional[dict]) -> Subject:
    return Subject(name, functools.partial(SGLangDriver, settings), SGLANG_GRID)


SUBJECTS = [
    sim_subject("vllm+", granularity=32),  # a state every 32-token block
    sim_subject("paper-sglang+"),
    sim_subject("marconi"),                # alpha tuned by bootstrap
    sim_subject("marconi:alpha=1"),
    sim_subject("marconi:alpha=online"),
    sim_subject("marconi+"),
    sim_subject("infinite"),
    sim_subject("offline"),
    sglang_subject("sglang-stock", None),
    sglang_subject("sglang-marconi-a0", dict(alpha=0.0)),
    sglang_subject("sglang-marconi-a1", dict(alpha=1.0)),
    sglang_subject("sglang-marconi+", dict()),
    sglang_subject("sglang-marconi-decay", dict(decay=True)),
]
every_subject = pytest.mark.parametrize("subject", SUBJECTS, ids=str)


def replay(driver, requests, after=None) -> list:
    hits = []
    for inp, out in requests:
        hits.append(driver.request(inp, out))
        if after is not None:
            after(driver)
    return hits


# -- the contract ---------------------------------------------------------------------------
@every_subject
def test_an_empty_cache_has_no_hits(subject):
    requests = disjoint_stream()
    driver = subject.build(requests, False)
    assert replay(driver, requests) == [0] * len(requests)
    counts = driver.own_counts()
    if counts is not None:
        assert counts[:3] == (len(requests), 0, 0.0)


@every_subject
def test_a_seen_sequence_hits_when_a_request_extends_it(subject):
    requests = continuation_stream()
    driver = subject.build(requests, False)
    hits = replay(driver, requests)
    prompt = requests[0][0]
    assert hits[-1] >= len(prompt) - subject.granularity > 0, hits


@every_subject
def test_a_shared_prefix_hits_by_its_third_occurrence(subject):
    requests = shared_prefix_stream()
    driver = subject.build(requests, False)
    hits = replay(driver, requests)
    assert hits[0] == 0
    assert hits[2] >= SYSTEM_LEN - subject.granularity, hits


@every_subject
@pytest.mark.parametrize("tight", [False, True], ids=["roomy", "tight"])
def test_hits_stay_within_the_input_and_what_was_seen(subject, tight):
    requests = mixed_stream(0)
    driver = subject.build(requests, tight)
    hits = replay(driver, requests)
    seen = []
    for k, ((inp, out), hit) in enumerate(zip(requests, hits)):
        shared = max((common_prefix(inp, s) for s in seen), default=0)
        assert 0 <= hit <= min(len(inp) - 1, shared), f"request {k}: hit {hit}"
        seen.append(full_tokens(inp, out))
    assert sum(hits) > 0  # the stream has hits to bound


@every_subject
@pytest.mark.parametrize("tight", [False, True], ids=["roomy", "tight"])
def test_flops_saved_stay_within_the_prefill_flops(subject, tight):
    requests = mixed_stream(1)
    driver = subject.build(requests, tight)
    hits = replay(driver, requests)
    saved = [SPEC.flops_saved(h, 0) for h in hits]
    prefill = [SPEC.prefill_flops(len(inp)) for inp, _ in requests]
    assert all(s <= p for s, p in zip(saved, prefill))
    assert 0 < sum(saved) < sum(prefill)
    counts = driver.own_counts()
    if counts is not None:
        n, hit_tokens, own_saved, own_prefill = counts
        assert (n, hit_tokens) == (len(requests), sum(hits))
        assert own_saved == pytest.approx(sum(saved), rel=1e-9)
        assert own_prefill == pytest.approx(sum(prefill), rel=1e-9)
        assert own_saved <= own_prefill


@every_subject
def test_the_cache_stays_within_its_budget(subject):
    requests = mixed_stream(2, n=40)
    driver = subject.build(requests, True)
    if driver.budget is None:  # unbounded: nothing to keep within, nothing evicted
        replay(driver, requests)
        assert driver.evictions() == 0
        return
    replay(driver, requests, after=lambda d: d.check_budget())
    assert driver.evictions() > 0  # the budget binds


@every_subject
@pytest.mark.parametrize("tight", [False, True], ids=["roomy", "tight"])
def test_invariants_hold_after_every_request(subject, tight):
    requests = mixed_stream(3)
    driver = subject.build(requests, tight)
    driver.check()  # the empty cache too
    replay(driver, requests, after=lambda d: d.check())


@every_subject
def test_the_same_stream_gives_the_same_hits(subject):
    requests = mixed_stream(4, n=40)
    runs = []
    for _ in range(2):
        driver = subject.build(requests, True)
        runs.append((replay(driver, requests), driver.evictions()))
    assert runs[0] == runs[1]
    assert sum(runs[0][0]) > 0
