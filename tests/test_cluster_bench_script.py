"""scripts/bench_scale_out.py's own logic (no replay): the held-out slice it writes and the
issue's targets it prints (PASS, MISS, nothing to divide by)."""
import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_scale_out.py"


def _module():
    spec = importlib.util.spec_from_file_location("bench_scale_out", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_slice_trace_keeps_lines_skip_to_skip_plus_limit(tmp_path):
    mod = _module()
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i}) + "\n" for i in range(10)))
    assert mod.slice_trace(trace, 0, 4, tmp_path / "s.jsonl") == trace   # --limit does it
    part = mod.slice_trace(trace, 3, 4, tmp_path / "s.jsonl")
    assert [json.loads(ln)["timestamp"] for ln in part.read_text().splitlines()] == [3, 4, 5, 6]
    tail = mod.slice_trace(trace, 8, None, tmp_path / "s.jsonl")
    assert [json.loads(ln)["timestamp"] for ln in tail.read_text().splitlines()] == [8, 9]


def _row(router, cache, flops, p95, n=4):
    return {"model": "m", "replicas": n, "router": router, "cache": cache,
            "flops_saved_fraction": flops, "ttft_p95_s": p95}


def test_targets_pass_miss_and_nothing_to_divide_by():
    mod = _module()
    (line,) = mod.targets([_row("cache_aware", "stock", 0.40, 2.0),
                           _row("marconi", "marconi+", 0.56, 1.5),
                           _row("oracle", "marconi+", 0.70, 1.4)])
    assert "FLOPs saved 1.40x (target >= 1.3: PASS)" in line
    assert "P95 TTFT 0.75x (target <= 0.8: PASS)" in line
    assert "FLOPs saved 0.80x (target >= 0.9: MISS)" in line
    (line,) = mod.targets([_row("cache_aware", "stock", 0.0, 2.0),
                           _row("marconi", "marconi+", 0.1, 2.0)])
    assert "n/a (nothing to divide by)" in line and "1.00x (target <= 0.8: MISS)" in line
    assert mod.targets([_row("round_robin", "stock", 0.1, 1.0)]) == []
