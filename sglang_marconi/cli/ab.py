"""``python -m sglang_marconi ab``: replay a trace through stock SGLang caches and the
Marconi cache on CPU and print them side by side (``--json`` for machines)."""
from __future__ import annotations

import argparse
import json
import sys

from sglang_marconi.cli.common import (add_trace_model_arguments, describe_model,
                                        run_with_sglang, server_model_kwargs)
from sglang_marconi.cli.host_flags import (add_host_arguments, host_enabled, host_summary,
                                           resolve_host)
from sglang_marconi.cli.pool_flags import (add_int8_arguments, add_pool_arguments,
                                           check_int8, check_pools_fit, describe_int8,
                                           describe_pools, int8_pool_fields, int8_summary,
                                           pool_summary, positive_int, resolve_pools)
from sglang_marconi.errors import UserError
from sglang_marconi.model import resolve_model
from sglang_marconi.policy import defaults
from sglang_marconi.sglang_integration.options import (MarconiSettings, add_settings_arguments,
                                                       settings_given)
from sglang_marconi.sim.traces import read_trace

CACHE_NAMES = ("stock", "stock-python", "marconi", "marconi+", "marconi-paper")
DEFAULT_CACHES = ("stock", "stock-python", "marconi")

ROWS = (  # (label, key, format)
    ("token hit rate", "token_hit_rate", "{:.2%}"),
    ("KV matched past the hit (tokens)", "lost_reuse_tokens", "{:,}"),
    ("FLOPs saved", "flops_saved", "{:.3e}"),
    ("FLOPs saved / all prefill", "flops_saved_fraction", "{:.2%}"),
    ("states admitted", "states_admitted", "{:,}"),
    ("states evicted", "states_evicted", "{:,}"),
    ("KV tokens evicted", "kv_tokens_evicted", "{:,}"),
    ("peak KV token slots used", "peak_kv_slots_used", "{:,}"),
    ("peak state slots used", "peak_state_slots_used", "{:,}"),
    ("bookkeeping ms / request", "bookkeeping_ms_per_request", "{:.2f}"),
    ("bookkeeping ms p50", "bookkeeping_ms_p50", "{:.2f}"),
    ("bookkeeping ms p95", "bookkeeping_ms_p95", "{:.2f}"),
    ("bookkeeping ms p99", "bookkeeping_ms_p99", "{:.2f}"),
    ("bookkeeping ms max request", "bookkeeping_ms_max_request", "{:.2f}"),
    ("longest cache call ms", "bookkeeping_ms_max", "{:.2f}"),
    ("wall seconds", "wall_seconds", "{:.1f}"),
    # the collector's pauses during the run (the trace frozen out of it), not bookkeeping
    ("GC collections", "gc_collections", "{:,}"),
    ("GC pause max s", "gc_pause_s_max", "{:.3f}"),
)
HOST_ROWS = (  # with a host tier (--hicache-*): the "host" section
    ("host: hit tokens (loaded back)", "hit_tokens", "{:,}"),
    ("host: FLOPs saved by host hits", "flops_saved", "{:.3e}"),
    ("host: bytes loaded to device", "bytes_loaded", "{:.3e}"),
    ("host: bytes backed up", "bytes_backed_up", "{:.3e}"),
    ("host: KV tokens evicted", "kv_tokens_evicted", "{:,}"),
    ("host: states evicted", "states_evicted", "{:,}"),
    ("host: L3 tokens fetched", "storage_hit_tokens", "{:,}"),
)


_positive = positive_int
def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_trace_model_arguments(parser)
    parser.add_argument("--limit", type=_positive, default=None,
                        help="replay only the first N requests")
    add_replay_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """The replay's flags (``ab``, ``sim``): pools, scheduler, caches, Marconi, host tier."""
    add_pool_arguments(parser)
    parser.add_argument("--page-size", type=_positive, default=64)
    parser.add_argument("--chunked-prefill-size", type=_positive, default=8192)
    parser.add_argument("--mamba-track-interval", type=_positive, default=256)
    parser.add_argument("--mamba-radix-cache-strategy", choices=("extra_buffer", "no_buffer"),
                        default="extra_buffer",
                        help="where states are taken, as SGLang's flag: extra_buffer (what "
                             "auto picks for hybrid models; default) or no_buffer (one state "
                             "at the end; page size 1)")
    parser.add_argument("--disable-overlap-schedule", action="store_true",
                        help="SGLang's flag: the normal loop's order instead of the overlap "
                             "loop's (SGLang's default), and 1 tracking slot per running "
                             "request instead of 2 (driver.replay.Replayer)")
    add_int8_arguments(parser)
    parser.add_argument("--caches", default=",".join(DEFAULT_CACHES),
                        help=f"comma-separated subset of {', '.join(CACHE_NAMES)}")
    add_marconi_arguments(parser)
    parser.add_argument("--per-request", action="store_true",
                        help="with --json: each cache's tokens hit per request, in order "
                             "(hit_tokens_per_request), and the tokens whose KV matched past "
                             "the hit (lost_reuse_tokens_per_request)")


def add_marconi_arguments(parser: argparse.ArgumentParser) -> None:
    """The Marconi cache's flags, as the server has them (``ab`` and ``serve-sim``)."""
    add_settings_arguments(parser.add_argument_group(
        "the Marconi cache (the server's flags; the marconi-paper column takes the paper's "
        f"admission and, without --marconi-alpha, alpha {defaults.PAPER_ALPHA:g})"))
    add_host_arguments(parser)


def _caches(text: str) -> tuple:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in CACHE_NAMES]
    if bad or not names:
        raise UserError(f"--caches: unknown {', '.join(bad) or 'empty list'}; "
                        f"known: {', '.join(CACHE_NAMES)}")
    return names


def _settings(args):
    try:
        return MarconiSettings(**settings_given(args))
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _check_pools(args, requests, kv_tokens: int, mamba_slots: int) -> int:
    """The longest request must fit the pools; returns the max context length to size."""
    longest = max(len(r.input_ids) + max(1, r.output_len) for r in requests)
    need = check_pools_fit(args, kv_tokens, mamba_slots, longest, args.page_size)
    if args.mamba_track_interval % args.page_size or args.chunked_prefill_size % args.page_size:
        raise UserError("--mamba-track-interval and --chunked-prefill-size must be multiples "
                        f"of --page-size {args.page_size}")
    if args.mamba_radix_cache_strategy == "no_buffer" and args.page_size != 1:
        raise UserError("--mamba-radix-cache-strategy no_buffer needs --page-size 1 "
                        "(as in SGLang)")
    check_int8(args, unified=args.memory == "unified", host=host_enabled(args))
    if args.mamba_radix_cache_strategy == "no_buffer" and not args.disable_overlap_schedule:
        raise UserError("--mamba-radix-cache-strategy no_buffer needs "
                        "--disable-overlap-schedule (as in SGLang: mamba_hook.py 156-160)")
    return need


def format_table(results: dict) -> str:
    names = list(results["caches"])
    cols = [results["caches"][n] for n in names]
    width = max(len(r[0]) for r in ROWS + HOST_ROWS) + 2
    colw = max(14, *(len(n) + 2 for n in names))
    lines = ["".ljust(width) + "".join(n.rjust(colw) for n in names)]
    for label, key, fmt in ROWS:
        lines.append(label.ljust(width) + "".join(fmt.format(c.get(key, 0)).rjust(colw)
                                                  for c in cols))
    if any("host" in c for c in cols):
        for label, key, fmt in HOST_ROWS:
            lines.append(label.ljust(width) + "".join(
                fmt.format(c.get("host", {}).get(key, 0)).rjust(colw) for c in cols))
    for n, c in zip(names, cols):
        m = c.get("marconi")
        if m:
            adm = ", ".join(f"{k}={v}" for k, v in m["states_admitted"].items())
            ev = ", ".join(f"{k}={v}" for k, v in m["states_evicted"].items())
            plus = m.get("ranking") == "reuse-weighted"
            skipped = f"; end states skipped {m['end_states_skipped']}" if plus else ""
            policy = ("reuse-weighted FLOPs per byte with GDSF aging" if plus
                      else f"the paper's ranking, alpha={m['alpha']:g}")
            host = m.get("host_evicted", {})
            ranked = (f"; host victims by the two-tier rule: KV leaves {host['full']}, "
                      f"states {host['mamba']}" if "host" in c and host else "")
            lines.append(f"{n}: {policy}; admitted {adm}; rejected "
                         f"{m['states_rejected']}{skipped}; evicted {ev}{ranked}")
    return "\n".join(lines)


def run(args) -> int:
    return run_with_sglang(_run, args)


def _run(args) -> int:
    spec = resolve_model(args.model, args.config, **server_model_kwargs(args))
    return run_replay(args, spec, read_trace(args.trace), str(args.trace))


def run_replay(args, spec, trace, label: str, settings=None) -> int:
    """``trace`` through every cache of ``--caches`` on the pools the flags size, printed
    as a table or JSON (``ab``, and ``sim`` without ``--paper``); ``settings``: the Marconi
    columns' ``MarconiSettings`` (the Python API; default: from the flags)."""
    # torch and sglang: only for a run, not for --help
    from sglang_marconi.driver.pools import PoolConfig
    from sglang_marconi.harness.ab import ABConfig, run_ab, to_replay_requests

    caches = _caches(args.caches)
    settings = settings or _settings(args)
    if not spec.is_hybrid:
        raise UserError(f"model {spec.name} has no SSM layers: Marconi needs a hybrid model")
    requests = to_replay_requests(trace, args.limit)
    if not requests:
        raise UserError(f"{label}: no requests")
    kv_tokens, mamba_slots, sizes, unified = resolve_pools(args, spec)
    max_len = _check_pools(args, requests, kv_tokens, mamba_slots)
    pools = PoolConfig(kv_tokens=kv_tokens, mamba_slots=mamba_slots, page_size=args.page_size,
                       max_context_len=max_len, chunked_prefill_size=args.chunked_prefill_size,
                       mamba_track_interval=args.mamba_track_interval,
                       extra_buffer=args.mamba_radix_cache_strategy == "extra_buffer",
                       overlap_schedule=not args.disable_overlap_schedule,
                       **int8_pool_fields(args),
                       **resolve_host(args, spec, kv_tokens, mamba_slots, unified))
    cfg = ABConfig(pools=pools, spec=spec, settings=settings, caches=caches, unified=unified,
                   l3=args.hicache_storage_backend == "file",
                   overlap=not args.disable_overlap_schedule)
    results = run_ab(requests, cfg, show_progress=not args.no_progress,
                     per_request=args.per_request)
    results["config"] = {"trace": label, "model": spec.name,
                         "kv_bytes_per_token": spec.kv_bytes_per_token,
                         "state_bytes": spec.ssm_state_bytes, "tp_size": spec.tp_size,
                         "cache_dtypes": vars(spec.cache_dtypes) if spec.cache_dtypes else None,
                         "requests": len(requests), "kv_tokens": kv_tokens,
                         "mamba_slots": mamba_slots, "page_size": args.page_size,
                         "pools": pool_summary(sizes, kv_tokens, mamba_slots),
                         "chunked_prefill_size": args.chunked_prefill_size,
                         "mamba_track_interval": args.mamba_track_interval,
                         "mamba_radix_cache_strategy": args.mamba_radix_cache_strategy,
                         "loop": "normal" if args.disable_overlap_schedule else "overlap",
                         **int8_summary(spec, pools), "marconi_alpha": settings.alpha,
                         "marconi_max_states_per_request": settings.max_states_per_request,
                         **host_summary(args, spec, pools)}
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"A/B on {label}: {len(requests)} requests, page {args.page_size}; "
              f"{describe_pools(sizes, kv_tokens, mamba_slots)}")
        if pools.int8_checkpoint:
            print(describe_int8(results["config"]["int8_checkpoints"]))
        print(describe_model(spec))
        print(format_table(results))
    return 0
