"""The two rankings behind one interface (``policy.rankings``): what each answers."""
import types

from sglang_marconi.policy.likelihood import ReuseWeight
from sglang_marconi.policy.rankings import AlphaRanking, ReuseWeightedRanking


def _node(children=0):
    return types.SimpleNamespace(children={i: None for i in range(children)})


def test_alpha_ranking_weighs_every_node_one():
    r = AlphaRanking(1.5)
    node = _node(3)
    assert (r.queue_mode, r.alpha, r.weighs_nodes, r.weight_fn) == ("marconi", 1.5, False, None)
    assert r.weight(node) == 1.0 and r.record_hit(node, 7) is False
    r.forget_hits(node)
    assert not hasattr(node, "hit_score")  # a hit changes nothing but recency
    assert r.host_mode("ranked") == "marconi" and r.host_mode("lru") is None
    assert AlphaRanking(0).host_mode("ranked") is None and AlphaRanking(0).is_lru


def test_reuse_weighted_ranking_counts_hits_on_the_node():
    r = ReuseWeightedRanking()
    node = _node(0)  # a leaf (a chain state, one child, weighs the learned chain weight)
    assert (r.queue_mode, r.alpha, r.weighs_nodes, r.is_lru) == ("gdsf", 0.0, True, False)
    before = r.weight(node)
    assert (node.hit_score, node.max_children) == (0.0, 0)
    assert r.record_hit(node, 3) is True  # the key moved: the cache re-keys the node
    assert r.weight(node) > before
    r.forget_hits(node)
    assert (node.hit_score, node.last_hit) == (0.0, 0) and r.weight(node) == before
    assert r.host_mode("ranked") == "gdsf" and r.host_mode("lru") is None
    fixed = ReuseWeightedRanking(ReuseWeight(chain_weight=0.25))
    assert fixed.weight_fn == fixed.weight and fixed.reuse.chain_weight == 0.25
