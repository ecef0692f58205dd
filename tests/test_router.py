"""The Python re-implementation of sglang-router 0.3.2's tree and policies, rule by rule.

Cases ported from the Rust tests in ``src/policies/tree.rs`` (test_simple_eviction,
test_advanced_eviction, test_prefix_is_subset_of_existing, ...) keep their expectations;
the rest pin one rule each (strict threshold, balance rule, first worker on ties, the
creator as a node's tenant, the 1-in-8 access refresh, eviction to the cap), and a
hypothesis property checks the per-worker character counts against a recount.
"""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from sglang_marconi.errors import UserError
from sglang_marconi.serving.router import (CacheAwareRouter, RandomRouter, RoundRobinRouter,
                                           make_router, text_for_input_ids,
                                           tokens_within_chars)
from sglang_marconi.serving.router_tree import CharTree, shared_prefix_len

W = ["http://w0", "http://w1", "http://w2"]


def used_size_per_tenant(tree: CharTree) -> dict:
    """``get_used_size_per_tenant`` (tree.rs 905-929): recount by walking the tree."""
    sizes: dict = {}
    stack = [tree.root]
    while stack:
        node = stack.pop()
        for tenant in node.tenant_epoch:
            sizes[tenant] = sizes.get(tenant, 0) + len(node.text)
        stack.extend(node.children.values())
    return sizes


def test_shared_prefix_len():
    assert shared_prefix_len("hello", "help") == 3
    assert shared_prefix_len("abc", "abc") == 3
    assert shared_prefix_len("abc", "abcd") == 3
    assert shared_prefix_len("xbc", "abc") == 0
    assert shared_prefix_len("héllo wörld", "héllo wörst") == 9


@given(st.text(alphabet="ab", max_size=40), st.text(alphabet="ab", max_size=40))
def test_shared_prefix_len_matches_a_char_loop(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert shared_prefix_len(a, b) == n


def test_simple_eviction_as_in_tree_rs():
    tree = CharTree()
    tree.insert("hello", "tenant1")
    tree.insert("hello", "tenant2")
    tree.insert("world", "tenant2")
    assert used_size_per_tenant(tree) == {"tenant1": 5, "tenant2": 10}
    tree.evict_tenant_by_size(5)
    assert used_size_per_tenant(tree) == {"tenant1": 5, "tenant2": 5}
    match = tree.prefix_match("world")
    assert (match.matched_chars, match.tenant) == (5, "tenant2")
    assert tree.tenant_char_count == {"tenant1": 5, "tenant2": 5}


def test_advanced_eviction_as_in_tree_rs():
    rng = random.Random(7)
    tree = CharTree()
    prefixes = ["aqwefcisdf", "iajsdfkmade", "kjnzxcvewqe", "iejksduqasd"]
    for _ in range(100):
        for j, prefix in enumerate(prefixes):
            suffix = "".join(rng.choice("abcdefghij") for _ in range(10))
            tree.insert(prefix + suffix, f"tenant{j + 1}")
    tree.evict_tenant_by_size(100)
    sizes = used_size_per_tenant(tree)
    assert sizes and all(size <= 100 for size in sizes.values())
    assert sizes == tree.tenant_char_count


def test_split_and_subset_prefixes():
    tree = CharTree()
    tree.insert("hello world", "t1")
    tree.insert("hello", "t2")             # prefix of an existing edge: split at 5
    node = tree.root.children["h"]
    assert node.text == "hello" and node.children[" "].text == " world"
    assert set(node.tenant_epoch) == {"t1", "t2"}
    assert tree.tenant_char_count == {"t1": 11, "t2": 5}
    tree.insert("help", "t2")              # split "hello" at 3
    assert tree.root.children["h"].text == "hel"
    assert used_size_per_tenant(tree) == tree.tenant_char_count == {"t1": 11, "t2": 6}


def test_node_tenant_is_its_creator_and_partial_match_counts():
    tree = CharTree()
    tree.insert("abcdef", "A")
    tree.insert("abcdef", "B")             # B joins the node: last_tenant stays A
    tree.insert("abcxyz", "B")
    m = tree.prefix_match("abcdeq")        # stops inside "def" (created by A)
    assert (m.tenant, m.matched_chars, m.input_chars, m.ambiguous) == ("A", 5, 6, False)
    m = tree.prefix_match("abcxy")
    assert (m.tenant, m.matched_chars) == ("B", 5)
    m = tree.prefix_match("abq")           # partial in the split node "abc": its creator A
    assert (m.tenant, m.matched_chars) == ("A", 2)
    assert tree.prefix_match("zzz").matched_chars == 0


def test_access_refresh_only_on_epochs_multiple_of_eight():
    tree = CharTree(first_epoch=1)
    tree.insert("abc", "A")                # epoch 1
    leaf = tree.root.children["a"]
    assert leaf.tenant_epoch["A"] == 1
    for expected_epoch in range(2, 8):     # matches take epochs 2..7: no refresh
        tree.prefix_match("abc")
        assert leaf.tenant_epoch["A"] == 1, expected_epoch
    tree.prefix_match("abc")               # epoch 8: refreshed
    assert leaf.tenant_epoch["A"] == 8


def test_eviction_is_lru_and_drops_emptied_nodes():
    tree = CharTree()
    tree.insert("aaaa", "A")               # epoch 0
    tree.insert("bbbb", "A")               # epoch 1
    tree.insert("cccc", "A")               # epoch 2
    tree.insert("aaaa", "A")               # end node refreshed: epoch 3
    assert tree.evict_tenant_by_size(8) == 1
    assert set(tree.root.children) == {"a", "c"}
    assert tree.tenant_char_count["A"] == 8


def test_eviction_walks_up_to_a_parent_that_becomes_a_leaf():
    tree = CharTree()
    tree.insert("abcd", "A")
    tree.insert("abxy", "A")               # "ab" (epoch 0 for A) with two leaves
    tree.insert("zz", "A")
    assert tree.tenant_char_count["A"] == 8
    tree.evict_tenant_by_size(2)           # both leaves, then "ab" itself (epoch 0)
    assert tree.tenant_char_count["A"] == 2
    assert set(tree.root.children) == {"z"}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(alphabet="abc", min_size=0, max_size=12),
                          st.sampled_from(["A", "B", "C"])), max_size=40),
       st.integers(min_value=0, max_value=30))
def test_char_counts_match_a_recount(inserts, cap):
    tree = CharTree()
    for text, tenant in inserts:
        tree.insert(text, tenant)
        tree.prefix_match(text[:3])
    recount = used_size_per_tenant(tree)
    assert {t: tree.tenant_char_count[t] for t in recount} == recount
    tree.evict_tenant_by_size(cap)
    recount = used_size_per_tenant(tree)
    for tenant, size in tree.tenant_char_count.items():
        assert recount.get(tenant, 0) == size
        assert size <= cap or size == 0


def test_cache_aware_defaults_are_the_cli_defaults_of_0_3_2():
    router = CacheAwareRouter(W)
    assert float(router.cache_threshold) == pytest.approx(0.3)
    assert (router.balance_abs_threshold, float(router.balance_rel_threshold)) == (64, 1.5)
    assert (router.eviction_interval_secs, router.max_tree_size) == (60, 2 ** 26)


def test_cache_aware_affinity_and_first_worker_on_ties():
    router = CacheAwareRouter(W)
    d = router.route("hello world", [0, 0, 0])
    assert (d.worker, d.rule) == (0, "min_load")        # empty tree, tie: the first
    d = router.route("goodbye", [1, 0, 0])
    assert (d.worker, d.rule) == (1, "min_load")        # no match: least loaded, first
    d = router.route("hello there", [5, 0, 0])
    assert (d.worker, d.rule, d.matched_chars) == (0, "cache_hit", 6)


def test_cache_threshold_is_strict():
    router = CacheAwareRouter(W, cache_threshold=0.5)
    router.route("abcdefgh", [0, 0, 0])                 # worker 0
    d = router.route("abcdWXYZ", [1, 0, 0])             # 4 / 8 = 0.5: not > 0.5
    assert (d.worker, d.rule) == (1, "min_load")
    d = router.route("abcdeXYZ", [1, 1, 0])             # 5 / 8 > 0.5
    assert (d.worker, d.rule) == (0, "cache_hit")


def test_balance_rule_needs_both_thresholds():
    router = CacheAwareRouter(W, balance_abs_threshold=4, balance_rel_threshold=1.5)
    router.route("shared prefix", [0, 0, 0])            # worker 0 owns the text
    # max - min = 5 > 4 and 9 > 1.5 * 4: balance -> least loaded, inserted there too
    d = router.route("shared prefix", [9, 4, 6])
    assert (d.worker, d.rule) == (1, "balance")
    # max - min = 4, not > 4: cache path (worker 0 created the node)
    d = router.route("shared prefix", [8, 4, 6])
    assert (d.worker, d.rule) == (0, "cache_hit")
    # max - min = 6 > 4 and 16 > 1.5 * 10 = 15: balance
    d = router.route("shared prefix", [16, 10, 12])
    assert d.rule == "balance" and d.worker == 1
    d = router.route("shared prefix", [15, 10, 12])     # 15 > 15 is false
    assert d.rule == "cache_hit"


def test_balance_path_inserts_text_for_the_chosen_worker():
    router = CacheAwareRouter(W[:2], balance_abs_threshold=0, balance_rel_threshold=1.0)
    d = router.route("only here", [3, 0])
    assert (d.worker, d.rule) == (1, "balance")
    d = router.route("only here", [0, 0])
    assert (d.worker, d.rule) == (1, "cache_hit")


def test_periodic_eviction_runs_when_due():
    router = CacheAwareRouter(W[:1], eviction_interval_secs=60, max_tree_size=4)
    router.route("aaaa", [0])
    router.route("bbbb", [0])
    assert router.tick(59.9) == 0 and router.tree.tenant_char_count[W[0]] == 8
    assert router.tick(125.0) == 2 and router.tree.tenant_char_count[W[0]] == 4


def test_input_ids_text_and_token_belief():
    assert text_for_input_ids([12, 345, 6]) == "12 345 6"
    ids = [12, 345, 6]
    assert [tokens_within_chars(ids, c) for c in (0, 1, 2, 3, 5, 6, 7, 8)] == \
        [0, 0, 1, 1, 1, 2, 2, 3]


def test_round_robin_and_random():
    rr = RoundRobinRouter(W)
    assert [rr.route("", [0, 0, 0]).worker for _ in range(5)] == [0, 1, 2, 0, 1]
    a = [RandomRouter(W, seed=3).route("", [0] * 3).worker for _ in range(3)]
    b = RandomRouter(W, seed=3)
    assert a[0] == b.route("", [0] * 3).worker
    seq = [b.route("", [0] * 3).worker for _ in range(200)]
    assert set(seq) == {0, 1, 2}


def test_bad_router_name_is_a_user_error():
    with pytest.raises(UserError, match="--router: unknown router 'nope'"):
        make_router("nope", W)
