"""Replays a trace through one or more cache policies, one request at a time as in the paper's
simulator, and reports what each saved (policies in parallel processes with ``jobs``)."""
from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
from tqdm import tqdm

from sglang_marconi.sim.latency import LatencyModel
from sglang_marconi.sim.policies import PolicySpec, build_cache

LONG_REQUEST = 7000  # tokens: the paper's short / long split (Fig. 10)


def run_policy(trace, spec, capacity, policy: PolicySpec, grid: int = 1,
               latency: LatencyModel | None = None, progress: bool = False,
               position: int = 0) -> dict:
    latency = latency or LatencyModel()
    cache = build_cache(policy, spec, capacity, grid, trace)
    hits = np.zeros(len(trace), dtype=np.int64)
    requests = trace.requests
    it = range(len(requests))
    if progress:
        it = tqdm(it, desc=f"{policy.label:>16}", unit="req", leave=False, position=position,
                  mininterval=0.5)
    start = time.perf_counter()
    for i in it:
        r = requests[i]
        hits[i] = cache.process(r.input_tokens, r.full_tokens)
    wall = time.perf_counter() - start
    return summarize(cache, trace, hits, spec, latency, wall)


def summarize(cache, trace, hits, spec, latency, wall) -> dict:
    st = cache.stats
    lens = np.array([r.input_len for r in trace.requests], dtype=np.int64)
    ttft = np.array([latency.ttft(spec, int(n), int(h)) for n, h in zip(lens, hits)])
    long = lens >= LONG_REQUEST
    out = {"token_hit_rate": st.token_hit_rate, "request_hit_rate": st.request_hit_rate,
           "hit_tokens": st.hit_tokens, "input_tokens": st.input_tokens,
           "flops_saved": st.flops_saved, "prefill_flops": st.prefill_flops,
           "flops_saved_fraction": st.flops_saved_fraction, "states_admitted": st.states_admitted,
           "states_evicted": st.states_evicted, "states_dropped_one_child": st.states_dropped,
           "nodes_deleted": st.nodes_deleted, "kv_tokens_evicted": st.kv_tokens_evicted,
           "admissions_truncated": st.admissions_truncated,
           "admissions_rejected": st.admissions_rejected, "peak_bytes": st.peak_bytes,
           "ttft_p50_s": float(np.percentile(ttft, 50)),
           "ttft_p95_s": float(np.percentile(ttft, 95)),
           "short_token_hit_rate": _rate(hits[~long], lens[~long]),
           "long_token_hit_rate": _rate(hits[long], lens[long]), "alpha": _alpha(cache),
           "wall_s": wall}
    tuner = getattr(cache, "tuner", None)
    if tuner is not None:
        out["alpha_tuned"] = tuner.tuned
        out["alpha_scores"] = {str(a): s for a, s in tuner.scores.items()}
    return out


def _alpha(cache):
    """The alpha in use (None for marconi+'s GDSF ranking, which has none)."""
    tree = getattr(cache, "tree", None)
    return None if tree is not None and tree.queue.mode == "gdsf" else cache.alpha


def _rate(hits, lens) -> float | None:
    return float(hits.sum() / lens.sum()) if len(lens) else None


_FORK_STATE: dict = {}


def _run_forked(args):
    trace, spec, capacity, grid, latency = _FORK_STATE["shared"]
    policy, position = args
    return policy.label, run_policy(trace, spec, capacity, policy, grid, latency, False, position)


def simulate(trace, spec, capacity, policies, grid: int = 1, latency: LatencyModel | None = None,
             progress: bool = True, jobs: int = 1) -> dict:
    """Replay ``trace`` through every policy; returns {"policies": {label: metrics}, ...}."""
    latency = latency or LatencyModel()
    results: dict[str, dict] = {}
    if jobs > 1 and len(policies) > 1:
        _FORK_STATE["shared"] = (trace, spec, capacity, grid, latency)
        with mp.get_context("fork").Pool(min(jobs, len(policies))) as pool:
            for label, res in pool.imap(_run_forked, [(p, i) for i, p in enumerate(policies)]):
                results[label] = res
    else:
        for i, p in enumerate(policies):
            results[p.label] = run_policy(trace, spec, capacity, p, grid, latency, progress, 0)
    for ref in ("infinite", "offline"):  # every policy's savings as fractions of these
        ceiling = results.get(ref)
        for res in results.values() if ceiling else ():
            res[f"fraction_of_{ref}_flops"] = (res["flops_saved"] / ceiling["flops_saved"]
                                               if ceiling["flops_saved"] else None)
            res[f"fraction_of_{ref}_tokens"] = (res["hit_tokens"] / ceiling["hit_tokens"]
                                                if ceiling["hit_tokens"] else None)
    return {"trace": trace.name, "requests": len(trace), "input_tokens": trace.input_tokens,
            "model": spec.name, "capacity_bytes": capacity, "grid": grid,
            "latency": {"gpu": latency.gpu, "mfu": latency.mfu, "overhead_s": latency.overhead_s},
            "policies": results}
