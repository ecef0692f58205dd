"""Marconi counters, reported through SGLang's logging and (with --enable-metrics) Prometheus.

Counted per finished request: tokens hit and the prefill FLOPs the hit saved. Counted per
state: admitted (by reason: ``branch`` point, ``chunk`` boundary, ``final`` state of a
finished request), ``rejected`` chunk-boundary states (over the per-request cap), and
evicted (by reason: ``state_pool_drop`` = an internal node's state dropped to free a state
slot, ``state_pool_leaf`` = a leaf deleted to free a state slot, ``kv_pool_leaf`` = a leaf
deleted to free KV token slots, its state with it; with --enable-unified-memory the joint
walk's ``unified_state`` = an inner state dropped for bytes, ``unified_leaf`` = a leaf with a
state deleted for bytes).

With ``--marconi-alpha online``: the alpha switches, and what the shadow caches cost next to
the real cache: their CPU time over the real cache's bookkeeping time (match, insert,
evict), and the token ids their trees hold over the token ids the real tree holds.

With ``--marconi-alpha auto``: the tuning slices run, the request count at which the tuned
alpha took effect, and ``tuner_failures`` (``sglang:marconi_tuner_failures``): replays that
raised, each also logged as an error (the alpha then stays where it was).
"""
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
    flops_saved: float = 0.0
    prefill_flops: float = 0.0
    alpha: float = 0.0
    alpha_tuned: bool = False
    tuning_seconds: float = 0.0
    tuning_slices: int = 0         # auto: tuning slices run (one per finished request)
    tuned_at: int = 0              # auto: finished requests when the tuned alpha took effect
    tuner_failures: int = 0        # auto: replays that raised (alpha left where it was)
    admitted: Counter = field(default_factory=Counter)
    rejected: int = 0
    end_states_skipped: int = 0    # marconi+: final states not admitted (learned rate)
    evicted: Counter = field(default_factory=Counter)
    alpha_mode: str = "fixed"      # fixed, auto or online
    bookkeeping_seconds: float = 0.0  # the cache's match / insert / evict calls
    online_switches: int = 0
    online_seconds: float = 0.0    # the shadow caches' bookkeeping
    shadow_tokens: int = 0         # token ids held by the shadows' trees
    shadow_nodes: int = 0
    tree_tokens: int = 0           # token ids held by the real tree (its KV tokens)
    loaded_back: int = 0           # HiCache: states loaded back from the host tier
    # HiCache: host victims the two-tier rule chose ("full": host leaves, "mamba": host
    # states; 0 while SGLang's host LRU decides: MarconiSettings.host_rule)
    host_evicted: Counter = field(default_factory=Counter)

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def online_time_ratio(self) -> float:
        return self.online_seconds / self.bookkeeping_seconds if self.bookkeeping_seconds else 0.0

    @property
    def online_memory_ratio(self) -> float:
        return self.shadow_tokens / self.tree_tokens if self.tree_tokens else 0.0

    def as_dict(self) -> dict:
        return {
            "requests": self.requests,
            "input_tokens": self.input_tokens,
            "hit_tokens": self.hit_tokens,
            "token_hit_rate": self.token_hit_rate,
            "flops_saved": self.flops_saved,
            "prefill_flops": self.prefill_flops,
            "alpha": self.alpha,
            "alpha_tuned": self.alpha_tuned,
            "tuning_seconds": self.tuning_seconds,
            "tuning_slices": self.tuning_slices,
            "tuned_at": self.tuned_at,
            "tuner_failures": self.tuner_failures,
            "states_admitted": {r: self.admitted[r] for r in ADMIT_REASONS},
            "states_rejected": self.rejected,
            "end_states_skipped": self.end_states_skipped,
            "states_evicted": {r: self.evicted[r] for r in EVICT_REASONS},
            "alpha_mode": self.alpha_mode,
            "host_evicted": {t: self.host_evicted[t] for t in ("full", "mamba")},
            "bookkeeping_seconds": self.bookkeeping_seconds,
            **({"online": self.online_dict()} if self.alpha_mode == "online" else {}),
        }

    def online_dict(self) -> dict:
        return {"switches": self.online_switches, "seconds": self.online_seconds,
                "time_ratio": self.online_time_ratio, "shadow_tokens": self.shadow_tokens,
                "shadow_nodes": self.shadow_nodes, "tree_tokens": self.tree_tokens,
                "memory_ratio": self.online_memory_ratio}

    def summary_line(self) -> str:
        adm = ", ".join(f"{r}={self.admitted[r]}" for r in ADMIT_REASONS)
        ev = ", ".join(f"{r}={self.evicted[r]}" for r in EVICT_REASONS)
        mode = ("" if self.alpha_tuned or self.alpha_mode == "online" else " (untuned)")
        online = (f" online[switches={self.online_switches}"
                  f" time_ratio={self.online_time_ratio:.2f}"
                  f" memory_ratio={self.online_memory_ratio:.2f}]"
                  if self.alpha_mode == "online" else "")
        policy = ("marconi+" if self.alpha_mode == "marconi+"
                  else f"alpha={self.alpha:g}{mode}")
        return (f"Marconi cache: {policy}"
                f" requests={self.requests} token_hit_rate={self.token_hit_rate:.3f}"
                f" flops_saved={self.flops_saved:.3e} states_admitted[{adm}]"
                f" rejected={self.rejected} end_states_skipped={self.end_states_skipped}"
                f" states_evicted[{ev}]{online}")


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
            "flops_saved": PCounter("sglang:marconi_flops_saved",
                                    "Prefill FLOPs saved by hits", names),
            "admitted": PCounter("sglang:marconi_states_admitted", "SSM states admitted",
                                 names + ["reason"]),
            "evicted": PCounter("sglang:marconi_states_evicted", "SSM states evicted",
                                names + ["reason"]),
            "tuner_failures": PCounter("sglang:marconi_tuner_failures",
                                       "alpha=auto tuning replays that raised", names),
        }
    return _SERIES[label_names]


class PrometheusExporter:
    """``sglang:marconi_*`` series next to SGLang's own radix-cache metrics."""

    def __init__(self, labels: dict):
        self.labels = labels
        self.series = _series(tuple(sorted(labels)))

    def request(self, hit_tokens: int, flops_saved: float) -> None:
        self.series["hit_tokens"].labels(**self.labels).inc(hit_tokens)
        self.series["flops_saved"].labels(**self.labels).inc(flops_saved)

    def set_alpha(self, alpha: float) -> None:
        self.series["alpha"].labels(**self.labels).set(alpha)

    def state(self, kind: str, reason: str) -> None:
        self.series[kind].labels(reason=reason, **self.labels).inc()

    def tuner_failure(self) -> None:
        self.series["tuner_failures"].labels(**self.labels).inc()


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
