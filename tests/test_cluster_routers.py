"""The ``oracle`` router's read-only walk and the marconi / oracle routers in a cluster
(``serving/router_marconi.py``, ``serving/cluster.py``): the walk answers what SGLang's
match would, and asking it changes nothing (the run's hits and steps are identical with and
without the queries); the cluster feeds the routers their responses (the CLI's rows: tests/test_cluster.py)."""
from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("sglang")

# spec: test_cluster's fixture (qwen3_next), shared by importing it
from test_cluster import _groups, _request_view, _setup, spec  # noqa: E402,F401



class AskingRouter:
    """round_robin that, before routing each request, asks every replica's cache (read-only)
    about each of ``requests`` (the oracle's queries, without acting on them)."""

    def __init__(self, inner, cluster_ref, requests):
        self.inner, self.cluster_ref, self.requests = inner, cluster_ref, requests
        self.name, self.asked = inner.name, 0

    def tick(self, now):
        return self.inner.tick(now)

    def route(self, text, loads):
        from sglang_marconi.serving.router_marconi import readonly_match

        for sched in self.cluster_ref[0].replicas:
            for rr in self.requests:
                readonly_match(sched.cache, rr.input_ids)
                self.asked += 1
        return self.inner.route(text, loads)


@pytest.mark.parametrize("cache", ["stock-python", "marconi+"])
def test_oracle_queries_are_read_only(spec, cache):
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    from sglang_marconi.serving.cluster import build_cluster, cluster_arrivals
    from sglang_marconi.serving.router_marconi import readonly_match

    reqs, ts = _groups(per_prefix=4, prefix_len=1024)   # round robin keeps each group on
    setup = _setup(spec, reqs, ts)                        # one of the 2 replicas: hits
    times = cluster_arrivals(setup, reqs, 2, None, 0.25)
    plain = build_cluster(cache, "round_robin", setup, 2)
    plain.run(reqs, times)
    asked = build_cluster(cache, "round_robin", setup, 2)
    asked.router = AskingRouter(asked.router, [asked], reqs[::4])
    asked.run(reqs, times)
    assert asked.router.asked == len(reqs) * 2 * len(reqs[::4])
    hits = []
    for a, b in zip(plain.replicas, asked.replicas):
        assert _request_view(a) == _request_view(b)          # every hit, every time
        assert [dataclasses.astuple(s) for s in a.steps] == \
            [dataclasses.astuple(s) for s in b.steps]
        hits += [r.hit_len for r in a.records.values() if r.hit_len]
    assert hits, "the run must hit for this test to mean something"
    # the walk answers what SGLang's own match answers (asked after the run)
    answers = []
    for sched in plain.replicas:
        for rr in reqs:
            walk, kv = readonly_match(sched.cache, rr.input_ids)
            key = RadixKey(rr.input_ids[:len(rr.input_ids) - 1])
            real = sched.cache.match_prefix(MatchPrefixParams(key=key))
            assert walk == real.device_prefix_len, rr.rid
            assert kv >= walk
            answers.append(walk)
    assert any(answers)


def test_oracle_refuses_the_compiled_tree_core(spec):
    from sglang_marconi.errors import UserError
    from sglang_marconi.serving.cluster import build_cluster
    from sglang_marconi.serving.router_marconi import readonly_match

    reqs, ts = _groups(n_prefixes=1, per_prefix=1)
    cluster = build_cluster("stock", "round_robin", _setup(spec, reqs, ts), 1)
    with pytest.raises(UserError, match="--router oracle"):
        readonly_match(cluster.replicas[0].cache, reqs[0].input_ids)
    oracle = build_cluster("stock", "oracle", _setup(spec, reqs, ts), 1)
    assert oracle.replicas[0].cache.tree_core.root_node is not None   # stock-python


@pytest.mark.parametrize("router", ["marconi", "oracle"])
def test_cost_routers_serve_everything_and_hear_every_response(spec, router):
    from sglang_marconi.serving.cluster import run_cluster

    reqs, ts = _groups(per_prefix=4, prefix_len=1024)
    summary, cluster = run_cluster("marconi+", router, reqs, _setup(spec, reqs, ts), 3,
                                   rate_scale=0.02)      # 40 ms apart: queues form
    assert summary["finished"] + summary["aborted"] == len(reqs)
    assert sum(summary["requests_per_replica"]) == len(reqs)
    assert summary["belief_gap_tokens"] == summary["router_believed_tokens"] - \
        summary["hit_tokens"]
    assert summary["hit_tokens"] > 0
    # responses complete before the last arrival were all reported, the rest still open
    assert len(cluster.router.in_flight) == sum(len(o) for o in cluster.open)
    assert set(cluster.router.in_flight) == set().union(*cluster.open)
