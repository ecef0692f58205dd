"""One serving run's numbers from the scheduler's request and step records: TTFT, queueing,
rates over the makespan, hits and FLOPs saved at first admission, busy and CPU-critical
fractions, and ``backlog_growth`` (``overloaded`` above ``OVERLOAD_GROWTH``)."""
from __future__ import annotations

import numpy as np

from sglang_marconi.harness.ab import host_section
from sglang_marconi.harness.timing import quantile

OVERLOAD_GROWTH = 0.1


def _weighted_mean(values, weights) -> float:
    total = sum(weights)
    return sum(v * w for v, w in zip(values, weights)) / total if total else 0.0


def busy_in_window(steps, t0: float, t1: float) -> float:
    """The GPU's busy fraction of [t0, t1] (0 for an empty window)."""
    if t1 <= t0:
        return 0.0
    busy = sum(max(0.0, min(t1, s.gpu_start + s.gpu_s) - max(t0, s.gpu_start)) for s in steps)
    return busy / (t1 - t0)


def backlog_growth(recs) -> float:
    """Requests left in the server per request arriving, over the later half."""
    late = sorted(recs, key=lambda r: r.arrival)[len(recs) // 2:]
    x = np.array([r.arrival for r in late])
    if len(late) < 4 or np.ptp(x) == 0:
        return 0.0
    slope = np.polyfit(x, np.array([r.backlog for r in late], dtype=float), 1)[0]
    return float(slope / ((len(late) - 1) / np.ptp(x)))


def request_stats(recs, spec, span: float) -> dict:
    """The per-request numbers of a run (one server's records, or a cluster's)."""
    done = [r for r in recs if r.finished is not None]
    admitted = [r for r in recs if r.hit_len is not None]
    ttft = [r.first_token - r.arrival for r in done]
    queue = [r.admitted - r.arrival for r in admitted]
    inp = sum(r.input_len for r in admitted)
    hit = sum(r.hit_len for r in admitted)
    lost = sum(r.lost_reuse for r in admitted)
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
        "lost_reuse_tokens": lost,  # KV matched past the hit (driver.lost_reuse)
        "flops_saved": saved,
    }


def summarize(sched, spec, cache: str, load, wall_s: float) -> dict:
    span = sched.now or 1.0
    steps = [s for s in sched.steps if s.kind != "idle"]
    dur = [s.gpu_s + s.cache_s for s in steps]
    recs = list(sched.records.values())
    arrivals = [r.arrival for r in recs]
    growth = backlog_growth(recs)
    return {
        "cache": cache,
        "load": load,
        # the server died (SGLang's scheduler raised): the figures cover what ran until then
        "crashed": sched.crash,
        **request_stats(recs, spec, span),
        "gpu_busy_fraction": sum(s.gpu_s for s in steps) / span,
        "busy_fraction": busy_in_window(steps, min(arrivals, default=0.0),
                                        max(arrivals, default=0.0)),
        "loop": "overlap" if sched.cfg.overlap else "normal",
        "cpu_critical_fraction": (sum(1 for s in steps if s.exposed_cpu_s > 0) / len(steps)
                                  if steps else 0.0),
        "cpu_exposed_s_total": sum(s.exposed_cpu_s for s in steps),
        "backlog_growth": growth,
        "overloaded": growth > OVERLOAD_GROWTH,
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
        **host_stats(sched, spec),
    }


def host_stats(sched, spec) -> dict:
    """With a host tier: its hits, ``ab``'s ``host`` section, load-back time ({} without)."""
    if sched.host is None:
        return {}
    recs = [r for r in sched.records.values() if r.hit_len is not None]
    hits = [r for r in recs if r.host_hit_len]
    flops = sum(spec.flops_saved(r.hit_len, r.hit_len - r.host_hit_len) for r in hits)
    host = host_section(sched.host, spec, sum(r.host_hit_len for r in hits), flops,
                        sum(r.storage_hit_len for r in sched.records.values()))
    loads = [s for s in sched.steps if s.load_s > 0]
    ttft = [r.first_token - r.arrival for r in hits if r.first_token is not None]
    host.update(requests_with_host_hits=len(hits), steps_with_loads=len(loads),
                load_s_total=sum(s.load_s for s in loads),
                load_exposed_s_total=sum(s.load_exposed_s for s in loads),
                device_kv_tokens_evicted=sched.device.kv_tokens_evicted,
                device_states_evicted=sched.device.states_evicted,
                ttft_host_hit_p50_s=quantile(ttft, 0.50), ttft_host_hit_p95_s=quantile(ttft, 0.95))
    return {"host_hit_tokens": host["hit_tokens"], "host": host}


def ttfts(sched) -> list:
    return sorted(r.first_token - r.arrival for r in sched.records.values()
                  if r.finished is not None)


def bookkeeping_ratios(runs) -> list:
    """Each cache's total bookkeeping over stock's and stock-python's, per load."""
    by_point: dict = {}
    for r in runs:
        by_point.setdefault(r.get("load", r.get("rate_scale")), {})[r["cache"]] = r
    out = []
    for point, caches in by_point.items():
        for name, r in caches.items():
            if name.startswith("stock"):
                continue
            row = {"load": point, "cache": name, "bookkeeping_s_total": r["bookkeeping_s_total"]}
            for base, key in (("stock", "vs_stock"), ("stock-python", "vs_stock_python")):
                total = caches.get(base, {}).get("bookkeeping_s_total")
                row[key] = r["bookkeeping_s_total"] / total if total else None
            out.append(row)
    return out
