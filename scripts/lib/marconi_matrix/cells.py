"""The matrix's cells and their runs through ``ab`` (SGLang's own cache objects).

A cell is (trace, model, memory mode, size). The size is where the cache binds: the
memory at which stock SGLang saves a target share (25%, 50% or 75%) of the trace's
ceiling, what stock saves on pools too large to evict. ``calibrate`` finds it with stock
alone (so no policy under test takes part in sizing its cells), from a first guess at 5%,
15% or 40% of the never-evicting footprint (every byte that run held), and keeps the
sizes found in a JSON file (stock is SGLang's own cache: its sizes stay valid for every
candidate). A cell whose size cannot hold the trace's longest request is grown until it
can; one whose stock is above its target even there is reported as such.
Each trace has six cells, the two models and two memory modes spread over the three
targets; a trace's cells take the run's seeds in turn.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

from sglang_marconi.cli import ab as ab_cli
from sglang_marconi.cli.common import run_with_sglang, server_model_kwargs
from sglang_marconi.errors import UserError
from sglang_marconi.model import resolve_model

GB = 1 << 30
TRACES = ("bundled", "chat", "agent", "shared-prompt", "fork-join", "drift", "alpha-shift",
          "mooncake-turns")
# (model, memory, stock's target share of the ceiling)
LAYOUT = (("qwen3_next", "static", 0.25), ("qwen3_next", "static", 0.75),
          ("qwen3_next", "unified", 0.50), ("nemotron_h", "static", 0.50),
          ("nemotron_h", "unified", 0.25), ("nemotron_h", "unified", 0.75))
FIRST_GUESS = {0.25: 0.05, 0.50: 0.15, 0.75: 0.40}  # share of the held footprint
TOLERANCE = 0.06  # calibration stops within this relative distance of the target share
MAX_RUNS = 8  # stock runs per calibration at most
TOO_SMALL = ("cannot hold the longest request", "is too small for",
             "the pools are too small for this trace")  # ab's refusals
BINDS = 0.10  # a cell binds when stock evicts at least this share of the KV it inserts
MIN_GAP = 0.005  # the gap share needs this much headroom between stock and the ceiling


@dataclass(frozen=True)
class Cell:
    trace: str
    model: str
    memory: str
    target: float  # stock's share of the ceiling the size is chosen for
    seed: int

    @property
    def name(self) -> str:
        return f"{self.trace}/s{self.seed}/{self.model}/{self.memory}/{self.target:.0%}"


def cells(seeds, traces=TRACES) -> list:
    out = []
    for trace in traces:
        for i, (model, memory, target) in enumerate(LAYOUT):
            seed = 0 if trace == "bundled" else seeds[i % len(seeds)]
            out.append(Cell(trace, model, memory, target, seed))
    return out


def run_ab(argv: list, trace, settings=None) -> dict:
    """``ab`` with these arguments on ``trace``, in this process (``settings``: the Marconi
    column's ``MarconiSettings``, the Python API); its JSON."""
    parser = argparse.ArgumentParser()
    ab_cli.add_arguments(parser)
    args = parser.parse_args(["--trace", trace.name, *argv])
    spec = resolve_model(args.model, None, **server_model_kwargs(args))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run_with_sglang(lambda a: ab_cli.run_replay(a, spec, trace, trace.name, settings),
                        args)
    return json.loads(out.getvalue())


def footprint(trace, model: str) -> dict:
    """Stock on pools that never evict: every byte it held (``held_bytes``), the bytes of
    what it reused (``reused_bytes``: the KV of the hit prefixes and a state per distinct
    hit end) and the FLOPs fraction it saves (``ceiling``)."""
    tokens = sum(r.input_len + r.output_len for r in trace.requests)
    res = run_ab(["--model", model, "--kv-tokens", str(tokens + 4096),
                  "--mamba-slots", str(4 * len(trace) + 64), "--caches", "stock", "--json",
                  "--no-progress", "--per-request"], trace)
    col, cfg = res["caches"]["stock"], res["config"]
    if col["kv_tokens_evicted"] or col["states_evicted"]:
        raise UserError(f"{trace.name} {model}: the never-evicting pools evicted")
    held = (col["peak_kv_slots_used"] * cfg["kv_bytes_per_token"]
            + col["states_in_tree"] * cfg["state_bytes"])
    kv, ends = reused_prefixes(trace, col["hit_tokens_per_request"])
    return {"reused_bytes": kv * cfg["kv_bytes_per_token"] + ends * cfg["state_bytes"],
            "held_bytes": held, "ceiling": col["flops_saved_fraction"]}


def reused_prefixes(trace, hits: list) -> tuple:
    """(distinct tokens in the union of the hit prefixes, distinct hit ends) of the
    requests of ``trace`` with these hit lengths, in blocks of ``FOOTPRINT_BLOCK``
    tokens (a prefix is named by the hash chain of its blocks)."""
    if len(hits) != len(trace.requests):
        raise UserError(f"{trace.name}: {len(hits)} hit lengths for {len(trace)} requests")
    blocks, ends = set(), set()
    for req, hit in zip(trace.requests, hits):
        n = hit // FOOTPRINT_BLOCK
        if not n:
            continue
        ids = np.asarray(req.input_tokens[:n * FOOTPRINT_BLOCK], dtype=np.int64)
        h = 0
        for b in ids.reshape(n, FOOTPRINT_BLOCK):
            h = hash((h, b.tobytes()))
            blocks.add(h)
        ends.add(h)
    return len(blocks) * FOOTPRINT_BLOCK, len(ends)


FOOTPRINT_BLOCK = 64  # SGLang's page under extra_buffer: hits are whole pages


def stock_share(cell: Cell, trace, fp: dict, gb: float) -> Optional[float]:
    """Stock's FLOPs saved at ``gb`` GiB over the ceiling; None if the pools are too small
    for the model or the trace's longest request."""
    try:
        res = run_ab(["--model", cell.model, "--memory", cell.memory, "--json",
                      "--no-progress", "--cache-gb", f"{gb:.6g}", "--caches", "stock"], trace)
    except UserError as exc:
        if not any(m in str(exc) for m in TOO_SMALL):
            raise
        return None
    return res["caches"]["stock"]["flops_saved_fraction"] / fp["ceiling"]


def calibrate(cell: Cell, trace, fp: dict) -> dict:
    """The size (GiB) at which stock saves ``cell.target`` of the ceiling: a bracketing
    search on log size from ``FIRST_GUESS``, interpolating stock's share; the run closest
    to the target within ``MAX_RUNS`` (``floor``: the smallest size that holds the longest
    request, where stock was still above the target)."""
    gb = FIRST_GUESS[cell.target] * fp["held_bytes"] / GB
    runs, floor = [], None  # (gb, share)
    lo = hi = None
    for _ in range(MAX_RUNS):
        share = stock_share(cell, trace, fp, gb)
        if share is None:
            floor = gb
            gb = gb * 1.25 if hi is None else (gb * hi[0]) ** 0.5
            continue
        runs.append((gb, share))
        if abs(share / cell.target - 1) <= TOLERANCE:
            break
        if share < cell.target:
            lo = (gb, share) if lo is None or gb > lo[0] else lo
        else:
            hi = (gb, share) if hi is None or gb < hi[0] else hi
        if hi is not None and floor is not None and hi[0] <= floor * 1.25 ** 0.5:
            break  # above the target at (about) the smallest size that runs
        if lo is None:
            gb = max(gb / 3, floor * 1.25 if floor else 0.0)
        elif hi is None:
            gb *= 3
        else:
            t = (cell.target - lo[1]) / (hi[1] - lo[1])
            gb = float(np.exp(np.log(lo[0]) + t * (np.log(hi[0]) - np.log(lo[0]))))
    if not runs:
        raise UserError(f"{cell.name}: no size up to {gb:.3g} GB holds the longest request")
    gb, share = min(runs, key=lambda r: abs(r[1] - cell.target))
    return {"cache_gb": gb, "stock_share": share, "runs": len(runs)}


def run_cell(cell: Cell, trace, fp: dict, size: dict, candidates: dict) -> dict:
    """Stock, the product and each candidate (name -> ``MarconiSettings``) on the cell at
    its calibrated ``size``."""
    gb = size["cache_gb"]
    base = ["--model", cell.model, "--memory", cell.memory, "--json", "--no-progress",
            "--per-request", "--cache-gb", f"{gb:.6g}"]
    res = run_ab([*base, "--caches", "stock,marconi"], trace)
    cols = {"stock": summary_of(res["caches"]["stock"]),
            "marconi": summary_of(res["caches"]["marconi"]),
            **run_candidates(cell, trace, size, candidates)}
    return {"cell": asdict(cell), "name": cell.name, "cache_gb": gb,
            "size_fraction": gb * GB / fp["held_bytes"], "held_bytes": fp["held_bytes"],
            "reused_bytes": fp["reused_bytes"], "stock_share_target": size["stock_share"],
            "ceiling": fp["ceiling"], "requests": len(trace),
            "output_tokens": sum(r.output_len for r in trace.requests),
            "columns": cols}


def run_candidates(cell: Cell, trace, size: dict, candidates: dict) -> dict:
    """Each candidate's column (name -> ``MarconiSettings``, None: the defaults) on the
    cell at ``size``."""
    base = ["--model", cell.model, "--memory", cell.memory, "--json", "--no-progress",
            "--per-request", "--cache-gb", f"{size['cache_gb']:.6g}"]
    return {name: summary_of(run_ab([*base, "--caches", "marconi"], trace, settings)
                             ["caches"]["marconi"]) for name, settings in candidates.items()}


def summary_of(col: dict) -> dict:
    hits = col.pop("hit_tokens_per_request", [])
    col.pop("lost_reuse_tokens_per_request", None)
    keep = ("flops_saved_fraction", "token_hit_rate", "hit_tokens", "input_tokens",
            "kv_tokens_evicted", "states_evicted", "states_admitted",
            "bookkeeping_ms_per_request")
    out = {k: col[k] for k in keep}
    out["hit_requests"] = sum(1 for h in hits if h > 0)
    return out


def ratio(row: dict, name: str = "marconi") -> Optional[float]:
    s = row["columns"]["stock"]["flops_saved_fraction"]
    m = row["columns"][name]["flops_saved_fraction"]
    return m / s if s > 0 else None


def binds(row: dict) -> bool:
    stock = row["columns"]["stock"]
    inserted = stock["input_tokens"] - stock["hit_tokens"] + row["output_tokens"]
    return stock["kv_tokens_evicted"] >= BINDS * inserted


def gap_closed(row: dict, name: str = "marconi") -> Optional[float]:
    s = row["columns"]["stock"]["flops_saved_fraction"]
    m = row["columns"][name]["flops_saved_fraction"]
    # under half a point of headroom the share is noise
    return (m - s) / (row["ceiling"] - s) if row["ceiling"] - s >= MIN_GAP else None
