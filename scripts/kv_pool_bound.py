"""How close stock SGLang and marconi+ come to what any cache could save in SGLang's static
KV pool: an upper bound from a linear programme that knows the future (analysis and its
relaxations: scripts/lib/marconi_reports/kv_pool_bound.py).

The pools are sized as `ab` and `sim` size them (`--cache-gb N`, static, SGLang's default
split, or `--kv-tokens K --mamba-slots S`); the caches (`ab` cache names) replay the same
trace on them through SGLang's own cache objects, as `ab` does (its default overlap loop,
page 64). Prints, per cache, FLOPs saved, its share of the bound and its ratio to the
first cache; then what the optimum holds, by how often the reused block was used before
(the signal an online cache has: the reuse count).

Usage: python scripts/kv_pool_bound.py [--trace PATH] [--limit N] [--model paper-7b]
       [--cache-gb 100 | --kv-tokens K --mamba-slots S] [--caches stock,marconi] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

from sglang_marconi.cli.common import run_with_sglang  # noqa: E402
from sglang_marconi.cli.pool_flags import (add_pool_arguments, check_pools_fit,  # noqa: E402
                                            pool_sizes, positive_int)
from sglang_marconi.errors import UserError  # noqa: E402
from sglang_marconi.model import resolve_model  # noqa: E402
from marconi_reports.formatting import pct, text_table  # noqa: E402
from marconi_reports.kv_pool_bound import (held_by_reuse_class, kv_pool_bound,  # noqa: E402
                                           mooncake_blocks, reuse_intervals)
from marconi_reports.sweeps import MOONCAKE_TRACE  # noqa: E402
from sglang_marconi.sim.traces import MOONCAKE_BLOCK, detect_format, read_trace  # noqa: E402

DEFAULT_CACHES = "stock,marconi"
CACHE_NAMES = ("stock", "stock-python", "marconi", "marconi-paper")


def cache_savings(trace, spec, caches, kv_tokens: int, mamba_slots: int, page: int,
                  max_len: int) -> dict:
    """Each cache's FLOPs saved (a fraction of all prefill FLOPs) on SGLang's static pools,
    replayed through SGLang's own cache objects as ``ab`` replays them."""
    from sglang_marconi.driver.pools import PoolConfig  # torch, sglang
    from sglang_marconi.harness.ab import ABConfig, run_ab, to_replay_requests

    pools = PoolConfig(kv_tokens=kv_tokens, mamba_slots=mamba_slots, page_size=page,
                       max_context_len=max_len, overlap_schedule=True)
    results = run_ab(to_replay_requests(trace), ABConfig(pools=pools, spec=spec,
                                                         caches=tuple(caches)),
                     show_progress=False)
    return {name: col["flops_saved_fraction"] for name, col in results["caches"].items()}


def run(args) -> dict:
    spec = resolve_model(args.model, None)
    kv_tokens, mamba_slots, sizes = pool_sizes(args, spec)
    if sizes is not None and sizes.mode != "static":
        raise UserError("--memory unified: one byte buffer holds KV and states; this bound "
                        "is for the static layout's KV pool (--memory static)")
    if detect_format(args.trace) != "mooncake":
        raise UserError(f"{args.trace}: the bound needs a Mooncake trace (hash blocks; outputs "
                        "never part of a later input), not a session trace")
    trace = read_trace(args.trace)
    trace.requests = trace.requests[:args.limit] if args.limit else trace.requests
    longest = max(r.input_len + max(1, r.output_len) for r in trace.requests)
    max_len = check_pools_fit(args, kv_tokens, mamba_slots, longest, args.page_size)
    names = [n.strip() for n in args.caches.split(",") if n.strip()]
    bad = [n for n in names if n not in CACHE_NAMES]
    if bad or not names:
        raise UserError(f"--caches: unknown {', '.join(bad) or 'empty list'}; known: "
                        f"{', '.join(CACHE_NAMES)}")
    intervals = reuse_intervals(mooncake_blocks(trace), spec)
    bound = kv_pool_bound(intervals, kv_tokens)
    caches = run_with_sglang(lambda _: cache_savings(trace, spec, names, kv_tokens,
                                                     mamba_slots, args.page_size, max_len),
                             args)
    return {"trace": str(args.trace), "requests": len(trace.requests), "model": args.model,
            "kv_tokens": kv_tokens, "mamba_slots": mamba_slots, "block": MOONCAKE_BLOCK,
            "bound": bound.fraction, "never_evicting_kv_only": bound.never_evicting,
            "fractional_intervals": bound.fractional, "intervals": len(intervals.start),
            "caches": caches,
            "held_by_uses_before": [dict(zip(("uses_before", "intervals", "share_held",
                                              "worth_held", "worth_all"), row))
                                    for row in held_by_reuse_class(intervals, bound)]}


def report(out: dict) -> str:
    lines = [f"{Path(out['trace']).name}: {out['requests']:,} requests | {out['model']} | "
             f"static pools: {out['kv_tokens']:,} KV tokens, {out['mamba_slots']:,} state slots",
             f"upper bound (future known, a state wherever a hit ends, {out['block']}-token "
             f"blocks): {out['bound']:.2%} of prefill FLOPs; never evicting (KV only): "
             f"{out['never_evicting_kv_only']:.2%}", ""]
    first = next(iter(out["caches"].values()), None)
    rows = [[name, f"{v:.2%}", f"{v / out['bound']:.1%}" if out["bound"] else "-",
             f"{v / first:.3f}x" if first else "-"] for name, v in out["caches"].items()]
    width = max([len(n) for n in out["caches"]] + [5]) + 2
    lines += text_table((("cache", f"<{width}"), ("FLOPs saved", ">12"),
                         ("of the bound", ">14"), ("x first", ">10")), rows)
    lines += ["", "what the optimum holds, by the reused block's uses before:"]
    lines += text_table(
        (("uses before", "<13"), ("intervals", ">10"), ("held", ">7"), ("worth held", ">12"),
         ("worth of all", ">14")),
        [[r["uses_before"], f"{r['intervals']:,}", f"{r['share_held']:.0%}",
          pct(r["worth_held"]), pct(r["worth_all"])] for r in out["held_by_uses_before"]])
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(MOONCAKE_TRACE), help="a Mooncake trace")
    ap.add_argument("--limit", type=positive_int, default=None, help="the first N requests")
    ap.add_argument("--model", default="paper-7b")
    ap.add_argument("--caches", default=DEFAULT_CACHES,
                    help=f"ab caches replayed on the same pools, of {', '.join(CACHE_NAMES)} "
                         f"(default {DEFAULT_CACHES})")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    add_pool_arguments(ap)
    ap.set_defaults(page_size=64)
    args = ap.parse_args(argv)
    try:
        out = run(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(out) if args.json else report(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
