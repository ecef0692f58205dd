"""The simulator's marconi+ with SGLang's host tier and the two-tier rule
(``policy.in_sglang_host.MarconiHiCache``, ``sim --hicache-size H --policies
marconi+:materialise=sglang`` on static pools) against ``ab``'s marconi+ (the plugin) with
HiCache: the same hits request for request and the same host section, field by field.

The whole bundled trace: ``scripts/bench_baseline_agreement.py --hicache-size H --caches
marconi+`` (docs/hicache.md).
"""
from __future__ import annotations

import json

import pytest
from cli_helper import ab_chat_small_pools, run_cli

from sglang_marconi.cli import ab as ab_cli
from sglang_marconi.cli import sim as sim_cli
from sglang_marconi.driver.sizing import size_pools
from sglang_marconi.model import preset_spec
from sglang_marconi.policy.in_sglang_host import MarconiHiCache
from sglang_marconi.policy.likelihood import ReuseWeight
from sglang_marconi.policy.stock_host import HostPools
from marconi_reports import baseline_agreement, host_agreement
from sglang_marconi.sim.traces import read_trace


def test_bundled_trace_slice_agrees_with_ab_marconi_plus_hicache(mooncake_path):
    """paper-7b, 100 GiB static + 400 GB host, write_through, 600 requests: device
    demotions, host evictions ranked by the two-tier rule and host hits all happen."""
    pytest.importorskip("sglang")
    spec, limit = preset_spec("paper-7b"), 600
    pools = baseline_agreement.sim_pools(size_pools(spec, 100, "static"))
    pools.pop("capacity_bytes")
    argv = host_agreement.ab_argv(mooncake_path, "paper-7b", 100, 400, limit, cache="marconi+")
    ab = json.loads(run_cli(ab_cli, *argv[1:]))
    trace = read_trace(mooncake_path).head(limit)
    hits, cache = host_agreement.simulate(trace, spec, 400, cache="marconi+", **pools)
    assert isinstance(cache, MarconiHiCache)
    cache.check()
    res = host_agreement.compare(trace, spec, hits, cache, ab, "marconi+")
    host = res["host"]
    assert host["ab"]["kv_tokens_evicted"] > 0 and host["ab"]["hit_tokens"] > 0
    assert res["identical"] == res["requests"] == limit, res["worst"]
    assert host["sim"] == host["ab"] and host["pools"]["sim"] == host["pools"]["ab"]
    for key in ("states_admitted", "states_evicted", "kv_tokens_evicted"):
        assert res["sim"][key] == res["ab"][key], key


@pytest.mark.parametrize("write_policy", ["write_through", "write_through_selective"])
def test_agrees_with_ab_when_states_run_short(paper_spec, tmp_path, write_policy):
    """A chat trace on a 12-slot state pool and host pools twice the device's: the MAMBA
    walks of both tiers run (device states tombstoned or demoted, host states ranked by
    the two-tier rule and evicted); under write_through_selective marconi+ keeps the
    tails its end-state rule would refuse."""
    pytest.importorskip("sglang")
    path, ab = ab_chat_small_pools(tmp_path, "marconi+", write_policy)
    trace = read_trace(path)
    host = HostPools.from_ratio(ab["config"]["host"]["hicache_ratio"], 60000, 12,
                                write_policy)
    cache = MarconiHiCache(paper_spec, host=host, kv_tokens=60000, state_slots=12,
                           reuse_weight=ReuseWeight(), ghost_tokens=600000,
                           end_threshold=0.05, tracking_slots=2)
    hits = []
    for r in trace.requests:
        hits.append(cache.process(r.input_tokens, r.full_tokens))
        cache.check()
    res = host_agreement.compare(trace, paper_spec, hits, cache, ab, "marconi+")
    assert cache.host_stats.hit_tokens > 0 and cache.host_stats.states_evicted > 0
    assert res["identical"] == res["requests"], res["worst"]
    assert res["host"]["sim"] == res["host"]["ab"]


def test_sim_cli_runs_marconi_plus_with_the_host_tier(mooncake_path):
    """``sim --cache-gb --hicache-size`` with stock and marconi+: both host sections; the
    two-tier rule keeps more than stock's host LRU on the bundled trace's first 600."""
    res = json.loads(run_cli(sim_cli, "--trace", str(mooncake_path), "--limit", "600",
                             "--model", "paper-7b", "--cache-gb", "100", "--hicache-size",
                             "400", "--policies", "sglang,marconi+:materialise=sglang",
                             "--json", "--no-progress"))
    stock, plus = res["policies"]["sglang"], res["policies"]["marconi+:materialise=sglang"]
    assert stock["host"]["kv_tokens_backed_up"] > 0 and plus["host"]["hit_tokens"] > 0
    assert plus["flops_saved"] > stock["flops_saved"]


def test_needs_marconi_plus(paper_spec):
    with pytest.raises(ValueError, match="marconi\\+"):
        MarconiHiCache(paper_spec, host=HostPools(1000, 10), kv_tokens=60000,
                       state_slots=12)
