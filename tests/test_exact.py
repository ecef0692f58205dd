"""verify-exact: resuming from tree-chosen checkpoints on real hybrid model code is exact."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from functools import lru_cache

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from sglang_marconi.exact import runner, snapshot  # noqa: E402
from sglang_marconi.exact.archs import ARCHS, build_model, get_arch  # noqa: E402
from sglang_marconi.exact.scenario import (N_DECODE, SYSTEM_LEN, USER_LEN,  # noqa: E402
                                           BranchOracle, run_arch)

ALL = list(ARCHS)
MAMBA2 = [a for a in ALL if ARCHS[a].ssm_family == "mamba2"]


@lru_cache(maxsize=None)
def result(name, **kw):
    return run_arch(ARCHS[name], seed=0, **kw)


@pytest.mark.parametrize("name", ALL)
def test_resuming_is_exact(name):
    res = result(name)
    assert res.max_abs_logit_diff <= res.tolerance, res.to_dict()
    assert res.tokens_match
    assert res.branch_hits >= 1 and res.output_hits >= 1  # both kinds of hit were exercised
    assert res.passed


@pytest.mark.parametrize("name", ALL)
def test_tree_checkpoints_at_branch_points(name):
    res = result(name)
    assert res.positions_match
    req = {r.name: r for r in res.requests}
    first_full = SYSTEM_LEN + USER_LEN + N_DECODE - 1  # input + output[:-1]
    # 1st use of the system prompt: no tree yet, state only at the end
    assert req["conv1-turn1"].checkpoint_positions == [] and req["conv1-turn1"].hit_len == 0
    assert req["conv1-turn1"].stored_positions == [first_full]
    # 2nd use: the branch point is the end of the system prompt -> two-pass prefill
    assert req["conv2-turn1"].checkpoint_positions == [SYSTEM_LEN]
    assert req["conv2-turn1"].stored_positions == [SYSTEM_LEN, first_full]
    # next turn resumes from the end-of-request state; 3rd use hits the branch point
    assert req["conv2-turn2"].hit_len == first_full
    assert req["conv3-turn1"].hit_len == SYSTEM_LEN
    assert req["conv1-turn2"].hit_len == first_full


@pytest.mark.parametrize("name", ALL)
def test_checkpoint_bytes_equal_cost_model(name):
    assert result(name).checkpoint_bytes_match_cost_model


@pytest.mark.parametrize("name", MAMBA2)
def test_mamba2_states_match_reference_scan(name):
    ssd = result(name).ssd_crosscheck
    assert ssd["checked_states"] > 0 and ssd["passed"], ssd


@pytest.mark.parametrize("name", ALL)
def test_negative_control_off_by_one_fails(name):
    res = result(name, ssm_offset=-1)
    assert not res.passed
    assert res.max_abs_logit_diff > 100 * res.tolerance
    # only the request resuming from the (wrong) branch-point state is affected
    bad = [r.name for r in res.requests
           if max(r.next_token_max_abs_diff, r.continuation_max_abs_diff) > res.tolerance]
    assert bad == ["conv3-turn1"]
    if name in MAMBA2:
        assert not res.ssd_crosscheck["passed"]


@pytest.mark.parametrize("name", ["bamba", "qwen3_next"])
def test_exact_under_eviction(name):
    # a byte budget that forces evictions: on_evict frees tensors, the store stays in step
    # with the tree (checked after every request), and whatever still hits is exact
    res = run_arch(ARCHS[name], seed=0, capacity_bytes=100_000, crosscheck=False)
    assert res.states_evicted > 0
    assert res.branch_hits + res.output_hits > 0
    assert res.max_abs_logit_diff <= res.tolerance and res.tokens_match


def test_negative_control_one_token_late_fails():
    assert not result("bamba", ssm_offset=1).passed


def test_jamba_needs_token_by_token_continuation():
    chunked = replace(ARCHS["jamba"], token_by_token=False)
    res = run_arch(chunked, seed=0, crosscheck=False)
    assert res.max_abs_logit_diff > res.tolerance and not res.passed


def test_zamba2_prefill_only_dt_clamp_breaks_decode_states():
    res = result("zamba2", keep_dt_clamp=True)
    assert not res.passed and not res.ssd_crosscheck["passed"]


def test_restore_round_trip_matches_live_cache():
    arch = ARCHS["falcon_h1"]  # layers with both KV and SSM state
    model = build_model(arch, 0)
    tokens = list(range(3, 23))
    live = snapshot.DynamicCache(config=model.config)
    runner.extend(model, arch, live, tokens[:12], 0)
    ckpt = snapshot.Checkpoint(12, snapshot.take_kv(live, 12), snapshot.take_ssm_states(live))
    restored = snapshot.restore(model.config, ckpt)
    a = runner.extend(model, arch, live, tokens[12:], 12)
    b = runner.extend(model, arch, restored, tokens[12:], 12)
    assert torch.equal(a, b)  # dropping the never-read conv column changes nothing


def test_reference_scan_loads_without_leaving_mamba_ssm_imported():
    from sglang_marconi.exact.ssd_reference import load_ssd_minimal

    assert callable(load_ssd_minimal())
    assert "mamba_ssm" not in sys.modules  # transformers must keep seeing it as absent


def test_reference_scan_split_and_resume_equals_one_pass():
    from sglang_marconi.exact.ssd_reference import reference_state

    g = torch.Generator().manual_seed(0)
    rec = {"hidden_states": torch.randn(1, 19, 2, 4, generator=g),
           "dt": torch.randn(1, 19, 2, generator=g), "A": -torch.rand(2, generator=g),
           "B": torch.randn(1, 19, 1, 3, generator=g), "C": torch.randn(1, 19, 1, 3, generator=g),
           "dt_bias": torch.zeros(2), "dt_softplus": True}
    one = reference_state(rec, 19, resume_at=0)
    for h in (5, 8, 13):
        assert torch.allclose(reference_state(rec, 19, resume_at=h), one, atol=1e-6)


def test_branch_oracle():
    o = BranchOracle()
    assert o.expected([1, 2, 3, 4]) == (0, [])
    o.record([1, 2, 3, 4, 5], [5])
    assert o.expected([1, 2, 9, 9]) == (0, [2])
    assert o.expected([1, 2, 3, 4, 5, 6]) == (5, [])  # a follow-up: no branch, hit at the end


def test_arch_names_are_forgiving_and_unknown_is_user_error():
    from sglang_marconi.errors import UserError

    assert get_arch("NemotronH").name == "nemotron_h"
    assert get_arch("qwen3-next").name == "qwen3_next"
    assert get_arch("Falcon-H1").name == "falcon_h1"
    with pytest.raises(UserError, match="mamba9"):
        get_arch("mamba9")


def test_cli_unknown_arch_exits_2(capsys):
    from sglang_marconi.cli import main

    assert main(["verify-exact", "--arch", "mamba9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "mamba9" in err


def test_cli_live_without_the_harness_exits_2(capsys, monkeypatch, tmp_path):
    """``--live`` needs a source checkout's tests/live: one line naming the folder."""
    from sglang_marconi.cli import main, verify_exact

    monkeypatch.setattr(verify_exact, "LIVE_HARNESS", tmp_path / "tests" / "live")
    assert main(["verify-exact", "--live"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "tests/live" in err


def test_cli_list_and_json(capsys):
    from sglang_marconi.cli import main

    assert main(["verify-exact", "--list"]) == 0
    assert set(ALL) <= {line.split()[0] for line in capsys.readouterr().out.splitlines()}
    assert main(["verify-exact", "--arch", "bamba", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] and data["arch"] == "bamba"


def test_cli_negative_control_exits_1(capsys):
    from sglang_marconi.cli import main

    assert main(["verify-exact", "--arch", "qwen3_next", "--ssm-offset", "-1"]) == 1
    assert capsys.readouterr().out.rstrip().endswith("FAIL")


def test_live_int8_summary_line(capsys):
    """``verify-exact --live`` ends each model's int8 scenario with one PASS / FAIL line of
    its figures (``exact_live.run_int8``'s result)."""
    from live.exact_report import print_int8

    res = {"configs": {"extra_buffer-marconi-int8": {
               "problems": [], "audit": {"equal": 9, "failed": 0}, "max_rel": 3.1e-4}},
           "negative_control": {"perturb": 1.0, "audit": {"equal": 0, "failed": 4},
                                "max_rel_resumed": 3.5e-2},
           "passed": True}
    print_int8("qwen3_next", res, 1e-3)
    line = capsys.readouterr().out.strip()
    assert line.startswith("PASS int8 checkpoints (qwen3_next, tolerance 1e-03)")
    assert "9 hits resumed from a state bitwise equal" in line and "= 35x" in line
    res["passed"] = False
    res["configs"]["extra_buffer-marconi-int8"]["problems"] = ["int8 audit: 8 loads ..."]
    print_int8("qwen3_next", res, 1e-3)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "FAIL qwen3_next extra_buffer-marconi-int8: int8 audit: 8 loads ..."
    assert lines[1].startswith("FAIL int8 checkpoints")


def test_live_spec_summary_line(capsys):
    """``verify-exact --live``'s speculative decoding line, from the NGRAM configuration's
    per-request comparisons."""
    from types import SimpleNamespace

    from live.exact_report import print_spec

    live = SimpleNamespace(SPEC="extra_buffer_ngram", config_id="-".join,
                           identical_tokens=lambda reqs: (sum(r["positions"] for r in reqs),
                                                          sum(r["length"] for r in reqs)))
    res = {"configs": {"extra_buffer_ngram-marconi": {
        "problems": [], "max_rel": 6.3e-6,
        "requests": [{"positions": 140, "length": 140}, {"positions": 8, "length": 8}]}}}
    print_spec("qwen3_next", res, live, 1e-4)
    assert capsys.readouterr().out.strip() == (
        "PASS speculative decoding (qwen3_next, NGRAM, extra_buffer_ngram, marconi): 148 of "
        "148 greedy tokens identical to the uncached server's, max rel diff 6.30e-06 "
        "(tolerance 1e-04)")
    res["configs"]["extra_buffer_ngram-marconi"]["problems"] = ["x"]
    print_spec("qwen3_next", res, live, 1e-4)
    assert capsys.readouterr().out.startswith("FAIL speculative decoding")
    print_spec("qwen3_next", {"configs": {}}, live, 1e-4)
    assert capsys.readouterr().out == ""
