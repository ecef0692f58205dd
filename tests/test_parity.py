"""The simulator and the SGLang cache make the same decisions where their models coincide.

The simulator is ``policy.cache.PrefixCache``; the SGLang cache is
``MarconiUnifiedRadixCache`` on real SGLang pools, driven through the scheduler's own calls
(``driver.replay``). Both see the same requests; after every request the tests compare the
hit length, the branch position admitted, the set of prefix lengths that hold an SSM state
in each tree and (with eviction) the sequence of evicted state positions; marconi+ also on
the ghost index, the end-state counts and (with eviction) the GDSF victim queue. Where the
eviction candidates differ (branch states under the extra buffer) they compare the inputs
of the ranking instead.

The two sides, the configurations in which the models coincide (and why) and the traces
are in ``parity_harness``.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sglang")

from marconi_checks.invariants import walk  # noqa: E402
from sglang_marconi.policy.cache import PrefixCache  # noqa: E402
from sglang_marconi.policy.ghost import GhostIndex  # noqa: E402
from sglang_marconi.policy.ranking import ranked_efficiency  # noqa: E402
from sglang_marconi.policy.scoring import VictimQueue  # noqa: E402
from sglang_marconi.sglang_integration.components import state_recency  # noqa: E402

from parity_harness import (  # noqa: E402
    ADMISSION_REGIMES,
    EXTRA,
    EXTRA_GRID16,
    EXTRA_GRID64,
    HAND_BUILT,
    MAMBA,
    NO_BUFFER,
    SPEC,
    SimSide,
    assert_same_decisions,
    both,
    both_plus,
    generated,
    lengths,
    multi_turn_chat,
    random_mix,
    repeats_and_prefixes,
    same_plus_state,
    shared_system_prompt,
    sglang_path,
    sim_state_nodes,
    state_reinserted,
    unreached_ends,
)


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
            efficiency = ranked_efficiency(tree.spec, tree, node, tree.state_bytes)
        sim_scores[path] = (node.last_access, efficiency)
        x = lru.get_prev_no_lock(x)
    assert set(sglang_scores) == set(by_path)
    for path, (recency, efficiency) in sglang_scores.items():
        assert recency == sim_scores[path][0], len(path)
        assert efficiency == pytest.approx(sim_scores[path][1], rel=1e-12), len(path)
    assert any(not tree.is_candidate(by_path[p]) for p in sglang_scores)  # the case at hand

    component = cache.components[MAMBA]
    # SGLang's walk-start hook (which the MAMBA component overrides to refresh its queue),
    # called as SGLang's tree core calls it before an eviction walk: there is no public way
    # to see the order a walk would take without evicting
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


def test_marconi_plus_a_state_stored_again_starts_without_hits():
    """GDSF counts hits while a state is cached: SGLang's node outlives its state (a
    tombstone), the simulator's does not; a state stored there again must not inherit the
    evicted state's hit count (it would rank above the simulator's). Chain states weigh 0
    (fixed) on both sides, so the state at 34 goes first while it has one child."""
    requests = state_reinserted()
    sgl, sim = both_plus(NO_BUFFER, requests, slots=7, chain_weight=0.0)
    steps = assert_same_decisions(requests, sgl, sim,
                                  after=same_plus_state(sgl, sim, queues=True))
    assert [len(p) for s in steps for p in s.evicted][:2] == [34, 46]
    assert len(requests[9][0]) + len(requests[9][1]) - 1 in lengths(steps[9].states)


def test_marconi_plus_gates_only_requests_with_an_end_state():
    """A request with no end state beyond its hit is neither an end of the reuse rate nor a
    skipped end state (it stores nothing new either way)."""
    requests = unreached_ends()
    sgl, sim = both_plus(EXTRA_GRID64, requests)
    steps = assert_same_decisions(requests, sgl, sim, after=same_plus_state(sgl, sim))
    assert steps[40].hit == 64 and 64 in lengths(steps[40].states)
    assert sgl.cache.marconi.stats.end_states_skipped >= 20
