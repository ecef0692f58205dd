"""The cache bookkeeping benchmark (marconi_reports.overhead, .overhead_report) on a tiny
configuration: every part runs and reports numbers that are positive and consistent with
each other (no timing thresholds); scripts/bench_overhead.py run once, tiny."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sglang")

from marconi_reports import overhead as bench  # noqa: E402
from marconi_reports.overhead_report import (format_replay, format_scaling,  # noqa: E402
                                             format_sim)

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 24


@pytest.fixture(scope="module")
def replay(mooncake_path):  # conftest: ../shared/traces/mooncake (skips if absent)
    requests = bench.load_requests(mooncake_path, LIMIT)
    # small pools, so the caches evict within a few dozen requests
    cfg = bench.replay_config(requests, kv_tokens=300_000, mamba_slots=16, alpha=1.0)
    timing = bench.replay_timing(requests, cfg, bench.REPLAY_CACHES, alpha=1.0)
    memory = bench.replay_memory(requests[:8], cfg, ("stock-python", "marconi"),
                                        alpha=1.0)
    return requests, timing, memory


def test_replay_columns(replay):
    requests, timing, memory = replay
    assert set(timing) == {"stock", "stock-python", "marconi"}
    for name, col in timing.items():
        assert col["requests"] == LIMIT
        assert 0 < col["p50_ms"] <= col["p99_ms"] <= col["max_ms"]
        assert 0 < col["mean_ms"] <= col["max_ms"]
        assert col["total_s"] * 1000 == pytest.approx(col["mean_ms"] * LIMIT)
        assert col["input_tokens"] == sum(len(r.input_ids) for r in requests)
        assert 0 <= col["hit_tokens"] <= col["input_tokens"]
        assert col["evict_calls"] > 0  # the pools are small enough to evict
    assert timing["stock"]["tree_core"] != timing["stock-python"]["tree_core"]
    # same policy on both cores: the same hits and states
    for key in ("hit_tokens", "states_admitted", "states_evicted"):
        assert timing["stock"][key] == timing["stock-python"][key]
    assert timing["marconi"]["ranking"] == "reuse-weighted"  # what the server runs


def test_interleaving_does_not_change_the_policy(replay, mooncake_path):
    """Each cache keeps its own access-time clock while interleaved: Marconi decides exactly
    as in a run of its own (the A/B's ``run_one``)."""
    from sglang_marconi.harness.ab import run_one

    requests, timing, _ = replay
    cfg = bench.replay_config(requests, kv_tokens=300_000, mamba_slots=16, alpha=1.0)
    alone = run_one("marconi", requests, cfg)
    for key in ("hit_tokens", "states_admitted", "states_evicted"):
        assert alone[key] == timing["marconi"][key]


def test_replay_ratios_and_table(replay):
    _, timing, memory = replay
    r = bench.ratios(timing)
    assert set(r) == {"stock", "stock-python"}
    for stock, v in r.items():
        assert v["mean"] == pytest.approx(timing["marconi"]["mean_ms"] / timing[stock]["mean_ms"])
        assert v["p99"] == pytest.approx(timing["marconi"]["p99_ms"] / timing[stock]["p99_ms"])
        assert v["mean"] > 0 and v["p99"] > 0
    assert set(memory) == {"stock-python", "marconi"}
    for m in memory.values():
        assert m["peak_mib"] >= m["end_mib"] > 0 and m["requests"] == 8
    text = format_replay(timing, memory, 1.15)
    assert "stock-python" in text and "marconi" in text
    verdict = "PASS" if r["stock"]["mean"] <= 1.15 else "MISS"
    assert f"of stock (compiled core): {r['stock']['mean']:.3f}x -> {verdict}" in text
    for col in timing.values():  # per cache call: bounded by the per-request time
        assert 0 < col["call_mean_ms"] <= col["call_p99_ms"] <= col["call_max_ms"]
        assert col["call_max_ms"] <= col["max_ms"] + 1e-9
    assert "longest single cache call" in text


@pytest.mark.parametrize("scenario", bench.SCENARIOS)
def test_scaling_point_evicts_every_request(scenario):
    from sglang_marconi.model import preset_spec

    spec = preset_spec("qwen3_next")
    rows = bench.scaling((40, 120), spec, names=("stock-python", "marconi"),
                                scenarios=(scenario,), max_requests=5, budget_s=60.0)
    assert [(r["nodes_target"], r["cache"]) for r in rows] == [
        (40, "stock-python"), (40, "marconi"), (120, "stock-python"), (120, "marconi")]
    for r in rows:
        assert r["requests"] == 5
        # one eviction call per request, each freeing one node (a state and 128 KV tokens)
        assert r["evict_calls"] == r["requests"]
        if scenario == "state":
            assert r["states_evicted"] == r["requests"]
        else:
            assert r["kv_tokens_evicted"] == bench.SEQ * r["requests"]
        assert abs(r["nodes"] - r["nodes_target"]) <= 2
        assert r["ms_per_request"] > 0 and r["ms_per_evict_call"] > 0
        assert r["ms_evict_per_request"] <= r["ms_per_request"]
    assert "ms/evict call" in format_scaling(rows)


def test_quantile_nearest_rank():
    """The one quantile of every timing report (harness.ab's columns use it too)."""
    from sglang_marconi.harness import ab
    from sglang_marconi.harness.timing import quantile

    assert ab.quantile is bench.quantile is quantile
    assert quantile([], 0.5) == 0.0
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile(list(range(100)), 0.99) == 99
    assert quantile(list(range(10)), 1.0) == 9


def test_sim_scaling():
    from sglang_marconi.model import preset_spec

    spec = preset_spec("qwen3_next")
    rows = bench.sim_scaling((50, 200), spec, max_requests=100)
    assert [r["nodes"] for r in rows] == [50, 200]
    assert [r["requests"] for r in rows] == [50, 100]
    for r in rows:
        assert r["evictions"] == r["requests"]  # each request evicts exactly one node
        assert 0 < r["us_per_eviction"] <= r["us_eviction_max"]
        assert r["us_per_request"] > 0
    assert "us/eviction" in format_sim(rows)


def test_main_json(mooncake_path, tmp_path):
    path = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_overhead.py"),
                           "--trace", str(mooncake_path), "--limit", "6",
                           "--memory-limit", "3", "--sizes", "30", "--scale-requests", "3",
                           "--sim-requests", "30", "--json", str(path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "target: marconi mean within 1.15x" in text and "simulator PrefixCache" in text
    data = json.loads(path.read_text())
    assert set(data["replay"]["timing"]) == {"stock", "stock-python", "marconi"}
    assert data["replay"]["verdict"] in ("PASS", "MISS")
    assert len(data["scaling"]) == len(bench.SCALE_CACHES) * len(bench.SCENARIOS)
    assert [r["nodes"] for r in data["sim"]] == [30]
