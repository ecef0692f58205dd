"""Issue 11's benchmark: stock vs Marconi caches in SGLang, pools sized from a byte budget.

On one trace, for each model and budget (GB of cache memory, ``driver/sizing.py``), the CPU
A/B (``harness/ab.py``: SGLang's real caches driven with the scheduler's calls) in four
memory modes: ``static`` at ``--mamba-full-memory-ratio`` 0.9 (SGLang's default), 0.3 and 2.0,
and ``unified`` (``--enable-unified-memory``, one byte buffer). Caches: stock (the compiled
tree core, SGLang's default), marconi (a fixed alpha, labelled: auto-tuning settles at 0 on
this trace, where marconi is stock by construction), marconi+, and, in static 0.9 and
unified, the paper's admission (at most 2 states per request) as its own row.

``run`` replays every cell in a process pool and appends one JSON line per cell to a file
(a rerun skips cells already there); ``analyze`` makes the rows and the targets' PASS/MISS;
``markdown`` the tables; ``write_plot`` FLOPs saved vs budget per mode.
"""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Optional

from sglang_marconi.driver.sizing import size_pools
from sglang_marconi.model import preset_spec
from marconi_reports import cell_runs

MODELS = ("paper-7b", "qwen3_next")
BUDGETS = (50, 100, 200)
MODES = (("static", 0.9), ("static", 0.3), ("static", 2.0), ("unified", 0.9))
ALPHA = 1.0  # marconi's fixed alpha (labelled in every table)
ADMISSION = "marconi-adm2"  # marconi with the paper's admission: <= 2 states per request
CACHES = ("stock", "marconi", "marconi+", ADMISSION)


def mode_name(memory: str, ratio: float) -> str:
    return "unified" if memory == "unified" else f"static r={ratio:g}"


def grid(models=MODELS, budgets=BUDGETS) -> list:
    """Every cell: (model, budget, memory, ratio, cache); the target's cells first."""
    cells = []
    for model in models:
        for gb in budgets:
            for memory, ratio in MODES:
                for cache in CACHES:
                    if cache == ADMISSION and ratio not in (0.9,):
                        continue
                    cells.append({"model": model, "gb": gb, "memory": memory,
                                  "ratio": ratio, "cache": cache})
    cells.sort(key=lambda c: (c["model"] != "paper-7b", c["gb"] != 100,
                              c["memory"] != "unified"))
    return cells


def cell_key(c: dict) -> tuple:
    return (c["model"], c["gb"], c["memory"], c["ratio"], c["cache"])




def run_cell(cell: dict, trace: str, limit: Optional[int] = None) -> dict:
    """One cache on one sized pool: the A/B column plus the cell and its pool sizes."""
    warnings.filterwarnings("ignore", category=UserWarning)
    from sglang_marconi.driver.pools import PoolConfig
    from sglang_marconi.driver.unified_pools import UnifiedConfig
    from sglang_marconi.harness.ab import ABConfig, run_one
    from sglang_marconi.sglang_integration.options import MarconiSettings

    spec = preset_spec(cell["model"])
    sizes = size_pools(spec, cell["gb"], cell["memory"], mamba_full_memory_ratio=cell["ratio"])
    requests = cell_runs.requests(trace, limit)
    longest = max(len(r.input_ids) + max(1, r.output_len) for r in requests)
    pools = PoolConfig(kv_tokens=sizes.kv_tokens, mamba_slots=sizes.mamba_slots,
                       max_context_len=longest + 128)
    unified = (UnifiedConfig(sizes.unified_bytes, sizes.kv_bytes_per_token, sizes.state_bytes,
                             sizes.mamba_slots) if sizes.mode == "unified" else None)
    settings = MarconiSettings(alpha=ALPHA)
    name = cell["cache"]
    if name == ADMISSION:
        name, settings = "marconi", dataclasses.replace(settings, max_states_per_request=2)
    cfg = ABConfig(pools=pools, spec=spec, settings=settings, caches=(name,), unified=unified)
    column = run_one(name, requests, cfg)
    column.pop("marconi", None)
    column["cache_class"] = column.pop("cache")
    return {**column, **cell, "requests": len(requests), "limit": limit, "alpha": ALPHA,
            "pools": sizes.as_dict()}


def _work(args):
    cell, trace, limit = args
    return run_cell(cell, trace, limit)


def _describe(row: dict) -> str:
    return (f"{row['model']} {row['gb']} GB {mode_name(row['memory'], row['ratio'])} "
            f"{row['cache']}: {row['flops_saved_fraction']:.2%} FLOPs saved, "
            f"{row['wall_seconds']:.0f} s")


def run(trace: str, out: Path, cells: list, processes: int = 2,
        limit: Optional[int] = None, progress=print) -> list:
    """Replay the cells not yet in ``out`` (JSON lines), ``processes`` at a time."""
    return cell_runs.run(_work, trace, out, cells, cell_key, _describe, processes, limit,
                         progress)


load = cell_runs.load


def analyze(rows: list) -> dict:
    """Per (model, budget, mode): FLOPs saved per cache and the ratios to stock; targets."""
    by = {}
    for r in rows:
        by.setdefault((r["model"], r["gb"], mode_name(r["memory"], r["ratio"])), {})[
            r["cache"]] = r
    table = []
    for (model, gb, mode), cols in sorted(by.items(), key=lambda kv: (
            kv[0][0], kv[0][1], kv[0][2] != "unified", kv[0][2])):
        stock = cols.get("stock")
        row = {"model": model, "gb": gb, "mode": mode, "cols": cols,
               "pools": next(iter(cols.values()))["pools"]}
        for name, col in cols.items():
            row[name] = col["flops_saved_fraction"]
            if stock and stock["flops_saved_fraction"]:
                row[f"{name}/stock"] = col["flops_saved_fraction"] / stock["flops_saved_fraction"]
            if stock and stock["bookkeeping_ms_per_request"]:
                row[f"{name} ms/stock"] = (col["bookkeeping_ms_per_request"]
                                           / stock["bookkeeping_ms_per_request"])
        table.append(row)
    return {"rows": table, "targets": targets(table)}


def targets(table: list) -> list:
    """(target, measured, PASS/MISS/not run)."""
    out = []
    cell = next((r for r in table if r["model"] == "paper-7b" and r["gb"] == 100
                 and r["mode"] == "unified"), None)
    gain = cell.get("marconi+/stock") if cell else None
    out.append(("unified, 100 GB, paper-7b: marconi+ >= 1.5x stock's FLOPs saved",
                "not run" if gain is None else f"{gain:.2f}x",
                "not run" if gain is None else ("PASS" if gain >= 1.5 else "MISS")))
    ratios = [(r["marconi+/stock"], r) for r in table if "marconi+/stock" in r]
    if ratios:
        worst, r = min(ratios, key=lambda x: x[0])
        out.append(("marconi+ never more than 2% below stock (any row)",
                    f"worst {worst:.3f}x ({r['model']} {r['gb']} GB {r['mode']})",
                    "PASS" if worst >= 0.98 else "MISS"))
    for mode in ("static r=0.9", "unified"):
        ms = [(r[f"{c} ms/stock"], c, r) for r in table if r["mode"] == mode
              for c in ("marconi", "marconi+") if f"{c} ms/stock" in r]
        if ms:
            worst, c, r = max(ms, key=lambda x: x[0])
            out.append((f"bookkeeping per request <= 1.10x stock's compiled core ({mode})",
                        f"worst {worst:.2f}x ({c}, {r['model']} {r['gb']} GB)",
                        "PASS" if worst <= 1.10 else "MISS"))
    return out
