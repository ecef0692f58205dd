"""Arrival times for the serving replay: the trace's timestamps, rescaled to an offered load.

``--load L`` scales arrivals so that the trace's prefill FLOPs *without any cache hit*,
spread over the arrival span, equal ``L`` times the GPU's prefill capacity (``mfu * peak``
of the time model): a trace-independent way to say "L busy" (decode time comes on top, so
L near 1 overloads the server). A trace without timestamps (all equal: generators, session
traces without ``ts``) gets seeded Poisson arrivals at that rate. ``--rate-scale S`` is the
raw alternative: timestamps times S (0: everything arrives at once).
"""
from __future__ import annotations

import numpy as np


def offered_seconds(requests, time_model) -> float:
    """GPU seconds of all prefills with no hit (the step overhead excluded)."""
    flops = sum(time_model.spec.prefill_flops(len(r.input_ids)) for r in requests)
    return flops / time_model.prefill_flops_s


def arrivals_for_load(timestamps, requests, time_model, load: float, seed: int = 0):
    """Arrival seconds (sorted like ``timestamps``) for offered load ``load`` (> 0)."""
    ts = np.asarray(timestamps, dtype=float)
    span = offered_seconds(requests, time_model) / load
    t0 = ts.min() if len(ts) else 0.0
    width = (ts.max() - t0) if len(ts) else 0.0
    if width > 0:
        return list((ts - t0) * (span / width))
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(span / max(1, len(ts)), size=len(ts))
    gaps[0] = 0.0
    return list(np.cumsum(gaps))


def arrivals_scaled(timestamps, scale: float):
    ts = np.asarray(timestamps, dtype=float)
    t0 = ts.min() if len(ts) else 0.0
    return list((ts - t0) * scale)
