"""Issue 11: stock vs marconi vs marconi+ in SGLang with pools sized from a byte budget,
static (--mamba-full-memory-ratio 0.9, 0.3, 2.0) and unified (--enable-unified-memory), on
the shared Mooncake trace; prints the tables (markdown) and the targets' PASS/MISS, writes
the FLOPs-saved plot. Runs and analysis: ``scripts/lib/marconi_reports/unified_bench.py`` and
``unified_markdown.py``. A benchmark, not a test: exits 0 either way.

Usage: python scripts/bench_unified.py [--limit N] [--processes 2] [--out runs.jsonl]
       [--models paper-7b,qwen3_next] [--budgets 50,100,200] [--plot results/unified_flops.png]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

from marconi_reports import unified_bench, unified_markdown  # noqa: E402
from marconi_reports.sweeps import MOONCAKE_TRACE  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(MOONCAKE_TRACE))
    ap.add_argument("--limit", type=int, default=None, help="first N requests of the trace")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--out", default="bench_unified.jsonl", help="JSON lines, one per cell "
                    "(a rerun skips the cells already there)")
    ap.add_argument("--models", default=",".join(unified_bench.MODELS))
    ap.add_argument("--budgets", default=",".join(map(str, unified_bench.BUDGETS)))
    ap.add_argument("--plot", default=str(ROOT / "results" / "unified_flops.png"))
    ap.add_argument("--analyze-only", action="store_true", help="no replays: tables from --out")
    args = ap.parse_args(argv)
    cells = unified_bench.grid(args.models.split(","),
                               [float(b) if "." in b else int(b) for b in args.budgets.split(",")])
    out = Path(args.out)
    rows = (unified_bench.load(out) if args.analyze_only else
            unified_bench.run(args.trace, out, cells, args.processes, args.limit))
    rows = [r for r in rows if r.get("limit") == args.limit]
    an = unified_bench.analyze(rows)
    print(unified_markdown.markdown(an, command=" ".join(["python scripts/bench_unified.py",
                                                          *(argv or sys.argv[1:])]),
                                    limit=args.limit))
    if rows:
        note = f" (first {args.limit} requests)" if args.limit else ""
        print(f"plot: {unified_markdown.write_plot(an, Path(args.plot), note)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
