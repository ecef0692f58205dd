"""The rankings behind one interface (``policy.rankings``): what each answers."""
import math
import types

import pytest

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


def test_decay_queue_keys_are_last_use_plus_tau_log_efficiency():
    import math

    from sglang_marconi.policy.scoring import VictimQueue

    q = VictimQueue(mode="decay", tau=10.0)
    q.update("old-valuable", 0.0, math.e ** 3)  # key 30
    q.update("new-cheap", 20.0, 1.0)            # key 20
    q.update("worthless", 100.0, 0.0)           # no state: below every other key
    assert q.ordered() == ["worthless", "new-cheap", "old-valuable"]
    q.set_tau(5.0)  # key 15 against 20: the old one goes first now
    assert q.ordered() == ["worthless", "old-valuable", "new-cheap"]
    ticks = VictimQueue(mode="decay", tau=1.0, to_ticks=lambda counter: counter / 100)
    ticks.update("a", 300.0, 1.0)
    ticks.update("b", 250.0, math.e)  # 2.5 + 1 = 3.5 against 3.0
    assert ticks.ordered() == ["a", "b"]


def test_decay_ranking_learns_the_mean_reuse_distance_in_steps():
    from sglang_marconi.policy.rankings import DecayRanking

    r = DecayRanking()
    assert r.tau == DecayRanking.PRIOR_TICKS
    assert not r.observe_distance(70)  # inside the band around 64: no move, no re-key
    moves = [r.observe_distance(1000) for _ in range(200)]
    assert any(moves) and not all(moves)
    mean = r.distance_sum / r.distances
    assert r.tau / DecayRanking.STEP <= mean <= r.tau * DecayRanking.STEP
    assert math.log(r.tau, DecayRanking.STEP) == pytest.approx(
        round(math.log(r.tau, DecayRanking.STEP)))


def test_clock_log_reads_counters_as_clocks_and_stays_bounded(monkeypatch):
    from sglang_marconi.policy import clock_log

    log = clock_log.ClockLog()
    for clock, counter in enumerate([1.0, 3.0, 3.5, 7.0], start=1):
        log.append(counter, clock)
    assert [log.clock_at(c) for c in (0.5, 1.0, 2.9, 3.5, 100.0)] == [0, 1, 1, 3, 4]
    monkeypatch.setattr(clock_log, "CLOCK_LOG_LIMIT", 8)
    bounded = clock_log.ClockLog()
    for clock in range(1, 101):
        bounded.append(float(clock * 10), clock)
        assert len(bounded.counters) == len(bounded.clocks) <= 8
    assert bounded.clock_at(1000.0) == 100 and bounded.clock_at(995.0) == 99
    assert bounded.clock_at(15.0) == 0  # dropped long ago: reads as the oldest
