"""The simulator's ``sglang`` baseline (``policy.stock``, issue 18): where stock SGLang takes
its states (``policy.admission``'s ``sglang_*`` rules), how its tree and buffer evict, and
its agreement with ``ab``'s stock SGLang on the same bytes.

Agreement measured (``scripts/bench_baseline_agreement.py``): identical hits for every
request of the bundled trace (paper-7b, 100 GiB unified: 17.601% of prefill FLOPs saved by
both; 100 GiB static, SGLang's default two pools: 11.770% by both); the slices below hold
that level (any differing request fails).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helper import run_cli

from sglang_marconi.cli import ab as ab_cli
from sglang_marconi.cli import sim as sim_cli
from sglang_marconi.driver.sizing import size_pools
from sglang_marconi.model import preset_spec
from marconi_reports import baseline_agreement as agreement
from sglang_marconi.sim.generators import generate
from sglang_marconi.sim.traces import read_trace, write_sessions

from sglang_marconi.policy.admission import (plan_sglang_checkpoints, sglang_branch_point,
                                             sglang_chunk_end, sglang_chunk_snapshot,
                                             sglang_decode_snapshot, sglang_grid,
                                             sglang_prefill_chunks, sglang_track_grid)
from sglang_marconi.policy.stock import StockSGLangCache
from sglang_marconi.sim.policies import build_cache, parse_policy


# ---- where states are taken -------------------------------------------------------------------
def test_grids_follow_the_page():
    assert sglang_grid(64) == 64 and sglang_grid(16) == 64 and sglang_grid(128) == 128
    assert sglang_grid(48) == 192
    assert sglang_track_grid(64, 256) == 256 and sglang_track_grid(192, 256) == 768


def test_chunks_start_at_the_hit_and_truncated_ones_are_floored():
    assert sglang_chunk_end(0, 20000, 8192, 64, 64) == 8192
    assert sglang_chunk_end(512, 20000, 8192, 64, 64) == 512 + 8192
    assert sglang_chunk_end(16384, 20000, 8192, 64, 64) == 20000  # the rest fits
    assert sglang_chunk_end(0, 8192, 8192, 64, 64) == 8192
    # page 48: grid 192; 8192 floored to the page (8160), then to the grid (8064)
    assert sglang_chunk_end(0, 20000, 8192, 48, 192) == 8064
    assert sglang_chunk_end(0, 20000, -1, 64, 64) == 20000  # chunked prefill off


def test_chunk_states_at_every_boundary_and_the_grid_floored_end():
    chunks = sglang_prefill_chunks(20000, 512, 0, 8192, 64, 64)
    assert chunks == [(512, 8704, 8704), (8704, 16896, 16896), (16896, 20000, 19968)]
    # a last chunk shorter than the grid takes no snapshot
    assert sglang_prefill_chunks(8192 + 40, 0, 0, 8192, 64, 64)[-1] == (8192, 8232, 0)
    assert sglang_chunk_snapshot(960, 1000, 0, 64) == 0


def test_branch_replaces_the_end_of_the_chunk_that_contains_it():
    assert sglang_branch_point(10000, 8192, 64) == 9984
    assert sglang_branch_point(8200, 8192, 64) == 0  # floored: not beyond the hit
    assert sglang_branch_point(5000, 8192, 64) == 0
    chunks = sglang_prefill_chunks(30000, 0, 9984, 8192, 64, 64)
    assert [s for _, _, s in chunks] == [8192, 9984, 24576, 29952]
    # strictly inside: a branch on a chunk end is that chunk's end state
    assert sglang_chunk_snapshot(0, 8192, 8192, 64) == 8192
    assert sglang_chunk_snapshot(8192, 16384, 8192, 64) == 16384
    # in the last chunk too
    assert sglang_chunk_snapshot(0, 1000, 512, 64) == 512


def test_decode_snapshots_only_the_last_one_is_published():
    # KV exists for input + output - 1 tokens: tracked positions n+1 .. n+out-1
    assert sglang_decode_snapshot(1000, 1, 256) == 0
    assert sglang_decode_snapshot(1000, 24, 256) == 0     # last KV position 1023
    assert sglang_decode_snapshot(1000, 25, 256) == 1024  # reaches 1024
    assert sglang_decode_snapshot(1000, 600, 256) == 1536  # 1024 and 1280 replaced
    assert sglang_decode_snapshot(1024, 2, 256) == 0  # the input's end is not a decode state


def test_plan_publishes_chunks_last_chunk_and_last_decode_snapshot():
    plan = plan_sglang_checkpoints(20000, 600, 0, 0)
    assert plan.positions == (8192, 16384, 19968, 20480) and plan.cached_len == 20480
    plan = plan_sglang_checkpoints(20000, 1, 0, 0)  # no decode: the last chunk's state ends it
    assert plan.positions == (8192, 16384, 19968) and plan.cached_len == 19968
    plan = plan_sglang_checkpoints(12000, 10, 8192, 9984)  # hit 8192, branch 9984
    assert plan.positions == (9984,) and plan.branch_len == 9984
    assert plan_sglang_checkpoints(1000, 1, 960, 0).positions == ()


# ---- the cache ----------------------------------------------------------------------------------
def _tokens(n, start=0):
    return np.arange(start, start + n, dtype=np.int64)


def _full(inp, out_len, fresh):
    return np.concatenate([inp, _tokens(max(0, out_len - 1), fresh)])


def _states(cache):
    out, stack = [], [cache.root]
    while stack:
        x = stack.pop()
        stack.extend(x.children.values())
        if x.state:
            out.append(x.depth)
    return sorted(out)


@pytest.fixture
def unlimited(paper_spec):
    return StockSGLangCache(paper_spec, None)


def test_one_request_keeps_its_chunk_states_and_kv_up_to_the_last(unlimited):
    c = unlimited
    inp = _tokens(20000)
    assert c.process(inp, _full(inp, 600, 10**9)) == 0
    assert _states(c) == [8192, 16384, 19968, 20480]
    assert c.tree_kv_tokens == 20480
    c.check()
    # the same prompt again: the hit is the deepest state within input[:-1]
    assert c.process(inp, inp) == 19968


def test_branch_state_replaces_the_chunk_end_and_hits_resume_there(unlimited):
    c = unlimited
    a = _tokens(30000)
    c.process(a, a)
    assert _states(c) == [8192, 16384, 24576, 29952]
    b = np.concatenate([a[:10000], _tokens(20000, 10**8)])  # shares 10,000 tokens
    assert c.process(b, b) == 8192  # the deepest state on the shared path
    # KV matched 9984 (page-floored): the branch snapshot replaces [8192, 16384)'s end
    # b's chunks from the hit: [8192, 16384) -> 9984, [16384, 24576), [24576, 30000) -> 29952
    assert _states(c) == [8192, 9984, 16384, 24576, 24576, 29952, 29952]
    c2 = np.concatenate([a[:12000], _tokens(5000, 10**9)])
    assert c.process(c2, c2) == 9984
    c.check()


def test_output_of_one_token_publishes_the_last_chunk_at_finish(unlimited):
    inp = _tokens(9000)
    unlimited.process(inp, inp)
    assert _states(unlimited) == [8192, 8960]


def test_short_last_chunk_and_no_decode_state_publish_nothing_more(unlimited):
    c = unlimited
    a = _tokens(1000)
    c.process(a, a)
    assert _states(c) == [960]
    b = np.concatenate([a, _tokens(30, 10**8)])  # 1030 tokens: hit 960, last chunk 70 -> 1024
    assert c.process(b, b) == 960
    assert _states(c) == [960, 1024]
    d = np.concatenate([a[:990], _tokens(10, 10**9)])  # 1000 tokens, 40 past the hit
    assert c.process(d, d) == 960
    assert _states(c) == [960, 1024]  # a chunk shorter than the grid snapshots nothing


def _leaf_owners(cache, unit=10**6):
    out, stack = [], [cache.root]
    while stack:
        x = stack.pop()
        stack.extend(x.children.values())
        if not x.children and x is not cache.root:
            out.append(int(x.key[0]) // unit)
    return sorted(out)


def test_lru_over_leaves_a_hit_refreshes_the_consumed_state_not_its_subtree(paper_spec):
    # requests of 10,000 tokens, each its own token range (unit 10**6)
    c = StockSGLangCache(paper_spec, 55_000 * paper_spec.kv_bytes_per_token)
    a, b = _tokens(10000), _tokens(10000, 10**6)
    c.process(a, a)  # states at 8192 and 9984
    c.process(b, b)
    # a request that reuses a's first chunk consumes its 8192 state: that node (and its
    # ancestors) are stamped, a's leaf [8192, 9984) is not
    a2 = np.concatenate([a[:8192], _tokens(1800, 10 * 10**6)])
    assert c.process(a2, a2) == 8192
    for i in range(2, 5):  # fill until the fourth request needs one eviction
        x = _tokens(10000, i * 10**6)
        c.process(x, x)
    assert c.stats.evictions == 1
    # the victim is a's leaf, older than b's since the hit did not refresh it
    assert _leaf_owners(c) == [1, 2, 3, 4, 10]
    c.check()
    assert c.process(a, a) == 8192  # a's chunk state survives under a2's branch
    assert c.stats.peak_bytes <= c.capacity


def test_running_request_never_exceeds_the_budget(paper_spec):

    trace = generate("agent", seed=3, sessions=3, min_turns=8, max_turns=10)
    longest = max(r.input_len + r.output_len for r in trace.requests)
    cap = 2 * longest * paper_spec.kv_bytes_per_token
    c = StockSGLangCache(paper_spec, cap)
    for r in trace.requests:
        c.process(r.input_tokens, r.full_tokens)
        c.check()
    assert c.stuck == 0 and c.stats.peak_bytes <= cap and c.stats.evictions > 0


def test_policy_options_reach_the_cache(paper_spec):
    c = build_cache(parse_policy("sglang:chunk=4096:track=512:page=32:overlap=1"),
                    paper_spec, 10**12, 1)
    assert (c.chunk, c.page, c.grid, c.track_grid, c.tracking_slots) == (4096, 32, 64, 512, 2)
    c = build_cache(parse_policy("sglang"), paper_spec, None, 1)
    assert (c.chunk, c.page, c.grid, c.track_grid, c.tracking_slots) == (8192, 64, 64, 256, 1)


# ---- static pools: the MAMBA walk -----------------------------------------------------------------
def test_state_shortage_tombstones_inner_states_and_deletes_leaves(paper_spec):
    c = StockSGLangCache(paper_spec, None, kv_tokens=10**6, state_slots=4)
    a = _tokens(20000)
    c.process(a, a)  # states at 8192, 16384 (inner) and 19968 (the leaf)
    assert _states(c) == [8192, 16384, 19968] and c.tree_kv_tokens == 19968
    c.check()
    # a request of its own takes 2 slots (working, tracking), then one more to publish its
    # 8192: the MAMBA walk drops the least recent states, a's 8192 and 16384, inner
    # nodes (tombstones: their KV stays)
    b = _tokens(9000, 10**6)
    c.process(b, b)
    assert _states(c) == [8192, 8960, 19968]
    assert c.tree_kv_tokens == 19968 + 8960 and c.stats.nodes_deleted == 0
    assert c.stats.states_evicted == 2
    # a's KV still matches, the hit is its deepest surviving state (refreshed by the
    # match); the request's tracking slot tombstones b's 8192
    assert c.process(a, a) == 19968
    assert _states(c) == [8960, 19968]
    c.check()
    # publishing d's 8192 takes b's 8960, an unlocked leaf: deleted with its KV; b's
    # 8192 stays as KV only
    d = _tokens(9000, 2 * 10**6)
    c.process(d, d)
    assert c.stats.nodes_deleted == 1 and c.tree_kv_tokens == 19968 + 8192 + 8960
    assert _states(c) == [8192, 8960, 19968]
    c.check()


def test_a_match_refreshes_only_the_consumed_state_in_the_mamba_list(paper_spec):
    c = StockSGLangCache(paper_spec, None, kv_tokens=10**6, state_slots=6)
    a, b = _tokens(9000), _tokens(9000, 10**6)
    c.process(a, a)  # 8192, 8960
    c.process(b, b)  # 8192, 8960
    a2 = np.concatenate([a[:8192], _tokens(100, 10 * 10**6)])
    assert c.process(a2, a2) == 8192  # a's 8192 consumed: moved up; a2 adds 8256 (5 states)
    d = _tokens(9000, 2 * 10**6)
    c.process(d, d)  # 2 slots, then 1 to publish: a's leaf 8960 (deleted) and b's 8192
    # (tombstoned) go; a's 8192, older than both but consumed since, stays
    assert c.stats.states_evicted == 2 and c.stats.nodes_deleted == 1
    assert c.process(a, a) == 8192
    c.check()


def test_static_pools_need_both_sizes(paper_spec):
    with pytest.raises(ValueError):
        StockSGLangCache(paper_spec, None, kv_tokens=10**6)
    c = build_cache(parse_policy("sglang:kv_tokens=100000:state_slots=40:overlap=1"),
                    paper_spec, 10**12, 1)
    assert (c.static, c.kv_tokens, c.state_slots, c.capacity, c.tracking_slots) == (
        True, 99968, 40, None, 2)


def test_simulator_runs_the_policy():

    text = run_cli(sim_cli, "--paper", "--workload", "chat", "--param", "sessions=6", "--policies",
                   "sglang,paper-sglang+", "--capacity", "2GB", "--json", "--no-progress")
    res = json.loads(text)["policies"]
    assert res["sglang"]["alpha"] == 0.0
    assert 0.0 < res["sglang"]["flops_saved_fraction"] <= 1.0
    assert res["sglang"]["states_admitted"] > 0


# ---- agreement with ab's stock SGLang -----------------------------------------------------------
def _agreement(trace_path, cache_gb, limit=None, model="paper-7b", memory="unified"):

    spec = preset_spec(model)
    pools = agreement.sim_pools(size_pools(spec, cache_gb, memory))
    capacity = pools.pop("capacity_bytes")
    argv = agreement.ab_argv(trace_path, model, cache_gb, limit, memory=memory)
    ab = json.loads(run_cli(ab_cli, *argv[1:]))
    trace = read_trace(trace_path).head(limit)
    hits, stats = agreement.simulate(trace, spec, capacity, **pools)
    return agreement.compare(trace, spec, hits, stats, ab, capacity), stats


def _chat_trace(path):
    write_sessions(generate("chat", seed=1, sessions=8, max_len=30000, user_median=2500,
                            output_median=300), path)
    return path


def test_agrees_with_ab_stock_on_the_bundled_trace_slice(mooncake_path):
    pytest.importorskip("sglang")
    res, stats = _agreement(mooncake_path, 100, limit=300)
    assert stats.evictions > 0  # the slice fills the 100 GiB buffer
    assert res["identical"] == res["requests"] == 300, res["worst"]
    assert res["diff_pp"] == 0.0
    assert res["sim"]["states_evicted"] == res["ab"]["states_evicted"]
    assert res["sim"]["kv_tokens_evicted"] == res["ab"]["kv_tokens_evicted"]


def test_agrees_with_ab_stock_on_reused_outputs_and_branches(tmp_path):
    """A chat trace: outputs reused by the next turn, branch points off the 512-token
    blocks of Mooncake, several chunks per request, a buffer that evicts."""
    pytest.importorskip("sglang")

    res, stats = _agreement(_chat_trace(tmp_path / "chat.jsonl"), 4)
    assert stats.evictions > 0
    assert res["identical"] == res["requests"], res["worst"]
    assert res["diff_pp"] == 0.0


def test_static_pools_agree_with_ab_stock_on_the_bundled_trace_slice(mooncake_path):
    pytest.importorskip("sglang")
    res, stats = _agreement(mooncake_path, 100, limit=300, memory="static")
    assert stats.evictions > 0
    assert res["identical"] == res["requests"] == 300, res["worst"]
    assert res["diff_pp"] == 0.0
    assert res["sim"]["states_evicted"] == res["ab"]["states_evicted"]
    assert res["sim"]["kv_tokens_evicted"] == res["ab"]["kv_tokens_evicted"]


def test_static_pools_agree_with_ab_stock_when_states_run_short(paper_spec, tmp_path):
    """A state pool of 12 slots under 60,000 KV tokens: most evictions are the MAMBA
    walk's, inner states tombstoned (``ab --kv-tokens K --mamba-slots S``)."""
    pytest.importorskip("sglang")
    path = _chat_trace(tmp_path / "chat.jsonl")
    argv = agreement.ab_argv(path, "paper-7b", 1)[1:]
    for flag in ("--cache-gb", "--memory"):
        i = argv.index(flag)
        del argv[i:i + 2]
    ab = json.loads(run_cli(ab_cli, *argv, "--kv-tokens", "60000", "--mamba-slots", "12"))
    trace = read_trace(path)
    cache = StockSGLangCache(paper_spec, None, kv_tokens=60000, state_slots=12,
                             tracking_slots=2)
    hits = [cache.process(r.input_tokens, r.full_tokens) for r in trace.requests]
    cache.check()
    assert cache.stats.states_evicted > cache.stats.nodes_deleted  # tombstones
    res = agreement.compare(trace, paper_spec, hits, cache.stats, ab, None)
    assert res["identical"] == res["requests"], res["worst"]
    assert res["sim"]["states_evicted"] == res["ab"]["states_evicted"]
    assert res["sim"]["kv_tokens_evicted"] == res["ab"]["kv_tokens_evicted"]
