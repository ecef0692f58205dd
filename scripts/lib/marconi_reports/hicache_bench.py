"""Issue 20's evidence grid: stock vs Marconi caches in SGLang with its host tier (HiCache).

For each model, host-memory size (``--hicache-size`` GB) and write policy, the CPU A/B
(``harness/ab.py``: SGLang's real caches and host tier driven with the scheduler's calls)
on device pools sized from one budget (``--cache-gb``, static split, SGLang's default) for
each cache: stock (the compiled tree core), marconi (the server's defaults: online alpha)
and marconi+, each Marconi cache once per host rule given (``marconi+:host=lru`` keeps
SGLang's host LRU; see ``policy/host_tier.py``). A cell's row is the A/B column with its
``host`` section (tokens hit from host, bytes loaded, evictions per tier).

``run`` replays the cells not yet in a JSON-lines file (``processes`` at a time) and
appends one line per cell; ``analyze`` makes the rows and the targets' PASS/MISS;
``markdown`` the table.
"""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Optional

from sglang_marconi.driver.pools import PoolConfig
from sglang_marconi.driver.sizing import size_pools
from sglang_marconi.model import preset_spec
from sglang_marconi.cli.host_flags import ratio_for_size
from marconi_reports import cell_runs
from marconi_reports.formatting import table
from sglang_marconi.sglang_integration.options import MarconiSettings

MODELS = ("paper-7b", "qwen3_next")
DEVICE_GB = 100
HOST_GB = (200, 400)
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
CACHES = ("stock", "marconi+")  # marconi+: what --cache-policy marconi runs
TARGET = ("paper-7b", 400, "write_through")  # marconi+ >= 1.2x stock here
TARGET_GAIN = 1.2


def parse_cache(name: str) -> tuple:
    """``marconi+:host=lru`` -> ("marconi+", {"host": "lru"})."""
    base, _, opts = name.partition(":")
    options = dict(o.split("=", 1) for o in opts.split(",") if o)
    return base, options


def grid(models=MODELS, host_gbs=HOST_GB, policies=WRITE_POLICIES, caches=CACHES) -> list:
    """Every cell, the target's first."""
    cells = [{"model": m, "device_gb": DEVICE_GB, "host_gb": h, "policy": p, "cache": c}
             for m in models for h in host_gbs for p in policies for c in caches]
    cells.sort(key=lambda c: (c["model"], c["host_gb"], c["policy"]) != TARGET)
    return cells


def cell_key(c: dict) -> tuple:
    return (c["model"], c["device_gb"], c["host_gb"], c["policy"], c["cache"])




def cell_config(cell: dict, requests: list):
    """The A/B configuration of one cell (``cell["cache"]``'s settings) for ``requests``:
    (``harness.ab.ABConfig``, the cache's A/B name, the host/device ratio, the pool sizes)."""
    # heavy: sglang and torch, only in the worker that replays
    from sglang_marconi.harness.ab import ABConfig

    spec = preset_spec(cell["model"])
    sizes = size_pools(spec, cell["device_gb"], "static")
    longest = max(len(r.input_ids) + max(1, r.output_len) for r in requests)
    ratio = ratio_for_size(cell["host_gb"], spec, sizes.kv_tokens, sizes.mamba_slots)
    pools = PoolConfig(kv_tokens=sizes.kv_tokens, mamba_slots=sizes.mamba_slots,
                       max_context_len=longest + 128, hicache_write_policy=cell["policy"],
                       hicache_ratio=ratio)
    name, options = parse_cache(cell["cache"])
    settings = MarconiSettings()
    if "host" in options:
        settings = dataclasses.replace(settings, host_rule=options["host"])
    return ABConfig(pools=pools, spec=spec, settings=settings, caches=(name,)), name, ratio, sizes


def run_cell(cell: dict, trace: str, limit: Optional[int] = None) -> dict:
    """One cache on one device budget + host tier: the A/B column plus the cell."""
    warnings.filterwarnings("ignore", category=UserWarning)
    from sglang_marconi.harness.ab import run_one  # heavy: sglang and torch

    requests = cell_runs.requests(trace, limit)
    cfg, name, ratio, sizes = cell_config(cell, requests)
    column = run_one(name, requests, cfg)
    column["cache_class"] = column.pop("cache")
    return {**column, **cell, "requests": len(requests), "limit": limit,
            "hicache_ratio": ratio, "pools": sizes.as_dict()}


load = cell_runs.load


def _work(args):
    cell, trace, limit = args
    return run_cell(cell, trace, limit)


def _describe(row: dict) -> str:
    return (f"{row['model']} {row['host_gb']} GB host {row['policy']} {row['cache']}: "
            f"{row['flops_saved_fraction']:.2%} FLOPs saved, {row['wall_seconds']:.0f} s")


def run(trace: str, out: Path, cells: list, processes: int = 1,
        limit: Optional[int] = None, progress=print) -> list:
    """Replay the cells not yet in ``out`` (JSON lines), ``processes`` at a time."""
    return cell_runs.run(_work, trace, out, cells, cell_key, _describe, processes, limit,
                         progress)


def analyze(rows: list, limit: Optional[int] = None) -> dict:
    """Per (model, host GB, policy): every cache's column and its ratio to stock."""
    by = {}
    for r in rows:
        by.setdefault((r["model"], r["host_gb"], r["policy"]), {})[r["cache"]] = r
    order = {p: i for i, p in enumerate(WRITE_POLICIES)}
    table_rows = []
    for (model, host_gb, policy), cols in sorted(
            by.items(), key=lambda kv: (kv[0][0], kv[0][1], order.get(kv[0][2], 9))):
        stock = cols.get("stock")
        ratios = {name: col["flops_saved"] / stock["flops_saved"]
                  for name, col in cols.items()
                  if stock and stock["flops_saved"] and name != "stock"}
        table_rows.append({"model": model, "host_gb": host_gb, "policy": policy,
                           "cols": cols, "ratios": ratios})
    return {"rows": table_rows, "targets": targets(table_rows, limit)}


def targets(rows: list, limit: Optional[int] = None) -> list:
    """(target, measured, PASS/MISS/not run) for every Marconi cache in the grid; on the
    first ``limit`` requests the verdicts say so (the targets are for the whole trace)."""
    scope = f" on the first {limit} requests only" if limit else ""
    out = []
    caches = sorted({c for r in rows for c in r["ratios"]})
    for cache in caches:
        if not parse_cache(cache)[0] == "marconi+":
            continue
        cell = next((r for r in rows if (r["model"], r["host_gb"], r["policy"]) == TARGET),
                    None)
        gain = cell["ratios"].get(cache) if cell else None
        out.append((f"{cache}: >= {TARGET_GAIN}x stock's FLOPs saved (paper-7b, "
                    f"{DEVICE_GB} GB + {TARGET[1]} GB host, {TARGET[2]})",
                    "not run" if gain is None else f"{gain:.3f}x",
                    "not run" if gain is None else ("PASS" if gain >= TARGET_GAIN
                                                    else "MISS") + scope))
    for cache in caches:
        got = [(r["ratios"][cache], r) for r in rows if cache in r["ratios"]]
        if got:
            worst, r = min(got, key=lambda x: x[0])
            out.append((f"{cache}: never below stock's FLOPs saved (any cell)",
                        f"worst {worst:.3f}x ({r['model']} {r['host_gb']} GB "
                        f"{r['policy']}; {len(got)} cells)",
                        ("PASS" if worst >= 1.0 else "MISS") + scope))
    return out


def _host(col: dict, key: str) -> float:
    return col.get("host", {}).get(key, 0)


def markdown(an: dict, command: str, limit=None) -> str:
    """The grid: one line per cell and cache, then the targets."""
    scope = f"first {limit} requests" if limit else "all requests"
    lines = [f"Command: `{command}` ({scope} of the trace; FLOPs saved = prefill FLOPs of "
             "the device and host hits / all prefill FLOPs; evictions: KV tokens and states "
             "freed on each tier)", ""]
    header = ["model", "host GB", "write policy", "cache", "FLOPs saved", "x stock",
              "host hit tokens", "bytes loaded", "KV evicted dev / host",
              "states evicted dev / host", "ms/req"]
    body = []
    for r in an["rows"]:
        for name, col in r["cols"].items():
            body.append([
                r["model"], f"{r['host_gb']:g}", r["policy"], name,
                f'{col["flops_saved_fraction"]:.2%}',
                f"{r['ratios'][name]:.3f}x" if name in r["ratios"] else "-",
                f"{_host(col, 'hit_tokens'):,}", f"{_host(col, 'bytes_loaded'):.3e}",
                f"{col['kv_tokens_evicted']:,} / {_host(col, 'kv_tokens_evicted'):,}",
                f"{col['states_evicted']:,} / {_host(col, 'states_evicted'):,}",
                f"{col['bookkeeping_ms_per_request']:.1f}"])
    lines.append(table(header, body))
    lines += ["", "| target | measured | result |", "| --- | --- | --- |"]
    lines += [f"| {t} | {m} | {res} |" for t, m, res in an["targets"]]
    return "\n".join(lines)
