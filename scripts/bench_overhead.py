"""Benchmark: cache bookkeeping overhead of the Marconi cache against stock SGLang.

1. Replay: the same requests of the shared Mooncake trace through stock
   ``UnifiedRadixCache`` (compiled core "stock", python core "stock-python") and
   ``MarconiUnifiedRadixCache`` ("marconi", what ``--cache-policy marconi`` runs; ``--paper``:
   "marconi-paper", the paper's ranking at ``--alpha``), interleaved request by request.
   Printed: mean, P50 and P99 ms per request, the ratio to each stock core, mean, P99 and
   max ms per cache call, PASS/MISS for the targets (marconi mean
   within 1.15x of stock, the compiled core; no cache call over 50 ms), and peak Python
   memory from a separate, untimed tracemalloc pass.
2. Scaling: trees of about 1K, 10K and 100K nodes, pools full ("state" or "kv"), time per
   request and per eviction call.
3. The simulator's ``policy.cache.PrefixCache`` at the same sizes.

How each part measures: ``scripts/lib/marconi_reports/overhead.py``; the report:
``marconi_reports/overhead_report.py``.
A benchmark, not a test: exits 0 either way (1 with ``--strict`` on a MISS).

Usage: .venv/bin/python scripts/bench_overhead.py [--quick] [--limit N] [--paper]
       [--sizes 1000,10000,100000] [--json PATH] [--strict]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

from marconi_reports import overhead_report  # noqa: E402
from marconi_reports.sweeps import MOONCAKE_TRACE as TRACE  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--limit", type=int, default=None, help="replay the first N requests")
    ap.add_argument("--model", default="qwen3_next")
    ap.add_argument("--kv-tokens", type=int, default=1_500_000)
    ap.add_argument("--mamba-slots", type=int, default=200)
    ap.add_argument("--alpha", type=float, default=1.0,
                    help="the marconi-paper column's fixed alpha")
    ap.add_argument("--paper", action="store_true",
                    help="add a marconi-paper column (--marconi-alpha ALPHA: the paper's ranking)")
    ap.add_argument("--memory-limit", type=int, default=500,
                    help="requests of the tracemalloc pass (0: skip it)")
    ap.add_argument("--sizes", default="1000,10000,100000", help="tree sizes for scaling")
    ap.add_argument("--scale-requests", type=int, default=50,
                    help="most measured requests per scaling point")
    ap.add_argument("--scale-budget-s", type=float, default=4.0,
                    help="stop measuring a scaling point after this long (3 requests at least)")
    ap.add_argument("--sim-requests", type=int, default=100_000,
                    help="simulator: measured requests per size, at most the tree size")
    ap.add_argument("--skip", default="", help="comma list of replay,scaling,sim to skip")
    ap.add_argument("--quick", action="store_true",
                    help="--limit 300 --memory-limit 300 --sizes 1000,10000 "
                         "--scale-requests 20 --sim-requests 10000")
    ap.add_argument("--target", type=float, default=1.15)
    ap.add_argument("--json", metavar="PATH", help="also write every number as JSON")
    ap.add_argument("--strict", action="store_true", help="exit 1 on a MISS")
    args = ap.parse_args(argv)
    if args.quick:
        args.limit = args.limit or 300
        args.memory_limit = min(args.memory_limit, 300)
        args.sizes = "1000,10000"
        args.scale_requests = 20
        args.sim_requests = 10_000
    return overhead_report.run(args)


if __name__ == "__main__":
    sys.exit(main())
