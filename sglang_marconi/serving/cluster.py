"""Several SGLang replicas behind a router on one virtual clock (``serve-sim --replicas N``):
each replica runs its steps before a request is routed and keeps its own access-time counter;
with one replica the steps are ``run_serving``'s."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from sglang_marconi.harness.ab import ABConfig, OwnAccessClock, make_cache
from sglang_marconi.serving.arrivals import arrivals_for_load, arrivals_scaled, decode_batch
from sglang_marconi.serving.metrics import request_stats
from sglang_marconi.serving.router import make_router, text_for_input_ids, tokens_within_chars
from sglang_marconi.serving.scheduler import ServerCrash, ServingScheduler


@dataclass
class Routed:
    """Where one request went and what the router believed about it."""
    replica: int
    rule: str
    believed_tokens: Optional[int]      # None: the router keeps no tree


@dataclass
class Cluster:
    replicas: List[ServingScheduler]
    router: object                      # serving.router: CacheAwareRouter, ...
    routed: dict = field(default_factory=dict)     # rid -> Routed
    sent: list = field(default_factory=list)       # per replica: requests routed there
    open: list = field(default_factory=list)       # per replica: rids not known complete
    prefilled: set = field(default_factory=set)    # rids whose first token the router heard

    def __post_init__(self):
        self.sent = [[] for _ in self.replicas]
        self.open = [set() for _ in self.replicas]
        self.clocks = [OwnAccessClock() for _ in self.replicas]

    def in_flight(self, k: int, t: float) -> int:
        """Requests routed to replica ``k`` whose response is not complete at ``t``."""
        records = self.replicas[k].records
        ended = {rid for rid in self.open[k] if rid in records
                 and records[rid].ended is not None and records[rid].ended <= t}
        self.open[k] -= ended
        return len(self.open[k])

    def listen(self, t: float) -> None:
        """What the router hears before routing at ``t``: nothing (in-flight counts only)."""

    def decide(self, rr, loads) -> tuple:
        """(the router's ``Decision`` for ``rr``, the tokens it believed would be reused)."""
        decision = self.router.route(text_for_input_ids(rr.input_ids), loads)
        believed = None
        if self.router.name == "cache_aware":
            believed = (tokens_within_chars(rr.input_ids, decision.matched_chars)
                        if decision.rule == "cache_hit" else 0)
        return decision, believed

    def advance(self, t: float) -> None:
        """Run every replica's steps that start before ``t``."""
        for sched, clock in zip(self.replicas, self.clocks):
            with clock:
                while not sched.done() and sched.now < t:
                    sched.step()

    def route(self, t: float, rr) -> Routed:
        self.router.tick(t)
        self.listen(t)
        loads = [self.in_flight(k, t) for k in range(len(self.replicas))]
        decision, believed = self.decide(rr, loads)
        routed = Routed(decision.worker, decision.rule, believed)
        self.routed[rr.rid] = routed
        self.sent[decision.worker].append(rr.rid)
        self.open[decision.worker].add(rr.rid)
        self.replicas[decision.worker].submit(t, rr)
        return routed

    def run(self, requests, arrivals, progress: Optional[Callable] = None) -> None:
        """Route and run every request; stops when a replica's scheduler crashes."""
        order = sorted(range(len(requests)), key=lambda i: (arrivals[i], i))
        with contextlib.ExitStack() as stack:
            for sched in self.replicas:
                stack.enter_context(sched.gc)
            try:
                for i in order:
                    self.advance(arrivals[i])
                    self.route(arrivals[i], requests[i])
                    if progress is not None:
                        progress(1)
                for sched, clock in zip(self.replicas, self.clocks):
                    with clock:
                        while not sched.done():
                            sched.step()
            except ServerCrash:
                pass
            OwnAccessClock.settle(self.clocks)

    @property
    def crash(self) -> Optional[str]:
        """The first crashed replica and what its scheduler raised (None: none crashed)."""
        return next((f"replica {k}: {sched.crash}" for k, sched in enumerate(self.replicas)
                     if sched.crash is not None), None)

    @property
    def records(self) -> list:
        return [rec for sched in self.replicas for rec in sched.records.values()]


def cluster_arrivals(setup, requests, replicas: int, load, rate_scale):
    """``--load`` is the cluster's: a replica's no-hit busy time over replicas x span."""
    if rate_scale is not None:
        return arrivals_scaled(setup.timestamps, rate_scale)
    batch = decode_batch(requests, setup.sched.max_running_requests, setup.pools.kv_tokens)
    return arrivals_for_load(setup.timestamps, requests, setup.time_model, load * replicas,
                             setup.seed, batch, setup.pools.chunked_prefill_size)


def replica_schedulers(cache_name: str, setup, replicas: int) -> list:
    """One ``ServingScheduler`` per replica, each with fresh pools and cache ``cache_name``."""
    scheds = []
    for _ in range(replicas):
        cache, _, _ = make_cache(cache_name, ABConfig(pools=setup.pools, spec=setup.spec,
                                                      settings=setup.settings,
                                                      unified=setup.unified))
        scheds.append(ServingScheduler(cache, setup.time_model, setup.sched, [], []))
    return scheds


def build_cluster(cache_name: str, router_name: str, setup, replicas: int,
                  router_options: Optional[dict] = None) -> Cluster:
    workers = [f"replica-{k}" for k in range(replicas)]
    router = make_router(router_name, workers, seed=setup.seed, **(router_options or {}))
    return Cluster(replica_schedulers(cache_name, setup, replicas), router)


def summarize_cluster(cluster: Cluster, spec, cache: str, router: str, load,
                      wall_s: float) -> dict:
    recs = cluster.records
    admitted = [r for r in recs if r.hit_len is not None]
    span = max((s.now for s in cluster.replicas), default=0.0) or 1.0
    stats = request_stats(recs, spec, span)
    inp = sum(r.input_len for r in admitted)
    hit = stats["hit_tokens"]
    per_replica = [len(sent) for sent in cluster.sent]
    mean_sent = sum(per_replica) / len(per_replica)
    believed = [cluster.routed[r.rid].believed_tokens for r in admitted]
    rules: dict = {}
    for routed in cluster.routed.values():
        rules[routed.rule] = rules.get(routed.rule, 0) + 1
    gap = None if any(b is None for b in believed) else sum(believed) - hit
    return {
        "router": router,
        "cache": cache,
        "crashed": cluster.crash,
        "replicas": len(cluster.replicas),
        "load": load,
        **stats,
        "requests_per_replica": per_replica,
        "load_skew": max(per_replica) / mean_sent if mean_sent else 0.0,
        "router_rules": rules,
        "router_believed_tokens": None if gap is None else sum(believed),
        "belief_gap_tokens": gap,
        "belief_gap_fraction": None if gap is None or not inp else gap / inp,
        "router_evictions": getattr(cluster.router, "evictions", 0),
        "gpu_busy_fraction": sum(s.gpu_s for sched in cluster.replicas for s in sched.steps
                                 if s.kind != "idle") / (span * len(cluster.replicas)),
        "retractions": sum(s.retractions for s in cluster.replicas),
        "makespan_s": span,
        "wall_s": wall_s,
    }


def run_cluster(cache_name: str, router_name: str, requests, setup, replicas: int,
                load=None, rate_scale=None, progress: Optional[Callable] = None,
                router_options: Optional[dict] = None, build: Optional[Callable] = None):
    """One (router, cache) run of ``replicas`` replicas (``build``: how the cluster is
    built, ``build_cluster`` by default); returns (summary, cluster)."""
    cluster = (build or build_cluster)(cache_name, router_name, setup, replicas, router_options)
    times = cluster_arrivals(setup, requests, replicas, load, rate_scale)
    t0 = time.perf_counter()
    cluster.run(requests, times, progress)
    summary = summarize_cluster(cluster, setup.spec, cache_name, router_name,
                                load if rate_scale is None else None, time.perf_counter() - t0)
    if rate_scale is not None:
        summary["rate_scale"] = rate_scale
    return summary, cluster
