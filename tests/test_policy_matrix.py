"""The policy matrix's parts (``scripts/policy_matrix.py``): its Mooncake-format
multi-turn generator keeps Mooncake's shape (turns extend an earlier input with new
blocks; outputs never reappear), its 48 cells spread models, memory modes and sizes over
every trace, and its judgement (ratio, binding, gap) reads the runs as it says; one small
cell runs end to end through ``ab``."""
import numpy as np
import pytest

from marconi_matrix import cells as mc
from marconi_matrix.traces import GENERATED, MooncakeTurns, mooncake_turns
from sglang_marconi.sim.traces import MOONCAKE_BLOCK


def test_mooncake_turns_extend_an_earlier_input_and_never_reuse_outputs():
    trace = mooncake_turns(MooncakeTurns(sessions=40), seed=3)
    assert trace.requests == sorted(trace.requests, key=lambda r: r.timestamp)
    by_session, outputs, rewinds = {}, set(), 0
    for r in trace.requests:
        assert not outputs & set(r.input_tokens.tolist())  # no output reappears
        earlier = by_session.setdefault(r.session_id, [])
        if earlier:
            bases = [e for e in earlier
                     if len(e) < len(r.input_tokens)
                     and np.array_equal(r.input_tokens[:len(e)], e)]
            assert bases, "a turn extends an earlier input of its conversation"
            rewinds += not np.array_equal(r.input_tokens[:len(earlier[-1])], earlier[-1])
            assert (len(r.input_tokens) - max(map(len, bases))) % MOONCAKE_BLOCK == 0
        earlier.append(r.input_tokens)
        outputs.update(r.output_tokens.tolist())
    assert rewinds > 0
    again = mooncake_turns(MooncakeTurns(sessions=40), seed=3)
    assert all(np.array_equal(a.input_tokens, b.input_tokens)
               for a, b in zip(trace.requests, again.requests))


def test_cells_cover_every_trace_model_mode_and_size():
    cells = mc.cells([0, 1, 2])
    assert len(cells) == 48 and len({c.name for c in cells}) == 48
    assert {c.trace for c in cells} == set(mc.TRACES) == {"bundled", *GENERATED}
    for trace in mc.TRACES:
        mine = [c for c in cells if c.trace == trace]
        assert {c.model for c in mine} == {"qwen3_next", "nemotron_h"}
        assert {c.memory for c in mine} == {"static", "unified"}
        assert {c.target for c in mine} == {0.25, 0.50, 0.75}
        assert {c.seed for c in mine} == ({0} if trace == "bundled" else {0, 1, 2})


def _row(stock, marconi, ceiling, evicted, hits=150):
    col = lambda f: {"flops_saved_fraction": f, "input_tokens": 1000, "hit_tokens": 200,  # noqa: E731
                     "kv_tokens_evicted": evicted, "hit_requests": hits}
    return {"columns": {"stock": col(stock), "marconi": col(marconi)}, "ceiling": ceiling,
            "output_tokens": 200}


def test_ratio_binding_and_gap():
    row = _row(0.20, 0.25, 0.30, evicted=100)
    assert mc.ratio(row) == pytest.approx(1.25)
    assert mc.gap_closed(row) == pytest.approx(0.5)
    assert mc.binds(row)  # 100 of 1000 - 200 + 200 inserted
    assert not mc.binds(_row(0.2, 0.25, 0.3, evicted=99))
    assert mc.ratio(_row(0.0, 0.1, 0.3, 0)) is None
    assert mc.gap_closed(_row(0.3, 0.3, 0.3, 0)) is None
    assert mc.gap_closed(_row(0.3, 0.3, 0.304, 0)) is None  # under half a point: noise


def test_one_small_cell_runs_through_ab():
    pytest.importorskip("sglang")
    from sglang_marconi.sim.generators import generate

    trace = generate("fork-join", seed=0, programs=25)
    fp = mc.footprint(trace, "qwen3_next")
    assert 0 < fp["reused_bytes"] < fp["held_bytes"] and 0 < fp["ceiling"] < 1
    cell = mc.Cell("fork-join", "qwen3_next", "static", 0.50, 0)
    size = mc.calibrate(cell, trace, fp)
    assert 1 <= size["runs"] <= mc.MAX_RUNS
    row = mc.run_cell(cell, trace, fp, size, {})
    stock, marconi = row["columns"]["stock"], row["columns"]["marconi"]
    # the calibrated size is where stock saves about half of the ceiling, and binds
    assert stock["flops_saved_fraction"] / fp["ceiling"] == pytest.approx(
        size["stock_share"])
    assert abs(size["stock_share"] - 0.5) < 0.15
    assert stock["input_tokens"] == marconi["input_tokens"] == sum(
        r.input_len for r in trace.requests)
    assert mc.binds(row)


def test_reused_prefixes_count_the_union_of_hit_prefixes_once():
    from sglang_marconi.sim.traces import Request, Trace

    a = np.arange(256, dtype=np.int64)
    b = np.concatenate([a[:128], np.arange(1000, 1128, dtype=np.int64)])
    out = np.zeros(1, dtype=np.int64)
    trace = Trace("t", [Request(a, out), Request(a, out), Request(b, out)])
    # the second hits 192 of a (three blocks), the third 128 (two of those blocks)
    assert mc.reused_prefixes(trace, [0, 192, 130]) == (192, 2)
    with pytest.raises(mc.UserError, match="2 hit lengths for 3"):
        mc.reused_prefixes(trace, [0, 1])


def _matrix_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "policy_matrix.py"
    spec = importlib.util.spec_from_file_location("policy_matrix_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gain_table_puts_the_worst_cell_beside_the_median_and_resume_keeps_known_cells(
        tmp_path):
    import json

    pm = _matrix_script()
    rows = []
    for i, (model, memory, stock, marconi) in enumerate(
            [("qwen3_next", "static", 0.2, 0.3), ("qwen3_next", "static", 0.2, 0.18),
             ("qwen3_next", "static", 0.4, 0.5), ("nemotron_h", "unified", 0.1, 0.2)]):
        row = _row(stock, marconi, 0.6, 0)
        row["cell"] = {"trace": f"t{i}", "model": model, "memory": memory, "target": 0.25}
        row["name"] = f"t{i}"
        rows.append(row)
    table = pm.gain_table(rows, "marconi")
    assert table[4] == ("| qwen3_next | static | 3 | 20.0% | 1.25x | 0.90x (t1, stock at 25% "
                        "of the ceiling) |")
    assert table[5].startswith("| nemotron_h | unified | 1 | 10.0% | 2.00x | 2.00x (t3")
    assert len(table) == 6  # no rows for a pairing without cells
    assert pm.resumed(tmp_path) == {}
    (tmp_path / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    later = dict(rows[1], cache_gb=2.0)
    (tmp_path / pm.PARTIAL).write_text(json.dumps(later) + "\n\n")  # an interrupted run's
    kept = pm.resumed(tmp_path)
    assert list(kept) == ["t0", "t1", "t2", "t3"] and kept["t1"]["cache_gb"] == 2.0
