"""An upper bound on the prefill FLOPs any cache can save in a KV pool of K tokens
(``scripts/kv_pool_bound.py``): the reference for SGLang's static pools, where the
simulator's future-knowing ``offline`` policy does not run.

In SGLang's default static layout (``--mamba-full-memory-ratio 0.9``) the KV pool is what
fills on the bundled trace (paper-7b at 100 GiB: 862,592 KV tokens and 1,897 state slots;
a cache with 100,000 state slots saves exactly as much), so what a cache can save there is
decided by which KV it keeps. The bound is the optimum of a relaxation, solved as a
linear programme (HiGHS, through ``scipy.optimize.linprog``):

- Requests run one at a time in trace order. The inputs are the trace's hash blocks (512
  tokens in the Mooncake traces, whose outputs are never part of a later input); a block
  is its hash id and every id before it, so two requests share a block exactly when they
  share the prefix up to its end.
- Holding a block from one use to its next (a *reuse interval*) costs its tokens in the
  pool for every request in between, and is worth the FLOPs its tokens save on the next
  use: ``flops_saved(end, start)`` of the cost model, positions capped at the input less
  one token (SGLang matches at most input - 1 tokens). A hit of h tokens is worth
  ``flops_saved(h)``: the sum of its blocks' worths.
- While request t runs, its own input (its hit included) and every block held across it
  fit in K tokens.
- A block's worth counts only if the block before it in the same request is held too (a
  hit is a prefix), fractionally: held to the same degree or less.

Relaxed (so the optimum can only be higher than any real cache's): the future is known;
a state exists wherever a hit ends (the bound is the KV-only one: SGLang's chunk, branch
and decode grids are not imposed, nor the state pool); no page rounding; outputs hold no
pool room (they are never reused in the Mooncake traces) and requests never overlap.
Interval scheduling with one capacity is a network flow (one unit of flow per pool token
along the requests; an interval is an edge skipping the requests it spans), so the linear
programme has O(requests + intervals) non-zeros; only the prefix constraints are not of
flow form, which is why the optimum may hold an interval in part (``fractional`` counts
them); that only raises the bound.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from sglang_marconi.sim.traces import MOONCAKE_BLOCK

REUSE_CLASSES = ((1, 1), (2, 2), (3, 4), (5, 8), (9, None))  # the block's uses before


@dataclass
class Intervals:
    """The reuse intervals of a trace: one per use of a block after its first."""

    start: np.ndarray      # request of the previous use
    end: np.ndarray        # request of this use
    tokens: np.ndarray     # the block's tokens (the last block of an input may be short)
    worth: np.ndarray      # FLOPs its tokens save on this use
    after: np.ndarray      # the interval of the block before it in request ``end``, -1:
                           # none (the first block), -2: that block is not reusable
    uses_before: np.ndarray  # how often the block was used before this use
    input_len: np.ndarray  # per request
    prefill_flops: float   # all requests' prefill FLOPs


def reuse_intervals(requests, spec, block: int = MOONCAKE_BLOCK) -> Intervals:
    """The reuse intervals of ``requests``: per request, in order, its hash block ids and
    its input length (a Mooncake trace's ``hash_ids`` and ``input_length``). A block is
    its id and every id before it (two requests share it when they share the prefix up to
    it). An interval charges the tokens of the block its next use can hit (to the input
    less one) and is worth the FLOPs they save; a short last block counts as its next
    use's (more than an earlier short copy held: the bound errs high, never low)."""
    ids: dict = {}           # (id of the block before, hash id) -> block id
    last_use: dict = {}      # block id -> (request, uses so far)
    cols = {k: [] for k in ("start", "end", "tokens", "worth", "after", "uses_before")}
    lens, prefill = [], 0.0
    for t, (hashes, n) in enumerate(requests):
        lens.append(n)
        prefill += spec.prefill_flops(n)
        limit = n - 1                      # SGLang matches at most input - 1 tokens
        prev, prev_interval = -1, -1
        for j, h in enumerate(hashes):
            start = j * block
            if start >= n:
                break
            bid = ids.setdefault((prev, int(h)), len(ids))
            seen = last_use.get(bid)
            interval = -2
            if seen is not None and start < limit:
                stop = min(start + block, limit)
                interval = len(cols["start"])
                cols["start"].append(seen[0])
                cols["end"].append(t)
                cols["tokens"].append(stop - start)
                cols["worth"].append(spec.flops_saved(stop, start))
                cols["after"].append(prev_interval)
                cols["uses_before"].append(seen[1])
            last_use[bid] = (t, (seen[1] if seen else 0) + 1)
            prev, prev_interval = bid, interval
    arrays = {k: np.asarray(v, dtype=float if k == "worth" else np.int64)
              for k, v in cols.items()}
    return Intervals(**arrays, input_len=np.asarray(lens, dtype=np.int64),
                     prefill_flops=prefill)


def mooncake_blocks(trace) -> list:
    """(hash ids, input length) of each request of a Mooncake trace read by
    ``sim.traces.read_trace`` (block ``h`` is the tokens ``h * 512 ...``)."""
    return [(r.input_tokens[::MOONCAKE_BLOCK] // MOONCAKE_BLOCK, r.input_len)
            for r in trace.requests]


@dataclass
class Bound:
    """The optimum of the relaxation: FLOPs saved and what it holds of each interval."""

    flops_saved: float
    fraction: float        # of all prefill FLOPs
    held: np.ndarray       # per interval, the fraction of it held (0..1)
    never_evicting: float  # every interval held: the KV-only ceiling, as a fraction

    @property
    def fractional(self) -> int:
        return int(((self.held > 1e-6) & (self.held < 1 - 1e-6)).sum())


def kv_pool_bound(iv: Intervals, kv_tokens: int) -> Bound:
    """The relaxation's optimum for a pool of ``kv_tokens`` (see the module doc).

    Variables (in pools of K tokens): per request t the room not held across it, ``f_t``
    (at least its input, at most the pool), between requests t and t+1 the free room
    ``g_t``, per interval the tokens held ``y_i`` (up to its tokens); the prefix rows
    compare shares held (``y_i / tokens_i``). Flow is conserved at the start and
    the end of every request: K tokens enter before the first request and leave after the
    last; an interval leaves the end of its first request and enters the start of its
    last, so it counts against every request it spans."""
    T, m = len(iv.input_len), len(iv.start)
    if T == 0:
        raise ValueError("no requests")
    if int(iv.input_len.max()) > kv_tokens:
        raise ValueError(f"a pool of {kv_tokens} KV tokens cannot hold the longest input "
                         f"({int(iv.input_len.max())} tokens)")
    scale = float(kv_tokens)              # work in pools, not tokens (the LP's numerics)
    nf, ng = T, T - 1
    f = np.arange(nf)                      # variable indices
    g = nf + np.arange(ng)
    y = nf + ng + np.arange(m)
    # rows: node 2t = start of request t, node 2t+1 = its end; inflow - outflow = supply
    r, c, v = [], [], []

    def edge(tail_nodes, head_nodes, var, weight=None):
        w = np.ones(len(var)) if weight is None else weight
        r.extend(head_nodes); c.extend(var); v.extend(w)
        r.extend(tail_nodes); c.extend(var); v.extend(-w)

    edge(2 * np.arange(T), 2 * np.arange(T) + 1, f)
    edge(2 * np.arange(T - 1) + 1, 2 * np.arange(1, T), g)
    edge(2 * iv.start + 1, 2 * iv.end, y)  # y: the tokens held, in pools
    supply = np.zeros(2 * T)
    supply[0] = -1.0                       # K tokens enter at the first request's start
    supply[2 * T - 1] = 1.0                # and leave at the last request's end
    a_eq = coo_matrix((v, (r, c)), shape=(2 * T, nf + ng + m)).tocsr()
    # prefix rows: the share held of each, y_i / tokens_i - y_p / tokens_p <= 0
    child = np.nonzero(iv.after >= 0)[0]
    parent = iv.after[child]
    a_ub = coo_matrix((np.concatenate([1.0 / iv.tokens[child], -1.0 / iv.tokens[parent]]),
                       (np.concatenate([np.arange(len(child))] * 2),
                        np.concatenate([y[child], y[parent]]))),
                      shape=(len(child), nf + ng + m)).tocsr()
    upper_y = np.where(iv.after == -2, 0.0, iv.tokens / scale)  # -2: the block before is
    # not reusable
    bounds = np.concatenate([
        np.stack([iv.input_len / scale, np.ones(nf)], 1),
        np.stack([np.zeros(ng), np.ones(ng)], 1),
        np.stack([np.zeros(m), upper_y], 1)])
    per_token = iv.worth / iv.tokens if m else np.zeros(0)
    top = per_token.max() if m else 1.0
    cost = np.concatenate([np.zeros(nf + ng), -per_token / top])
    res = linprog(cost, A_ub=a_ub if len(child) else None,
                  b_ub=np.zeros(len(child)) if len(child) else None,
                  A_eq=a_eq, b_eq=supply, bounds=bounds, method="highs")
    if res.status != 0:
        raise RuntimeError(f"the linear programme did not solve: {res.message}")
    held = np.clip(res.x[nf + ng:] * scale / iv.tokens, 0.0, 1.0) if m else np.zeros(0)
    saved = float(held @ iv.worth)
    reusable = iv.after != -2
    return Bound(flops_saved=saved, fraction=saved / iv.prefill_flops, held=held,
                 never_evicting=float(iv.worth[reusable].sum()) / iv.prefill_flops)


def held_by_reuse_class(iv: Intervals, bound: Bound) -> list:
    """Rows (class label, intervals, share held, worth held / all prefill FLOPs, worth
    / all prefill FLOPs) by how often the block was used before: what the optimum keeps."""
    rows = []
    for lo, hi in REUSE_CLASSES:
        sel = (iv.uses_before >= lo) & ((iv.uses_before <= hi) if hi else True)
        label = f"{lo}" if lo == hi else (f"{lo}-{hi}" if hi else f"{lo}+")
        n = int(sel.sum())
        rows.append((label, n, float(bound.held[sel].mean()) if n else 0.0,
                     float(bound.held[sel] @ iv.worth[sel]) / iv.prefill_flops,
                     float(iv.worth[sel].sum()) / iv.prefill_flops))
    return rows
