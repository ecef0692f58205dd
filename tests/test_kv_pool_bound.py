"""marconi_reports/kv_pool_bound.py and scripts/kv_pool_bound.py: the linear programme's
upper bound on what any cache saves in a KV pool of K tokens.

Checked: a hand-built trace whose optimum is summed by hand (the pool, the prefix rule and
the input - 1 cap each decide a term); on the bundled trace the bound grows with the pool up
to the never-evicting KV-only ceiling, which a pool holding every token reaches; the
script prints it above what SGLang's own stock and Marconi caches save on the same static
pools, and refuses a unified buffer, a pool too small and an unknown cache in one line.
"""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hand_costs import LinearCost, SquareCost
from sglang_marconi.model import resolve_model
from marconi_reports.kv_pool_bound import (held_by_reuse_class, kv_pool_bound,
                                           mooncake_blocks, reuse_intervals)
from marconi_reports.sweeps import MOONCAKE_TRACE
from sglang_marconi.sim.traces import read_trace

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "kv_pool_bound.py"



def request(*ids, length=None, block=4):
    """(hash ids, input length) of an input made of 4-token blocks (whole by default)."""
    return list(ids), length if length is not None else block * len(ids)


def test_hand_built_optimum():
    # A = [a, b], B = [c, d], C = A + [e], D = B + [f]; pool 16 tokens
    a, b, c, d, e, f = 100, 200, 300, 400, 500, 600
    inputs = [request(a, b), request(c, d), request(a, b, e), request(c, d, f)]
    iv = reuse_intervals(inputs, LinearCost(), block=4)
    assert list(iv.start) == [0, 0, 1, 1] and list(iv.end) == [2, 2, 3, 3]
    assert list(iv.after) == [-1, 0, -1, 2]
    total = 8 + 8 + 12 + 12
    # holding A's 8 tokens across B (8 tokens) fits: 16; holding B's across C (12 tokens)
    # leaves room for 4 of its tokens, d held no more than c
    bound = kv_pool_bound(iv, 16)
    assert bound.flops_saved == pytest.approx(8 + 4)
    assert bound.fraction == pytest.approx(12 / total)
    assert bound.held[:2] == pytest.approx([1, 1])
    assert bound.held[2] + bound.held[3] == pytest.approx(1)
    assert bound.held[3] <= bound.held[2] + 1e-9
    assert bound.never_evicting == pytest.approx(16 / total)
    # a pool that holds everything: the never-evicting figure
    assert kv_pool_bound(iv, 20).flops_saved == pytest.approx(16)
    # a pool of the longest input: A's first block across B (8 tokens), nothing across C
    assert kv_pool_bound(iv, 12).flops_saved == pytest.approx(4)
    with pytest.raises(ValueError, match="cannot hold the longest input"):
        kv_pool_bound(iv, 11)


def test_prefix_rule_holds_the_shallow_block():
    # as above; across C only 4 of B's tokens fit: d is worth 48 alone (112 in all without
    # the prefix rule), c 16; the rule holds d no more than c, so the relaxation's optimum
    # holds half of each (2 tokens each: 8 + 24), above any real cache's 16: an upper bound
    a, b, c, d, e, f = 100, 200, 300, 400, 500, 600
    inputs = [request(a, b), request(c, d), request(a, b, e), request(c, d, f)]
    iv = reuse_intervals(inputs, SquareCost(), block=4)
    assert list(iv.worth) == [16, 48, 16, 48]
    bound = kv_pool_bound(iv, 16)
    assert bound.flops_saved == pytest.approx(64 + 8 + 24)
    assert bound.held == pytest.approx([1, 1, 0.5, 0.5])
    assert bound.fractional == 2


def test_a_block_is_held_from_its_last_use():
    # a is used by R0, R1 (12 tokens, the whole pool) and R3; held from R1, not from R0, it
    # fits beside R2 (8 tokens): both reuses count
    a, x, u, y, z, q = 1, 2, 3, 4, 5, 6
    inputs = [request(a), request(a, x, u), request(y, z), request(a, q)]
    iv = reuse_intervals(inputs, LinearCost(), block=4)
    assert list(iv.start) == [0, 1] and list(iv.end) == [1, 3]
    assert kv_pool_bound(iv, 12).flops_saved == pytest.approx(4 + 4)


def test_input_cap_and_prefix_rule():
    # the repeat of a whole 8-token input may match 7 tokens: its last block is worth 3
    iv = reuse_intervals([request(1, 2), request(1, 2)], LinearCost(), block=4)
    assert list(iv.worth) == [4, 3]
    assert kv_pool_bound(iv, 16).flops_saved == pytest.approx(7)
    # a block after one that is not reused is worth nothing: [x, b] vs [y, b] share no block
    iv = reuse_intervals([request(1, 2), request(9, 2)], LinearCost(), block=4)
    assert len(iv.start) == 0
    # a short last block counts as its next use's (the bound errs high): 4 tokens, not 2
    iv = reuse_intervals([request(1, 2, length=6), request(1, 2, 3)], LinearCost(), block=4)
    assert list(iv.tokens) == [4, 4] and list(iv.worth) == [4, 4]
    # two uses before a third: the reuse classes count the uses before each reuse
    iv = reuse_intervals([request(1), request(1, 2), request(1, 2, 3)], LinearCost(), block=4)
    assert list(iv.uses_before) == [1, 2, 1]
    rows = held_by_reuse_class(iv, kv_pool_bound(iv, 100))
    assert [r[1] for r in rows[:2]] == [2, 1]


@pytest.fixture(scope="module")
def bundled():
    trace = read_trace(MOONCAKE_TRACE)
    trace.requests = trace.requests[:1000]
    return trace


def test_bound_grows_with_the_pool_to_the_never_evicting_ceiling(bundled):
    spec = resolve_model("paper-7b", None)
    iv = reuse_intervals(mooncake_blocks(bundled), spec)
    # pools that bind (the first 400 requests reuse too little for any to): the longest of
    # these inputs is 134,773 tokens
    small, large = 150_000, 300_000
    lo, hi = kv_pool_bound(iv, small), kv_pool_bound(iv, large)
    assert 0 < lo.fraction < hi.fraction < hi.never_evicting
    # a pool of every input token holds every interval: the never-evicting ceiling
    everything = kv_pool_bound(iv, int(iv.input_len.sum()))
    assert everything.fraction == pytest.approx(everything.never_evicting, rel=1e-6)
    assert everything.never_evicting == hi.never_evicting


def run_script(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


def script_main():
    spec = importlib.util.spec_from_file_location("kv_pool_bound_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_script_prints_the_bound_and_refuses_bad_pools(capsys):
    out = run_script("--limit", "1000", "--kv-tokens", "150000", "--mamba-slots", "500",
                     "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert set(result["caches"]) == {"stock", "marconi"}
    assert all(0 < v <= result["bound"] for v in result["caches"].values())
    assert result["bound"] < result["never_evicting_kv_only"]  # the pool binds
    main = script_main()  # the table and the refusals in this process
    assert main(["--limit", "300", "--kv-tokens", "150000", "--mamba-slots", "500"]) == 0
    text = capsys.readouterr().out
    assert "upper bound" in text and "of the bound" in text
    for argv, message in (
            (["--cache-gb", "100", "--memory", "unified"], "static layout"),
            (["--kv-tokens", "1000", "--mamba-slots", "50"], "--kv-tokens 1000"),
            (["--kv-tokens", "150000", "--mamba-slots", "50", "--caches", "sglang"],
             "--caches: unknown sglang")):
        assert main(["--limit", "10", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_script_refuses_a_session_trace(tmp_path, capsys):
    trace = tmp_path / "chat.jsonl"
    trace.write_text(json.dumps({"input_tokens": [1, 2, 3], "output_tokens": [4]}) + "\n")
    assert script_main()(["--trace", str(trace), "--kv-tokens", "1000",
                          "--mamba-slots", "50"]) == 2
    err = capsys.readouterr().err
    assert "Mooncake trace" in err and len(err.strip().splitlines()) == 1
