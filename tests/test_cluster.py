"""Several replicas behind a router on one virtual clock (``serving/cluster.py``): one
replica is today's serve-sim step for step; the router sees the true in-flight counts;
every request is served once; cache_aware's affinity gives hits that round_robin loses;
the cluster load scales the arrival span; the CLI's rows and errors."""
import dataclasses
import json
from array import array

import pytest

pytest.importorskip("sglang")

from sglang_marconi.driver.replay import ReplayRequest  # noqa: E402
from sglang_marconi.model import preset_spec  # noqa: E402

OUT_CAP = 12


@pytest.fixture(scope="module")
def spec():
    return preset_spec("qwen3_next")


@pytest.fixture(scope="module")
def trace_requests(mooncake_path):
    from sglang_marconi.harness.ab import to_replay_requests
    from sglang_marconi.sim.traces import read_trace

    trace = read_trace(mooncake_path).head(60)
    reqs = [dataclasses.replace(r, output_ids=r.output_ids[:OUT_CAP])
            for r in to_replay_requests(trace)]
    return reqs, [r.timestamp for r in trace.requests]


def _setup(spec, requests, timestamps, *, kv=400_000, slots=24, running=4, policy="fcfs"):
    from sglang_marconi.driver.pools import PoolConfig
    from sglang_marconi.serving.gpu_model import GpuTimeModel, preset
    from sglang_marconi.serving.run import ServeSetup
    from sglang_marconi.serving.scheduler import SchedulerConfig

    longest = max(len(r.input_ids) + max(1, r.output_len) for r in requests)
    pools = PoolConfig(kv_tokens=kv, mamba_slots=slots, max_context_len=longest + 128,
                       max_running_requests=running)
    sched = SchedulerConfig(max_running_requests=running, measure_bookkeeping=False,
                            schedule_policy=policy)
    return ServeSetup(spec=spec, time_model=GpuTimeModel(spec, preset("h200")), pools=pools,
                      sched=sched, timestamps=list(timestamps))


def _request_view(sched):
    return [(r.rid, r.arrival, r.hit_len, r.admitted, r.first_token, r.finished, r.aborted)
            for r in sched.records.values()]


@pytest.mark.parametrize("cache", ["stock", "marconi+"])
def test_one_replica_is_serve_sim_step_for_step(spec, trace_requests, cache):
    from sglang_marconi.serving.cluster import run_cluster
    from sglang_marconi.serving.run import run_serving

    reqs, ts = trace_requests
    # lpm: its in-queue prefix grouping gives these 60 requests hits (fcfs admits the
    # requests sharing a prefix in one batch, and none hits)
    setup = _setup(spec, reqs, ts, policy="lpm")
    single, sched = run_serving(cache, reqs, setup, load=0.9)
    summary, cluster = run_cluster(cache, "cache_aware", reqs, setup, 1, load=0.9)
    (replica,) = cluster.replicas
    assert single["hit_tokens"] > 0
    assert _request_view(replica) == _request_view(sched)
    assert [dataclasses.astuple(s) for s in replica.steps] == \
        [dataclasses.astuple(s) for s in sched.steps]
    for key in ("ttft_p50_s", "ttft_p95_s", "flops_saved_fraction", "hit_tokens",
                "finished", "aborted", "makespan_s"):
        assert summary[key] == single[key], key
    assert summary["load_skew"] == 1.0 and summary["requests_per_replica"] == [len(reqs)]


class LoadCheckingRouter:
    """Wraps a router: checks every load vector against a recount from the records."""

    def __init__(self, inner, cluster_ref):
        self.inner, self.cluster_ref, self.checked = inner, cluster_ref, 0
        self.name = inner.name

    def tick(self, now):
        self.now = now
        return self.inner.tick(now)

    def route(self, text, loads):
        cluster = self.cluster_ref[0]
        for k, sched in enumerate(cluster.replicas):
            recount = sum(1 for rid in cluster.sent[k]
                          if sched.records.get(rid) is None
                          or sched.records[rid].ended is None
                          or sched.records[rid].ended > self.now)
            assert loads[k] == recount
            assert sched.done() or sched.now >= self.now   # caught up before routing
        self.checked += 1
        return self.inner.route(text, loads)


def test_router_sees_true_in_flight_counts_and_everything_is_served(spec, trace_requests):
    from marconi_checks.invariants import check_idle
    from sglang_marconi.serving.cluster import (build_cluster, cluster_arrivals,
                                                summarize_cluster)

    reqs, ts = trace_requests
    setup = _setup(spec, reqs, ts, running=3)
    cluster = build_cluster("marconi+", "cache_aware", setup, 3,
                            {"balance_abs_threshold": 1, "balance_rel_threshold": 1.0})
    ref = [cluster]
    cluster.router = LoadCheckingRouter(cluster.router, ref)
    cluster.run(reqs, cluster_arrivals(setup, reqs, 3, 1.2, None))
    summary = summarize_cluster(cluster, spec, "marconi+", "cache_aware", 1.2, 0.0)
    assert cluster.router.checked == len(reqs)
    assert summary["finished"] + summary["aborted"] == len(reqs)
    assert sorted(rid for sent in cluster.sent for rid in sent) == sorted(r.rid for r in reqs)
    assert sum(summary["requests_per_replica"]) == len(reqs)
    assert summary["router_rules"].get("balance", 0) > 0     # in-flight counts mattered
    assert summary["load_skew"] >= 1.0
    assert summary["belief_gap_tokens"] == summary["router_believed_tokens"] - \
        summary["hit_tokens"]
    for sched in cluster.replicas:
        check_idle(sched.cache)


def _groups(n_prefixes=4, per_prefix=6, prefix_len=2048, suffix_len=128):
    """Requests sharing long prefixes in groups, interleaved, one every 2 s (no queueing)."""
    reqs = []
    for j in range(per_prefix):
        for g in range(n_prefixes):
            i = len(reqs)
            ids = array("q", [10_000 * (g + 1) + t for t in range(prefix_len)]
                        + [5_000_000 + 1000 * i + t for t in range(suffix_len)])
            reqs.append(ReplayRequest(f"g{g}-{j}", ids, [7, 8]))
    return reqs, [2.0 * i for i in range(len(reqs))]


def test_cache_aware_affinity_beats_round_robin_on_shared_prefixes(spec):
    from sglang_marconi.serving.cluster import run_cluster

    reqs, ts = _groups()
    setup = _setup(spec, reqs, ts)
    rows = {name: run_cluster("stock", name, reqs, setup, 3, rate_scale=1.0)[0]
            for name in ("cache_aware", "round_robin", "random")}
    aware, rr = rows["cache_aware"], rows["round_robin"]
    # each prefix group stays on one replica: a hybrid checkpoint forms on the 2nd request
    # and hits from the 3rd; round robin spreads every group over all three replicas
    assert aware["hit_tokens"] > rr["hit_tokens"]
    assert aware["router_rules"]["cache_hit"] == len(reqs) - 4
    assert aware["router_believed_tokens"] > aware["hit_tokens"]   # the tree overstates
    assert rr["router_believed_tokens"] is None and rr["belief_gap_tokens"] is None
    assert rr["requests_per_replica"] == [8, 8, 8] and rr["load_skew"] == 1.0
    assert rows["random"]["finished"] == len(reqs)


def test_cluster_load_spreads_the_same_work_over_n_replicas(spec, trace_requests):
    from sglang_marconi.serving.arrivals import offered_seconds
    from sglang_marconi.serving.cluster import cluster_arrivals
    from sglang_marconi.serving.run import offered_batch

    reqs, ts = trace_requests
    setup = _setup(spec, reqs, ts)
    span1 = max(cluster_arrivals(setup, reqs, 1, 0.8, None))
    span4 = max(cluster_arrivals(setup, reqs, 4, 0.8, None))
    # one replica's load is serve-sim's: prefill and decode at the batch the pools allow
    batch = offered_batch(setup, reqs)
    assert batch > 1
    assert span1 == pytest.approx(offered_seconds(reqs, setup.time_model, batch,
                                                  setup.pools.chunked_prefill_size) / 0.8)
    assert span4 == pytest.approx(span1 / 4)


def test_deterministic(spec, trace_requests):
    from sglang_marconi.serving.cluster import run_cluster

    reqs, ts = trace_requests
    setup = _setup(spec, reqs[:30], ts[:30])
    a = run_cluster("marconi+", "cache_aware", reqs[:30], setup, 2, load=0.9)[0]
    b = run_cluster("marconi+", "cache_aware", reqs[:30], setup, 2, load=0.9)[0]
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b



def test_a_replica_that_sglang_crashes_stops_the_run_and_is_named(spec, trace_requests,
                                                                  monkeypatch):
    """SGLang's allocator raising inside one replica's step (its server would exit): the
    cluster run stops there and its summary names the replica and the error; any other
    exception still propagates."""
    from sglang_marconi.serving import cluster as cluster_mod
    from sglang_marconi.serving.scheduler import ServingScheduler

    reqs, ts = trace_requests
    setup = _setup(spec, reqs[:30], ts[:30])
    real_step = ServingScheduler._step_overlap
    calls = {}

    def step(self, message="Prefill out of memory. Try to lower your batch size.\nTry x."):
        calls[id(self)] = calls.get(id(self), 0) + 1
        if self is built[-1].replicas[1] and calls[id(self)] == 5:
            raise RuntimeError(message)
        real_step(self)

    built = []
    real_build = cluster_mod.build_cluster
    monkeypatch.setattr(cluster_mod, "build_cluster",
                        lambda *a, **k: built.append(real_build(*a, **k)) or built[-1])
    monkeypatch.setattr(ServingScheduler, "_step_overlap", step)
    summary, cluster = cluster_mod.run_cluster("stock", "round_robin", reqs[:30], setup, 2,
                                               load=0.9)
    assert summary["crashed"].startswith("replica 1: SGLang raised 'Prefill out of memory")
    assert summary["finished"] < 30 and cluster.replicas[0].crash is None
    monkeypatch.setattr(ServingScheduler, "_step_overlap",
                        lambda self: step(self, "something else"))
    with pytest.raises(RuntimeError, match="something else"):
        cluster_mod.run_cluster("stock", "round_robin", reqs[:30], setup, 2, load=0.9)

def test_cli_prints_one_row_per_router_and_cache(mooncake_path, capsys):
    from sglang_marconi.cli.main import main

    rc = main(["serve-sim", "--trace", str(mooncake_path), "--model", "qwen3_next",
               "--limit", "12", "--replicas", "2",
               "--router", "cache_aware,round_robin",
               "--caches", "stock,marconi+", "--load", "0.8", "--bookkeeping", "off",
               "--json", "--no-progress"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rows = [(r["router"], r["cache"]) for r in out["runs"]]
    assert rows == [("cache_aware", "stock"), ("cache_aware", "marconi+"),
                    ("round_robin", "stock"), ("round_robin", "marconi+")]
    assert all(r["replicas"] == 2 and r["finished"] == 12 for r in out["runs"])
    # cache_aware reports its belief, round_robin keeps no tree
    assert [r["belief_gap_tokens"] is None for r in out["runs"]] == [False] * 2 + [True] * 2
    assert out["config"]["replicas"] == 2


def test_dp_size_is_sglangs_round_robin_over_dp_ranks(mooncake_path, capsys):
    """``--dp-size N``: N ranks behind SGLang's DP controller's round-robin, the same
    dispatch (and so the same run) as N replicas behind sglang-router's round_robin."""
    from sglang_marconi.cli.main import main

    common = ["serve-sim", "--trace", str(mooncake_path), "--model", "qwen3_next",
              "--limit", "9", "--caches", "stock", "--load", "0.8", "--bookkeeping", "off",
              "--json", "--no-progress"]
    assert main(common + ["--dp-size", "3"]) == 0
    (dp,) = json.loads(capsys.readouterr().out)["runs"]
    assert main(common + ["--replicas", "3", "--router", "round_robin"]) == 0
    (rr,) = json.loads(capsys.readouterr().out)["runs"]
    assert dp["router"] == "dp_round_robin" and dp["replicas"] == 3
    assert dp["router_rules"] == {"dp_round_robin": 9} and dp["requests_per_replica"] == [3, 3, 3]
    for key in ("hit_tokens", "ttft_p50_s", "ttft_p95_s", "finished", "makespan_s"):
        assert dp[key] == rr[key], key


@pytest.mark.parametrize("argv, message", [
    (["--dp-size", "2", "--replicas", "2"], "--dp-size"),
    (["--dp-size", "2", "--router", "round_robin"], "--dp-size"),
    (["--replicas", "2", "--router", "nope"], "--router: unknown router 'nope'"),
    (["--replicas", "2", "--router", "marconi"], "--router: unknown router 'marconi'"),
    (["--replicas", "2", "--clients", "4"], "--clients"),
    (["--replicas", "2", "--router", "cache_aware,cache_aware"], "--router: cache_aware twice"),
    (["--replicas", "2", "--router-balance-abs-threshold", "-1"],
     "router: the balance thresholds must be >= 0"),
    (["--replicas", "2", "--plot", "x.png"], "--plot draws single-server runs"),
])
def test_cli_errors(mooncake_path, capsys, argv, message):
    from sglang_marconi.cli.main import main

    rc = main(["serve-sim", "--trace", str(mooncake_path), "--model", "qwen3_next",
               "--limit", "4", "--no-progress", *argv])
    assert rc == 2
    assert message in capsys.readouterr().err
