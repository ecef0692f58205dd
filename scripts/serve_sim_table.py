"""Print the table of a saved ``serve-sim --json`` output (the table serve-sim prints, host
columns included when the runs have a host tier), then one line per cache and load with its
P95 TTFT and FLOPs saved against stock's at the same load. With several files (or
``--brief``): per file a line naming its cell (model, pools, host tier, loop) and the
lines against stock, no table. ``--bookkeeping``: instead, per file and run the cache's
own time (per-step max and p99, total, the total over stock's and stock-python's in that
file, the longest GC pause, reported apart) and FLOPs saved.

    python scripts/serve_sim_table.py results/hicache_serving.json
    python scripts/serve_sim_table.py results/hicache_serving_grid/*.json
    python scripts/serve_sim_table.py --bookkeeping before.json after.json
"""
from __future__ import annotations

import argparse
import json
import sys

from sglang_marconi.cli.serve_sim import format_table


def against_stock(runs: list) -> list:
    """'cache@load: P95 ... = Nx stock's; FLOPs saved ... vs stock's ...' lines."""
    stock = {r["load"]: r for r in runs if r["cache"] == "stock"}
    lines = []
    for r in runs:
        base = stock.get(r["load"])
        if r["cache"] == "stock" or base is None:
            continue
        host = (f"; host hit tokens {r['host_hit_tokens']:,} vs {base['host_hit_tokens']:,}"
                if "host" in r and "host" in base else "")
        lines.append(
            f"{r['cache']}@{r['load']}: P95 TTFT {r['ttft_p95_s']:.3f} s vs stock's "
            f"{base['ttft_p95_s']:.3f} s = {r['ttft_p95_s'] / base['ttft_p95_s']:.3f}x; "
            f"FLOPs saved {r['flops_saved_fraction']:.2%} vs {base['flops_saved_fraction']:.2%}"
            f" = {r['flops_saved'] / base['flops_saved']:.3f}x{host}")
    return lines


def cell(config: dict) -> str:
    """'paper-7b, static 100 GB, host 400 GB write_through, h200 PCIe 64 GB/s, overlap loop,
    3993 requests'"""
    host = config.get("host")
    tier = (f"host {host['hicache_size_gb'] or host['hicache_ratio']:g}"
            f"{' GB' if host['hicache_size_gb'] else 'x'} {host['write_policy']}, "
            f"{config['gpu']['name']} PCIe {config['gpu']['pcie_bytes_s'] / 1e9:g} GB/s"
            if host else "no host tier")
    pools = config["pools"]
    return (f"{config['model']}, {pools['mode']} {pools['cache_bytes'] / 2**30:g} GB, {tier}, "
            f"{config['loop']} loop, {config['requests']} requests")


def bookkeeping_rows(out: dict) -> list:
    """'cache@load: bk max ... ms, p99 ..., total ... s = Nx stock, Nx stock-python; gc max
    ... s; FLOPs saved ...' lines of one serve-sim --json output."""
    ratios = {(r["cache"], r["load"]): r for r in out.get("bookkeeping_ratios", [])}
    lines = []
    for r in out["runs"]:
        ratio = ratios.get((r["cache"], r["load"]), {})
        vs = "".join(f", {ratio[key]:.2f}x {name}" for key, name in
                     (("vs_stock", "stock"), ("vs_stock_python", "stock-python"))
                     if ratio.get(key) is not None)
        lines.append(
            f"{r['cache']}@{r['load']}: bk ms max {r['bookkeeping_ms_per_step_max']:.1f}, "
            f"p99 {r['bookkeeping_ms_per_step_p99']:.2f}, total {r['bookkeeping_s_total']:.2f} s"
            f"{vs}; gc max {r['gc_pause_s_max']:.3f} s; FLOPs saved "
            f"{r['flops_saved_fraction']:.2%}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", help="serve-sim --json outputs")
    parser.add_argument("--brief", action="store_true", help="no table")
    parser.add_argument("--bookkeeping", action="store_true",
                        help="the cache's own time per run (no table)")
    args = parser.parse_args(argv)
    brief = args.brief or len(args.json) > 1
    for path in args.json:
        with open(path) as f:
            out = json.load(f)
        if args.bookkeeping:
            print(f"{path}: {cell(out['config'])}")
            for line in bookkeeping_rows(out):
                print("  " + line)
            continue
        if brief:
            print(cell(out["config"]))
        else:
            print(format_table(out["runs"]))
        for line in against_stock(out["runs"]):
            print(("  " if brief else "") + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
