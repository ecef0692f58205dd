"""scripts/bench_overhead.py on a tiny configuration: every part runs and reports numbers
that are positive and consistent with each other (no timing thresholds)."""
import importlib.util
import io
import json
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

pytest.importorskip("sglang")

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 24


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_script_{name}", ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


bo = _load("bench_overhead")


@pytest.fixture(scope="module")
def replay(mooncake_path):  # conftest: ../shared/traces/mooncake (skips if absent)
    requests = bo.load_requests(mooncake_path, LIMIT)
    # small pools, so the caches evict within a few dozen requests
    cfg = bo.replay_config(requests, kv_tokens=300_000, mamba_slots=16, alpha=1.0)
    timing = bo.replay_timing(requests, cfg, bo.REPLAY_CACHES, alpha=1.0)
    memory = bo.replay_memory(requests[:8], cfg, ("stock-python", "marconi"), alpha=1.0)
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
    assert timing["marconi"]["alpha"] == 1.0 and timing["marconi"]["tuning_s"] == 0.0


def test_interleaving_does_not_change_the_policy(replay, mooncake_path):
    """Each cache keeps its own access-time clock while interleaved: Marconi decides exactly
    as in a run of its own (the A/B's ``run_one``)."""
    from sglang_marconi.harness.ab import run_one

    requests, timing, _ = replay
    cfg = bo.replay_config(requests, kv_tokens=300_000, mamba_slots=16, alpha=1.0)
    alone = run_one("marconi", requests, cfg)
    for key in ("hit_tokens", "states_admitted", "states_evicted"):
        assert alone[key] == timing["marconi"][key]


def test_replay_ratios_and_table(replay):
    _, timing, memory = replay
    r = bo.ratios(timing)
    assert set(r) == {"stock", "stock-python"}
    for stock, v in r.items():
        assert v["mean"] == pytest.approx(timing["marconi"]["mean_ms"] / timing[stock]["mean_ms"])
        assert v["p99"] == pytest.approx(timing["marconi"]["p99_ms"] / timing[stock]["p99_ms"])
        assert v["mean"] > 0 and v["p99"] > 0
    assert set(memory) == {"stock-python", "marconi"}
    for m in memory.values():
        assert m["peak_mib"] >= m["end_mib"] > 0 and m["requests"] == 8
    text = bo.format_replay(timing, memory, 1.15)
    assert "stock-python" in text and "marconi" in text
    verdict = "PASS" if r["stock-python"]["mean"] <= 1.15 else "MISS"
    assert f"-> {verdict}" in text


@pytest.mark.parametrize("scenario", bo.SCENARIOS)
def test_scaling_point_evicts_every_request(scenario):
    from sglang_marconi.model import HybridModelSpec

    spec = HybridModelSpec.from_preset("qwen3_next")
    rows = bo.scaling((40, 120), spec, names=("stock-python", "marconi"), scenarios=(scenario,),
                      max_requests=5, budget_s=60.0)
    assert [(r["nodes_target"], r["cache"]) for r in rows] == [
        (40, "stock-python"), (40, "marconi"), (120, "stock-python"), (120, "marconi")]
    for r in rows:
        assert r["requests"] == 5
        # one eviction call per request, each freeing one node (a state and 128 KV tokens)
        assert r["evict_calls"] == r["requests"]
        if scenario == "state":
            assert r["states_evicted"] == r["requests"]
        else:
            assert r["kv_tokens_evicted"] == bo.SEQ * r["requests"]
        assert abs(r["nodes"] - r["nodes_target"]) <= 2
        assert r["ms_per_request"] > 0 and r["ms_per_evict_call"] > 0
        assert r["ms_evict_per_request"] <= r["ms_per_request"]
    assert "ms/evict call" in bo.format_scaling(rows)


def test_sim_scaling():
    from sglang_marconi.model import HybridModelSpec

    spec = HybridModelSpec.from_preset("qwen3_next")
    rows = bo.sim_scaling((50, 200), spec, max_requests=100)
    assert [r["nodes"] for r in rows] == [50, 200]
    assert [r["requests"] for r in rows] == [50, 100]
    for r in rows:
        assert r["evictions"] == r["requests"]  # each request evicts exactly one node
        assert 0 < r["us_per_eviction"] <= r["us_eviction_max"]
        assert r["us_per_request"] > 0
    assert "us/eviction" in bo.format_sim(rows)


def test_main_json(mooncake_path, tmp_path):
    path = tmp_path / "out.json"
    out = io.StringIO()
    with redirect_stdout(out):
        rc = bo.main(["--trace", str(mooncake_path), "--limit", "6",
                      "--memory-limit", "3", "--sizes", "30", "--scale-requests", "3",
                      "--sim-requests", "30", "--json", str(path)])
    assert rc == 0
    text = out.getvalue()
    assert "target: marconi mean within 1.15x" in text and "simulator PrefixCache" in text
    data = json.loads(path.read_text())
    assert set(data["replay"]["timing"]) == {"stock", "stock-python", "marconi"}
    assert data["replay"]["verdict"] in ("PASS", "MISS")
    assert len(data["scaling"]) == len(bo.SCALE_CACHES) * len(bo.SCENARIOS)
    assert [r["nodes"] for r in data["sim"]] == [30]
