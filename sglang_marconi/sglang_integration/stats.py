"""Marconi counters (per request: tokens hit, FLOPs saved; per state: admitted, rejected,
evicted by reason), reported through SGLang's logging and, with --enable-metrics, as
``sglang:marconi_*`` Prometheus series."""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

logger = logging.getLogger("sglang_marconi.cache")

ADMIT_REASONS = ("branch", "chunk", "final")
EVICT_REASONS = ("state_pool_drop", "state_pool_leaf", "kv_pool_leaf", "unified_state",
                 "unified_leaf")


@dataclass
class MarconiStats:
    requests: int = 0
    input_tokens: int = 0
    hit_tokens: int = 0
    lost_reuse_tokens: int = 0     # KV matched past the hit (driver.lost_reuse)
    flops_saved: float = 0.0
    prefill_flops: float = 0.0
    alpha: float = 0.0
    admitted: Counter = field(default_factory=Counter)
    rejected: int = 0
    end_states_skipped: int = 0    # marconi+: final states not admitted (learned rate)
    evicted: Counter = field(default_factory=Counter)
    ranking: str = "alpha"         # "alpha" (the paper's) or "reuse-weighted"
    bookkeeping_seconds: float = 0.0  # the cache's match / insert / evict calls
    loaded_back: int = 0           # HiCache: states loaded back from the host tier
    # HiCache: host victims the two-tier rule chose ("full": host leaves, "mamba": host
    # states; 0 while SGLang's host LRU decides: MarconiSettings.host_rule)
    host_evicted: Counter = field(default_factory=Counter)

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    def as_dict(self) -> dict:
        return {"requests": self.requests, "input_tokens": self.input_tokens,
                "hit_tokens": self.hit_tokens, "lost_reuse_tokens": self.lost_reuse_tokens,
                "token_hit_rate": self.token_hit_rate, "flops_saved": self.flops_saved,
                "prefill_flops": self.prefill_flops, "alpha": self.alpha,
                "states_admitted": {r: self.admitted[r] for r in ADMIT_REASONS},
                "states_rejected": self.rejected, "end_states_skipped": self.end_states_skipped,
                "states_evicted": {r: self.evicted[r] for r in EVICT_REASONS},
                "ranking": self.ranking,
                "host_evicted": {t: self.host_evicted[t] for t in ("full", "mamba")},
                "bookkeeping_seconds": self.bookkeeping_seconds}

    def summary_line(self) -> str:
        adm = ", ".join(f"{r}={self.admitted[r]}" for r in ADMIT_REASONS)
        ev = ", ".join(f"{r}={self.evicted[r]}" for r in EVICT_REASONS)
        policy = ("reuse-weighted" if self.ranking == "reuse-weighted"
                  else f"alpha={self.alpha:g}")
        return (f"Marconi cache: {policy} requests={self.requests} "
                f"token_hit_rate={self.token_hit_rate:.3f} "
                f"lost_reuse_tokens={self.lost_reuse_tokens} flops_saved={self.flops_saved:.3e} "
                f"states_admitted[{adm}] rejected={self.rejected} "
                f"end_states_skipped={self.end_states_skipped} states_evicted[{ev}]")


_SERIES: dict = {}  # one set of Prometheus series per process, shared by every cache


def _series(label_names: tuple) -> dict:
    if label_names not in _SERIES:
        from prometheus_client import Counter as PCounter
        from prometheus_client import Gauge

        names = list(label_names)
        _SERIES[label_names] = {
            "alpha": Gauge("sglang:marconi_alpha", "Current Marconi alpha", names,
                           multiprocess_mode="mostrecent"),
            "hit_tokens": PCounter("sglang:marconi_hit_tokens", "Prefix tokens hit", names),
            "lost_reuse": PCounter("sglang:marconi_lost_reuse_tokens",
                                   "Prompt tokens whose KV matched past the deepest usable "
                                   "state (no state to resume from)", names),
            "flops_saved": PCounter("sglang:marconi_flops_saved",
                                    "Prefill FLOPs saved by hits", names),
            "admitted": PCounter("sglang:marconi_states_admitted", "SSM states admitted",
                                 names + ["reason"]),
            "evicted": PCounter("sglang:marconi_states_evicted", "SSM states evicted",
                                names + ["reason"]),
        }
    return _SERIES[label_names]


class PrometheusExporter:
    """``sglang:marconi_*`` series next to SGLang's own radix-cache metrics."""

    def __init__(self, labels: dict):
        self.labels = labels
        self.series = _series(tuple(sorted(labels)))

    def request(self, hit_tokens: int, flops_saved: float, lost_reuse: int = 0) -> None:
        self.series["hit_tokens"].labels(**self.labels).inc(hit_tokens)
        self.series["lost_reuse"].labels(**self.labels).inc(lost_reuse)
        self.series["flops_saved"].labels(**self.labels).inc(flops_saved)

    def set_alpha(self, alpha: float) -> None:
        self.series["alpha"].labels(**self.labels).set(alpha)

    def state(self, kind: str, reason: str) -> None:
        self.series[kind].labels(reason=reason, **self.labels).inc()



def make_exporter(cache) -> "PrometheusExporter | None":
    """An exporter when SGLang's --enable-metrics built a metrics collector for the cache."""
    collector = getattr(cache, "metrics_collector", None)
    if collector is None:
        return None
    try:
        return PrometheusExporter({str(k): str(v) for k, v in collector.labels.items()})
    except Exception as exc:  # prometheus_client missing, or clashing series
        logger.warning("Marconi Prometheus metrics disabled: %s", exc)
        return None
