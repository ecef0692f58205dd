"""``sim``: replay a trace (file or generated workload) through cache policies."""
from __future__ import annotations

import sys

from sglang_marconi.cli.common import (add_model_arguments, human_bytes, human_flops,
                                            model_from_args, parse_bytes, parse_params,
                                            print_json)
from sglang_marconi.cli.host_flags import add_host_arguments, host_enabled
from sglang_marconi.cli.pool_flags import (add_pool_arguments, check_pools_fit, pool_sizes,
                                           pool_summary)
from sglang_marconi.driver.sizing import sim_capacity
from sglang_marconi.errors import UserError
from sglang_marconi.policy.stock_host import WRITE_POLICIES
from sglang_marconi.sim.generators import generate
from sglang_marconi.sim.latency import LatencyModel
from sglang_marconi.sim.plots import plot_runs
from sglang_marconi.sim.policies import HostTier, in_sglang_pools, parse_policies
from sglang_marconi.sim.runner import simulate
from sglang_marconi.sim.traces import read_trace


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
    parser.add_argument("--capacity", default=None,
                        help="cache budget in bytes, e.g. 40GB (default 40GB; or the pools "
                             "ab builds: --cache-gb / --kv-tokens below)")
    parser.add_argument("--capacities", help="several budgets, e.g. 10GB,20GB,40GB (a sweep)")
    parser.add_argument("--policies", default="sglang,vllm+,paper-sglang+,marconi,infinite",
                        help="comma-separated: sglang (stock SGLang as a server runs it), "
                             "vllm+, paper-sglang+ (the paper's baselines), marconi[:alpha=X|auto], "
                             "marconi+, infinite, offline")
    parser.add_argument("--grid", type=int, default=1,
                        help="checkpoint granularity in tokens (64 mirrors SGLang; default 1)")
    parser.add_argument("--gpu", default="a100", help="TTFT model GPU: a100, h100, h200, l40s, b200")
    parser.add_argument("--mfu", type=float, default=0.5, help="TTFT model MFU (default 0.5)")
    parser.add_argument("--ttft-overhead", type=float, default=0.02,
                        help="TTFT model fixed overhead in seconds (default 0.02)")
    parser.add_argument("--jobs", type=int, default=1, help="policies replayed in parallel")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the results")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_host_arguments(parser)
    add_pool_arguments(parser)
    parser.set_defaults(page_size=64)


def sglang_pools(args, spec, policies, trace):
    """``--cache-gb`` / ``--kv-tokens``: the pools ``ab`` builds (at SGLang's default page of
    64 tokens), as (policies run on them, [the budget], their summary); None without those
    flags. Unified: the buffer's bytes (``driver.sizing.sim_capacity``); static:
    the two pools (the budget is then None). Pools ``ab`` would refuse for ``trace`` are
    refused."""
    if (args.cache_gb is None and args.kv_tokens is None and args.mamba_slots is None
            and args.memory is None and args.mamba_full_memory_ratio is None):
        return None
    if args.capacity is not None or args.capacities:
        raise UserError("--capacity/--capacities and --cache-gb/--kv-tokens are two forms of "
                        "the cache size: give one")
    kv_tokens, mamba_slots, sizes = pool_sizes(args, spec)
    longest = max(r.input_len + max(1, r.output_len) for r in trace.requests)
    check_pools_fit(args, kv_tokens, mamba_slots, longest, args.page_size)
    if sizes is not None and sizes.mode == "unified":
        return ([in_sglang_pools(p) for p in policies], [sim_capacity(sizes)],
                pool_summary(sizes, kv_tokens, mamba_slots))
    return ([in_sglang_pools(p, kv_tokens, mamba_slots) for p in policies], [None],
            pool_summary(sizes, kv_tokens, mamba_slots))


def host_tier(args):
    """The host tier from ``ab``'s flags (``cli.host_flags``), None without them; what the
    simulator does not build is refused."""
    if not host_enabled(args):
        return None
    if args.hicache_storage_backend is not None:
        raise UserError("--hicache-storage-backend: the simulator has no L3 store "
                        "(ab models it)")
    policy = args.hicache_write_policy or "write_through"
    if policy not in WRITE_POLICIES:
        raise UserError(f"--hicache-write-policy {policy}: the simulator's host tier is "
                        f"built for {', '.join(WRITE_POLICIES)} only (ab models every policy)")
    return HostTier(size_gb=args.hicache_size, ratio=args.hicache_ratio, write_policy=policy)


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
    if args.grid < 1:
        raise UserError("--grid must be >= 1")
    policies = parse_policies(args.policies)
    latency = LatencyModel(args.gpu, args.mfu, args.ttft_overhead)
    spec = model_from_args(args, default_preset="paper-7b")
    trace = load_trace(args)
    pools = sglang_pools(args, spec, policies, trace)
    if pools is not None:
        policies, caps, summary = pools
    else:
        summary = None
        caps = ([parse_bytes(c, "--capacities") for c in args.capacities.split(",") if c.strip()]
                if args.capacities else [parse_bytes(args.capacity or "40GB", "--capacity")])
    progress = not args.no_progress and sys.stderr.isatty()
    host = host_tier(args)
    runs = [simulate(trace, spec, cap, policies, args.grid, latency, progress, args.jobs, host)
            for cap in caps]
    if summary is not None:
        for res in runs:
            res["pools"] = summary
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
    pools = res.get("pools")
    if pools is not None and pools.get("mode") != "unified":
        size = (f"static pools: {pools['kv_tokens']:,} KV tokens, {pools['mamba_slots']:,} "
                "state slots")
    else:
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
    for name, r in res["policies"].items():
        if "host" in r:
            h = r["host"]
            print(f"  {name} host tier: {h['hit_tokens']:,} hit tokens from host, "
                  f"{h['bytes_loaded']:.3e} bytes loaded, KV tokens evicted device / host "
                  f"{r['kv_tokens_evicted']:,} / {h['kv_tokens_evicted']:,}")
