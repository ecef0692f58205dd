"""The simulator: trace readers and their errors, generators, the sim and gen-trace CLIs
(``sim`` driving SGLang's caches by default, ``--paper`` the planning simulator)."""
import json
import subprocess
import sys

import numpy as np
import pytest

from sglang_marconi.errors import UserError
from sglang_marconi.sim.generators import generate
from sglang_marconi.sim.policies import parse_policies
from sglang_marconi.sim.runner import simulate
from sglang_marconi.sim.traces import read_trace, write_sessions


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "sglang_marconi", *args],
                          capture_output=True, text=True)


def test_mooncake_expansion(mooncake_path):
    trace = read_trace(mooncake_path)
    assert len(trace) == 3993
    first = trace.requests[0]
    assert first.input_len == 40160 and first.output_len == 6
    # block h expands to h*512 .. h*512+511; the last block is cut at input_length
    assert first.input_tokens[512 * 3] == 3 * 512 and first.input_tokens[-1] == 78 * 512 + 223
    assert not set(first.output_tokens.tolist()) & set(first.input_tokens.tolist())


@pytest.mark.parametrize("line,message", [
    ('{"timestamp": 0, "input_length": 10, "output_length": 1}', "field 'hash_ids'"),
    ('{"timestamp": 0, "input_length": 900, "output_length": 1, "hash_ids": [1]}',
     "does not fit 1 blocks"),
    ('{"timestamp": 0, "input_length": -3, "output_length": 1, "hash_ids": [1]}',
     "'input_length' must be an integer >= 1"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]', "invalid JSON"),
])
def test_mooncake_bad_lines_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
                    + line + "\n")
    with pytest.raises(UserError, match=rf"t.jsonl:2: .*{message}"):
        read_trace(path, "mooncake")


def test_session_trace_errors(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"session_id": 1, "turn_id": 0, "ts": 0, "input_tokens": [1, 2], '
                    '"output_tokens": ["x"]}\n')
    with pytest.raises(UserError, match=r"s.jsonl:1: field 'output_tokens' must be a list"):
        read_trace(path)
    path.write_text("\n\n")
    with pytest.raises(UserError, match="empty"):
        read_trace(path)
    with pytest.raises(UserError, match="trace not found"):
        read_trace(tmp_path / "nope.jsonl")


def test_generators_are_seeded_and_round_trip(tmp_path):
    a = generate("agent", seed=3, sessions=4)
    b = generate("agent", seed=3, sessions=4)
    c = generate("agent", seed=4, sessions=4)
    assert [r.input_len for r in a.requests] == [r.input_len for r in b.requests]
    assert [r.input_len for r in a.requests] != [r.input_len for r in c.requests]
    path = tmp_path / "a.jsonl"
    write_sessions(a, path)
    back = read_trace(path)
    assert len(back) == len(a)
    assert all(np.array_equal(x.input_tokens, y.input_tokens)
               for x, y in zip(a.requests, back.requests))
    with pytest.raises(UserError, match="unknown workload parameter 'sesions'"):
        generate("agent", sesions=3)


def test_agent_history_drops_old_observations():
    trace = generate("agent", seed=0, sessions=1, min_turns=8, max_turns=8, keep_last=2)
    turns = trace.requests
    # turn t+1 extends turn t until an observation is replaced: then it branches off
    common = [int(np.argmin(np.r_[a.input_tokens[:min(a.input_len, b.input_len)] ==
                                  b.input_tokens[:min(a.input_len, b.input_len)], False]))
              for a, b in zip(turns, turns[1:])]
    extends = [c == t.input_len for c, t in zip(common, turns)]
    # with keep_last=2, turn 3 is the first whose history replaces an observation, and every
    # later turn replaces one more: each branches off the previous turn's sequence
    assert extends == [True, True] + [False] * 5


def test_chat_second_turn_extends_first():
    trace = generate("chat", seed=1, sessions=3)
    by_session = {}
    for r in trace.requests:
        by_session.setdefault(r.session_id, []).append(r)
    for turns in by_session.values():
        for a, b in zip(turns, turns[1:]):
            full = np.concatenate([a.input_tokens, a.output_tokens])
            assert np.array_equal(b.input_tokens[:len(full)], full)


def test_simulate_orders_policies_sensibly(paper_spec):
    trace = generate("shared-prompt", seed=0, requests=300)
    res = simulate(trace, paper_spec, 20 * 10**9,
                   parse_policies("vllm+,paper-sglang+,marconi:alpha=1,infinite"), progress=False)
    pol = res["policies"]
    assert pol["infinite"]["fraction_of_infinite_flops"] == 1.0
    for name in ("paper-sglang+", "marconi:alpha=1"):
        assert 0 < pol[name]["flops_saved"] <= pol["infinite"]["flops_saved"]
        assert pol[name]["peak_bytes"] <= 20 * 10**9
    # the shared prompts are reused: Marconi admission keeps few states, vLLM+ keeps many
    assert pol["vllm+"]["states_admitted"] > 10 * pol["paper-sglang+"]["states_admitted"]
    assert pol["infinite"]["ttft_p95_s"] <= pol["paper-sglang+"]["ttft_p95_s"]


def test_sim_cli_json_and_plot(tmp_path, mooncake_path):
    png = tmp_path / "p.png"
    r = _cli("sim", "--paper", "--trace", str(mooncake_path), "--limit", "300", "--model",
             "paper-7b", "--capacity", "50GB", "--policies", "paper-sglang+,marconi,infinite", "--json",
             "--plot", str(png))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for name in ("paper-sglang+", "marconi", "infinite"):
        m = out["policies"][name]
        for key in ("token_hit_rate", "request_hit_rate", "flops_saved", "flops_saved_fraction",
                    "states_admitted", "states_evicted", "peak_bytes", "ttft_p50_s",
                    "ttft_p95_s", "alpha", "wall_s"):
            assert key in m
        assert m["peak_bytes"] <= 50 * 10**9 or name == "infinite"
    assert png.stat().st_size > 10_000


def test_sim_cli_capacity_sweep_and_errors(tmp_path):
    png = tmp_path / "sweep.png"
    r = _cli("sim", "--paper", "--workload", "chat", "--param", "sessions=30", "--capacities",
             "0.2GB,1GB", "--policies", "paper-sglang+,infinite", "--plot", str(png), "--json")
    assert r.returncode == 0, r.stderr
    runs = json.loads(r.stdout)["runs"]
    assert [x["capacity_bytes"] for x in runs] == [2 * 10**8, 10**9]
    assert png.is_file()
    for args, msg in [(("--workload", "chat", "--policies", "lru"), "unknown policy 'lru'"),
                      (("--workload", "chat", "--policies", "sglang+"),
                       "'sglang+' was renamed: write paper-sglang+"),
                      (("--workload", "chat", "--policies", "marconi,sglang"),
                       "policy 'sglang' is gone from `sim --paper`: `sim` without --paper runs "
                       "SGLang's own cache"),
                      (("--workload", "chat", "--policies", "marconi+:materialise=sglang"),
                       "unknown option 'materialise'"),
                      (("--workload", "chat", "--capacity", "lots"), "cannot read 'lots'"),
                      (("--workload", "nope"), "unknown workload 'nope'"),
                      (("--workload", "chat", "--policies", "marconi:beta=1"),
                       "unknown option 'beta'")]:
        r = _cli("sim", "--paper", *args)
        assert r.returncode == 2 and msg in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_gen_trace_cli(tmp_path):
    out = tmp_path / "fj.jsonl"
    r = _cli("gen-trace", "--workload", "fork-join", "--param", "programs=5", "-o", str(out))
    assert r.returncode == 0, r.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == 5 * 5  # 4 forks + 1 join per program
    assert set(json.loads(lines[0])) == {"session_id", "turn_id", "ts", "input_tokens",
                                         "output_tokens"}


def test_sim_drives_sglangs_caches_like_ab(mooncake_path):
    """``sim`` without ``--paper`` is ``ab``'s replay: on the same trace and pools the same
    columns, request for request; a generated workload works too."""
    common = ("--trace", str(mooncake_path), "--model", "qwen3_next", "--limit", "60",
              "--kv-tokens", "300000", "--mamba-slots", "16", "--caches", "stock,marconi",
              "--json", "--no-progress", "--per-request")
    sim = _cli("sim", *common)
    ab = _cli("ab", *common)
    assert sim.returncode == 0 and ab.returncode == 0, sim.stderr + ab.stderr
    got, ref = json.loads(sim.stdout), json.loads(ab.stdout)
    for name in ("stock", "marconi"):
        assert (got["caches"][name]["hit_tokens_per_request"]
                == ref["caches"][name]["hit_tokens_per_request"])
    assert got["config"]["pools"] == ref["config"]["pools"]
    chat = _cli("sim", "--workload", "chat", "--param", "sessions=4", "--model", "qwen3_next",
                "--cache-gb", "20", "--caches", "stock,marconi", "--json", "--no-progress")
    assert chat.returncode == 0, chat.stderr
    assert json.loads(chat.stdout)["config"]["trace"] == "workload chat (seed 0)"


def test_sim_modes_refuse_each_others_flags(mooncake_path):
    base = ("sim", "--trace", str(mooncake_path), "--limit", "5", "--model", "qwen3_next")
    cases = [(("--cache-gb", "10", "--policies", "marconi+"),
              "--policies: the paper's planning simulator; add --paper"),
             (("--capacity", "10GB"), "--capacity: the paper's planning simulator"),
             ((), "give the pools SGLang would build"),
             (("--paper", "--cache-gb", "10"), "--cache-gb: SGLang's pools; --paper takes one"),
             (("--paper", "--hicache-size", "10"), "--hicache-*: SGLang's pools"),
             (("--kv-tokens", "9000"), "both --kv-tokens and --mamba-slots")]
    for extra, message in cases:
        r = _cli(*base, *extra)
        assert r.returncode == 2 and message in r.stderr, (extra, r.stderr)
        assert "Traceback" not in r.stderr
