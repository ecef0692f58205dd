"""The evidence for ``--marconi-alpha``'s default: the SGLang cache's FLOPs saved for each
alpha mode (fixed, auto with sliced tuning, online) against stock SGLang, over state-pool
sizes and traces (the shared Mooncake trace and generators), on the CPU A/B
(``harness.ab.run_one``: real SGLang caches driven with the scheduler's calls).

``run`` replays every (trace, slots, mode) cell in a process pool; ``choose`` picks the
default: among the modes never more than 2% (relative) below stock in any cell, the one
best on average over the cells (mean FLOPs saved relative to stock); ``markdown`` writes
the table with the command that computed it. The script is ``scripts/sweep_alpha_mode.py``.
"""
from __future__ import annotations

import dataclasses
import warnings
from concurrent.futures import ProcessPoolExecutor

from sglang_marconi.model import resolve_model
from sglang_marconi.sim.generators import generate
from sglang_marconi.sim.traces import read_trace

MODES = {"stock": None, "fixed-1": 1.0, "fixed-2": 2.0, "auto": "auto", "online": "online"}
SLOTS = (60, 200, 600, 1800)
TOLERANCE = 0.02  # a default may lose at most 2% of stock's FLOPs saved in any cell


@dataclasses.dataclass(frozen=True)
class Cell:
    trace: str      # a trace path or "gen:<workload>"
    slots: int
    mode: str
    kv_tokens: int
    limit: int | None
    model: str = "qwen3_next"


def load(trace: str, limit):
    from sglang_marconi.harness.ab import to_replay_requests

    if trace.startswith("gen:"):
        return to_replay_requests(generate(trace[4:], seed=0), limit)

    return to_replay_requests(read_trace(trace), limit)


def run_cell(cell: Cell) -> dict:
    """One replay: FLOPs saved (fraction of prefill) and the longest cache call."""
    warnings.filterwarnings("ignore", category=UserWarning)
    from sglang_marconi.driver.pools import PoolConfig
    from sglang_marconi.harness.ab import ABConfig, run_one
    from sglang_marconi.sglang_integration.options import MarconiSettings

    requests = load(cell.trace, cell.limit)
    longest = max(len(r.input_ids) + len(r.output_ids) for r in requests)
    pools = PoolConfig(kv_tokens=cell.kv_tokens, mamba_slots=cell.slots,
                       max_context_len=longest + 128)
    alpha = MODES[cell.mode]
    name = "stock" if alpha is None else "marconi"
    cfg = ABConfig(pools=pools, spec=resolve_model(cell.model, None),
                   settings=MarconiSettings(alpha=alpha if alpha is not None else 0.0),
                   caches=(name,))
    col = run_one(name, [r for r in requests
                         if len(r.input_ids) + len(r.output_ids) + 128 < cell.kv_tokens], cfg)
    return {**dataclasses.asdict(cell), "flops_saved_fraction": col["flops_saved_fraction"],
            "bookkeeping_ms_max": col["bookkeeping_ms_max"],
            "tuned_at": col.get("marconi", {}).get("tuned_at")}


def run(cells, workers: int = 2) -> list:
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(run_cell, cells))


def choose(rows: list) -> tuple:
    """(default mode, {mode: (mean relative gain over stock, worst relative gain)})."""
    stock = {(r["trace"], r["slots"]): r["flops_saved_fraction"] for r in rows
             if r["mode"] == "stock"}
    gains: dict = {}
    for r in rows:
        base = stock.get((r["trace"], r["slots"]))
        if r["mode"] != "stock" and base:
            gains.setdefault(r["mode"], []).append(r["flops_saved_fraction"] / base - 1)
    summary = {m: (sum(g) / len(g), min(g)) for m, g in gains.items()}
    ok = {m: s for m, s in summary.items() if s[1] >= -TOLERANCE}
    return (max(ok, key=lambda m: ok[m][0]) if ok else "stock"), summary


def markdown(rows: list, command: str) -> str:
    default, summary = choose(rows)
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    keys = sorted({(r["trace"], r["slots"]) for r in rows}, key=lambda k: (k[0], k[1]))
    cell = {(r["trace"], r["slots"], r["mode"]): r for r in rows}
    out = [f"`{command}`", "", "| trace | slots | " + " | ".join(modes) + " |",
           "|---|---|" + "---|" * len(modes)]
    for trace, slots in keys:
        vals = [cell.get((trace, slots, m)) for m in modes]
        out.append(f"| {trace} | {slots} | " + " | ".join(
            f"{v['flops_saved_fraction']:.2%}" if v else "-" for v in vals) + " |")
    out += ["", "| mode | mean gain over stock | worst cell |", "|---|---|---|"]
    out += [f"| {m} | {g:+.1%} | {w:+.1%} |" for m, (g, w) in summary.items()]
    out += ["", f"default by the rule (never more than {TOLERANCE:.0%} below stock, best on "
                f"average): **{default}**"]
    return "\n".join(out)
