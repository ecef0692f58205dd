"""``python -m sglang_marconi serve-sim``: stock vs Marconi caches under concurrent traffic
with arrival times, through SGLang's own scheduler code on CPU, on a virtual GPU clock
(TTFT, throughput, FLOPs saved). See ``sglang_marconi/serving/README.md``."""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import sys

from sglang_marconi.cli.ab import CACHE_NAMES
from sglang_marconi.cli.ab import _caches as parse_caches
from sglang_marconi.cli.ab import _positive
from sglang_marconi.cli.ab import _settings as settings_from_args
from sglang_marconi.cli.ab import add_marconi_arguments
from sglang_marconi.cli.common import (add_trace_model_arguments, describe_model,
                                        run_with_sglang, server_model_kwargs)
from sglang_marconi.cli.host_flags import host_enabled, host_summary, resolve_host
from sglang_marconi.cli.pool_flags import (_positive_float, add_int8_arguments, check_int8,
                                           describe_int8, int8_pool_fields, int8_summary)
from sglang_marconi.driver.sizing import size_pools
from sglang_marconi.errors import UserError
from sglang_marconi.model import resolve_model
from sglang_marconi.policy import defaults
from sglang_marconi.serving.gpu_model import PRESETS, GpuTimeModel, preset
from sglang_marconi.serving.metrics import bookkeeping_ratios
from sglang_marconi.serving.router import ROUTERS, make_router
from sglang_marconi.sim.traces import read_trace

COLUMNS = (  # (header, key, format)
    ("cache", "cache", "{}"), ("load", "load", "{}"),
    ("TTFT p50", "ttft_p50_s", "{:.3f}"), ("p95", "ttft_p95_s", "{:.3f}"),
    ("p99", "ttft_p99_s", "{:.3f}"), ("queue p95", "queue_p95_s", "{:.3f}"),
    ("req/s", "throughput_req_s", "{:.2f}"), ("out tok/s", "output_tok_s", "{:,.0f}"),
    ("FLOPs saved", "flops_saved_fraction", "{:.1%}"), ("hit", "token_hit_rate", "{:.1%}"),
    ("busy", "busy_fraction", "{:.0%}"), ("cpu crit", "cpu_critical_fraction", "{:.0%}"),
    ("overloaded", "overloaded", "{}"), ("running", "mean_running", "{:.1f}"),
    ("slots run", "state_slots_by_running_mean", "{:.0f}"),
    ("slots tree", "state_slots_by_tree_mean", "{:.0f}"), ("retract", "retractions", "{}"),
    ("aborted", "aborted", "{}"), ("bk ms p99", "bookkeeping_ms_per_step_p99", "{:.2f}"),
    ("bk ms max", "bookkeeping_ms_per_step_max", "{:.1f}"), ("gc max s", "gc_pause_s_max", "{:.3f}"),
    ("wall s", "wall_s", "{:.0f}"),
)
HOST_COLUMNS = (  # with a host tier (--hicache-*): from the run's "host" section
    ("host hit", "host_hit_tokens", "{:,}"), ("load s", "load_s_total", "{:.2f}"),
    ("load exposed s", "load_exposed_s_total", "{:.2f}"),
)


CLUSTER_COLUMNS = (  # (header, key, format)
    ("router", "router", "{}"), ("cache", "cache", "{}"), ("N", "replicas", "{}"),
    ("load", "load", "{}"), ("TTFT p50", "ttft_p50_s", "{:.3f}"), ("p95", "ttft_p95_s", "{:.3f}"),
    ("FLOPs saved", "flops_saved_fraction", "{:.1%}"), ("hit", "token_hit_rate", "{:.1%}"),
    ("skew", "load_skew", "{:.2f}"), ("belief gap", "belief_gap_fraction", "{:+.1%}"),
    ("busy", "gpu_busy_fraction", "{:.0%}"), ("aborted", "aborted", "{}"),
    ("wall s", "wall_s", "{:.0f}"),
)


def _routers(text: str) -> tuple:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for n in names:
        if n not in ROUTERS:
            raise UserError(f"--router: unknown router {n!r} (choose from {', '.join(ROUTERS)})")
        if names.count(n) > 1:
            raise UserError(f"--router: {n} twice")
    if not names:
        raise UserError("--router: empty list")
    return names


def _loads(text: str) -> tuple:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(re.fullmatch(r"[0-9]*\.?[0-9]+", p) and float(p) > 0 for p in parts):
        raise UserError(f"--load: expected positive numbers, comma-separated (0.8 = 80% "
                        f"of the capacity with no cache hit), got {text!r}")
    return tuple(float(p) for p in parts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_trace_model_arguments(parser)
    g = parser.add_argument_group("GPU time model (uncalibrated; presets: " + "; ".join(
        f"{p.name} {p.peak_flops / 1e12:g} TFLOP/s {p.hbm_bytes_s / 1e12:g} TB/s"
        for p in PRESETS.values()) + ")")
    g.add_argument("--gpu", choices=sorted(PRESETS), default="h200")
    g.add_argument("--peak-tflops", type=float, help="dense BF16 peak (preset's datasheet)")
    g.add_argument("--hbm-tbs", type=float, help="HBM bandwidth, TB/s (preset's datasheet)")
    g.add_argument("--mfu", type=float, help="fraction of peak a prefill reaches (0.45)")
    g.add_argument("--hbm-efficiency", type=float,
                   help="fraction of bandwidth a decode step reaches (0.7)")
    g.add_argument("--step-overhead-ms", type=float, help="fixed cost per step (2 ms)")
    g.add_argument("--pcie-gb-s", type=_positive_float, metavar="GB/S",
                   help="host -> device bandwidth of HiCache's load-backs, GB/s (the "
                        "preset's: one direction of the datasheet's PCIe figure, e.g. 64 for "
                        "the h200; model/gpus.py)")
    p = parser.add_argument_group("pools and scheduler (SGLang's flags)")
    p.add_argument("--cache-gb", type=float, default=100.0,
                   help="GPU memory left for KV + states (SGLang's rest memory)")
    p.add_argument("--memory", choices=("static", "unified"), default="static")
    p.add_argument("--mamba-full-memory-ratio", type=float, default=0.9)
    p.add_argument("--max-running-requests", type=_positive, default=None)
    p.add_argument("--page-size", type=_positive, default=64)
    p.add_argument("--chunked-prefill-size", type=_positive, default=8192)
    p.add_argument("--max-prefill-tokens", type=_positive, default=16384)
    p.add_argument("--mamba-track-interval", type=_positive, default=256)
    add_int8_arguments(p)
    p.add_argument("--disable-overlap-schedule", action="store_true",
                   help="SGLang's flag: the normal loop (event_loop_normal) instead of the "
                        "overlap loop, SGLang's default; also 1 tracking slot per request "
                        "instead of 2")
    p.add_argument("--schedule-policy", choices=defaults.SCHEDULE_POLICIES,
                   default=defaults.SCHEDULE_POLICY, help="the waiting queue's order (default "
                   f"{defaults.SCHEDULE_POLICY}, SGLang "
                   "0.5.23's; lpm: longest prefix match first, serve-sim's default until "
                   "2026-12-02)")
    a = parser.add_argument_group("arrivals")
    a.add_argument("--load", default="0.8", help="offered loads, e.g. 0.5,0.8,0.95: the GPU work of the trace with "
                        "no cache hit (prefill, and decode at the largest batch the pools "
                        "allow) over the arrival span")
    a.add_argument("--rate-scale", type=float, default=None,
                   help="instead of --load: multiply the trace's timestamps by this")
    a.add_argument("--clients", type=_positive, default=None,
                   help="closed loop: at most N requests in the server")
    a.add_argument("--arrivals", choices=("trace", "poisson"), default="trace",
                   help="with --load: the trace's timestamps rescaled (trace), or seeded "
                        "Poisson arrivals at the same rate in the trace's order (poisson; "
                        "also what a trace without timestamps gets)")
    a.add_argument("--seed", type=int, default=0,
                   help="seed of the Poisson arrival process (--arrivals poisson, or a "
                        "trace without timestamps)")
    parser.add_argument("--caches", default="stock,marconi",
                        help=f"comma-separated subset of {', '.join(CACHE_NAMES)}")
    r = parser.add_argument_group(
        "replicas behind a router (serving/cluster.py; cache_aware, round_robin, random "
        "re-implement sglang-router 0.3.2, serving/router.py)")
    r.add_argument("--replicas", type=_positive, default=1,
                   help="independent SGLang servers (each --cache-gb, its own cache); "
                        "--load is then the cluster's")
    r.add_argument("--dp-size", type=_positive, default=1,
                   help="SGLang's in-server data parallelism: N DP ranks (each its own "
                        "scheduler, pools and cache) behind its DP controller's round-robin "
                        "(router dp_round_robin); not with --replicas / --router")
    r.add_argument("--router", default=None,
                   help=f"comma-separated subset of {', '.join(ROUTERS)} (default with "
                        "--replicas > 1: cache_aware, the router's default)")
    r.add_argument("--router-cache-threshold", type=float, default=0.3,
                   help="cache_aware: route on the match when matched / input characters "
                        "is above this (sglang-router's --cache-threshold)")
    r.add_argument("--router-balance-abs-threshold", type=int, default=64,
                   help="cache_aware: balance when max - min in-flight exceeds this ...")
    r.add_argument("--router-balance-rel-threshold", type=float, default=1.5,
                   help="... and max exceeds this times min")
    r.add_argument("--router-eviction-interval-secs", type=int, default=60,
                   help="cache_aware: trim the tree every this many virtual seconds (0: never)")
    r.add_argument("--router-max-tree-size", type=_positive, default=1 << 26,
                   help="cache_aware: characters kept per replica at each trim")
    parser.add_argument("--limit", type=_positive, default=None, help="only the first N requests")
    parser.add_argument("--bookkeeping", choices=("measured", "cpu", "off"), default="measured",
                        help="add the cache's measured time to the clock: wall time "
                             "(measured), the thread's CPU time (cpu: what a call costs "
                             "without other processes' turns on a shared machine), or "
                             "nothing (off: deterministic)")
    add_marconi_arguments(parser)
    parser.add_argument("--interleave", action="store_true",
                        help="run the caches of each load side by side, one scheduler step each "
                             "in turn, instead of one after the other: the same decisions, and "
                             "bookkeeping ratios that a shared machine's drifting speed does not "
                             "skew (one server only; every cache in memory at once)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--plot", metavar="PNG", help="TTFT CDFs and P95 TTFT vs load")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def format_table(runs: list, columns=COLUMNS) -> str:
    if any("host" in r for r in runs):
        columns = columns + HOST_COLUMNS
    rows = [[h for h, _, _ in columns]]
    for r in runs:
        host = r.get("host", {})
        row = {**r, **{key: host[key] for _, key, _ in HOST_COLUMNS if key in host}}
        if r.get("crashed"):
            row["cache"] = f"{r['cache']} CRASHED"
        rows.append([fmt.format(row.get(key)) if row.get(key) is not None else "-"
                     for _, key, fmt in columns])
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows)


def build_setup(args):
    """(requests, ServeSetup, PoolSizes) from the parsed arguments (UserError on bad input)."""
    from sglang_marconi.harness.ab import to_replay_requests
    from sglang_marconi.serving.run import ServeSetup, pool_config
    from sglang_marconi.serving.scheduler import SchedulerConfig

    if args.mamba_track_interval % args.page_size or args.chunked_prefill_size % args.page_size:
        raise UserError("--mamba-track-interval and --chunked-prefill-size must be multiples "
                        f"of --page-size {args.page_size}")
    for name in ("mfu", "hbm_efficiency"):
        v = getattr(args, name)
        if v is not None and not 0 < v <= 1:
            raise UserError(f"--{name.replace('_', '-')}: expected a fraction in (0, 1], got {v}")
    spec = resolve_model(args.model, args.config, **server_model_kwargs(args))
    if not spec.is_hybrid:
        raise UserError(f"model {spec.name} has no SSM layers: Marconi needs a hybrid model")
    trace = read_trace(args.trace).head(args.limit)
    if not len(trace):
        raise UserError(f"{args.trace}: no requests")
    requests = to_replay_requests(trace)
    sizes = size_pools(spec, args.cache_gb, args.memory,
                       mamba_full_memory_ratio=args.mamba_full_memory_ratio,
                       page_size=args.page_size, max_running_requests=args.max_running_requests,
                       overlap=not args.disable_overlap_schedule)
    gpu = preset(args.gpu,
                 peak_flops=args.peak_tflops and args.peak_tflops * 1e12,
                 hbm_bytes_s=args.hbm_tbs and args.hbm_tbs * 1e12, mfu=args.mfu,
                 hbm_efficiency=args.hbm_efficiency,
                 step_overhead_s=None if args.step_overhead_ms is None
                 else args.step_overhead_ms / 1e3,
                 pcie_bytes_s=args.pcie_gb_s and args.pcie_gb_s * 1e9)
    longest = max(len(r.input_ids) + max(1, r.output_len) for r in requests)
    pools = pool_config(sizes, longest + 2 * args.page_size, args.chunked_prefill_size,
                        args.mamba_track_interval, overlap=not args.disable_overlap_schedule)
    sched = SchedulerConfig(max_running_requests=sizes.max_running_requests,
                            chunked_prefill_size=args.chunked_prefill_size,
                            max_prefill_tokens=args.max_prefill_tokens,
                            schedule_policy=args.schedule_policy,
                            measure_bookkeeping=args.bookkeeping != "off",
                            bookkeeping_cpu_time=args.bookkeeping == "cpu", clients=args.clients,
                            overlap=not args.disable_overlap_schedule)
    unified = None
    if sizes.mode == "unified":
        from sglang_marconi.driver.unified_pools import UnifiedConfig

        unified = UnifiedConfig.from_sizes(sizes)
    check_int8(args, unified=unified is not None, host=host_enabled(args))
    pools = dataclasses.replace(pools, **int8_pool_fields(args),
                                **resolve_host(args, spec, sizes.kv_tokens, sizes.mamba_slots,
                                               unified))
    setup = ServeSetup(spec=spec, time_model=GpuTimeModel(spec, gpu), pools=pools,
                       sched=sched, settings=settings_from_args(args),
                       timestamps=[r.timestamp for r in trace.requests], seed=args.seed,
                       unified=unified, poisson=args.arrivals == "poisson",
                       l3=args.hicache_storage_backend == "file")
    return requests, setup, sizes


def run(args) -> int:
    return run_with_sglang(_run, args)


def _run(args) -> int:
    logging.getLogger("sglang").setLevel(logging.ERROR)  # retraction warnings: counted
    from sglang_marconi.serving.run import run_grid

    caches = parse_caches(args.caches)
    if args.rate_scale is not None and not args.rate_scale >= 0:
        raise UserError(f"--rate-scale: expected a number >= 0, got {args.rate_scale}")
    loads = _loads(args.load)
    routers = _routers(args.router) if args.router is not None else None
    if args.dp_size > 1:
        if args.replicas > 1 or routers is not None:
            raise UserError("--dp-size (one server's DP ranks behind its own controller) does "
                            "not combine with --replicas / --router")
        args.replicas, routers = args.dp_size, ("dp_round_robin",)
    if routers is None and args.replicas > 1:
        routers = ("cache_aware",)
    if routers is not None and args.clients is not None:
        raise UserError("--clients (a closed loop of one server) does not combine with "
                        "--replicas / --router")
    if routers is not None and host_enabled(args):
        raise UserError("--hicache-*: the host tier is built for one server; it does not "
                        "combine with --replicas / --router / --dp-size yet")
    if routers is not None and args.interleave:
        raise UserError("--interleave runs one server per cache side by side; it does not "
                        "combine with --replicas / --router / --dp-size")
    if routers is not None and args.plot:
        raise UserError("--plot draws single-server runs; it does not combine with "
                        "--replicas / --router")
    if routers is not None:
        options = router_options(args)
        make_router("cache_aware", ["check"], **options["cache_aware"])  # bad flags: fail early
    requests, setup, sizes = build_setup(args)
    config = {"trace": str(args.trace), "model": setup.spec.name, "requests": len(requests),
              "gpu": setup.time_model.gpu.as_dict(), "pools": sizes.as_dict(),
              "schedule_policy": args.schedule_policy, "bookkeeping": args.bookkeeping,
              "clients": args.clients, "arrivals": args.arrivals, "seed": args.seed,
              "loop": "normal" if args.disable_overlap_schedule else "overlap",
              "interleaved": args.interleave, **host_summary(args, setup.spec, setup.pools),
              **int8_summary(setup.spec, setup.pools)}
    if routers is not None:
        return _run_cluster(args, requests, setup, sizes, caches, loads, routers, options, config)
    result = run_grid(requests, setup, caches, loads, args.rate_scale,
                      show_progress=not args.no_progress, interleave=args.interleave)
    if args.plot:
        from sglang_marconi.serving.plots import plot_serving

        plot_serving(result, args.plot, f"{setup.spec.name} on {args.gpu}, {sizes.describe()}")
    ratios = bookkeeping_ratios(result["runs"]) if args.bookkeeping != "off" else []
    if args.json:
        json.dump({"runs": result["runs"], "bookkeeping_ratios": ratios, "config": config},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"serve-sim {args.trace}: {len(requests)} requests, model {setup.spec.name}; "
              f"{sizes.describe()}; {setup.time_model.describe()}")
        if "int8_checkpoints" in config:
            print(describe_int8(config["int8_checkpoints"]))
        print(format_table(result["runs"]))
        print(describe_model(setup.spec))
        for line in format_ratios(ratios):
            print(line)
    report_crashes(result["runs"])
    return 0


def report_crashes(runs) -> None:
    """One line on stderr per run whose server SGLang crashed (in the JSON: ``crashed``)."""
    for r in runs:
        if r.get("crashed"):
            where = f"{r.get('router', '')} {r['cache']}@{r.get('load', r.get('rate_scale'))}"
            print(f"serve-sim: {where.strip()}: the server crashed: {r['crashed']}; its "
                  "figures cover only what ran before", file=sys.stderr)


def format_ratios(ratios) -> list:
    """One line per cache and load: its total bookkeeping over stock's and stock-python's."""
    def times(x):
        return "-" if x is None else f"{x:.2f}x"

    return [f"bookkeeping {r['cache']}@{r['load']}: {r['bookkeeping_s_total']:.2f} s, "
            f"{times(r['vs_stock'])} stock (compiled core), "
            f"{times(r['vs_stock_python'])} stock-python" for r in ratios]


def router_options(args) -> dict:
    """Router name -> its options from the ``--router-*`` flags."""
    return {"cache_aware": {"cache_threshold": args.router_cache_threshold,
                            "balance_abs_threshold": args.router_balance_abs_threshold,
                            "balance_rel_threshold": args.router_balance_rel_threshold,
                            "eviction_interval_secs": args.router_eviction_interval_secs,
                            "max_tree_size": args.router_max_tree_size}}


def _run_cluster(args, requests, setup, sizes, caches, loads, routers, options, config) -> int:
    from sglang_marconi.serving.run import run_cluster_grid

    runs = run_cluster_grid(requests, setup, args.replicas, routers, caches, loads,
                            args.rate_scale, options, show_progress=not args.no_progress)
    config.update(replicas=args.replicas, router_options=options)
    if args.json:
        json.dump({"runs": runs, "config": config}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"serve-sim {args.trace}: {len(requests)} requests, {args.replicas} replicas of "
              f"{sizes.describe()}; model {setup.spec.name}; {setup.time_model.describe()}")
        print(format_table(runs, CLUSTER_COLUMNS))
        print(describe_model(setup.spec))
    report_crashes(runs)
    return 0
