"""Issue 18: the simulator's `sglang` baseline against `ab`'s stock SGLang on the same bytes.

Runs `python -m sglang_marconi ab --memory unified --caches stock --per-request` (SGLang's
own cache on a unified buffer sized from --cache-gb) and the simulator's `sglang` policy
with the byte budget of that buffer, on the same requests; prints both FLOPs-saved
fractions, their difference in percentage points, the share of requests with identical
hits, the capacity the simulator used and the requests that differ most. Analysis:
``sglang_marconi/reports/baseline_agreement.py``. A benchmark, not a test: exits 0 either
way (tests/test_sglang_baseline.py holds a slice to its bounds).

Usage: python scripts/bench_baseline_agreement.py [--limit N] [--model paper-7b]
       [--cache-gb 100] [--trace PATH] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_marconi.driver.sizing import size_pools  # noqa: E402
from sglang_marconi.model import resolve_model  # noqa: E402
from sglang_marconi.reports import baseline_agreement as agreement  # noqa: E402
from sglang_marconi.sim.traces import read_trace  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(ROOT.parent / "shared" / "traces" / "mooncake"
                                           / "synthetic_trace.jsonl"))
    ap.add_argument("--model", default="paper-7b")
    ap.add_argument("--cache-gb", type=float, default=100.0,
                    help="ab's --cache-gb (GiB, SGLang's unit); default 100")
    ap.add_argument("--limit", type=int, default=None, help="first N requests of the trace")
    ap.add_argument("--chunked-prefill-size", type=int, default=8192)
    ap.add_argument("--mamba-track-interval", type=int, default=256)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--json", action="store_true", help="print the comparison as JSON")
    args = ap.parse_args(argv)

    spec = resolve_model(args.model, None)
    sizes = size_pools(spec, args.cache_gb, "unified", page_size=args.page_size)
    capacity = agreement.sim_capacity(sizes)
    ab = agreement.ab_argv(args.trace, args.model, args.cache_gb, args.limit,
                           args.chunked_prefill_size, args.mamba_track_interval, args.page_size)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    run = subprocess.run([sys.executable, "-m", "sglang_marconi", *ab], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    if run.returncode != 0:
        sys.stderr.write(run.stderr)
        return run.returncode
    trace = read_trace(args.trace).head(args.limit)
    hits, stats = agreement.simulate(trace, spec, capacity, args.chunked_prefill_size,
                                     args.mamba_track_interval, args.page_size)
    res = agreement.compare(trace, spec, hits, stats, json.loads(run.stdout), capacity)
    if args.json:
        json.dump(res, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(agreement.format_report(res, trace_name=Path(args.trace).name, model=args.model,
                                      cache_gb=args.cache_gb, ab_command=" ".join(ab),
                                      limit=args.limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
