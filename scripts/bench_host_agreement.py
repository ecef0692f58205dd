"""Issue 20: the simulator's stock SGLang with a host tier against `ab`'s stock SGLang with
HiCache (write_through, static pools: SGLang's default layout, the one `ab` builds its host
tier over).

Runs `python -m sglang_marconi ab --memory static --hicache-size H --caches stock
--per-request` and the simulator's `sglang` policy on the same device pools with the same
host tier (`sim --hicache-size H`), on the same requests; prints FLOPs saved, per-request
hits and the host section (hits from host, bytes loaded, backups, evictions per tier) side
by side. Analysis: ``sglang_marconi/reports/host_agreement.py``. A benchmark, not a test:
exits 0 either way (tests/test_stock_host.py holds a slice to its bounds).

Usage: python scripts/bench_host_agreement.py [--limit N] [--model paper-7b]
       [--cache-gb 100] [--hicache-size 400] [--trace PATH] [--json]
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
from sglang_marconi.reports import baseline_agreement, host_agreement  # noqa: E402
from sglang_marconi.sim.sweeps import MOONCAKE_TRACE  # noqa: E402
from sglang_marconi.sim.traces import read_trace  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(MOONCAKE_TRACE))
    ap.add_argument("--model", default="paper-7b")
    ap.add_argument("--cache-gb", type=float, default=100.0,
                    help="ab's --cache-gb (GiB, SGLang's unit); default 100")
    ap.add_argument("--hicache-size", type=float, default=400.0,
                    help="host memory in GB (10**9 bytes); default 400")
    ap.add_argument("--limit", type=int, default=None, help="first N requests of the trace")
    ap.add_argument("--json", action="store_true", help="print the comparison as JSON")
    args = ap.parse_args(argv)

    spec = resolve_model(args.model, None)
    trace = read_trace(args.trace).head(args.limit)
    pools = baseline_agreement.sim_pools(size_pools(spec, args.cache_gb, "static"))
    pools.pop("capacity_bytes")
    ab = host_agreement.ab_argv(args.trace, args.model, args.cache_gb, args.hicache_size,
                                args.limit)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    run = subprocess.run([sys.executable, "-m", "sglang_marconi", *ab], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    if run.returncode != 0:
        sys.stderr.write(run.stderr)
        return run.returncode
    hits, cache = host_agreement.simulate(trace, spec, args.hicache_size, **pools)
    res = host_agreement.compare(trace, spec, hits, cache, json.loads(run.stdout))
    if args.json:
        json.dump(res, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    scope = f"first {len(trace):,} requests" if args.limit else f"all {len(trace):,} requests"
    print(host_agreement.format_report(
        res, ab_command=" ".join(ab),
        title=(f"Simulator `sglang` + host tier vs `ab` stock + HiCache: {args.model}, "
               f"{args.cache_gb:g} GiB static + {args.hicache_size:g} GB host, "
               f"write_through, {scope} of {Path(args.trace).name}")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
