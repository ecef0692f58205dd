"""The simulator's Marconi as SGLang lets the plugin keep it (``materialise=sglang``, issue 18):
only the snapshots SGLang takes (chunk boundaries, the branch point inside its chunk, the
last prefill chunk, the last decode-track snapshot), decided as the plugin decides
(``sglang_integration.admission_plans``), in the model of SGLang's unified buffer
(``policy.in_sglang``), so the simulator's figure is one the integration keeps.

Here: the admission rules, and the first 200 requests of the bundled trace where nothing is
evicted. Under pressure: ``tests/test_parity_pressure.py`` (request for request) and
``scripts/bench_baseline_agreement.py --caches marconi+`` (the whole trace).
"""
from __future__ import annotations

import json

import pytest
from cli_helper import run_cli

from sglang_marconi.cli import ab as ab_cli
from sglang_marconi.driver.sizing import size_pools
from sglang_marconi.errors import UserError
from sglang_marconi.model import preset_spec
from sglang_marconi.policy.admission import SGLangGrids, plan_marconi_in_sglang
from marconi_reports import baseline_agreement as agreement
from sglang_marconi.sim.policies import build_cache, parse_policy
from sglang_marconi.sim.traces import read_trace

G = SGLangGrids()  # chunk 8192, page 64, grid 64, track grid 256


def test_chunk_states_within_the_budget_and_the_input_end_as_an_end_candidate():
    mp = plan_marconi_in_sglang(20000, 10, 0, 0, G, chunk_budget=1)
    assert mp.intermediate == (8192,)          # the second chunk state is over the budget
    assert mp.ends == (19968,)                 # the last chunk's grid-floored end
    assert mp.end == 19968 and mp.branch == 0


def test_the_branch_replaces_the_end_of_its_chunk():
    mp = plan_marconi_in_sglang(20000, 10, 0, 5000, G, chunk_budget=0)
    assert mp.intermediate == (5000,)          # chunk [0, 8192) snapshots the branch
    assert mp.ends == (19968,) and mp.branch == 5000


def test_a_decode_snapshot_is_a_second_end_candidate():
    mp = plan_marconi_in_sglang(1000, 600, 0, 0, G, chunk_budget=5)
    assert mp.intermediate == ()
    assert mp.ends == (960, 1536)              # input end, then the last 256-grid snapshot
    assert mp.end == 960                       # the plugin sees the input end first


def test_a_branch_in_the_last_chunk_leaves_no_input_end_state():
    mp = plan_marconi_in_sglang(1000, 5, 0, 512, G, chunk_budget=5)
    assert mp.intermediate == (512,) and mp.ends == ()
    assert mp.end == 960                       # the branch stands in the end state's place


def test_nothing_beyond_the_hit_is_no_end():
    mp = plan_marconi_in_sglang(1000, 5, 960, 0, G, chunk_budget=5)
    assert mp.end == 0 and mp.intermediate == ()


def test_options_need_materialise_sglang(paper_spec):
    with pytest.raises(UserError, match="option chunk needs materialise=sglang"):
        build_cache(parse_policy("marconi+:chunk=4096"), paper_spec, 10**10, 64)
    with pytest.raises(UserError, match="materialise must be plan or sglang"):
        build_cache(parse_policy("marconi+:materialise=yes"), paper_spec, 10**10, 64)
    with pytest.raises(UserError, match="option kv_tokens needs materialise=sglang"):
        build_cache(parse_policy("marconi+:kv_tokens=9000:state_slots=8"), paper_spec, None, 64)
    with pytest.raises(UserError, match="static pools need both kv_tokens and state_slots"):
        build_cache(parse_policy("marconi+:materialise=sglang:kv_tokens=9000"), paper_spec,
                    None, 64)
    with pytest.raises(UserError, match="need a fixed alpha or marconi\\+"):
        build_cache(parse_policy("marconi:alpha=online:materialise=sglang:kv_tokens=9000:"
                                 "state_slots=8"), paper_spec, None, 64)


def test_same_hits_and_states_as_abs_marconi_plus_where_nothing_is_evicted(mooncake_path):
    """The first 200 requests of the bundled trace in a 400 GiB unified buffer (nothing is
    evicted): the simulator's ``marconi+:materialise=sglang`` hits what ``ab``'s marconi+
    (the plugin in SGLang's cache objects) hits, request for request, and keeps as many
    states; the planning simulator (``marconi+``) does not (it keeps no chunk states)."""
    pytest.importorskip("sglang")
    spec, limit, gib = preset_spec("paper-7b"), 200, 400
    argv = agreement.ab_argv(mooncake_path, "paper-7b", gib, limit, cache="marconi+")
    ab_json = json.loads(run_cli(ab_cli, *argv[1:]))
    ab = ab_json["caches"]["marconi+"]
    capacity = agreement.sim_capacity(size_pools(spec, gib, "unified"))
    trace = read_trace(mooncake_path).head(limit)
    got = {}
    for policy in ("marconi+:materialise=sglang", "marconi+"):
        cache = build_cache(parse_policy(policy), spec, capacity, 64, trace)
        got[policy] = ([cache.process(r.input_tokens, r.full_tokens) for r in trace.requests],
                       cache.stats)
    hits, stats = got["marconi+:materialise=sglang"]
    assert stats.states_evicted == 0 and ab["states_evicted"] == 0
    assert hits == ab["hit_tokens_per_request"]
    assert stats.states_admitted == ab["states_admitted"]
    assert got["marconi+"][0] != ab["hit_tokens_per_request"]
    # the agreement report's marconi+ row (scripts/bench_baseline_agreement.py)
    res = agreement.compare(trace, spec, hits, stats, ab_json, capacity, cache="marconi+")
    assert res["identical"] == limit and res["diff_pp"] == 0.0
    report = agreement.format_report(res, trace_name="t", model="paper-7b", cache_gb=gib,
                                     ab_command=" ".join(argv), limit=limit)
    assert "| ab marconi+ |" in report and agreement.marconi_plus_policy() in report


def test_static_pools_agree_with_abs_marconi_plus_on_the_bundled_trace_slice(mooncake_path):
    """SGLang's default static pools at 100 GiB (``ab --memory static``), the first 600
    requests: the KV pool fills and the plugin's FULL walk evicts; the simulator's image
    (``kv_tokens``, ``state_slots``) hits, admits and evicts the same, request for request.
    The whole trace: ``scripts/bench_baseline_agreement.py --memory static --caches
    marconi+``."""
    pytest.importorskip("sglang")
    spec, limit, gib = preset_spec("paper-7b"), 600, 100
    argv = agreement.ab_argv(mooncake_path, "paper-7b", gib, limit, memory="static",
                             cache="marconi+")
    ab_json = json.loads(run_cli(ab_cli, *argv[1:]))
    pools = agreement.sim_pools(size_pools(spec, gib, "static"))
    capacity = pools.pop("capacity_bytes")
    trace = read_trace(mooncake_path).head(limit)
    hits, stats = agreement.simulate_marconi_plus(trace, spec, capacity, **pools)
    res = agreement.compare(trace, spec, hits, stats, ab_json, capacity, cache="marconi+")
    assert stats.kv_tokens_evicted > 0  # the pool filled
    assert res["identical"] == limit and res["diff_pp"] == 0.0, res["worst"]
    for key in ("states_admitted", "states_evicted", "kv_tokens_evicted"):
        assert res["sim"][key] == res["ab"][key], key
    report = agreement.format_report(res, trace_name="t", model="paper-7b", cache_gb=gib,
                                     ab_command=" ".join(argv), limit=limit)
    assert f"kv_tokens={pools['kv_tokens']}:state_slots={pools['state_slots']}" in report
