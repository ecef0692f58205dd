"""The bookkeeping tools of issue 19's overhead work: ``scripts/serve_sim_table.py
--bookkeeping`` (the cache's own time from saved serve-sim JSON) and
``scripts/profile_bookkeeping.py --longest`` (per-step profiles of the longest steps)."""
from __future__ import annotations

import importlib.util
import json
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bookkeeping_lines_carry_the_files_ratios(capsys):
    path = ROOT / "tests" / "data" / "serving_overhead_paper_7b_unified_load0.8.json"
    out = json.loads(path.read_text())
    table = _script("serve_sim_table")
    lines = table.bookkeeping_rows(out)
    assert [line.split("@")[0] for line in lines] == [r["cache"] for r in out["runs"]]
    plus = next(r for r in out["bookkeeping_ratios"] if r["cache"] == "marconi+")
    assert f"{plus['vs_stock_python']:.2f}x stock-python" in lines[-1]
    run = out["runs"][-1]
    assert f"bk ms max {run['bookkeeping_ms_per_step_max']:.1f}," in lines[-1]
    assert "x stock" not in lines[0]  # stock has no ratio to itself
    assert table.main(["--bookkeeping", str(path)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"{path}: paper-7b, unified 100 GB") and len(printed) == 4


def test_longest_steps_keeps_the_steps_with_the_most_cache_time(capsys):
    prof_mod = _script("profile_bookkeeping")

    class Cache:
        def match_prefix(self, n):
            return sum(range(n))

    cache = Cache()
    prof = prof_mod.EntryProfiler(cache)
    longest = prof_mod.LongestSteps(prof, 2)
    sched = types.SimpleNamespace(steps=[], records={})
    for i, cache_s in enumerate((0.001, 0.005, 0.003, 0.002)):
        cache.match_prefix(1000 * (i + 1))
        sched.records[f"r{i}"] = types.SimpleNamespace(hit_len=0 if i % 2 else None)
        sched.steps.append(types.SimpleNamespace(cache_s=cache_s, kind="extend", batch=i))
        longest(sched)
    assert sorted(k[0] for k in longest.kept) == [0.003, 0.005]
    assert prof.calls["match_prefix"] == 4 and not prof.step_calls  # a fresh step counter
    longest.report(5)
    text = capsys.readouterr().out
    assert "5.0 ms  step 1 extend batch 1, 1 request(s) admitted" in text
    assert "match_prefix 1x" in text and "the 2 longest steps together" in text
