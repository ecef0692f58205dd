"""Issue 18: the simulator's `sglang` baseline against `ab`'s stock SGLang on the same bytes,
and the simulator's `marconi+:materialise=sglang` against `ab`'s marconi+ (the plugin).

Runs `python -m sglang_marconi ab --memory M --caches stock --per-request` (SGLang's own
cache on the pools a server builds from --cache-gb: M = unified, one byte buffer, or
static, SGLang's default KV token pool + state pool) and the simulator's `sglang` policy
on the same pools (unified: the buffer's byte budget; static: `kv_tokens`, `state_slots`),
on the same requests; `--memory both` (the default) runs both layouts. `--caches
stock,marconi+` (the default) adds the marconi+ row: `ab --caches marconi+` against the
simulator's `marconi+:materialise=sglang:overlap=1` (``policy.in_sglang``), in both
layouts (static: `kv_tokens`, `state_slots`, as for stock). Prints both FLOPs-saved
fractions, their difference in percentage points, the share of requests with identical
hits, the capacity the simulator used and the requests that differ most. Analysis:
``scripts/lib/marconi_reports/baseline_agreement.py``. A benchmark, not a test: exits 0 either
way (tests/test_sglang_baseline.py holds a slice to its bounds).

Usage: python scripts/bench_baseline_agreement.py [--limit N] [--model paper-7b]
       [--cache-gb 100] [--memory both|unified|static] [--caches stock,marconi+]
       [--trace PATH] [--json]
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
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

from sglang_marconi.driver.sizing import size_pools  # noqa: E402
from sglang_marconi.model import resolve_model  # noqa: E402
from marconi_reports import baseline_agreement as agreement  # noqa: E402
from sglang_marconi.sim.traces import read_trace  # noqa: E402
from marconi_reports.sweeps import MOONCAKE_TRACE  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(MOONCAKE_TRACE))
    ap.add_argument("--model", default="paper-7b")
    ap.add_argument("--cache-gb", type=float, default=100.0,
                    help="ab's --cache-gb (GiB, SGLang's unit); default 100")
    ap.add_argument("--limit", type=int, default=None, help="first N requests of the trace")
    ap.add_argument("--chunked-prefill-size", type=int, default=8192)
    ap.add_argument("--mamba-track-interval", type=int, default=256)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--memory", choices=("both", "unified", "static"), default="both",
                    help="the pools' layout: unified (one buffer), static (SGLang's default "
                         "two pools) or both (default)")
    ap.add_argument("--caches", default="stock,marconi+",
                    help="ab's caches to compare with their simulator images: stock (the "
                         "sglang baseline), marconi+ (the plugin); default both")
    ap.add_argument("--json", action="store_true", help="print the comparison as JSON")
    args = ap.parse_args(argv)
    caches = [c.strip() for c in args.caches.split(",") if c.strip()]
    if not caches or set(caches) - {"stock", "marconi+"}:
        ap.error(f"--caches: expected stock and/or marconi+, got {args.caches!r}")

    spec = resolve_model(args.model, None)
    trace = read_trace(args.trace).head(args.limit)
    env = _env()
    memories = ("unified", "static") if args.memory == "both" else (args.memory,)
    results, reports = {}, []
    for memory, cache in [(m, c) for c in caches for m in memories]:
        sizes = size_pools(spec, args.cache_gb, memory, page_size=args.page_size)
        pools = agreement.sim_pools(sizes)
        capacity = pools.pop("capacity_bytes")
        ab = agreement.ab_argv(args.trace, args.model, args.cache_gb, args.limit,
                               args.chunked_prefill_size, args.mamba_track_interval,
                               args.page_size, memory=memory, cache=cache)
        run = subprocess.run([sys.executable, "-m", "sglang_marconi", *ab], cwd=ROOT, env=env,
                             capture_output=True, text=True)
        if run.returncode != 0:
            sys.stderr.write(run.stderr)
            return run.returncode
        if cache == "stock":
            hits, stats = agreement.simulate(trace, spec, capacity, args.chunked_prefill_size,
                                             args.mamba_track_interval, args.page_size,
                                             **pools)
        else:
            hits, stats = agreement.simulate_marconi_plus(
                trace, spec, capacity, args.chunked_prefill_size, args.mamba_track_interval,
                args.page_size, **pools)
        res = agreement.compare(trace, spec, hits, stats, json.loads(run.stdout), capacity,
                                cache=cache)
        key = memory if cache == "stock" else f"{memory}-{cache}"
        results[key] = res
        reports.append(agreement.format_report(
            res, trace_name=Path(args.trace).name, model=args.model, cache_gb=args.cache_gb,
            ab_command=" ".join(ab), limit=args.limit))
    if args.json:
        json.dump(results if len(results) > 1 else next(iter(results.values())), sys.stdout,
                  indent=2)
        sys.stdout.write("\n")
    else:
        print("\n\n".join(reports))
    return 0


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))


if __name__ == "__main__":
    sys.exit(main())
