"""Issue 20: stock vs marconi vs marconi+ with SGLang's host tier (HiCache) on the shared
Mooncake trace: models x host sizes x write policies, 100 GB device (static split); prints
the grid (markdown: FLOPs saved, host hits, bytes loaded, evictions per tier) and the
targets' PASS/MISS. Runs and analysis: ``scripts/lib/marconi_reports/hicache_bench.py``. A
benchmark, not a test: exits 0 either way.

Usage: python scripts/bench_hicache.py [--limit N] [--processes 1] [--out runs.jsonl]
       [--models paper-7b,qwen3_next] [--host-gb 200,400]
       [--policies write_through,write_through_selective,write_back]
       [--caches stock,marconi,marconi+,marconi+:host=lru] [--analyze-only]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

from marconi_reports import hicache_bench  # noqa: E402
from marconi_reports.sweeps import MOONCAKE_TRACE  # noqa: E402


def _list(text: str) -> list:
    return [t.strip() for t in text.split(",") if t.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(MOONCAKE_TRACE))
    ap.add_argument("--limit", type=int, default=None, help="first N requests of the trace")
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--out", default="bench_hicache.jsonl", help="JSON lines, one per cell "
                    "(a rerun skips the cells already there)")
    ap.add_argument("--models", default=",".join(hicache_bench.MODELS))
    ap.add_argument("--host-gb", default=",".join(map(str, hicache_bench.HOST_GB)))
    ap.add_argument("--policies", default=",".join(hicache_bench.WRITE_POLICIES))
    ap.add_argument("--caches", default=",".join(hicache_bench.CACHES))
    ap.add_argument("--analyze-only", action="store_true", help="no replays: tables from --out")
    args = ap.parse_args(argv)
    bad = [p for p in _list(args.policies) if p not in hicache_bench.WRITE_POLICIES]
    if bad:
        ap.error(f"--policies: unknown {', '.join(bad)}")
    caches = _list(args.caches)
    cells = hicache_bench.grid(_list(args.models), [int(h) for h in _list(args.host_gb)],
                               _list(args.policies), caches)
    out = Path(args.out)
    rows = (hicache_bench.load(out) if args.analyze_only else
            hicache_bench.run(args.trace, out, cells, args.processes, args.limit))
    wanted = {hicache_bench.cell_key(c) for c in cells}
    rows = [r for r in rows if r.get("limit") == args.limit
            and hicache_bench.cell_key(r) in wanted]
    command = " ".join(["python scripts/bench_hicache.py", *(argv or sys.argv[1:])])
    print(hicache_bench.markdown(hicache_bench.analyze(rows, args.limit), command,
                                 args.limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
