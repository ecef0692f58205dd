"""``sim``: SGLang's own caches driven like ``ab`` on pools sized like a server (a trace file or
a generator), or with ``--paper`` the paper's planning simulator (one byte budget)."""
from __future__ import annotations

import sys

from sglang_marconi.cli import ab as ab_cli
from sglang_marconi.cli.common import (add_model_arguments, human_bytes, human_flops,
                                       model_from_args, parse_bytes, parse_params,
                                       print_json, run_with_sglang)
from sglang_marconi.cli.host_flags import host_enabled
from sglang_marconi.errors import UserError
from sglang_marconi.sim.generators import generate
from sglang_marconi.sim.latency import LatencyModel
from sglang_marconi.sim.plots import plot_runs
from sglang_marconi.sim.policies import parse_policies
from sglang_marconi.sim.runner import simulate
from sglang_marconi.sim.traces import read_trace

# flags of one mode only: (dest, flag, the value a parser leaves when it is not given)
PAPER_ONLY = (("policies", "--policies", None), ("capacity", "--capacity", None),
              ("capacities", "--capacities", None), ("grid", "--grid", None),
              ("gpu", "--gpu", None), ("mfu", "--mfu", None),
              ("ttft_overhead", "--ttft-overhead", None), ("jobs", "--jobs", None),
              ("plot", "--plot", None))
POOL_FLAGS = (("cache_gb", "--cache-gb"), ("kv_tokens", "--kv-tokens"),
              ("mamba_slots", "--mamba-slots"), ("memory", "--memory"),
              ("mamba_full_memory_ratio", "--mamba-full-memory-ratio"))
PAPER_DEFAULTS = {"policies": "vllm+,paper-sglang+,marconi,marconi+,infinite", "capacity": "40GB",
                  "grid": 1, "gpu": "a100", "mfu": 0.5, "ttft_overhead": 0.02, "jobs": 1}


def add_arguments(parser) -> None:
    src = parser.add_argument_group("trace (one of)")
    src.add_argument("--trace", metavar="PATH", help="Mooncake or session JSONL trace")
    src.add_argument("--workload", metavar="NAME",
                     help="a generated workload: chat, agent, shared-prompt, fork-join, drift")
    src.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    src.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                     help="generator parameter override, repeatable (e.g. sessions=100)")
    src.add_argument("--limit", type=int, help="replay only the first N requests")
    add_model_arguments(parser)
    ab_cli.add_replay_arguments(parser)
    paper = parser.add_argument_group(
        "the paper's planning setting (--paper: one byte budget, the states a policy plans "
        "wherever they are; its baselines and the offline reference)")
    paper.add_argument("--paper", action="store_true",
                       help="run the paper's planning simulator instead of SGLang's caches")
    paper.add_argument("--policies", default=None,
                       help="comma-separated: vllm+, paper-sglang+ (the paper's baselines), "
                            "marconi[:alpha=X|auto|online], marconi+, infinite, offline "
                            f"(default {PAPER_DEFAULTS['policies']})")
    paper.add_argument("--capacity", default=None,
                       help=f"cache budget in bytes, e.g. 40GB (default {PAPER_DEFAULTS['capacity']})")
    paper.add_argument("--capacities", help="several budgets, e.g. 10GB,20GB,40GB (a sweep)")
    paper.add_argument("--grid", type=int, default=None,
                       help="checkpoint granularity in tokens (64 mirrors SGLang; default 1)")
    paper.add_argument("--gpu", default=None,
                       help="TTFT model GPU: a100 (default), h100, h200, l40s, b200")
    paper.add_argument("--mfu", type=float, default=None, help="TTFT model MFU (default 0.5)")
    paper.add_argument("--ttft-overhead", type=float, default=None,
                       help="TTFT model fixed overhead in seconds (default 0.02)")
    paper.add_argument("--jobs", type=int, default=None, help="policies replayed in parallel")
    paper.add_argument("--plot", metavar="FILE.png", help="draw the results")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _check_mode(args) -> None:
    """Each mode's flags only with it, named in one line."""
    given = lambda dest, unset=None: getattr(args, dest) is not unset  # noqa: E731
    if args.paper:
        stray = [flag for dest, flag in POOL_FLAGS if given(dest)]
        if host_enabled(args):
            stray.append("--hicache-*")
        if args.enable_int8_mamba_checkpoint or args.int8_mamba_ckpt_size is not None:
            stray.append("--enable-int8-mamba-checkpoint")
        if stray:
            raise UserError(f"{', '.join(stray)}: SGLang's pools; --paper takes one byte "
                            "budget (--capacity)")
        for dest, value in PAPER_DEFAULTS.items():
            if getattr(args, dest) is None:
                setattr(args, dest, value)
        return
    stray = [flag for dest, flag, unset in PAPER_ONLY if given(dest, unset)]
    if stray:
        raise UserError(f"{', '.join(stray)}: the paper's planning simulator; add --paper")
    if not any(given(dest) for dest, _ in POOL_FLAGS[:3]):
        raise UserError("give the pools SGLang would build (--cache-gb N [--memory static|"
                        "unified], or --kv-tokens K --mamba-slots S), or --paper for the "
                        "paper's planning simulator")


def load_trace(args):
    if bool(args.trace) == bool(args.workload):
        raise UserError("give exactly one of --trace PATH or --workload NAME")
    if args.trace:
        if args.param:
            raise UserError("--param applies to --workload only")
        trace = read_trace(args.trace)
    else:
        trace = generate(args.workload, seed=args.seed, **parse_params(args.param))
    if args.limit is not None:
        if args.limit <= 0:
            raise UserError("--limit must be positive")
        trace = trace.head(args.limit)
    return trace


def run(args) -> int:
    _check_mode(args)
    if not args.paper:
        spec = model_from_args(args)
        trace = load_trace(args)
        return run_with_sglang(lambda a: ab_cli.run_replay(
            a, spec, trace, a.trace or f"workload {a.workload} (seed {a.seed})"), args)
    if args.grid < 1:
        raise UserError("--grid must be >= 1")
    policies = parse_policies(args.policies)
    latency = LatencyModel(args.gpu, args.mfu, args.ttft_overhead)
    spec = model_from_args(args, default_preset="paper-7b")
    trace = load_trace(args)
    caps = ([parse_bytes(c, "--capacities") for c in args.capacities.split(",") if c.strip()]
            if args.capacities else [parse_bytes(args.capacity, "--capacity")])
    progress = not args.no_progress and sys.stderr.isatty()
    runs = [simulate(trace, spec, cap, policies, args.grid, latency, progress, args.jobs)
            for cap in caps]
    if args.plot:
        plot_runs(runs, args.plot)
    if args.json:
        print_json(runs[0] if len(runs) == 1 else {"runs": runs})
    else:
        for res in runs:
            print_table(res)
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0


def print_table(res: dict) -> None:
    cap = res["capacity_bytes"]
    size = f"capacity {human_bytes(cap) if cap else 'unlimited'}"
    print(f"\ntrace {res['trace']}: {res['requests']:,} requests, {res['input_tokens']:,} input "
          f"tokens | model {res['model']} | {size}")
    cols = ("policy", "tok hit", "req hit", "FLOPs saved", "(frac)", "of inf", "ckpt in",
            "ckpt out", "peak", "TTFT p50", "TTFT p95", "alpha", "wall")
    print(" ".join(f"{c:>11}" for c in cols))
    for name, r in res["policies"].items():
        frac_inf = r.get("fraction_of_infinite_flops")
        row = (name, f"{r['token_hit_rate']:.2%}", f"{r['request_hit_rate']:.2%}",
               human_flops(r["flops_saved"]), f"{r['flops_saved_fraction']:.2%}",
               f"{frac_inf:.2%}" if frac_inf is not None else "-", f"{r['states_admitted']:,}",
               f"{r['states_evicted']:,}", human_bytes(r["peak_bytes"]),
               f"{r['ttft_p50_s'] * 1e3:.0f} ms", f"{r['ttft_p95_s'] * 1e3:.0f} ms",
               "-" if r["alpha"] is None else f"{r['alpha']:.1f}", f"{r['wall_s']:.1f} s")
        print(" ".join(f"{c:>11}" for c in row))
