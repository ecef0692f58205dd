"""The scale-out grid: N replicas behind each router, per model and per replica cache, with
SGLang's unified memory by default (``serve-sim --replicas N``'s replay, with the research
routers of scripts/lib/marconi_routing beside sglang-router's): TTFT P50/P95, FLOPs saved,
load skew and the router's belief gap, one row per (model, N, router, cache), and the
targets at N = 4 (marconi router + marconi+ >= 1.3x the FLOPs saved of cache_aware +
stock, P95 TTFT <= 0.8x, marconi within 10% of the oracle's FLOPs saved).

A benchmark, not a test: it exits 0 whatever the targets say. Each (model, N) is one
in-process replay of every router x cache; its rows are appended to ``--out`` (JSON lines), and a rerun
skips a (model, N) whose router x cache rows are all there for the same slice, so a long
grid can be resumed or filled in by parts.
``--skip S --limit L`` replays requests S .. S+L-1 of the trace only (the arrivals are
rescaled to the load over that slice): a slice held out from the one the router was
tuned on. The default is a short slice (the first 200 requests) that fits a shared 2-core
machine; ``--full`` runs the whole trace (hours there).

Usage: python scripts/bench_scale_out.py [--models paper-7b,qwen3_next] [--replicas 2,4,8]
       [--routers cache_aware,round_robin,marconi,oracle] [--caches stock,marconi+]
       [--memory unified] [--load 0.8] [--skip S] [--limit L | --full] [--out grid.jsonl]
       [--router-flags '--router-affinity-threshold off']
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

from marconi_reports.sweeps import MOONCAKE_TRACE  # noqa: E402
from marconi_routing.cluster import (COST_ROUTERS, add_router_arguments,  # noqa: E402
                                     router_options, run_cost_cluster)
from sglang_marconi.cli import serve_sim  # noqa: E402
from sglang_marconi.cli.common import run_with_sglang  # noqa: E402
from sglang_marconi.errors import UserError  # noqa: E402

COLUMNS = (("model", "model", "{}"), ("N", "replicas", "{}"), ("router", "router", "{}"),
           ("cache", "cache", "{}"), ("TTFT p50", "ttft_p50_s", "{:.3f}"),
           ("p95", "ttft_p95_s", "{:.3f}"), ("FLOPs saved", "flops_saved_fraction", "{:.1%}"),
           ("skew", "load_skew", "{:.2f}"), ("belief gap", "belief_gap_fraction", "{:+.1%}"),
           ("busy", "gpu_busy_fraction", "{:.0%}"), ("wall s", "wall_s", "{:.0f}"))
DEFAULT_LIMIT = 200


def slice_trace(trace: Path, skip: int, limit, tmp: Path) -> Path:
    """The trace itself, or its lines skip .. skip+limit-1 written to ``tmp``."""
    if not skip:
        return trace
    lines = [ln for ln in trace.read_text().splitlines() if ln.strip()]
    part = lines[skip:] if limit is None else lines[skip:skip + limit]
    if not part:
        raise SystemExit(f"--skip {skip}: {trace} has only {len(lines)} requests")
    tmp.write_text("\n".join(part) + "\n")
    return tmp


def run_cell(trace: Path, model: str, replicas: int, args) -> list:
    """Every router x cache for this model and N: serve-sim's setup and cluster replay, the
    research routers through ``marconi_routing``; their summaries."""
    argv = ["--trace", str(trace), "--model", model, "--gpu", args.gpu,
            "--cache-gb", str(args.cache_gb), "--memory", args.memory,
            "--load", str(args.load), "--bookkeeping", "off", "--no-progress"]
    if args.limit is not None and not args.skip:
        argv += ["--limit", str(args.limit)]
    parser = argparse.ArgumentParser()
    serve_sim.add_arguments(parser)
    add_router_arguments(parser)
    flags = parser.parse_args(argv + args.router_flags.split())
    logging.getLogger("sglang").setLevel(logging.ERROR)  # retraction warnings: counted
    try:
        options = {**serve_sim.router_options(flags), **router_options(flags)}
        requests, setup, _ = run_with_sglang(serve_sim.build_setup, flags)
    except UserError as err:
        raise SystemExit(f"error: {err}") from None
    from sglang_marconi.serving.cluster import run_cluster  # torch, sglang

    runs = []
    for router in args.routers.split(","):
        run = run_cost_cluster if router in COST_ROUTERS else run_cluster
        for cache in args.caches.split(","):
            summary, cluster = run(cache, router, requests, setup, replicas, load=args.load,
                                   router_options=options.get(router))
            runs.append(summary)
            del cluster
            gc.collect()
    return runs


def format_rows(rows: list) -> str:
    table = [[h for h, _, _ in COLUMNS]]
    for r in rows:
        table.append([fmt.format(r[key]) if r.get(key) is not None else "-"
                      for _, key, fmt in COLUMNS])
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in table)


def verdict(num: float, den: float, target: float, at_least: bool) -> str:
    """``num / den`` and PASS/MISS against ``target`` (n/a when ``den`` is 0)."""
    if not den:
        return "n/a (nothing to divide by)"
    ratio = num / den
    ok = ratio >= target if at_least else ratio <= target
    return f"{ratio:.2f}x (target {'>=' if at_least else '<='} {target}: " \
           f"{'PASS' if ok else 'MISS'})"


def targets(rows: list) -> list:
    """The issue's three targets per (model, N) where the rows they need are there."""
    lines = []
    for model, n in sorted({(r["model"], r["replicas"]) for r in rows}):
        got = {(r["router"], r["cache"]): r for r in rows
               if r["model"] == model and r["replicas"] == n}
        base, ours = got.get(("cache_aware", "stock")), got.get(("marconi", "marconi+"))
        oracle = got.get(("oracle", "marconi+"))
        if base is None or ours is None:
            continue
        line = (f"{model} N={n}: marconi+marconi+ / cache_aware+stock: FLOPs saved "
                + verdict(ours["flops_saved_fraction"], base["flops_saved_fraction"], 1.3, True)
                + ", P95 TTFT " + verdict(ours["ttft_p95_s"], base["ttft_p95_s"], 0.8, False))
        if oracle is not None:
            line += ("; marconi / oracle (marconi+) FLOPs saved "
                     + verdict(ours["flops_saved_fraction"], oracle["flops_saved_fraction"],
                               0.9, True))
        lines.append(line)
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(MOONCAKE_TRACE))
    ap.add_argument("--models", default="paper-7b,qwen3_next")
    ap.add_argument("--replicas", default="2,4,8")
    ap.add_argument("--routers", default="cache_aware,round_robin,marconi,oracle")
    ap.add_argument("--caches", default="stock,marconi+")
    ap.add_argument("--memory", choices=("unified", "static"), default="unified")
    ap.add_argument("--cache-gb", type=float, default=100.0)
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--skip", type=int, default=0, help="leave out the first S requests")
    ap.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                    help=f"requests replayed (default {DEFAULT_LIMIT})")
    ap.add_argument("--full", action="store_true", help="the whole trace (after --skip)")
    ap.add_argument("--router-flags", default="", help="more router flags, e.g. "
                    "'--router-affinity-threshold off' (part of a cell's identity)")
    ap.add_argument("--out", default="bench_scale_out.jsonl")
    ap.add_argument("--print-only", action="store_true", help="no runs: the table and the "
                    "targets from the rows already in --out")
    args = ap.parse_args(argv)
    if args.full:
        args.limit = None
    if args.skip < 0 or (args.limit is not None and args.limit < 1):
        raise SystemExit("--skip must be >= 0 and --limit >= 1")
    out = Path(args.out)
    done = [{"router_flags": "", **json.loads(ln)} for ln in out.read_text().splitlines()
            ] if out.exists() else []
    key = {"skip": args.skip, "limit": args.limit, "memory": args.memory,
           "load": args.load, "cache_gb": args.cache_gb, "router_flags": args.router_flags}
    wanted = {(router, cache) for router in args.routers.split(",")
              for cache in args.caches.split(",")}
    with tempfile.TemporaryDirectory() as tmp:
        trace = slice_trace(Path(args.trace), args.skip, args.limit, Path(tmp) / "slice.jsonl")
        for model in args.models.split(","):
            for n in (int(x) for x in args.replicas.split(",")):
                have = {(r["router"], r["cache"]) for r in done if r["model"] == model
                        and r["replicas"] == n and all(r.get(k) == v for k, v in key.items())}
                if wanted <= have or args.print_only:
                    continue
                for run in run_cell(trace, model, n, args):
                    row = {"model": model, **key, **run}
                    done.append(row)
                    with out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                print(f"done: {model} N={n}", file=sys.stderr, flush=True)
    rows = [r for r in done if all(r.get(k) == v for k, v in key.items())
            and r["model"] in args.models.split(",") and (r["router"], r["cache"]) in wanted
            and str(r["replicas"]) in args.replicas.split(",")]
    latest = {(r["model"], r["replicas"], r["router"], r["cache"]): r for r in rows}
    rows = list(latest.values())      # a cell run twice: its last run
    what = "whole trace" if args.limit is None else f"{args.limit} requests"
    print(f"{what} from request {args.skip}, {args.memory} memory, {args.cache_gb:g} GB per "
          f"replica, {args.gpu}, cluster load {args.load}")
    print(format_rows(rows))
    for line in targets(rows):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
