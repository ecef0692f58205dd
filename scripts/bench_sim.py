"""Benchmark: replay the shared Mooncake trace through vllm+, paper-sglang+ and marconi.

paper-7b, 100 GB by default. Prints the replay wall time of each policy and the total
(trace reading included), and PASS/MISS against the target: under 2 minutes in total on a
2-core machine. A benchmark, not a test: it exits 0 either way (1 with ``--strict`` on a
MISS).

Usage: .venv/bin/python scripts/bench_sim.py [--capacity 100GB] [--jobs 1]
       [--policies vllm+,paper-sglang+,marconi] [--trace PATH] [--target-s 120] [--strict]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

from sglang_marconi.cli.common import human_bytes, parse_bytes  # noqa: E402
from sglang_marconi.model import HybridModelSpec  # noqa: E402, preset_spec
from sglang_marconi.sim.policies import parse_policies  # noqa: E402
from sglang_marconi.sim.runner import simulate  # noqa: E402
from marconi_reports.sweeps import MOONCAKE_TRACE  # noqa: E402
from sglang_marconi.sim.traces import read_trace  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(MOONCAKE_TRACE))
    ap.add_argument("--model", default="paper-7b")
    ap.add_argument("--capacity", default="100GB")
    ap.add_argument("--policies", default="vllm+,paper-sglang+,marconi")
    ap.add_argument("--jobs", type=int, default=1,
                    help="policies replayed in parallel processes (default 1: one after another)")
    ap.add_argument("--target-s", type=float, default=120.0)
    ap.add_argument("--strict", action="store_true", help="exit 1 on a MISS")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    trace = read_trace(args.trace)
    t_read = time.perf_counter() - t0
    spec = preset_spec(args.model)
    cap = parse_bytes(args.capacity)
    policies = parse_policies(args.policies)
    print(f"trace {trace.name}: {len(trace):,} requests, {trace.input_tokens:,} input tokens "
          f"(read in {t_read:.1f} s) | {spec.name} | {human_bytes(cap)} | "
          f"{os.cpu_count()} CPUs, jobs {args.jobs}")
    res = simulate(trace, spec, cap, policies, progress=False, jobs=args.jobs)
    total = time.perf_counter() - t0
    print(f"{'policy':>10} {'wall':>9} {'tok hit':>8} {'FLOPs saved':>12} {'ckpt in':>10} "
          f"{'ckpt out':>10} {'alpha':>6}")
    for name, r in res["policies"].items():
        print(f"{name:>10} {r['wall_s']:>8.1f}s {r['token_hit_rate']:>8.2%} "
              f"{r['flops_saved_fraction']:>12.2%} {r['states_admitted']:>10,} "
              f"{r['states_evicted']:>10,} {r['alpha']:>6.1f}")
    summed = sum(r["wall_s"] for r in res["policies"].values())
    verdict = "PASS" if total < args.target_s else "MISS"
    print(f"total: {total:.1f} s wall (replays {summed:.1f} s, trace read {t_read:.1f} s); "
          f"target < {args.target_s:.0f} s: {verdict}")
    return 1 if args.strict and verdict == "MISS" else 0


if __name__ == "__main__":
    sys.exit(main())
