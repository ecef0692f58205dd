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
       [--candidate NAME='{"field": value}'] [--out DIR] [--limit-cells N] [--jobs N]
       [--resume]
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import json
import multiprocessing
import shlex
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
PARTIAL = "cells.partial.jsonl"  # rows as they are done; cells.jsonl is written at the end
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


def resumed(out: Path) -> dict:
    """An earlier run's rows by name: ``cells.jsonl``, then what an interrupted run left in
    ``cells.partial.jsonl`` (a later line wins)."""
    rows = {}
    for path in (out / "cells.jsonl", out / PARTIAL):
        if path.exists():
            rows.update((r["name"], r) for r in (json.loads(line) for line in path.read_text(
                encoding="utf-8").splitlines() if line.strip()))
    return rows


def run_group(group, bundled, sizes, candidates, earlier) -> list:
    """The cells of one (trace, seed, model), in order: [(cell, size, row)], calibrating
    the cells ``sizes`` (name -> size) lacks; a cell's row in ``earlier`` keeps its
    columns and gains only the policies it lacks."""
    trace = build(group[0].trace, group[0].seed, bundled)
    fps = []  # the footprint, run once if a cell needs it

    def fp():
        fps[:] = fps or [mc.footprint(trace, group[0].model)]
        return fps[0]

    out = []
    for cell in group:
        row = earlier.get(cell.name)
        if row is None:
            size = sizes.get(cell.name) or mc.calibrate(cell, trace, fp())
            row = mc.run_cell(cell, trace, fp(), size, candidates)
        else:  # new columns on the size of the row's own
            size = {"cache_gb": row["cache_gb"], "stock_share": row["stock_share_target"]}
            missing = {n: c for n, c in {"marconi": None, **candidates}.items()
                       if n not in row["columns"]}  # marconi: the defaults
            row["columns"].update(mc.run_candidates(cell, trace, size, missing))
        out.append((cell, size, row))
    return out


def gain_table(rows, name) -> list:
    """The README's gain table: ``name`` against stock per model and memory mode, the
    median over the cells beside the worst cell."""
    lines = [f"{name}: prefill FLOPs saved over stock's, per model and memory mode", "",
             "| model | memory | cells | stock saves (median) | median | worst (cell) |",
             "|---|---|---|---|---|---|"]
    for model in dict.fromkeys(r["cell"]["model"] for r in rows):
        for memory in ("static", "unified"):
            part = [r for r in rows if (r["cell"]["model"], r["cell"]["memory"]) == (model, memory)
                    and mc.ratio(r, name) is not None]
            if not part:
                continue
            worst = min(part, key=lambda r: mc.ratio(r, name))
            stock = quantile([r["columns"]["stock"]["flops_saved_fraction"] for r in part], 0.5)
            median = quantile([mc.ratio(r, name) for r in part], 0.5)
            lines.append(f"| {model} | {memory} | {len(part)} | {stock:.1%} | {median:.2f}x | "
                         f"{mc.ratio(worst, name):.2f}x ({worst['cell']['trace']}, "
                         f"stock at {worst['cell']['target']:.0%} of the ceiling) |")
    return lines


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
    ap.add_argument("--resume", action="store_true",
                    help="keep what --out's cells.jsonl (and an interrupted run's "
                         "cells.partial.jsonl) hold, running only the policies a cell lacks")
    ap.add_argument("--jobs", type=int, default=1,
                    help="processes, one (trace, seed, model) group of cells each")
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
    sizes_path = Path(args.sizes)
    sizes_path.parent.mkdir(parents=True, exist_ok=True)
    sizes = (json.loads(sizes_path.read_text(encoding="utf-8")) if sizes_path.exists()
             else {})
    groups = {}
    for cell in todo:
        groups.setdefault((cell.trace, cell.seed, cell.model), []).append(cell)
    order = {cell.name: i for i, cell in enumerate(todo)}
    kept = resumed(out) if args.resume else {}  # every earlier row stays in the files
    earlier = {name: row for name, row in kept.items() if name in order}
    rows = [r for r in earlier.values() if all(n in r["columns"] for n in names)]
    done = {r["name"] for r in rows}
    groups = [[c for c in g if c.name not in done] for g in groups.values()]
    t0 = time.time()
    failed = []
    partial = open(out / PARTIAL, "w", encoding="utf-8")
    partial.writelines(json.dumps(row) + "\n" for row in kept.values())
    spawn = multiprocessing.get_context("spawn")
    with partial, futures.ProcessPoolExecutor(max(1, args.jobs), mp_context=spawn) as pool:
        jobs = {pool.submit(run_group, g, args.bundled,
                            {c.name: sizes[c.name] for c in g if c.name in sizes}, candidates,
                            {c.name: earlier[c.name] for c in g if c.name in earlier}): g
                for g in groups if g}
        bar = tqdm(total=len(todo), initial=len(rows), desc="cells", unit="cell",
                   disable=not sys.stderr.isatty())
        for job in futures.as_completed(jobs):
            try:
                result = job.result()
            except Exception as exc:  # the other groups go on; the run fails at the end
                failed.append(f"{jobs[job][0].name} and its group: {exc}")
                print(f"error: {failed[-1]}", file=sys.stderr, flush=True)
                continue
            for cell, size, row in result:
                sizes[cell.name] = size
                rows.append(row)
                partial.write(json.dumps(row) + "\n")
                partial.flush()
                print(cell_line(row, names), flush=True)
                bar.update()
            sizes_path.write_text(json.dumps(sizes, indent=1, sort_keys=True) + "\n",
                                  encoding="utf-8")
        bar.close()
    rows.sort(key=lambda r: order[r["name"]])
    kept.update((r["name"], r) for r in rows)
    with open(out / "cells.jsonl", "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(row) + "\n" for row in kept.values())
    (out / PARTIAL).unlink()
    if failed:
        raise SystemExit(f"error: {len(failed)} group(s) failed, the rest are in "
                         f"{out / 'cells.jsonl'}: " + "; ".join(failed))
    minutes = (time.time() - t0) / 60
    command = shlex.join(["python", "scripts/policy_matrix.py",
                          *(sys.argv[1:] if argv is None else argv)])
    lines = [f"`{command}` at commit {commit}: {len(rows)} cells ({len(earlier)} resumed) "
             f"in {minutes:.0f} min; ratio = FLOPs saved / stock's", "",
             "| policy | cells | median | p10 | worst (cell) | binding cells with >= "
             f"{MIN_HITS} stock hits: n, median, p10, worst |", "|---|---|---|---|---|---|"]
    for n in names:
        d = describe(rows, n)
        lines.append(f"| {n} | {d['cells']} | {d['median']:.3f}x | {d['p10']:.3f}x | "
                     f"{d['worst']:.3f}x ({d['worst_cell']}) | {d['judged_cells']}, "
                     f"{d['judged_median']:.3f}x, {d['judged_p10']:.3f}x, "
                     f"{d['judged_worst']:.3f}x |")
    for n in names:
        lines += ["", *gain_table(rows, n)]
    (out / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
