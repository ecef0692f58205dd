"""The simulator and the SGLang cache make the same decisions where their models coincide.

The simulator is ``policy.cache.PrefixCache``; the SGLang cache is
``MarconiUnifiedRadixCache`` on real SGLang pools, driven through the scheduler's own calls
(``sglang_integration.replay``). Both see the same requests; after every request the test
compares the hit length, the branch position admitted, the set of prefix lengths that hold an
SSM state in each tree and (with eviction) the sequence of evicted state positions.

Where the models coincide (docs/sglang.md, "Where the simulator and SGLang differ", says why
it is only there):

- ``extra_buffer``: SGLang's extra-buffer strategy (checkpoint grid 1, 16 or SGLang's
  default 64; page 1 or 16) with one prefill chunk per request
  (chunked_prefill_size above every input) and no decode snapshot (mamba_track_interval
  above every sequence). SGLang then publishes one state per request, the last one the
  prefill took: the branch point when the match reported one, else the grid-floored end of
  the input; the tree keeps the sequence only up to it. The simulator mirrors it with
  ``max_states_per_request=1`` (the branch first, else the end), ``cache_output=False``,
  ``grid`` = SGLang's checkpoint grid and ``branch_rule="kv"`` (SGLang's branch: where the
  KV match of input[:-1] ends beyond the hit).
- ``no_buffer``: SGLang without the extra buffer (page 1): one state at the end of input +
  output minus the last token, no branch states. The simulator: ``branch_rule="none"``,
  ``cache_output=True``, grid 1.

Eviction: only the state pool binds (a KV pool larger than the trace), which the simulator
models with a byte budget of state slots and KV bytes of 0 (``StatePoolCost``), sized as the
pool minus the slots a running request holds (3 with the extra buffer, 1 without), with
SGLang's timing (``evict_at="begin"``), per-eviction normalisation (``renormalise``) and
SGLang's recency stamps (``insert_clock_offset=0.5``). The candidates coincide on trees
whose states have at most one child: chat sessions, and everything under ``no_buffer``
(which keeps no branch states). Elsewhere (branch states under the extra buffer) the test
checks the scoring instead: the efficiency, the recency and the ranking of every state.

marconi+ (``MarconiSettings(plus=True)``; the simulator's ``reuse_weight=ReuseWeight()``,
``ghost_tokens`` and ``end_threshold``, each side's ghost index of the same size) is compared
the same way, in the same configurations, and after every request also on the ghost index,
the end-state reuse counts and skipped end states; where eviction runs, on the GDSF victim
queue itself (the states, their keys, their order and the aging clock). Where branch states
are in the tree the test checks each state's reuse weight and weighted efficiency.
"""
from __future__ import annotations

import functools
import random
from array import array
from dataclasses import dataclass

import numpy as np
import pytest

pytest.importorskip("sglang")

from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402

from sglang_marconi.model import HybridModelSpec  # noqa: E402
from sglang_marconi.policy.cache import PrefixCache  # noqa: E402
from sglang_marconi.policy.ghost import GhostIndex  # noqa: E402
from sglang_marconi.policy.likelihood import ReuseWeight  # noqa: E402
from sglang_marconi.policy.scoring import VictimQueue, flop_efficiency  # noqa: E402
from sglang_marconi.sglang_integration.cache import MarconiUnifiedRadixCache  # noqa: E402
from sglang_marconi.sglang_integration.components import (  # noqa: E402
    state_recency,
)
from sglang_marconi.harness.invariants import check_idle, walk  # noqa: E402
from sglang_marconi.sglang_integration.options import MarconiSettings  # noqa: E402
from sglang_marconi.sglang_integration.policy_state import StatePoolCost  # noqa: E402
from sglang_marconi.driver.pools import PoolConfig, build_cache  # noqa: E402
from sglang_marconi.driver.replay import Replayer, ReplayRequest  # noqa: E402
from sglang_marconi.sim.generators import generate  # noqa: E402

MAMBA = ComponentType.MAMBA
SPEC = HybridModelSpec.from_preset("paper-7b")
NEVER = 1 << 20  # a chunk size / track interval no request of these traces reaches


@dataclass(frozen=True)
class Regime:
    name: str
    extra_buffer: bool
    page: int = 1
    mamba_chunk: int | None = None  # SGLang's mamba cache chunk (grid = lcm(it, page))
    running_slots: int = 1          # state slots a running request holds

    def sim(self, grid: int, alpha: float = 0.0, capacity: int | None = None,
            spec=SPEC, plus: dict | None = None) -> PrefixCache:
        mirror = (dict(max_states_per_request=1, cache_output=False, branch_rule="kv")
                  if self.extra_buffer else
                  dict(max_states_per_request=2, cache_output=True, branch_rule="none"))
        timing = dict(evict_at="begin", renormalise=True, insert_clock_offset=0.5)
        return PrefixCache(spec, capacity, alpha=alpha, grid=grid, **mirror, **timing,
                           **(plus or {}))


EXTRA = Regime("extra_buffer", True, mamba_chunk=1, running_slots=3)
EXTRA_GRID16 = Regime("extra_buffer-grid16", True, mamba_chunk=16, running_slots=3)
EXTRA_PAGE16 = Regime("extra_buffer-page16", True, page=16, mamba_chunk=16, running_slots=3)
EXTRA_GRID64 = Regime("extra_buffer-grid64", True, running_slots=3)  # SGLang's FLA chunk, 64
NO_BUFFER = Regime("no_buffer", False)
ADMISSION_REGIMES = [EXTRA, EXTRA_GRID16, EXTRA_PAGE16, EXTRA_GRID64, NO_BUFFER]


# -- the two caches side by side ------------------------------------------------------------
# A state is named by the tokens of its path (two branches may hold states at one length).
def sglang_path(node, root) -> tuple:
    parts = []
    while node is not root:
        parts.append(node.key.raw_token_ids()[:len(node.key)])
        node = node.parent
    return tuple(t for part in reversed(parts) for t in part)


def sglang_state_nodes(cache) -> dict:
    root = cache.tree_core.root_node
    return {sglang_path(n, root): n for n in walk(cache)
            if n.component_data[MAMBA].value is not None}


def sim_state_nodes(sim) -> dict:
    out, stack = {}, list(sim.tree.root.children.values())
    while stack:
        node = stack.pop()
        if node.has_state:
            out[tuple(int(t) for t in sim.tree.path_tokens(node))] = node
        stack.extend(node.children.values())
    return out


def lengths(paths) -> list:
    return sorted(len(p) for p in paths)


@dataclass
class Step:
    hit: int
    branch: int
    states: frozenset
    evicted: tuple


class SGLangSide:
    """MarconiUnifiedRadixCache on CPU pools, with probes for branch and evicted states."""

    def __init__(self, regime: Regime, requests, alpha=0.0, cap=2, mamba_slots=None,
                 **settings):
        longest = max(len(i) + len(o) for i, o in requests)
        total = sum(len(i) + len(o) for i, o in requests)
        self.pc = PoolConfig(
            kv_tokens=-(-(total + 4 * longest + 64) // regime.page) * regime.page,
            page_size=regime.page,
            mamba_slots=mamba_slots or 2 * len(requests) + 8,
            max_context_len=longest + 4 * regime.page, extra_buffer=regime.extra_buffer,
            chunked_prefill_size=NEVER, mamba_track_interval=NEVER,
            mamba_cache_chunk_size=regime.mamba_chunk)
        settings = MarconiSettings(alpha=alpha, max_states_per_request=cap,
                                   renormalise_limit=-1, **settings)
        cls = functools.partial(MarconiUnifiedRadixCache, spec=SPEC, settings=settings)
        self.cache = build_cache(self.pc, cache_class=cls, tree_core="python")[0]
        self.replayer = Replayer(self.cache, chunked_prefill_size=NEVER)
        # where states can land: the checkpoint grid, or any token without the extra buffer
        self.grid = self.replayer.grid if regime.extra_buffer else regime.page
        self.branches, self.evicted = {}, []
        policy = self.cache.marconi
        on_match = policy.on_match

        def probe_match(req, result, *args):
            on_match(req, result, *args)
            self.branches[req.rid] = policy._requests[req.rid].branch

        policy.on_match = probe_match
        component = self.cache.components[MAMBA]
        evict_component = component.evict_component
        root = self.cache.tree_core.root_node

        def probe_evict(node, *args, **kwargs):
            if node.component_data[MAMBA].value is not None:
                self.evicted.append(sglang_path(node, root))
            return evict_component(node, *args, **kwargs)

        component.evict_component = probe_evict

    def run(self, i, input_ids, output_ids) -> Step:
        self.evicted.clear()
        rid = f"r{i}"
        out = self.replayer.run(ReplayRequest(rid, array("q", input_ids), list(output_ids)))
        return Step(out.hit_len, self.branches.pop(rid),
                    frozenset(sglang_state_nodes(self.cache)), tuple(self.evicted))


class SimSide:
    def __init__(self, sim: PrefixCache):
        self.sim = sim
        self.evicted = []
        sim.on_evict = lambda node: self.evicted.append(
            tuple(int(t) for t in sim.tree.path_tokens(node)))

    def run(self, input_ids, output_ids) -> Step:
        self.evicted.clear()
        inp = np.asarray(input_ids, dtype=np.int64)
        full = np.concatenate([inp, np.asarray(output_ids[:-1], dtype=np.int64)])
        plan = self.sim.begin(inp)
        self.sim.finish(plan, full)
        branch = plan.checkpoint_positions[0] if plan.checkpoint_positions else 0
        return Step(plan.hit_len, branch, frozenset(sim_state_nodes(self.sim)),
                    tuple(self.evicted))


def assert_same_decisions(requests, sgl: SGLangSide, sim: SimSide, after=None) -> list:
    """Replay ``requests`` through both; fail at the first request where they differ.
    ``after(i)`` runs further checks after request ``i``."""
    steps = []
    for i, (inp, out) in enumerate(requests):
        a, b = sgl.run(i, inp, out), sim.run(inp, out)
        where = f"request {i} (input {len(inp)}, output {len(out)})"
        assert a.hit == b.hit, f"{where}: hit {a.hit} (SGLang) != {b.hit} (simulator)"
        assert a.branch == b.branch, f"{where}: branch {a.branch} != {b.branch}"
        assert a.evicted == b.evicted, (f"{where}: evicted {[len(p) for p in a.evicted]} "
                                        f"!= {[len(p) for p in b.evicted]}")
        assert a.states == b.states, (f"{where}: states only in SGLang "
                                      f"{lengths(a.states - b.states)}, only in the simulator "
                                      f"{lengths(b.states - a.states)}")
        steps.append(a)
        if after is not None:
            after(i)
    check_idle(sgl.cache)
    return steps


def both(regime, requests, alpha=0.0, cap=2, slots=None):
    """The SGLang cache and its mirror in the simulator. With ``slots`` the state pool has
    that many slots and binds; the simulator's budget is what the tree may keep of it."""
    sgl = SGLangSide(regime, requests, alpha=alpha, cap=cap, mamba_slots=slots)
    capacity = (None if slots is None
                else (slots - regime.running_slots) * SPEC.ssm_state_bytes)
    return sgl, SimSide(regime.sim(sgl.grid, alpha=alpha, capacity=capacity,
                                   spec=StatePoolCost(SPEC)))


# -- traces ---------------------------------------------------------------------------------
class Fresh:
    def __init__(self, start=10**6):
        self.next = start

    def __call__(self, n):
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def shared_system_prompt():
    """One system prompt, four questions: 1st no tree, 2nd a branch, 3rd and 4th hit."""
    t = Fresh()
    system = t(48)
    return [(system + t(20 + 3 * i), t(6)) for i in range(4)]


def multi_turn_chat():
    """Two interleaved sessions; each turn is the whole history plus a user message."""
    t = Fresh()
    sessions = [([], []), ([], [])]
    reqs = []
    for turn in range(4):
        for s, (hist, _) in enumerate(sessions):
            inp = hist + t(17 + 5 * turn + s)
            out = t(9 + turn)
            reqs.append((inp, out))
            sessions[s] = (inp + out, None)
    return reqs


def fork_join():
    """A shared prefix and question, three forks, a join over their outputs, twice."""
    t = Fresh()
    prefix, forks, join = t(40), [t(8) for _ in range(3)], t(5)
    reqs = []
    for _ in range(2):
        base = prefix + t(12)
        outs = [t(10) for _ in range(3)]
        reqs += [(base + f, o) for f, o in zip(forks, outs)]
        reqs.append((base + sum(outs, []) + join, t(4)))
    return reqs


def repeats_and_prefixes():
    """Repeated prompts and prompts that end inside a cached sequence."""
    t = Fresh()
    a, b = t(50), t(70)
    out_b = t(12)
    return [(a, t(5)), (a, t(5)), (a, t(5)), (b, out_b), (b + out_b[:4], t(3)),
            (b[:33], t(3)), (b[:33], t(3)), (a + t(9), t(4))]


def random_mix(seed, n=40):
    """Shared bases, chat continuations, exact repeats and prefixes of cached sequences."""
    rng = random.Random(seed)
    t = Fresh()
    bases = [t(200) for _ in range(3)]
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
            inp = rng.choice(bases)[:rng.randint(0, 200)] + t(rng.randint(1, 30))
        out = t(rng.randint(1, 20))
        hist.append((inp, out))
        reqs.append((inp, out))
    return reqs


def generated(name, seed):
    if name == "chat":
        trace = generate("chat", seed=seed, sessions=8, session_rate=2.0, mean_turns=4,
                         user_median=15, output_median=10, max_len=400)
    else:
        trace = generate("fork-join", seed=seed, programs=6, templates=2, prefix_len=100,
                         question_median=20, forks=3, fork_prompt=6, fork_output_median=10,
                         join_prompt=5, join_output=4)
    return [(r.input_tokens.tolist(), r.output_tokens.tolist()) for r in trace.requests]


HAND_BUILT = {"shared-system-prompt": shared_system_prompt, "multi-turn-chat": multi_turn_chat,
              "fork-join": fork_join, "repeats-and-prefixes": repeats_and_prefixes}


# -- admission and hits (no eviction) -------------------------------------------------------
@pytest.mark.parametrize("regime", ADMISSION_REGIMES, ids=lambda r: r.name)
@pytest.mark.parametrize("trace", list(HAND_BUILT), ids=str)
def test_same_admission_and_hits_on_hand_built_traces(regime, trace):
    requests = HAND_BUILT[trace]()
    assert_same_decisions(requests, *both(regime, requests))


@pytest.mark.parametrize("regime", ADMISSION_REGIMES, ids=lambda r: r.name)
@pytest.mark.parametrize("source", ["chat", "fork-join", "mix"])
@pytest.mark.parametrize("seed", [0, 1])
def test_same_admission_and_hits_on_generated_traces(regime, source, seed):
    requests = random_mix(seed) if source == "mix" else generated(source, seed)
    assert_same_decisions(requests, *both(regime, requests))


@pytest.mark.parametrize("regime", [EXTRA, NO_BUFFER], ids=lambda r: r.name)
@pytest.mark.parametrize("cap", [-1, 1, 2])
def test_the_state_cap_does_not_change_a_one_state_request(regime, cap):
    """With one state per request every cap keeps it (a cap of 1 kept nothing before the
    final state was admitted as the branch state it is)."""
    requests = random_mix(3)
    assert_same_decisions(requests, *both(regime, requests, cap=cap))


def test_the_paper_checkpoints_at_the_third_occurrence():
    requests = shared_system_prompt()
    steps = assert_same_decisions(requests, *both(EXTRA, requests))
    assert [s.hit for s in steps] == [0, 0, 48, 48]
    assert [s.branch for s in steps] == [0, 48, 0, 0]
    steps = assert_same_decisions(requests, *both(NO_BUFFER, requests))
    assert [s.hit for s in steps] == [0, 0, 0, 0]  # no_buffer takes no branch states


def test_chat_turns_hit_the_previous_turn():
    requests = multi_turn_chat()
    extra = assert_same_decisions(requests, *both(EXTRA, requests))
    plain = assert_same_decisions(requests, *both(NO_BUFFER, requests))
    for k in range(2, len(requests)):
        prev_in, prev_out = requests[k - 2]
        assert extra[k].hit == len(prev_in)                    # the input end
        assert plain[k].hit == len(prev_in) + len(prev_out) - 1  # input + output - 1


def test_the_papers_branch_rule_differs_on_repeated_prompts():
    """Why the simulator needs ``branch_rule="kv"`` to mirror SGLang: a prompt repeated
    whole is no split for the paper's speculative insertion, while SGLang snapshots where
    its KV match of input[:-1] ends."""
    requests = repeats_and_prefixes()
    sgl, _ = both(EXTRA, requests)
    sim = SimSide(PrefixCache(SPEC, None, grid=1, max_states_per_request=1,
                              cache_output=False))  # the default branch rule: "split"
    (i0, o0), (i1, o1) = requests[:2]
    sgl.run(0, i0, o0), sim.run(i0, o0)
    a, b = sgl.run(1, i1, o1), sim.run(i1, o1)
    assert a.branch == len(i1) - 1 and b.branch == 0


# -- eviction (the state pool binds) --------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("source,seed", [("chat", 0), ("chat", 1), ("fork-join", 0),
                                         ("mix", 2)])
def test_same_evictions_without_the_extra_buffer(alpha, source, seed):
    requests = random_mix(seed) if source == "mix" else generated(source, seed)
    steps = assert_same_decisions(requests, *both(NO_BUFFER, requests, alpha=alpha, slots=7))
    assert sum(len(s.evicted) for s in steps) >= 10


@pytest.mark.parametrize("alpha", [0.0, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_same_evictions_with_the_extra_buffer_on_chat(alpha, seed):
    requests = generated("chat", seed)
    steps = assert_same_decisions(requests, *both(EXTRA, requests, alpha=alpha, slots=7))
    assert sum(len(s.evicted) for s in steps) >= 10


def test_alpha_changes_the_evictions_it_is_compared_on():
    """The alpha > 0 comparisons are not alpha = 0 in disguise."""
    requests = generated("chat", 0)
    runs = [assert_same_decisions(requests, *both(NO_BUFFER, requests, alpha=a, slots=7))
            for a in (0.0, 1.0)]
    assert [s.evicted for s in runs[0]] != [s.evicted for s in runs[1]]


# -- scoring (where the eviction candidates differ) -----------------------------------------
@pytest.mark.parametrize("source,seed", [("fork-join", 0), ("fork-join", 1), ("mix", 0)])
def test_same_scores_for_every_state(source, seed):
    """Branch states under the extra buffer: SGLang's state pool may drop a state from a node
    with several children, the simulator never does, so their victims part ways (docs).
    On the same tree the inputs of the ranking agree: for every state SGLang's MAMBA
    component would rank, its recency and FLOP efficiency equal what the simulator's tree
    gives the node at the same prefix length, and SGLang's walk order is the order those
    values give."""
    requests = random_mix(seed) if source == "mix" else generated(source, seed)
    sgl, sim_side = both(EXTRA, requests, alpha=1.0)
    assert_same_decisions(requests, sgl, sim_side)
    tree = sim_side.sim.tree
    by_path = sim_state_nodes(sim_side.sim)
    cache = sgl.cache
    policy = cache.marconi
    root = cache.tree_core.root_node
    lru = cache.tree_core.lru_lists[MAMBA]
    sglang_scores, sim_scores = {}, {}
    x = lru.get_lru_no_lock()
    while x is not None:  # every state SGLang's walk would rank, least recent first
        path = sglang_path(x, root)
        sglang_scores[path] = (state_recency(x), policy.state_pool_efficiency(x))
        node = by_path[path]
        if tree.is_candidate(node):
            efficiency = tree.efficiency(node)
        else:  # a branch point holding a state: only SGLang ranks it
            assert len(node.children) > 1
            efficiency = flop_efficiency(tree.spec, node.prefix_len,
                                         tree.nearest_state_ancestor_len(node),
                                         tree.state_bytes)
        sim_scores[path] = (node.last_access, efficiency)
        x = lru.get_prev_no_lock(x)
    assert set(sglang_scores) == set(by_path)
    for path, (recency, efficiency) in sglang_scores.items():
        assert recency == sim_scores[path][0], len(path)
        assert efficiency == pytest.approx(sim_scores[path][1], rel=1e-12), len(path)
    assert any(not tree.is_candidate(by_path[p]) for p in sglang_scores)  # the case at hand

    component = cache.components[MAMBA]
    component._evict_device_start(1)
    try:
        walk_order = [sglang_path(n, root) for n in component.queue.ordered()]
    finally:
        component._evict_device_end()
    reference = VictimQueue(1.0)
    for path, (recency, efficiency) in sim_scores.items():
        reference.update(path, recency, efficiency)
    reference.refresh()
    assert walk_order == reference.ordered()


# -- marconi+ -------------------------------------------------------------------------------
# SGLang: MarconiSettings(plus=True); the simulator: reuse_weight, ghost_tokens, end_threshold
# (sim.policies ``marconi+``), each side's ghost index of the same size: SGLang's,
# ``ghost_factor`` x its token pool (2 x: it never forgets, the pool is larger than the trace).
def both_plus(regime, requests, slots=None, ghost_factor=2.0, end_threshold=0.05):
    sgl = SGLangSide(regime, requests, mamba_slots=slots, plus=True,
                     ghost_factor=ghost_factor, end_threshold=end_threshold)
    capacity = (None if slots is None
                else (slots - regime.running_slots) * SPEC.ssm_state_bytes)
    plus = dict(reuse_weight=ReuseWeight(), ghost_tokens=sgl.cache.marconi.ghost.max_tokens,
                end_threshold=end_threshold)
    sim = regime.sim(sgl.grid, capacity=capacity, spec=StatePoolCost(SPEC), plus=plus)
    return sgl, SimSide(sim)


def ghost_marks(index: GhostIndex) -> frozenset:
    """The remembered request ends of a ghost index, by token path."""
    tree = index.tree
    return frozenset(tuple(int(t) for t in tree.path_tokens(n))
                     for n in tree.iter_nodes() if n.has_state)


def same_plus_state(sgl: SGLangSide, sim: SimSide, queues: bool = False):
    """After each request: the same ghost index (tokens, end marks) and end-state counts;
    with ``queues`` the same GDSF victim queue of states (paths, keys, order, aging clock)."""
    policy, cache = sgl.cache.marconi, sim.sim

    def check(i):
        assert policy.ghost.tree.num_kv_tokens == cache.ghost.tree.num_kv_tokens, i
        assert ghost_marks(policy.ghost) == ghost_marks(cache.ghost), f"request {i}: marks"
        a, b = policy.end_usefulness, cache.end_usefulness
        assert (a.ends, a.reused) == (b.ends, b.reused), f"request {i}: end-state counts"
        assert policy.stats.end_states_skipped == cache.stats.end_states_skipped, i
        if not queues:
            return
        root = sgl.cache.tree_core.root_node
        mine = sgl.cache.components[MAMBA].queue
        ref = cache.tree.queue
        order = [sglang_path(n, root) for n in mine.ordered()]
        assert order == [tuple(int(t) for t in cache.tree.path_tokens(n))
                         for n in ref.ordered()], f"request {i}: victim order"
        keys = [ref.key_of(n) for n in ref.ordered()]
        assert [mine.key_of(n) for n in mine.ordered()] == pytest.approx(keys, rel=1e-12), i
        assert mine.clock == pytest.approx(ref.clock, rel=1e-12), i

    return check


@pytest.mark.parametrize("regime", ADMISSION_REGIMES, ids=lambda r: r.name)
@pytest.mark.parametrize("trace", list(HAND_BUILT), ids=str)
def test_marconi_plus_same_admission_and_hits_on_hand_built_traces(regime, trace):
    requests = HAND_BUILT[trace]()
    sgl, sim = both_plus(regime, requests)
    assert_same_decisions(requests, sgl, sim, after=same_plus_state(sgl, sim))


@pytest.mark.parametrize("regime", [EXTRA, EXTRA_GRID16, NO_BUFFER], ids=lambda r: r.name)
@pytest.mark.parametrize("source", ["chat", "fork-join", "mix"])
@pytest.mark.parametrize("seed", [0, 1])
def test_marconi_plus_same_admission_and_hits_on_generated_traces(regime, source, seed):
    requests = random_mix(seed) if source == "mix" else generated(source, seed)
    sgl, sim = both_plus(regime, requests)
    assert_same_decisions(requests, sgl, sim, after=same_plus_state(sgl, sim))


def test_marconi_plus_decisions_are_not_marconis():
    """What the marconi+ comparisons exercise: on fork-join under the extra buffer the ghost
    index reports branch points SGLang's own match does not, and the end states of forks,
    which no later request reaches, stop being admitted, on both sides alike."""
    requests = generated("fork-join", 0)
    marconi = assert_same_decisions(requests, *both(EXTRA, requests))
    sgl, sim = both_plus(EXTRA, requests)
    plus = assert_same_decisions(requests, sgl, sim)
    assert [s.branch for s in plus] != [s.branch for s in marconi]
    assert [s.states for s in plus] != [s.states for s in marconi]
    assert sgl.cache.marconi.stats.end_states_skipped >= 3
    assert sgl.cache.marconi.stats.admitted["branch"] > 0


@pytest.mark.parametrize("regime", [EXTRA, NO_BUFFER], ids=lambda r: r.name)
def test_marconi_plus_same_decisions_with_a_ghost_that_forgets(regime):
    """A ghost index far smaller than the trace (LRU over whole sequences) forgets the same
    sequences on both sides, and forgetting changes decisions."""
    requests = random_mix(1)
    sgl, sim = both_plus(regime, requests, ghost_factor=0.03)
    small = assert_same_decisions(requests, sgl, sim, after=same_plus_state(sgl, sim))
    everything = GhostIndex(1 << 40)
    for inp, out in requests:
        everything.record(np.asarray(inp + out[:-1]), 0, 0)
    assert everything.tree.num_kv_tokens > 5 * sgl.cache.marconi.ghost.max_tokens
    large = assert_same_decisions(requests, *both_plus(regime, requests))
    assert [(s.hit, s.branch, s.states) for s in small] != [
        (s.hit, s.branch, s.states) for s in large]


@pytest.mark.parametrize("source,seed", [("chat", 0), ("chat", 1), ("fork-join", 0),
                                         ("mix", 2)])
def test_marconi_plus_same_evictions_without_the_extra_buffer(source, seed):
    requests = random_mix(seed) if source == "mix" else generated(source, seed)
    sgl, sim = both_plus(NO_BUFFER, requests, slots=7)
    steps = assert_same_decisions(requests, sgl, sim,
                                  after=same_plus_state(sgl, sim, queues=True))
    assert sum(len(s.evicted) for s in steps) >= 10


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_marconi_plus_same_evictions_with_the_extra_buffer_on_chat(seed):
    requests = generated("chat", seed)
    sgl, sim = both_plus(EXTRA, requests, slots=7)
    steps = assert_same_decisions(requests, sgl, sim,
                                  after=same_plus_state(sgl, sim, queues=True))
    assert sum(len(s.evicted) for s in steps) >= 10


def test_marconi_plus_evictions_are_not_lrus():
    """GDSF with reuse weights is compared on cases where it evicts other states than LRU
    (marconi, alpha 0) and where states carry hit counts."""
    requests = random_mix(2)
    lru = assert_same_decisions(requests, *both(NO_BUFFER, requests, slots=7))
    sgl, sim = both_plus(NO_BUFFER, requests, slots=7)
    hit_counts = set()
    plus = assert_same_decisions(requests, sgl, sim, after=lambda i: hit_counts.update(
        getattr(n, "hit_score", 0) for n in walk(sgl.cache)))
    assert [s.evicted for s in plus] != [s.evicted for s in lru]
    assert max(hit_counts) >= 1  # the weights are not all alike


@pytest.mark.parametrize("source,seed", [("fork-join", 0), ("mix", 0)])
def test_marconi_plus_same_weights_for_every_state(source, seed):
    """Branch states under the extra buffer: the eviction candidates differ (see
    ``test_same_scores_for_every_state``), so the test checks the inputs of the ranking on
    a tree without eviction instead: after every request, every state SGLang's MAMBA queue
    holds is keyed by the efficiency times reuse weight (hit count, whether its node was a
    branch point, its children) that the simulator's tree gives the node with that path,
    states at branch points included."""
    requests = random_mix(seed) if source == "mix" else generated(source, seed)
    sgl, sim = both_plus(EXTRA, requests)
    root = sgl.cache.tree_core.root_node
    queue = sgl.cache.components[MAMBA].queue
    tree = sim.sim.tree
    seen = set()

    def same_weights(i):
        by_path = sim_state_nodes(sim.sim)
        for node in walk(sgl.cache):
            if node.component_data[MAMBA].value is None:
                continue
            ref = by_path[sglang_path(node, root)]
            assert (node.hit_score, node.max_children >= 2) == (
                ref.hit_score, ref.max_children >= 2), f"request {i}: {ref}"
            assert queue.entry(node)[1] == pytest.approx(tree.efficiency(ref), rel=1e-12), i
            if len(ref.children) > 1:
                seen.add("branch point")
            if ref.hit_score > 0 and ref.max_children >= 2:
                seen.add("hit branch point")

    assert_same_decisions(requests, sgl, sim, after=same_weights)
    assert seen == {"branch point", "hit branch point"}  # the case at hand


def state_reinserted():
    """A state with a hit (at 34) loses its state while it has one child, then the child is
    deleted (SGLang keeps the KV of 34: a KV-only leaf); later a request ends at 34 again."""
    t = Fresh()
    a, o0 = t(30), t(5)
    reqs = [(a, o0), (a + o0[:4] + t(10), t(3))]
    reqs += [(t(60), t(3)) for _ in range(7)]
    reqs += [(a + o0[:3], [o0[3]] + t(1))]  # no_buffer: its state lands at 33 + 2 - 1 = 34
    return reqs + [(t(60), t(3)) for _ in range(3)]


def test_marconi_plus_a_state_stored_again_starts_without_hits():
    """GDSF counts hits while a state is cached: SGLang's node outlives its state (a
    tombstone), the simulator's does not; a state stored there again must not inherit the
    evicted state's hit count (it would rank above the simulator's)."""
    requests = state_reinserted()
    sgl, sim = both_plus(NO_BUFFER, requests, slots=7)
    steps = assert_same_decisions(requests, sgl, sim,
                                  after=same_plus_state(sgl, sim, queues=True))
    assert [len(p) for s in steps for p in s.evicted][:2] == [34, 46]
    assert len(requests[9][0]) + len(requests[9][1]) - 1 in lengths(steps[9].states)


def unreached_ends():
    """40 unrelated prompts (no end is reached again: end states stop being admitted), then
    a repeat of the first, which on a 64-token grid has no end state of its own, then a
    continuation of the second."""
    t = Fresh()
    reqs = [(t(70), t(3)) for _ in range(40)]
    return reqs + [(reqs[0][0], t(3)), (reqs[1][0] + t(80), t(3))]


def test_marconi_plus_gates_only_requests_with_an_end_state():
    """A request with no end state beyond its hit is neither an end of the reuse rate nor a
    skipped end state (it stores nothing new either way)."""
    requests = unreached_ends()
    sgl, sim = both_plus(EXTRA_GRID64, requests)
    steps = assert_same_decisions(requests, sgl, sim, after=same_plus_state(sgl, sim))
    assert steps[40].hit == 64 and 64 in lengths(steps[40].states)
    assert sgl.cache.marconi.stats.end_states_skipped >= 20
