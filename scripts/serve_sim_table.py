"""Print the table of a saved ``serve-sim --json`` output (the table serve-sim prints, host
columns included when the runs have a host tier), then one line per cache and load with its
P95 TTFT and FLOPs saved against stock's at the same load.

    python scripts/serve_sim_table.py docs/data/hicache_serving.json
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="serve-sim --json output")
    args = parser.parse_args(argv)
    with open(args.json) as f:
        runs = json.load(f)["runs"]
    print(format_table(runs))
    for line in against_stock(runs):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
