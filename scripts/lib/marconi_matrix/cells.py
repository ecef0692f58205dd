"""The matrix's cells and their runs through ``ab`` (SGLang's own cache objects).

A cell is (trace, model, memory mode, size); the size is a fraction of the trace's
never-evicting footprint for that model: the bytes stock SGLang holds at the end of a run
on pools too large to evict (peak KV tokens x KV bytes + states in the tree x state
bytes), which run also gives the ceiling (what a cache that never evicts saves). A cell
whose fraction cannot hold the trace's longest request is grown until it can (the size
actually run is reported). Each trace has six cells, the two models and two memory modes
spread over 5%, 15% and 40%; a trace's cells take the run's seeds in turn.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
from dataclasses import asdict, dataclass
from typing import Optional

from sglang_marconi.cli import ab as ab_cli
from sglang_marconi.cli.common import run_with_sglang, server_model_kwargs
from sglang_marconi.errors import UserError
from sglang_marconi.model import resolve_model

GB = 1 << 30
TRACES = ("bundled", "chat", "agent", "shared-prompt", "fork-join", "drift", "alpha-shift",
          "mooncake-turns")
LAYOUT = (("qwen3_next", "static", 0.05), ("qwen3_next", "static", 0.40),
          ("qwen3_next", "unified", 0.15), ("nemotron_h", "static", 0.15),
          ("nemotron_h", "unified", 0.05), ("nemotron_h", "unified", 0.40))
BINDS = 0.10  # a cell binds when stock evicts at least this share of the KV it inserts
MIN_GAP = 0.005  # the gap share needs this much headroom between stock and the ceiling


@dataclass(frozen=True)
class Cell:
    trace: str
    model: str
    memory: str
    fraction: float
    seed: int

    @property
    def name(self) -> str:
        return f"{self.trace}/s{self.seed}/{self.model}/{self.memory}/{self.fraction:.0%}"


def cells(seeds, traces=TRACES) -> list:
    out = []
    for trace in traces:
        for i, (model, memory, fraction) in enumerate(LAYOUT):
            seed = 0 if trace == "bundled" else seeds[i % len(seeds)]
            out.append(Cell(trace, model, memory, fraction, seed))
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
    """Stock on pools that never evict: (bytes it holds, the FLOPs fraction it saves)."""
    tokens = sum(r.input_len + r.output_len for r in trace.requests)
    res = run_ab(["--model", model, "--kv-tokens", str(tokens + 4096),
                  "--mamba-slots", str(4 * len(trace) + 64), "--caches", "stock", "--json",
                  "--no-progress"], trace)
    col, cfg = res["caches"]["stock"], res["config"]
    held = (col["peak_kv_slots_used"] * cfg["kv_bytes_per_token"]
            + col["states_in_tree"] * cfg["state_bytes"])
    if col["kv_tokens_evicted"] or col["states_evicted"]:
        raise UserError(f"{trace.name} {model}: the never-evicting pools evicted")
    return {"bytes": held, "ceiling": col["flops_saved_fraction"]}


def run_cell(cell: Cell, trace, fp: dict, candidates: dict) -> dict:
    """Stock, the product and each candidate (name -> ``MarconiSettings``) on the cell."""
    gb = cell.fraction * fp["bytes"] / GB
    base = ["--model", cell.model, "--memory", cell.memory, "--json", "--no-progress",
            "--per-request"]
    for _ in range(30):
        try:
            res = run_ab([*base, "--cache-gb", f"{gb:.6g}", "--caches", "stock,marconi"],
                         trace)
            break
        except UserError as exc:
            if "cannot hold the longest request" not in str(exc):
                raise
            gb *= 1.25
    else:
        raise UserError(f"{cell.name}: no size up to {gb:.3g} GB holds the longest request")
    cols = {"stock": res["caches"]["stock"], "marconi": res["caches"]["marconi"]}
    for name, settings in candidates.items():
        cand = run_ab([*base, "--cache-gb", f"{gb:.6g}", "--caches", "marconi"], trace,
                      settings)
        cols[name] = cand["caches"]["marconi"]
    return {"cell": asdict(cell), "name": cell.name, "cache_gb": gb,
            "size_fraction": gb * GB / fp["bytes"], "footprint_bytes": fp["bytes"],
            "ceiling": fp["ceiling"], "requests": len(trace),
            "output_tokens": sum(r.output_len for r in trace.requests),
            "columns": {k: summary_of(v) for k, v in cols.items()}}


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
