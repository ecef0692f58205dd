"""The simulator: trace readers and their errors, generators, the sim and gen-trace CLIs."""
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
    r = _cli("sim", "--trace", str(mooncake_path), "--limit", "300", "--model", "paper-7b",
             "--capacity", "50GB", "--policies", "paper-sglang+,marconi,infinite", "--json",
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
    r = _cli("sim", "--workload", "chat", "--param", "sessions=30", "--capacities",
             "0.2GB,1GB", "--policies", "paper-sglang+,infinite", "--plot", str(png), "--json")
    assert r.returncode == 0, r.stderr
    runs = json.loads(r.stdout)["runs"]
    assert [x["capacity_bytes"] for x in runs] == [2 * 10**8, 10**9]
    assert png.is_file()
    for args, msg in [(("--workload", "chat", "--policies", "lru"), "unknown policy 'lru'"),
                      (("--workload", "chat", "--policies", "sglang+"),
                       "'sglang+' was renamed: write paper-sglang+"),
                      (("--workload", "chat", "--capacity", "lots"), "cannot read 'lots'"),
                      (("--workload", "nope"), "unknown workload 'nope'"),
                      (("--workload", "chat", "--policies", "marconi:beta=1"),
                       "unknown option 'beta'")]:
        r = _cli("sim", *args)
        assert r.returncode == 2 and msg in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_gen_trace_cli(tmp_path):
    out = tmp_path / "fj.jsonl"
    r = _cli("gen-trace", "--workload", "fork-join", "--param", "programs=5", "-o", str(out))
    assert r.returncode == 0, r.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == 5 * 5  # 4 forks + 1 join per program
    assert set(json.loads(lines[0])) == {"session_id", "turn_id", "ts", "input_tokens",
                                         "output_tokens"}


def test_sim_takes_abs_pool_flags(mooncake_path):
    """``sim --cache-gb N --memory static|unified`` runs the SGLang images on the pools
    ``ab --cache-gb N`` builds, in SGLang's default overlap loop: the same as naming the
    pools in the policy options."""
    common = ("sim", "--trace", str(mooncake_path), "--model", "paper-7b", "--limit", "400",
              "--json", "--no-progress")
    flags = _cli(*common, "--cache-gb", "100", "--memory", "static",
                 "--policies", "sglang,marconi+:materialise=sglang")
    assert flags.returncode == 0, flags.stderr
    got = json.loads(flags.stdout)
    assert (got["pools"]["mode"], got["pools"]["kv_tokens"], got["pools"]["mamba_slots"]) == (
        "static", 862592, 1897)
    pools = ":overlap=1:kv_tokens=862592:state_slots=1897"
    named = _cli(*common, "--policies", f"sglang{pools},marconi+:materialise=sglang{pools}")
    ref = json.loads(named.stdout)["policies"]
    for label, r in got["policies"].items():
        twin = ref[f"{label}{pools}"]
        assert r["flops_saved"] == twin["flops_saved"] > 0
        assert r["states_evicted"] == twin["states_evicted"]
    unified = json.loads(_cli(*common, "--cache-gb", "100", "--memory", "unified",
                              "--policies", "sglang").stdout)
    assert unified["pools"]["mode"] == "unified" and unified["capacity_bytes"] == 107318034432


def test_sim_pool_flags_refusals(mooncake_path):
    base = ("sim", "--trace", str(mooncake_path), "--limit", "5")
    cases = [(("--cache-gb", "10", "--capacity", "10GB"), "two forms of the cache size"),
             (("--cache-gb", "10", "--policies", "marconi+"), "static pools are modelled for"),
             (("--kv-tokens", "9000"), "both --kv-tokens and --mamba-slots"),
             (("--memory", "unified"), "need --cache-gb"),
             # the future-knowing reference models one byte budget, not SGLang's pools
             (("--kv-tokens", "90000", "--mamba-slots", "10", "--policies",
               "offline:materialise=sglang"), "static pools are modelled for"),
             # pools ab refuses: too small for the longest request, too few state slots
             (("--kv-tokens", "20000", "--mamba-slots", "10", "--policies", "sglang"),
              "cannot hold the longest request"),
             (("--kv-tokens", "90000", "--mamba-slots", "2", "--policies", "sglang"),
              "--mamba-slots must be at least 4"),
             (("--cache-gb", "100", "--policies", "sglang:kv_tokens=90000:state_slots=9"),
              "names its own pools")]
    for extra, message in cases:
        r = _cli(*base, *extra)
        assert r.returncode != 0 and message in r.stderr, (extra, r.stderr)
        assert "Traceback" not in r.stderr
