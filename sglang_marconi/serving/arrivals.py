"""Arrival times for the serving replay: the trace's timestamps rescaled so that its GPU work
without any cache hit takes ``--load`` of the arrival span, seeded Poisson arrivals at that
rate, or ``--rate-scale`` times the timestamps."""
from __future__ import annotations

import numpy as np


def decode_batch(requests, max_running_requests: int, kv_tokens: int) -> int:
    """The largest decode batch the pools allow (requests and KV)."""
    mean_len = np.mean([len(r.input_ids) + max(1, r.output_len) for r in requests])
    return max(1, min(max_running_requests, int(kv_tokens // mean_len)))


def offered_seconds(requests, time_model, batch: int, chunk: int = 8192) -> float:
    """GPU seconds of every request with no hit (prefill from 0 and decode shares)."""
    seconds = 0.0
    overhead = time_model.gpu.step_overhead_s
    for r in requests:
        n_in, n_out = len(r.input_ids), max(1, r.output_len)
        seconds += (time_model.extend_flops(0, n_in) / time_model.prefill_flops_s
                    + overhead * -(-n_in // chunk))
        if n_out > 1:  # the prefill samples the first token
            context = n_in + n_out / 2
            seconds += (n_out - 1) * time_model.decode_seconds(int(batch * context), batch) / batch
    return seconds


def arrivals_for_load(timestamps, requests, time_model, load: float, seed: int = 0,
                      batch: int = 1, chunk: int = 8192, poisson: bool = False):
    """Arrival seconds for offered load ``load`` (> 0), or seeded Poisson ones."""
    ts = np.asarray(timestamps, dtype=float)
    span = offered_seconds(requests, time_model, batch, chunk) / load
    t0 = ts.min() if len(ts) else 0.0
    width = (ts.max() - t0) if len(ts) else 0.0
    if width > 0 and not poisson:
        return list((ts - t0) * (span / width))
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(span / max(1, len(ts)), size=len(ts))
    gaps[0] = 0.0
    return list(np.cumsum(gaps))


def arrivals_scaled(timestamps, scale: float):
    ts = np.asarray(timestamps, dtype=float)
    t0 = ts.min() if len(ts) else 0.0
    return list((ts - t0) * scale)
