"""The ``oracle`` router's read-only walk and the marconi / oracle routers in a cluster
(scripts/lib/marconi_routing): the walk answers what SGLang's match would, and asking it
changes nothing (the run's hits and steps are identical with and without the queries); the
cluster feeds the routers their responses; the scale-out script's grid has one row per
router and cache."""
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
        from marconi_routing.cost_routers import readonly_match

        for sched in self.cluster_ref[0].replicas:
            for rr in self.requests:
                readonly_match(sched.cache, rr.input_ids)
                self.asked += 1
        return self.inner.route(text, loads)


@pytest.mark.parametrize("cache", ["stock-python", "marconi+"])
def test_oracle_queries_are_read_only(spec, cache):
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    from marconi_routing.cost_routers import readonly_match
    from sglang_marconi.serving.cluster import build_cluster, cluster_arrivals

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
    from marconi_routing.cluster import build_cost_cluster
    from marconi_routing.cost_routers import readonly_match
    from sglang_marconi.errors import UserError
    from sglang_marconi.serving.cluster import build_cluster

    reqs, ts = _groups(n_prefixes=1, per_prefix=1)
    cluster = build_cluster("stock", "round_robin", _setup(spec, reqs, ts), 1)
    with pytest.raises(UserError, match="--router oracle"):
        readonly_match(cluster.replicas[0].cache, reqs[0].input_ids)
    oracle = build_cost_cluster("stock", "oracle", _setup(spec, reqs, ts), 1)
    assert oracle.replicas[0].cache.tree_core.root_node is not None   # stock-python


@pytest.mark.parametrize("router", ["marconi", "oracle"])
def test_cost_routers_serve_everything_and_hear_every_response(spec, router):
    from marconi_routing.cluster import run_cost_cluster

    reqs, ts = _groups(per_prefix=4, prefix_len=1024)
    summary, cluster = run_cost_cluster("marconi+", router, reqs, _setup(spec, reqs, ts), 3,
                                        rate_scale=0.02)      # 40 ms apart: queues form
    assert summary["finished"] + summary["aborted"] == len(reqs)
    assert sum(summary["requests_per_replica"]) == len(reqs)
    assert summary["belief_gap_tokens"] == summary["router_believed_tokens"] - \
        summary["hit_tokens"]
    assert summary["hit_tokens"] > 0
    # responses complete before the last arrival were all reported, the rest still open
    assert len(cluster.router.in_flight) == sum(len(o) for o in cluster.open)
    assert set(cluster.router.in_flight) == set().union(*cluster.open)


def test_router_flags_are_checked_in_one_line():
    import argparse

    from marconi_routing.cluster import add_router_arguments, router_options
    from sglang_marconi.cli import serve_sim
    from sglang_marconi.errors import UserError

    parser = argparse.ArgumentParser()
    serve_sim.add_arguments(parser)
    add_router_arguments(parser)
    base = ["--trace", "t.jsonl", "--model", "qwen3_next"]
    options = router_options(parser.parse_args(base + ["--router-affinity-threshold", "off"]))
    assert options["marconi"]["affinity_threshold"] is None
    assert options["oracle"] == options["marconi"]
    for flag, value in (("--router-load-penalty", "-1"), ("--router-branch-weight", "-2"),
                        ("--router-owner-tokens", "-1")):
        with pytest.raises(UserError, match=flag):
            router_options(parser.parse_args(base + [flag, value]))


def test_scale_out_script_runs_every_router_and_cache(mooncake_path, tmp_path):
    """One tiny cell of scripts/bench_scale_out.py: one row per router and cache, the oracle's
    stock replicas on the python core, every router but round_robin reporting its belief."""
    import importlib.util
    import json
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_scale_out.py"
    module_spec = importlib.util.spec_from_file_location("bench_scale_out", script)
    bench = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(bench)
    out = tmp_path / "grid.jsonl"
    assert bench.main(["--trace", str(mooncake_path), "--models", "qwen3_next",
                       "--replicas", "2", "--limit", "12", "--caches", "stock,marconi+",
                       "--routers", "cache_aware,round_robin,marconi,oracle",
                       "--out", str(out)]) == 0
    runs = [json.loads(line) for line in out.read_text().splitlines()]
    rows = [(r["router"], r["cache"], r.get("replica_cache", r["cache"])) for r in runs]
    assert rows == [("cache_aware", "stock", "stock"), ("cache_aware", "marconi+", "marconi+"),
                    ("round_robin", "stock", "stock"), ("round_robin", "marconi+", "marconi+"),
                    ("marconi", "stock", "stock"), ("marconi", "marconi+", "marconi+"),
                    # the oracle walks the python tree core: stock runs as stock-python
                    ("oracle", "stock", "stock-python"), ("oracle", "marconi+", "marconi+")]
    assert all(r["replicas"] == 2 and r["finished"] == 12 for r in runs)
    assert [r["belief_gap_tokens"] is None for r in runs] == [False] * 2 + [True] * 2 \
        + [False] * 4
