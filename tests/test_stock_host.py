"""The simulator's host tier (``policy.stock_host``, issue 20): stock SGLang with HiCache
(write_through, write_through_selective) on static pools. Its mechanics (backup at insert
or at the second insert, demote on device eviction, host LRU, a host hit loaded back and
counted) and its agreement with ``ab``'s stock SGLang with HiCache on the same pools.

Agreement measured (``scripts/bench_baseline_agreement.py --hicache-size 400``, docs/
hicache.md "The simulator's host tier"): identical hits for every request of the bundled
trace and every field of the host section (paper-7b, 100 GiB static + 400 GB host:
31.290% of prefill FLOPs saved by both under write_through, 21.910% under
write_through_selective); the slices below hold that level (any differing request or
field fails).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helper import ab_chat_small_pools, run_cli

from sglang_marconi.cli import ab as ab_cli
from sglang_marconi.cli import sim as sim_cli
from sglang_marconi.driver.sizing import size_pools
from sglang_marconi.errors import UserError
from sglang_marconi.policy.stock import StockSGLangCache
from sglang_marconi.policy.stock_host import HostPools, StockHiCache
from marconi_reports import baseline_agreement, host_agreement
from sglang_marconi.sim.traces import read_trace

SEGMENT = 1024  # tokens of each request's own prefix: 16 pages


def _tokens(seed: int, n: int = SEGMENT) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 50_000, n)


def _small_cache(spec, host_kv: int = 2 * SEGMENT,
                 write_policy: str = "write_through") -> StockHiCache:
    """Room on the device for one segment and a running request; on host for two."""
    return StockHiCache(spec, host=HostPools(host_kv, 10, write_policy),
                        kv_tokens=2 * SEGMENT, state_slots=10, tracking_slots=2)


def _run(cache, tokens) -> int:
    hit = cache.process(tokens, tokens)
    cache.check()
    return hit


# ---- mechanics ------------------------------------------------------------------------------------
def test_insert_backs_up_and_device_eviction_demotes(paper_spec):
    c = _small_cache(paper_spec)
    a, b = _tokens(1), _tokens(2)
    _run(c, a)
    assert (c.host_kv_tokens, c.host_states) == (SEGMENT, 1)  # written through at insert
    _run(c, b)  # needs the device room a holds: a is demoted, not deleted
    node_a = c.root.children[c._child_key(a, 0)]
    assert node_a.alive and not node_a.dev and node_a.hkv and node_a.hstate
    assert not node_a.state  # its device state went with its KV
    assert c.stats.kv_tokens_evicted == SEGMENT
    assert (c.tree_kv_tokens, c.host_kv_tokens) == (SEGMENT, 2 * SEGMENT)


def test_a_hit_that_continues_on_host_is_loaded_back_and_counted(paper_spec):
    c = _small_cache(paper_spec)
    a, b = _tokens(1), _tokens(2)
    _run(c, a)
    _run(c, b)  # a is on host only now
    hit = _run(c, np.concatenate([a, _tokens(3, 512)]))
    assert hit == SEGMENT  # the state at a's end, from host
    hs = c.host_stats
    assert (hs.hit_tokens, hs.kv_tokens_loaded) == (SEGMENT, SEGMENT)
    assert hs.states_loaded == 2  # the node's device slot and the request's own copy
    assert hs.bytes_loaded == SEGMENT * c.kv_bytes + 2 * c.state_bytes
    assert hs.flops_saved == paper_spec.flops_saved(SEGMENT, 0) == c.stats.flops_saved


def test_host_evicts_its_least_recent_leaf_first(paper_spec):
    c = _small_cache(paper_spec)
    a, b, d = _tokens(1), _tokens(2), _tokens(4)
    for t in (a, b, d):  # d's backup needs the host room a or b holds: a is older
        _run(c, t)
    assert c.host_stats.kv_tokens_evicted == SEGMENT
    assert c._child_key(a, 0) not in c.root.children
    assert _run(c, np.concatenate([b, _tokens(5, 512)])) == SEGMENT  # b stayed on host
    assert _run(c, np.concatenate([a, _tokens(6, 512)])) == 0


def test_without_host_room_nothing_is_backed_up_and_eviction_deletes(paper_spec):
    c = _small_cache(paper_spec, host_kv=0)
    a, b = _tokens(1), _tokens(2)
    _run(c, a)
    _run(c, b)
    assert c.host_kv_tokens == c.host_stats.kv_tokens_backed_up == 0
    assert c._child_key(a, 0) not in c.root.children  # deleted, as without a host tier
    assert _run(c, np.concatenate([a, _tokens(3, 512)])) == 0


def test_selective_backs_up_on_the_second_insert_only(paper_spec):
    c = _small_cache(paper_spec, write_policy="write_through_selective")
    a = _tokens(1)
    _run(c, a)
    assert c.host_kv_tokens == 0  # one insert: not backed up
    a_more = np.concatenate([a, _tokens(3, 512)])
    _run(c, a_more)  # its insert walks through a's node: the second, a is backed up
    node_a = c.root.children[c._child_key(a, 0)]
    assert node_a.hkv and node_a.hstate and node_a.inserts == 2
    leaf = next(iter(node_a.children.values()))
    assert not leaf.hkv and leaf.inserts == 1  # the new tail waits for its second


def test_refuses_write_policies_it_does_not_build(paper_spec):
    with pytest.raises(ValueError, match="write_back"):
        StockHiCache(paper_spec, host=HostPools(10, 1, "write_back"), kv_tokens=2048,
                     state_slots=10)


def test_sim_cli_refuses_what_it_does_not_model():
    base = ("--workload", "chat", "--param", "sessions=2", "--no-progress",
            "--policies")
    static = "sglang:kv_tokens=60000:state_slots=12"
    cases = [((static, "--hicache-size", "1", "--hicache-write-policy", "write_back"),
              "--hicache-write-policy write_back"),
             ((static, "--hicache-ratio", "2", "--hicache-storage-backend", "file"),
              "--hicache-storage-backend"),
             (("sglang", "--hicache-ratio", "2"), "needs static pools"),
             (("marconi+", "--hicache-ratio", "2"), "has none"),
             (("marconi+:materialise=sglang", "--hicache-ratio", "2"), "needs static pools")]
    for extra, message in cases:
        with pytest.raises(UserError, match=message):
            run_cli(sim_cli, *base, *extra)


def test_sim_cli_reports_the_host_section():
    res = json.loads(run_cli(sim_cli, "--workload", "chat", "--param", "sessions=6",
                             "--policies", "sglang:kv_tokens=60000:state_slots=12:overlap=1",
                             "--hicache-ratio", "2", "--json", "--no-progress"))
    host = res["policies"]["sglang:kv_tokens=60000:state_slots=12:overlap=1"]["host"]
    assert host["kv_tokens_backed_up"] > 0 and host["hit_tokens"] > 0


# ---- agreement with ab's stock SGLang + HiCache ---------------------------------------------------
def _agreement(trace_path, limit, cache_gb=100, host_gb=400, model="paper-7b"):
    from sglang_marconi.model import preset_spec

    spec = preset_spec(model)
    pools = baseline_agreement.sim_pools(size_pools(spec, cache_gb, "static"))
    pools.pop("capacity_bytes")
    argv = host_agreement.ab_argv(trace_path, model, cache_gb, host_gb, limit)
    ab = json.loads(run_cli(ab_cli, *argv[1:]))
    trace = read_trace(trace_path).head(limit)
    hits, cache = host_agreement.simulate(trace, spec, host_gb, **pools)
    cache.check()
    return host_agreement.compare(trace, spec, hits, cache, ab), cache


def test_agrees_with_ab_stock_hicache_on_the_bundled_trace_slice(mooncake_path):
    pytest.importorskip("sglang")
    res, cache = _agreement(mooncake_path, 300)
    host = res["host"]
    # the slice exercises every piece: device demotions, host evictions, host hits
    assert cache.stats.kv_tokens_evicted > 0
    assert host["ab"]["kv_tokens_evicted"] > 0 and host["ab"]["hit_tokens"] > 0
    assert res["identical"] == res["requests"] == 300, res["worst"]
    assert res["diff_pp"] == 0.0
    # ab's config reports the host pools SGLang builds, the simulator's
    assert host["pools"]["sim"] == host["pools"]["ab"]
    assert host["sim"] == host["ab"]
    for key in ("states_admitted", "states_evicted", "kv_tokens_evicted"):
        assert res["sim"][key] == res["ab"][key], key


def test_host_tier_changes_nothing_while_the_device_never_evicts(paper_spec, mooncake_path):
    """Without device evictions nothing is ever demoted: the same hits as stock."""
    trace = read_trace(mooncake_path).head(40)
    plain = StockSGLangCache(paper_spec, None, kv_tokens=10**7, state_slots=10**4,
                             tracking_slots=2)
    host = StockHiCache(paper_spec, host=HostPools(10**7, 10**4), kv_tokens=10**7,
                        state_slots=10**4, tracking_slots=2)
    for r in trace.requests:
        assert plain.process(r.input_tokens, r.full_tokens) == host.process(
            r.input_tokens, r.full_tokens)
    assert host.host_stats.hit_tokens == 0 and host.host_stats.kv_tokens_backed_up > 0


@pytest.mark.parametrize("write_policy", ["write_through", "write_through_selective"])
def test_agrees_with_ab_when_states_run_short(paper_spec, tmp_path, write_policy):
    """A chat trace (outputs reused, branches) on a 12-slot state pool: the MAMBA walk
    tombstones inner states and demotes leaves; host pools twice the device's; the state
    host pool fills."""
    pytest.importorskip("sglang")
    path, ab = ab_chat_small_pools(tmp_path, "stock", write_policy)
    trace = read_trace(path)
    host = HostPools.from_ratio(ab["config"]["host"]["hicache_ratio"], 60000, 12,
                                write_policy)
    cache = StockHiCache(paper_spec, host=host, kv_tokens=60000, state_slots=12,
                         tracking_slots=2)
    hits = [cache.process(r.input_tokens, r.full_tokens) for r in trace.requests]
    cache.check()
    res = host_agreement.compare(trace, paper_spec, hits, cache, ab)
    assert cache.host_stats.hit_tokens > 0 and cache.host_stats.states_evicted > 0
    assert res["identical"] == res["requests"], res["worst"]
    assert res["host"]["sim"] == res["host"]["ab"]
