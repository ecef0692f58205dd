"""One serving run's numbers, from the scheduler's request and step records.

TTFT = first token - arrival; queue = start of the first prefill step - arrival; rates
over the makespan (first arrival at 0 to the last event); hits and FLOPs saved from each
request's match at its first admission (what that prefill skipped); step-weighted means
weight each step by its duration on the virtual clock (GPU + measured cache time).
"""
from __future__ import annotations

from sglang_marconi.harness.timing import quantile


def _weighted_mean(values, weights) -> float:
    total = sum(weights)
    return sum(v * w for v, w in zip(values, weights)) / total if total else 0.0


def request_stats(recs, spec, span: float) -> dict:
    """The per-request numbers of a run (one server's records, or a cluster's)."""
    done = [r for r in recs if r.finished is not None]
    admitted = [r for r in recs if r.hit_len is not None]
    ttft = [r.first_token - r.arrival for r in done]
    queue = [r.admitted - r.arrival for r in admitted]
    inp = sum(r.input_len for r in admitted)
    hit = sum(r.hit_len for r in admitted)
    total_flops = sum(spec.prefill_flops(r.input_len) for r in admitted)
    saved = sum(spec.flops_saved(r.hit_len, 0) for r in admitted)
    return {
        "requests": len(recs),
        "finished": len(done),
        "aborted": sum(1 for r in recs if r.aborted),
        "ttft_p50_s": quantile(ttft, 0.50),
        "ttft_p95_s": quantile(ttft, 0.95),
        "ttft_p99_s": quantile(ttft, 0.99),
        "queue_p95_s": quantile(queue, 0.95),
        "throughput_req_s": len(done) / span,
        "output_tok_s": sum(r.output_len for r in done) / span,
        "flops_saved_fraction": saved / total_flops if total_flops else 0.0,
        "token_hit_rate": hit / inp if inp else 0.0,
        "hit_tokens": hit,
        "flops_saved": saved,
    }


def summarize(sched, spec, cache: str, load, wall_s: float) -> dict:
    span = sched.now or 1.0
    steps = [s for s in sched.steps if s.kind != "idle"]
    dur = [s.gpu_s + s.cache_s for s in steps]
    return {
        "cache": cache,
        "load": load,
        **request_stats(list(sched.records.values()), spec, span),
        "gpu_busy_fraction": sum(s.gpu_s for s in steps) / span,
        "max_running_requests": sched.cfg.max_running_requests,
        "mean_running": _weighted_mean([s.resident for s in steps], dur),
        "state_slots_by_running_mean": _weighted_mean(
            [s.state_slots_used - s.state_slots_tree for s in steps], dur),
        "state_slots_by_tree_mean": _weighted_mean([s.state_slots_tree for s in steps], dur),
        "retractions": sched.retractions,
        "bookkeeping_ms_per_step_p99": 1000 * quantile([s.cache_s for s in steps], 0.99),
        "bookkeeping_ms_per_step_max": 1000 * max((s.cache_s for s in steps), default=0.0),
        "bookkeeping_s_total": sum(s.cache_s for s in steps),
        # the replay heap's collections (not the cache's time; a server holds no trace)
        **sched.gc.as_dict(),
        "steps": len(steps),
        "makespan_s": sched.now,
        "wall_s": wall_s,
    }


def ttfts(sched) -> list:
    return sorted(r.first_token - r.arrival for r in sched.records.values()
                  if r.finished is not None)
