"""marconi_reports/unified_bench.py and unified_markdown.py (issue 11's benchmark): the grid, one
tiny cell through the real replay, the analysis and its PASS/MISS, the table, the plot."""
import subprocess
import sys
from pathlib import Path

import pytest

from marconi_reports import unified_bench, unified_markdown

REPO = Path(__file__).resolve().parents[1]


def test_grid_has_every_mode_and_the_admission_row_where_asked():
    cells = unified_bench.grid()
    assert len(cells) == 2 * 3 * (4 * 3 + 2)
    adm = {(c["memory"], c["ratio"]) for c in cells if c["cache"] == unified_bench.ADMISSION}
    assert adm == {("static", 0.9), ("unified", 0.9)}
    first = cells[0]
    assert (first["model"], first["gb"], first["memory"]) == ("paper-7b", 100, "unified")
    assert len({unified_bench.cell_key(c) for c in cells}) == len(cells)


def _row(model, gb, memory, ratio, cache, saved, ms=10.0):
    return {"model": model, "gb": gb, "memory": memory, "ratio": ratio, "cache": cache,
            "flops_saved_fraction": saved, "bookkeeping_ms_per_request": ms,
            "pools": {"mode": memory, "kv_tokens": 100, "mamba_slots": 10,
                      "unified_bytes": 2**30, "max_running_requests": 2}}


def test_targets_pass_and_miss():
    rows = [_row("paper-7b", 100, "unified", 0.9, "stock", 0.10),
            _row("paper-7b", 100, "unified", 0.9, "marconi+", 0.16, ms=10.5),
            _row("paper-7b", 100, "static", 0.9, "stock", 0.10),
            _row("paper-7b", 100, "static", 0.9, "marconi+", 0.097, ms=12.0)]
    an = unified_bench.analyze(rows)
    verdicts = {t.split(":")[0]: res for t, _, res in an["targets"]}
    assert verdicts["unified, 100 GB, paper-7b"] == "PASS"
    assert verdicts["marconi+ never more than 2% below stock (any row)"] == "MISS"
    assert [res for t, _, res in an["targets"] if "bookkeeping" in t] == ["MISS", "PASS"]
    text = unified_markdown.markdown(an, command="python scripts/bench_unified.py", limit=7)
    assert "first 7 requests" in text and "| paper-7b | 100 | unified |" in text
    assert "1.60x" in text


def test_plot(tmp_path):
    rows = [_row("paper-7b", gb, "static", 0.9, c, 0.01 * gb / 50)
            for gb in (50, 100) for c in ("stock", "marconi+")]
    path = unified_markdown.write_plot(unified_bench.analyze(rows), tmp_path / "p.png", " x")
    assert path.stat().st_size > 1000


def test_one_cell_through_the_real_replay(mooncake_path):
    pytest.importorskip("sglang")
    row = unified_bench.run_cell({"model": "paper-7b", "gb": 20, "memory": "unified",
                                  "ratio": 0.9, "cache": "marconi+"}, str(mooncake_path), 6)
    assert row["cache"] == "marconi+" and row["requests"] == 6 and row["limit"] == 6
    assert row["cache_class"] == "MarconiUnifiedRadixCache"
    assert row["pools"]["mode"] == "unified" and 0 <= row["flops_saved_fraction"] <= 1


def test_script_help():
    out = subprocess.run([sys.executable, "scripts/bench_unified.py", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--limit" in out.stdout
