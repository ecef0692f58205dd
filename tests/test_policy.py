"""The policy core on hand-built traces with known answers, and its queue's ordering."""
import numpy as np
import pytest

from sglang_marconi.model import HybridModelSpec
from sglang_marconi.policy.admission import (branch_checkpoint, plan_block_checkpoints,
                                             plan_checkpoints)
from sglang_marconi.policy.cache import PrefixCache
from sglang_marconi.policy.scoring import VictimQueue
from sglang_marconi.policy.tree import RadixTree

SYSTEM = list(range(1000, 1100))  # a 100-token shared system prompt


def _fresh(start, n):
    return list(range(start, start + n))


def test_purely_input_prefix_hits_on_third_occurrence(paper_spec):
    cache = PrefixCache(paper_spec)
    hits, ckpts = [], []
    for k in range(4):
        inp = SYSTEM + _fresh(10_000 * (k + 1), 20)
        plan = cache.begin(inp)
        hits.append(plan.hit_len)
        ckpts.append(plan.checkpoint_positions)
        cache.finish(plan, inp + _fresh(50_000 * (k + 1), 5)[:-1])
    # 1st: nothing in the tree; 2nd: branch detected at the end of the system prompt and
    # checkpointed during its prefill; 3rd and later: hit.
    assert hits == [0, 0, 100, 100]
    assert ckpts == [(), (100,), (), ()]
    cache.tree.check()


def test_second_chat_turn_hits_whole_first_turn(paper_spec):
    cache = PrefixCache(paper_spec)
    turn1_in, turn1_out = SYSTEM + _fresh(5000, 30), _fresh(6000, 40)
    plan = cache.begin(turn1_in)
    stored = cache.finish(plan, turn1_in + turn1_out[:-1])
    assert sorted(stored) == [len(turn1_in) + len(turn1_out) - 1]
    turn2_in = turn1_in + turn1_out + _fresh(7000, 10)
    plan = cache.begin(turn2_in)
    assert plan.hit_len == len(turn1_in) + len(turn1_out) - 1
    assert cache.stats.flops_saved == pytest.approx(paper_spec.prefill_flops(plan.hit_len))


def test_grid_rounds_branch_down_and_truncates_cached_sequence():
    assert branch_checkpoint(input_len=500, hit_len=0, branch_len=130, grid=64) == 128
    assert branch_checkpoint(input_len=500, hit_len=128, branch_len=130, grid=64) == 0
    plan = plan_checkpoints(input_len=500, output_len=40, hit_len=0, branch_len=130, grid=64)
    assert plan.positions == (128, 512) and plan.cached_len == 512
    assert plan_checkpoints(500, 40, 0, 130, grid=64, max_states=1).positions == (128,)
    assert plan_checkpoints(500, 40, 0, None, grid=1).positions == (539,)
    assert plan_block_checkpoints(100, 1, hit_len=40, block=32).positions == (64, 96)


def test_one_child_state_drop_merges_edge(paper_spec):
    tree = RadixTree(paper_spec)
    a = np.arange(0, 50)
    tree.insert(a[:20], [20], now=1)          # node X: state at 20
    tree.insert(a, [50], now=2)               # leaf Y below X: X has one child
    x = tree.node_at(a, 20)
    assert x.has_state and len(x.children) == 1
    assert tree.queue.ordered()[0] is x       # older, LRU order (alpha 0)
    action, node = tree.evict_one()
    assert (action, node) == ("drop_state", x)
    (leaf,) = tree.root.children.values()      # X merged into Y: one edge of 50 tokens
    assert len(leaf.tokens) == 50 and leaf.has_state and leaf.prefix_len == 50
    assert tree.num_states == 1 and tree.num_nodes == 2
    tree.check()
    assert tree.match(a).hit_len == 50 and tree.match(a[:30]).hit_len == 0


def test_leaf_delete_cascades_to_stateless_parent(paper_spec):
    tree = RadixTree(paper_spec)
    base = np.arange(0, 40)
    tree.insert(np.concatenate([base, [7, 8]]), [42], now=1)
    tree.insert(np.concatenate([base, [9, 9]]), [42], now=2)   # split at 40, no state there
    assert tree.num_nodes == 4
    assert tree.evict_one()[0] == "delete"                     # the older leaf
    # the stateless split node has one child left: merged away
    assert tree.num_nodes == 2 and tree.num_kv_tokens == 42
    tree.check()


def test_alpha_zero_equals_lru_order():
    q = VictimQueue(alpha=0.0)
    rng = np.random.default_rng(0)
    recency = rng.permutation(50)
    for i, r in enumerate(recency):
        q.update(f"n{i}", float(r), float(rng.random() * 1e6))
    popped = [q.pop_victim() for _ in range(50)]
    assert popped == [f"n{i}" for i in np.argsort(recency)]


def test_alpha_weighs_efficiency_against_recency():
    q = VictimQueue(alpha=0.0)
    q.update("old_valuable", 1.0, 100.0)
    q.update("new_cheap", 2.0, 0.0)
    q.update("newest", 3.0, 50.0)
    assert q.peek_victim() == "old_valuable"
    q.set_alpha(2.0)   # efficiency now dominates: min-max normalised, 2 x (0..1)
    assert q.pop_victim() == "new_cheap"
    # old_valuable: 0 + 2*1.0 = 2.0; newest: 1.0 + 2*0.5 = 2.0: a tie, broken by age
    assert q.pop_victim() == "old_valuable"
    assert q.pop_victim() == "newest"
    assert q.pop_victim() is None


def test_queue_rekeys_lazily_and_stays_consistent():
    q = VictimQueue(alpha=1.0)
    for i in range(200):
        q.update(i, float(i), float(i % 7))
    for i in range(0, 200, 3):
        q.update(i, 1000.0 + i, float(i % 7))  # touched: now the most recent
    for i in range(1, 200, 5):
        q.discard(i)
    expected = q.ordered()
    got = []
    while (v := q.pop_victim()) is not None:
        got.append(v)
    assert got == expected and len(got) == len(set(got))


def test_capacity_respected_and_admission_cut_back(paper_spec):
    kv, st = paper_spec.kv_bytes_per_token, paper_spec.ssm_state_bytes
    cache = PrefixCache(paper_spec, capacity_bytes=150 * kv + st)  # room for one state
    inp = SYSTEM + _fresh(2000, 20)
    cache.process(inp, inp + [1, 2])
    assert cache.tree.bytes_used <= cache.capacity
    inp2 = SYSTEM + _fresh(3000, 20)
    cache.process(inp2, inp2)
    assert cache.tree.bytes_used <= cache.capacity
    huge = _fresh(90_000, 400)  # more KV than the whole budget: admitted nothing
    cache.process(huge, huge)
    assert cache.stats.admissions_rejected == 1
    assert cache.tree.bytes_used <= cache.capacity
    cache.tree.check()


def test_on_evict_callback_and_stats(paper_spec):
    dropped = []
    st = paper_spec.ssm_state_bytes
    cache = PrefixCache(paper_spec, capacity_bytes=2 * (st + 1000 * paper_spec.kv_bytes_per_token))
    cache.on_evict = dropped.append
    for k in range(6):
        inp = _fresh(10_000 * (k + 1), 1000)
        cache.process(inp, inp)
    assert len(dropped) == cache.stats.states_evicted == 4
    assert cache.tree.num_states == 2


def test_auto_alpha_tunes_after_bootstrap_window(paper_spec):
    st = paper_spec.ssm_state_bytes
    cache = PrefixCache(paper_spec, capacity_bytes=3 * st + 5000 * paper_spec.kv_bytes_per_token,
                        alpha="auto", bootstrap_multiplier=2, alpha_grid=(0.0, 0.5, 1.0))
    rng = np.random.default_rng(1)
    prompts = [_fresh(100_000 * (i + 1), 200 * (i + 1)) for i in range(4)]
    for k in range(30):
        inp = prompts[int(rng.integers(4))] + _fresh(1_000_000 + 100 * k, 30)
        cache.process(inp, inp)
    tuner = cache.tuner
    assert tuner.first_eviction_at is not None and tuner.tuned
    assert set(tuner.scores) == {0.0, 0.5, 1.0}
    assert cache.alpha == min(a for a, s in tuner.scores.items()
                              if s == max(tuner.scores.values()))


def test_victim_queue_suspend_keeps_a_candidates_place():
    """A locked candidate leaves the ranking and comes back where it was among equal keys
    (SGLang's lock/unlock of a state inserted with the same stamp as its neighbours)."""
    q = VictimQueue(0.0)
    for name in "abc":
        q.update(name, 5.0, 1.0)  # equal keys: insertion order decides
    q.suspend("a")
    assert "a" not in q and len(q) == 2 and q.entry("a") == (5.0, 1.0)
    q.update("a", 5.0, 2.0)  # re-scored while suspended: kept aside, not ranked
    assert "a" not in q and q.ordered() == ["b", "c"]
    q.resume("a")
    assert q.ordered() == ["a", "b", "c"] and q.entry("a") == (5.0, 2.0)
    q.suspend("b")
    q.update("b", 6.0, 1.0)  # touched while locked: a new place
    q.resume("b")
    assert [q.pop_victim() for _ in range(3)] == ["a", "c", "b"]
    q.update("d", 1.0, 0.0)
    q.suspend("d")
    q.discard("d")
    q.resume("d")
    assert "d" not in q and q.entry("d") is None and q.pop_victim() is None


@pytest.mark.parametrize("mode,alpha", [("marconi", 0.0), ("gdsf", 0.0), ("marconi", 1.0)])
def test_victim_queue_heap_stays_bounded(mode, alpha):
    """Re-keying a few candidates many times (a long-running server) does not grow the heap
    without bound, and the order is the one a fresh queue gives."""
    q = VictimQueue(alpha, mode=mode)
    for i in range(10):
        q.update(i, float(i), float(10 - i))
    for t in range(20_000):
        node = t % 10
        q.update(node, 10.0 + t, float(node))
    assert q.heap_size <= 2 * len(q) + 1024 + 1
    fresh = VictimQueue(alpha, mode=mode)
    for node in range(10):
        r, e = q.entry(node)
        fresh.update(node, r, e)
    if mode == "marconi":
        assert q.ordered() == fresh.ordered()
    assert len(q.ordered()) == 10


def test_suspend_victim_ages_the_gdsf_queue_as_a_pop():
    """A victim handed to SGLang is suspended (its eviction may be declined under HiCache),
    but an eviction must age marconi+'s GDSF queue as the simulator's pop does."""
    popped, handed = VictimQueue(0.0, mode="gdsf"), VictimQueue(0.0, mode="gdsf")
    for q in (popped, handed):
        q.update("a", 1.0, 5.0)
        q.update("b", 2.0, 9.0)
    assert popped.pop_victim() == handed.suspend_victim() == "a"
    assert handed.clock == popped.clock > 0
    assert "a" not in handed and handed.is_suspended("a")
    handed.resume("a")                       # declined: back with the key it had
    assert handed.peek_victim() == "a"


@pytest.mark.parametrize("mode,alpha", [("marconi", 0.0), ("gdsf", 0.0), ("marconi", 0.7)])
def test_victim_queue_load_aged_is_add_aged_then_refresh(mode, alpha):
    """The joint walk's bulk load (one heap build) gives the queue a push per candidate and a
    refresh give: the same victims in the same order, ties (equal keys) included, also for
    candidates added and re-keyed after it."""
    rng = np.random.default_rng(7)
    rows = [(i, float(rng.integers(0, 5)), float(rng.integers(0, 3)), float(rng.integers(0, 2)))
            for i in range(200)]  # few distinct values: many exact ties
    pushed, loaded = VictimQueue(alpha, mode=mode), VictimQueue(alpha, mode=mode)
    for q in (pushed, loaded):
        q.clock = 3.0
    for node, r, e, base in rows:
        pushed.add_aged(node, r, e, base)
    pushed.refresh()
    loaded.load_aged(rows)
    # the bulk build keys every candidate with ``_key``'s floats (its arithmetic is inlined)
    assert all(key == loaded.key_of(node) for key, _, _, node in loaded._heap)
    for q in (pushed, loaded):
        q.add_aged(500, 1.0, 1.0, q.clock)
        q.update(3, 9.0, 2.0)
    order = [pushed.pop_victim() for _ in range(len(pushed))]
    assert order == [loaded.pop_victim() for _ in range(len(loaded))]
    assert len(order) == 201 and pushed.clock == loaded.clock
    with pytest.raises(ValueError, match="already holds"):
        loaded.load_aged([(1, 0.0, 0.0, 0.0)] * 2)
