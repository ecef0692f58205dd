"""marconi_reports.reproduce on a tiny sweep: the markdown and the plots are written, and the
numbers in the markdown are the ones the replays returned (recomputed here from the raw
records, nothing hard-coded); scripts/reproduce.py run once on the same sweep."""
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sglang_marconi.model.presets import paper_7b
from marconi_reports import plots, reproduce_markdown
from marconi_reports import reproduce as rep
from marconi_reports.formatting import gb, pct, times
from marconi_reports import sweeps

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    cfg = rep.make_config("tiny")
    sweep = rep.run_sweep(cfg, jobs=1, progress=False)
    an = rep.analyze(sweep)
    pngs = plots.write_plots(sweep, an, out / "img")
    command = "python scripts/reproduce.py --tiny"
    text = reproduce_markdown.write_markdown(sweep, an, out / "results.md", "img", command)
    return cfg, sweep, an, pngs, text, out, command


def _row_cells(text, first_cells):
    """The cells of the markdown table row that starts with ``first_cells``."""
    prefix = "| " + " | ".join(first_cells) + " |"
    rows = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(rows) == 1, (prefix, rows)
    return [c.strip() for c in rows[0].strip("|").split("|")]


def test_files_written(tiny):
    cfg, sweep, an, pngs, text, out, command = tiny
    assert (out / "results.md").read_text() == text
    names = {p.name for p in pngs}
    assert {"fig7_8_ratio_gain.png", "fig9_ttft.png", "fig10_length.png",
            "fig12_sensitivity.png", "capacity_paper_7b.png"} <= names
    for p in pngs:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert f"img/{p.name}" in text  # every plot is linked
    # every table states the command that produced it
    lines = text.splitlines()
    headers = [i for i, line in enumerate(lines)
               if line.startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---")]
    assert headers
    for i in headers:
        before = [line for line in lines[max(0, i - 3):i] if line.strip()]
        assert before and before[-1] == f"Command: `{command}`", lines[i]


def test_configuration_rows_match_the_replays(tiny):
    cfg, sweep, an, pngs, text, out, command = tiny
    recs = sweep["records"]
    n_rows = 0
    for c in sweep["calibration"].values():
        assert len(c["capacities"]) == len(cfg.targets)
        inf = sweeps.one(recs, model=c["model"], workload=c["workload"], policy="infinite")
        for cap in sorted(set(c["capacities"])):
            got = {p: sweeps.one(recs, model=c["model"], workload=c["workload"], capacity=cap,
                                 policy=p) for p in ("vllm+", "paper-sglang+", "marconi")}
            assert got["paper-sglang+"]["states_evicted"] > 0  # eviction happens at every capacity
            cells = _row_cells(text, [c["workload"], f"{gb(cap)} "
                                      f"({pct(cap / inf['peak_bytes'])})"])
            for i, p in zip((3, 4, 5), ("vllm+", "paper-sglang+", "marconi")):
                r = got[p]
                want = (f"{pct(r['hit_tokens'] / r['input_tokens'])} "
                        f"({pct(r['hit_tokens'] / inf['hit_tokens'])})")
                assert cells[i] == want
            assert cells[6] == pct(inf["hit_tokens"] / inf["input_tokens"])
            m, v, s = (got[p]["token_hit_rate"] for p in ("marconi", "vllm+", "paper-sglang+"))
            assert cells[8] == (times(m / v) if v else "inf")
            assert cells[9] == pct(m / s - 1, True)
            n_rows += 1
    assert n_rows == sum(len(rows) for rows in an["rows"].values())


def test_summary_matches_recomputation(tiny):
    cfg, sweep, an, pngs, text, out, command = tiny
    recs = sweep["records"]
    for fam in ("chat", "agent"):
        ratios, gains = [], []
        for w in cfg.workloads:
            if w.family != fam:
                continue
            caps = sorted(set(sweep["calibration"][("paper-7b", w.label)]["capacities"]))
            for cap in caps:
                hit = {p: sweeps.one(recs, model="paper-7b", workload=w.label, capacity=cap,
                                     policy=p)["token_hit_rate"]
                       for p in ("vllm+", "paper-sglang+", "marconi")}
                ratios.append(hit["marconi"] / hit["vllm+"] if hit["vllm+"] else math.inf)
                gains.append(hit["marconi"] / hit["paper-sglang+"] - 1)
        finite = [r for r in ratios if math.isfinite(r)]
        cells = _row_cells(text, ["paper-7b", fam, str(len(ratios))])
        assert cells[3] == (times(float(np.mean(finite))) if finite else "-")
        assert cells[5] == str(len(ratios) - len(finite))
        assert cells[6] == pct(float(np.percentile(gains, 95)), True)


def test_sensitivity_rows(tiny):
    cfg, sweep, an, pngs, text, out, command = tiny
    models = rep.sens_models(cfg)
    assert len(models) == 1 + len(cfg.sens_ratios) + len(cfg.sens_state_dims)
    for x in an["sens"]:
        r = {p: sweeps.one(sweep["records"], model=x["model"], workload=x["workload"],
                           capacity=x["capacity"], policy=p) for p in ("vllm+", "paper-sglang+", "marconi")}
        cells = _row_cells(text, [x["model"], x["workload"], gb(x["capacity"])])
        assert cells[3:6] == [pct(r[p]["token_hit_rate"]) for p in ("vllm+", "paper-sglang+", "marconi")]


def test_paper_variants():
    base, same = paper_7b(), sweeps.paper_variant()
    assert same.kv_bytes_per_token == base.kv_bytes_per_token
    assert same.ssm_state_bytes == base.ssm_state_bytes
    assert same.prefill_flops(12_345) == base.prefill_flops(12_345)
    for ratio, attn in ((2, 9), (4, 6), (8, 3)):
        s = sweeps.model_spec(sweeps.variant_name(ratio))
        assert (s.num_attention_layers, s.num_ssm_layers, len(s.mlp_layers)) == (attn, 28 - attn, 28)
    small, big = (sweeps.model_spec(sweeps.variant_name(None, n)) for n in (16, 256))
    assert small.ssm_state_bytes < base.ssm_state_bytes < big.ssm_state_bytes
    assert small.kv_bytes_per_token == big.kv_bytes_per_token == base.kv_bytes_per_token


def test_formatters():
    assert pct(0.1234) == "12.3%" and pct(0.1234, True) == "+12.3%"
    assert pct(-0.05, True) == "-5.0%"
    assert pct(None) == "-" and pct(math.inf) == "inf"
    assert times(2.5) == "2.50x" and times(None) == "-" and times(math.inf) == "inf"
    assert gb(1.95e9) == "1.95 GB" and gb(None) == "unlimited"


def test_main_parallel(tmp_path):
    """The command line with two worker processes writes the same files."""
    out = tmp_path / "r.md"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "reproduce.py"), "--tiny",
                           "--out", str(out), "--jobs", "2", "--no-progress"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {out} and plots in {tmp_path / 'img'}")
    text = out.read_text()
    assert "Command: `python scripts/reproduce.py --tiny --out" in text
    assert len(list((tmp_path / "img").glob("*.png"))) == 5
