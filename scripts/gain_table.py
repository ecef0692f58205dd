"""The README's gain table: prefill FLOPs saved by stock SGLang and by ``--cache-policy
marconi`` on the same pools, for Qwen3-Next and Nemotron-H at SGLang's defaults (static
pools, unified memory, static pools with HiCache, static pools with int8 checkpoints on both
sides), from ``ab`` (SGLang's own cache objects
driven with the scheduler's calls) on one trace. Prints a markdown table with the command
and the commit it ran at, and what the cache costs: its bookkeeping per request against
stock on SGLang's compiled tree core, and the ghost index's host memory bound.

Usage: .venv/bin/python scripts/gain_table.py [--trace PATH] [--cache-gb 100[,200...]]
       [--hicache-size 400] [--models qwen3_next,nemotron_h] [--modes static,unified,...]
       [--limit N]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_marconi.policy.defaults import GHOST_FACTOR  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "synthetic_trace.jsonl"
MODES = {  # label -> ab flags beyond the model and the budget
    "static pools": ["--memory", "static"],
    "unified memory": ["--memory", "unified"],
    "static + HiCache": ["--memory", "static", "--hicache-size"],
    "static + int8 checkpoints": ["--memory", "static", "--enable-int8-mamba-checkpoint"],
}
SHORT = dict(zip(("static", "unified", "hicache", "int8"), MODES))


def run_cell(trace, model, cache_gb, mode, hicache_size, limit):
    flags = list(MODES[mode])
    if flags[-1] == "--hicache-size":
        flags.append(str(hicache_size))
    cmd = [sys.executable, "-m", "sglang_marconi", "ab", "--trace", str(trace), "--model", model,
           "--cache-gb", str(cache_gb), *flags, "--caches", "stock,marconi", "--json",
           "--no-progress", *(["--limit", str(limit)] if limit else [])]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise SystemExit(f"error: {' '.join(cmd[2:])}: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--cache-gb", default="100", help="GiB per rank, or a comma list")
    ap.add_argument("--hicache-size", type=int, default=400)
    ap.add_argument("--models", default="qwen3_next,nemotron_h")
    ap.add_argument("--modes", default="static,unified,hicache",
                    help=f"comma list of {', '.join(SHORT)}")
    ap.add_argument("--limit", type=int, default=None)
    args = ap.parse_args(argv)
    budgets = [float(x) for x in args.cache_gb.split(",") if x]
    bad = [m for m in args.modes.split(",") if m not in SHORT]
    if bad or not budgets:
        raise SystemExit(f"error: --modes: unknown {bad} (known: {', '.join(SHORT)})" if bad
                         else "error: --cache-gb: give a budget")
    modes = [SHORT[m] for m in args.modes.split(",")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip() or "?"
    print(f"`python scripts/gain_table.py --cache-gb {args.cache_gb} --hicache-size "
          f"{args.hicache_size} --modes {args.modes}"
          f"{f' --limit {args.limit}' if args.limit else ''}` at commit "
          f"{commit}, trace {Path(args.trace).name}: prefill FLOPs saved, one `ab` run a cell\n")
    print("| model | GiB per rank | pools | stock SGLang | marconi | marconi / stock "
          "| cache ms per request: stock (compiled core) / marconi | ghost index, host bytes |")
    print("|---|---|---|---|---|---|---|---|")
    cells = [(m, gb, mode) for m in args.models.split(",") if m for gb in budgets
             for mode in modes]
    for model, cache_gb, mode in cells:
        res = run_cell(args.trace, model, cache_gb, mode, args.hicache_size, args.limit)
        stock, marconi = res["caches"]["stock"], res["caches"]["marconi"]
        s, m = stock["flops_saved_fraction"], marconi["flops_saved_fraction"]
        label = mode if mode != "static + HiCache" else f"static + {args.hicache_size} GB HiCache"
        # the ghost index holds at most ghost_factor x the KV pool's token ids, 8 B each
        ghost = GHOST_FACTOR * res["config"]["kv_tokens"] * 8
        print(f"| {model} | {cache_gb:g} | {label} | {s:.2%} | {m:.2%} | "
              f"{m / s if s else float('nan'):.2f}x | "
              f"{stock['bookkeeping_ms_per_request']:.2f} / "
              f"{marconi['bookkeeping_ms_per_request']:.2f} | "
              f"{ghost / 2**20:,.0f} MiB |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
