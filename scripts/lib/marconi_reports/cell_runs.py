"""Benchmark grids kept as JSON lines, one line per cell: replay the cells a file does not
hold yet in a process pool (a rerun resumes), read them back. Used by ``unified_bench``
and ``hicache_bench``."""
from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Callable, Optional

from sglang_marconi.sim.traces import read_trace

_REQUESTS: dict = {}


def requests(trace: str, limit: Optional[int]) -> list:
    """The trace's first ``limit`` requests as replay requests, kept for the next cell
    of the same worker process."""
    from sglang_marconi.harness.ab import to_replay_requests  # heavy: sglang, torch

    key = (trace, limit)
    if key not in _REQUESTS:
        _REQUESTS.clear()
        _REQUESTS[key] = to_replay_requests(read_trace(trace), limit)
    return _REQUESTS[key]


def load(path: Path) -> list:
    if not Path(path).is_file():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def run(work: Callable, trace: str, out: Path, cells: list, key: Callable, describe: Callable,
        processes: int = 1, limit: Optional[int] = None, progress=print) -> list:
    """``work((cell, trace, limit))`` (a module-level function: it runs in spawned
    processes) for each cell whose ``key`` is not in ``out`` at this ``limit``; appends
    each row as it comes and reports it with ``describe(row)``. Returns every row."""
    done = load(out)
    have = {key(r) for r in done if r.get("limit") == limit}
    todo = [c for c in cells if key(c) not in have]
    out.parent.mkdir(parents=True, exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(processes) as pool, out.open("a") as fh:
        for i, row in enumerate(pool.imap_unordered(work, [(c, trace, limit) for c in todo])):
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            done.append(row)
            progress(f"[{i + 1}/{len(todo)}] {describe(row)}")
    return done
