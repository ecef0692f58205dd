"""The cache bookkeeping benchmark's report (``scripts/bench_overhead.py``, docs/overhead.md):
``run`` makes the three measurements of ``marconi_reports.overhead`` in turn with the command line's
options and prints their plain-text tables (``format_replay``, ``format_scaling``,
``format_sim``) as each finishes; ``--json`` gets every number."""
from __future__ import annotations

import gc
import json
import os
import time
import warnings
from pathlib import Path

from sglang_marconi.model import preset_spec
from marconi_reports.formatting import text_table
from marconi_reports.overhead import (
    REPLAY_CACHES,
    REQ_LEN,
    SEQ,
    load_requests,
    ratios,
    replay_config,
    replay_memory,
    replay_timing,
    scaling,
    sim_scaling,
)

REPLAY_COLUMNS = (("cache", "<14"), ("alpha", ">6"), ("mean ms", ">9"), ("P50 ms", ">8"),
                  ("P99 ms", ">8"), ("evict ms", ">9"), ("evicts", ">7"), ("mean/stock", ">11"),
                  ("P99/stock", ">10"), ("mean/py", ">8"), ("P99/py", ">7"),
                  ("call mean ms", ">13"), ("call P99 ms", ">12"), ("call max ms", ">12"))
CALL_LIMIT_MS = 50.0  # the longest single cache call allowed
MEMORY_COLUMNS = (("cache", "<14"), ("peak MiB", ">9"), ("end MiB", ">8"), ("hit rate", ">9"),
                  ("states in", ">10"), ("states out", ">11"))
SCALING_COLUMNS = (("scenario", "<9"), ("nodes", ">9"), ("cache", ">14"), ("tree nodes", ">11"),
                   ("reqs", ">6"), ("ms/req", ">9"), ("evict calls", ">12"),
                   ("ms/evict call", ">14"), ("evicted/call", ">13"))
SIM_COLUMNS = (("nodes", ">9"), ("requests", ">10"), ("us/request", ">12"), ("evictions", ">11"),
               ("us/eviction", ">13"), ("P99 us", ">9"), ("max us", ">10"), ("rebuilds", ">10"))


def _or_dash(x, fmt):
    return "-" if x is None else fmt.format(x)


def format_replay(timing: dict, memory: dict, target: float) -> str:
    """The replay's timing table, the tuning and target lines, then the memory table."""
    names = list(timing)
    rows = []
    for n in names:
        t = timing[n]
        r = ratios(timing, n)
        rs = r.get("stock", {}) if n != "stock" else {}
        rp = r.get("stock-python", {}) if n not in ("stock", "stock-python") else {}
        alpha = f"{t['alpha']:g}" if "alpha" in t and n != "marconi+" else "-"
        rows.append((n, alpha, *[f"{t[k]:.2f}" for k in ("mean_ms", "p50_ms", "p99_ms",
                                                         "evict_ms", "evict_calls_per_request")],
                     *[_or_dash(x.get(k), "{:.3f}") for x in (rs, rp) for k in ("mean", "p99")],
                     *[f"{t[k]:.2f}" for k in ("call_mean_ms", "call_p99_ms", "call_max_ms")]))
    lines = text_table(REPLAY_COLUMNS, rows)
    lines.append("(ms per request; evict ms = time inside the cache's _evict per request, "
                 "evicts = _evict calls per request; /stock = over the compiled core, "
                 "SGLang's default; /py = over stock-python; call = one cache call the "
                 "scheduler makes: match, lock, unlock, checkpoint, evict, free, release)")
    for n in names:
        t = timing[n]
    if "marconi" in timing and "stock" in timing:
        r = ratios(timing)["stock"]["mean"]
        lines.append(f"target: marconi mean within {target:g}x of stock (compiled core): "
                     f"{r:.3f}x -> {'PASS' if r <= target else 'MISS'}")
    longest = {n: timing[n]["call_max_ms"] for n in names}
    lines.append(f"longest single cache call: {max(longest.values()):.1f} ms "
                 f"({max(longest, key=longest.get)}); limit {CALL_LIMIT_MS:g} ms -> "
                 + ("PASS" if max(longest.values()) <= CALL_LIMIT_MS else "MISS"))
    lines.append("")
    mem = {n: memory.get(n, {}) for n in names}
    lines += text_table(MEMORY_COLUMNS, [
        (n, _or_dash(mem[n].get("peak_mib"), "{:.1f}"), _or_dash(mem[n].get("end_mib"), "{:.1f}"),
         f"{timing[n]['token_hit_rate']:.2%}", f"{timing[n]['states_admitted']:,}",
         f"{timing[n]['states_evicted']:,}") for n in names])
    return "\n".join(lines)


def _evicted_per_call(r) -> float:
    """Nodes freed per eviction call: states (state scenario) or 128-token sequences (kv)."""
    if not r["evict_calls"]:
        return 0.0
    freed = r["states_evicted"] if r["scenario"] == "state" else r["kv_tokens_evicted"] / SEQ
    return freed / r["evict_calls"]


def format_scaling(rows: list) -> str:
    return "\n".join(text_table(SCALING_COLUMNS, [
        (r["scenario"], f"{r['nodes_target']:,}", r["cache"],
         "-" if r["nodes"] is None else f"{r['nodes']:,}", r["requests"],
         f"{r['ms_per_request']:.2f}", r["evict_calls"], f"{r['ms_per_evict_call']:.3f}",
         f"{_evicted_per_call(r):.2f}") for r in rows]))


def format_sim(rows: list) -> str:
    return "\n".join(text_table(SIM_COLUMNS, [
        (f"{r['nodes']:,}", f"{r['requests']:,}", f"{r['us_per_request']:.1f}",
         f"{r['evictions']:,}", f"{r['us_per_eviction']:.1f}", f"{r['us_eviction_p99']:.1f}",
         f"{r['us_eviction_max']:.0f}", r["queue_rebuilds"]) for r in rows]))


def parse_sizes(text: str) -> tuple:
    """``"1000,1e4"`` -> ``(1000, 10000)``."""
    return tuple(int(float(x)) for x in text.split(",") if x.strip())


def run(args) -> int:
    """Every part not in ``args.skip``, printed as it finishes; ``args``: the options of
    ``scripts/bench_overhead.py`` (after ``--quick`` set its values). Returns the exit
    status (1 with ``args.strict`` on a MISS)."""
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    warnings.filterwarnings("ignore", category=UserWarning)


    t_all = time.perf_counter()
    out = {"config": {k: v for k, v in vars(args).items()}, "cpus": os.cpu_count()}
    spec = preset_spec(args.model)
    verdict = None
    if "replay" not in skip:
        t0 = time.perf_counter()
        requests = load_requests(Path(args.trace), args.limit)
        cfg = replay_config(requests, args.model, args.kv_tokens, args.mamba_slots,
                            alpha=args.alpha)
        names = REPLAY_CACHES + (("marconi-paper",) if args.paper else ())
        print(f"replay: {args.trace}: {len(requests):,} requests, "
              f"{sum(len(r.input_ids) for r in requests):,} input tokens, model {spec.name}, "
              f"{cfg.pools.kv_tokens:,} KV token slots, {cfg.pools.mamba_slots} state slots, "
              f"page {cfg.pools.page_size}; caches interleaved request by request; "
              f"{os.cpu_count()} CPUs", flush=True)
        timing = replay_timing(requests, cfg, names, args.alpha, progress=True)
        memory = {}
        if args.memory_limit:
            memory = replay_memory(requests[:args.memory_limit], cfg, names, args.alpha)
        print(format_replay(timing, memory, args.target))
        if memory:
            print(f"peak / end MiB: tracemalloc, a separate untimed pass over the first "
                  f"{min(args.memory_limit, len(requests)):,} requests, one cache at a time, "
                  "counted from just before the cache is built; Python allocations only (the "
                  "pools' torch tensors and the compiled core's tree are not traced)")
        print(f"replay part: {time.perf_counter() - t0:.0f} s", flush=True)
        if "marconi" in timing and "stock" in timing:
            verdict = ("PASS" if ratios(timing)["stock"]["mean"] <= args.target
                       else "MISS")
        out["replay"] = {"timing": timing, "memory": memory,
                         "ratios": ratios(timing) if "marconi" in timing else {},
                         "verdict": verdict}
        del requests
        gc.collect()
    if "scaling" not in skip:
        t0 = time.perf_counter()
        rows = scaling(parse_sizes(args.sizes), spec, alpha=args.alpha,
                       max_requests=args.scale_requests, budget_s=args.scale_budget_s,
                       progress=True)
        print(f"\nscaling (SGLang caches, alpha {args.alpha:g}): trees of distinct {SEQ}-token "
              f"sequences (one node and one state each); requests of {REQ_LEN} tokens; "
              "state = state pool full (MAMBA walk), kv = token pool full (FULL walk); "
              "'tree nodes' = live nodes of the python core after the run")
        print(format_scaling(rows))
        print(f"scaling part: {time.perf_counter() - t0:.0f} s", flush=True)
        out["scaling"] = rows
    if "sim" not in skip:
        t0 = time.perf_counter()
        rows = sim_scaling(parse_sizes(args.sizes), spec, args.alpha, args.sim_requests)
        print(f"\nsimulator PrefixCache (alpha {args.alpha:g}): byte budget full of distinct "
              f"{SEQ}-token sequences; each measured request evicts")
        print(format_sim(rows))
        print(f"simulator part: {time.perf_counter() - t0:.0f} s", flush=True)
        out["sim"] = rows
    total = time.perf_counter() - t_all
    print(f"\ntotal {total:.0f} s")
    out["total_s"] = total
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str) + "\n")
    return 1 if args.strict and verdict == "MISS" else 0
