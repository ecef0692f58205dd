"""The policy matrix: stock SGLang against ``--cache-policy marconi`` (and any candidate
settings, through the Python API) on 48 cells of traffic, judged by the worst cells.

Cells (``marconi_matrix.cells``): 8 traces (the bundled Mooncake trace's first 2,000
requests, the generators chat, agent, shared-prompt, fork-join, drift, alpha-shift, and
the Mooncake-format multi-turn generator with long contexts) x 6 (Qwen3-Next and
Nemotron-H with the bytes SGLang's pools hold; static split and unified memory; the
memory at which stock saves 25%, 50% or 75% of what a never-evicting cache saves, found
with stock alone and kept in ``--sizes``), each through SGLang's own cache objects
(``ab``). Development seeds 0,1,2; the accepted figures use 100,101,102.

Prints every cell (marconi / stock FLOPs saved, whether the cache binds: stock evicts at
least 10% of the KV it inserts, stock's hit requests, the share of the gap between stock
and the never-evicting ceiling the policy closes) and the median, 10th percentile and
worst ratio, over all cells and over the cells that bind with at least 100 stock hits;
writes ``cells.jsonl`` and ``summary.md`` to ``--out`` (default results/policy_matrix/).

Usage: .venv/bin/python scripts/policy_matrix.py [--seeds 0,1,2] [--traces a,b]
       [--candidate NAME='{"field": value}'] [--out DIR] [--limit-cells N]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

from tqdm import tqdm  # noqa: E402

from marconi_matrix import cells as mc  # noqa: E402
from marconi_matrix.traces import build  # noqa: E402
from sglang_marconi.errors import UserError  # noqa: E402
from sglang_marconi.sglang_integration.options import MarconiSettings  # noqa: E402

BUNDLED = ROOT.parent / "shared" / "traces" / "mooncake" / "synthetic_trace.jsonl"
RESULTS = ROOT / "results" / "policy_matrix"
MIN_HITS = 100  # the acceptance rule's cells: stock has at least this many hit requests


def quantile(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def parse_candidates(items) -> dict:
    out = {}
    for item in items or ():
        name, _, text = item.partition("=")
        try:
            out[name] = MarconiSettings(**json.loads(text))
        except (ValueError, TypeError) as exc:
            raise UserError(f"--candidate {item!r}: {exc}") from None
    return out


def describe(rows, name="marconi") -> dict:
    every = [r for r in (mc.ratio(x, name) for x in rows) if r is not None]
    judged = [mc.ratio(x, name) for x in rows
              if mc.binds(x) and x["columns"]["stock"]["hit_requests"] >= MIN_HITS
              and mc.ratio(x, name) is not None]
    worst = min(rows, key=lambda x: mc.ratio(x, name) or float("inf"), default=None)
    return {"cells": len(rows), "median": quantile(every, 0.5), "p10": quantile(every, 0.1),
            "worst": min(every, default=float("nan")),
            "worst_cell": worst["name"] if worst else None,
            "judged_cells": len(judged), "judged_median": quantile(judged, 0.5),
            "judged_p10": quantile(judged, 0.1),
            "judged_worst": min(judged, default=float("nan"))}


def cell_line(row, names) -> str:
    s = row["columns"]["stock"]
    parts = [f"{row['name']:42s}", f"{row['cache_gb']:7.1f} GiB",
             "binds" if mc.binds(row) else "  -  ", f"{s['hit_requests']:5d}",
             f"stock/ceiling {s['flops_saved_fraction'] / row['ceiling']:4.0%}",
             f"{s['flops_saved_fraction']:7.2%}", f"{row['ceiling']:7.2%}"]
    for n in names:
        r, g = mc.ratio(row, n), mc.gap_closed(row, n)
        parts.append(f"{n} {row['columns'][n]['flops_saved_fraction']:7.2%} "
                     f"{'  -  ' if r is None else f'{r:5.2f}x'} "
                     f"gap {'  -  ' if g is None else f'{g:+5.0%}'}")
    return "  ".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--traces", default=",".join(mc.TRACES))
    ap.add_argument("--candidate", action="append", metavar="NAME=JSON",
                    help="a candidate's MarconiSettings fields, e.g. "
                         "no-ghost='{\"ghost_factor\": 0}'")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--sizes", default=str(RESULTS / "sizes.json"),
                    help="the calibrated cell sizes (stock alone), read and extended")
    ap.add_argument("--limit-cells", type=int, default=None, help="the first N cells only")
    ap.add_argument("--bundled", default=str(BUNDLED))
    args = ap.parse_args(argv)
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x]
        traces = [t for t in args.traces.split(",") if t]
        bad = sorted(set(traces) - set(mc.TRACES))
        if bad or not seeds:
            raise UserError(f"--traces: unknown {bad} (known: {', '.join(mc.TRACES)})" if bad
                            else "--seeds: give at least one seed")
        candidates = parse_candidates(args.candidate)
    except (UserError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    todo = mc.cells(seeds, traces)[:args.limit_cells]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip() or "?"
    names = ["marconi", *candidates]
    built, fps, rows = {}, {}, []
    sizes_path = Path(args.sizes)
    sizes_path.parent.mkdir(parents=True, exist_ok=True)
    sizes = (json.loads(sizes_path.read_text(encoding="utf-8")) if sizes_path.exists()
             else {})
    t0 = time.time()
    with open(out / "cells.jsonl", "w", encoding="utf-8") as fh:
        for cell in tqdm(todo, desc="cells", unit="cell", disable=not sys.stderr.isatty()):
            key = (cell.trace, cell.seed)
            if key not in built:
                built[key] = build(cell.trace, cell.seed, args.bundled)
            trace = built[key]
            if (key, cell.model) not in fps:
                fps[(key, cell.model)] = mc.footprint(trace, cell.model)
            fp = fps[(key, cell.model)]
            if cell.name not in sizes:
                sizes[cell.name] = mc.calibrate(cell, trace, fp)
                sizes_path.write_text(json.dumps(sizes, indent=1, sort_keys=True) + "\n",
                                      encoding="utf-8")
            row = mc.run_cell(cell, trace, fp, sizes[cell.name], candidates)
            rows.append(row)
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            print(cell_line(row, names), flush=True)
    minutes = (time.time() - t0) / 60
    lines = [f"`python scripts/policy_matrix.py --seeds {args.seeds}` at commit {commit}: "
             f"{len(rows)} cells in {minutes:.0f} min; ratio = FLOPs saved / stock's", "",
             "| policy | cells | median | p10 | worst (cell) | binding cells with >= "
             f"{MIN_HITS} stock hits: n, median, p10, worst |", "|---|---|---|---|---|---|"]
    for n in names:
        d = describe(rows, n)
        lines.append(f"| {n} | {d['cells']} | {d['median']:.3f}x | {d['p10']:.3f}x | "
                     f"{d['worst']:.3f}x ({d['worst_cell']}) | {d['judged_cells']}, "
                     f"{d['judged_median']:.3f}x, {d['judged_p10']:.3f}x, "
                     f"{d['judged_worst']:.3f}x |")
    (out / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
