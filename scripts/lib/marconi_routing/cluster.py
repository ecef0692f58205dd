"""Replicas behind the ``marconi`` or ``oracle`` router, on one virtual clock: the package's
``serving.cluster.Cluster`` with the feedback a real router hears, built and run as
``serve-sim --replicas`` builds and runs sglang-router's policies, and the routers' flags.

The routers hear a replica's responses: the first token (the request's prefill is done)
and the complete response with its ``cached_tokens`` (the replica's hit), delivered before
routing the next request that arrives at or after them, in time order (ties: replica, then
request id). Belief gap: the reusable prefix a router scored the chosen replica with, minus
what the replica reused.
"""
from __future__ import annotations

import argparse
from typing import Callable, Optional

from marconi_routing.cost_routers import (AFFINITY_THRESHOLD, BRANCH_WEIGHT, LOAD_PENALTY,
                                          OWNER_TOKENS, CostRouter, make_cost_router)
from sglang_marconi.serving.cluster import Cluster, replica_schedulers, run_cluster

COST_ROUTERS = ("marconi", "oracle")


class FeedbackCluster(Cluster):
    """A ``Cluster`` whose router hears the replicas' responses (see the module doc)."""

    def listen(self, t: float) -> None:
        events = []
        for k, sched in enumerate(self.replicas):
            outputs = sched.outputs
            for rid in self.open[k]:
                rec = sched.records.get(rid)
                if rec is None:
                    continue
                if rec.ended is not None and rec.ended <= t:
                    events.append((rec.ended, k, rid, 1, rec.hit_len, outputs.get(rid, ())))
                elif (rec.first_token is not None and rec.first_token <= t
                      and rid not in self.prefilled):
                    events.append((rec.first_token, k, rid, 0, None, ()))
        for _, _, rid, kind, hit, outputs in sorted(events, key=lambda e: e[:4]):
            if kind:
                self.router.complete(rid, hit, outputs)
                self.prefilled.discard(rid)
            else:
                self.router.prefill_done(rid)
                self.prefilled.add(rid)

    def decide(self, rr, loads) -> tuple:
        decision = self.router.route_request(rr.rid, rr.input_ids, loads)
        return decision, decision.believed_tokens


def replica_admission(cache_name: str) -> str:
    """The admission rule the marconi router models for the replicas' cache (a router is
    configured with the policy its workers run): learned end-state admission for marconi
    (and its alias marconi+), SGLang's for stock and the paper's rule."""
    return "marconi+" if cache_name in ("marconi", "marconi+") else "sglang"


def replica_cache(cache_name: str, router_name: str) -> str:
    """The oracle walks the python tree core: stock replicas behind it run stock-python
    (the same cache on SGLang's python core, hit for hit)."""
    return "stock-python" if router_name == "oracle" and cache_name == "stock" else cache_name


def build_cost_cluster(cache_name: str, router_name: str, setup, replicas: int,
                       router_options: Optional[dict] = None) -> FeedbackCluster:
    scheds = replica_schedulers(replica_cache(cache_name, router_name), setup, replicas)
    workers = [f"replica-{k}" for k in range(replicas)]
    router = make_cost_router(router_name, workers, setup.spec, pools=setup.pools,
                              caches=[s.cache for s in scheds],
                              admission=replica_admission(cache_name), **(router_options or {}))
    return FeedbackCluster(scheds, router)


def run_cost_cluster(cache_name: str, router_name: str, requests, setup, replicas: int,
                     load=None, rate_scale=None, progress: Optional[Callable] = None,
                     router_options: Optional[dict] = None):
    """One (router, cache) run, as ``serving.cluster.run_cluster``; (summary, cluster)."""
    summary, cluster = run_cluster(cache_name, router_name, requests, setup, replicas, load,
                                   rate_scale, progress, router_options,
                                   build=build_cost_cluster)
    summary.update(replica_cache=replica_cache(cache_name, router_name),
                   router_admission=getattr(cluster.router, "admission", None),
                   router_corrections=getattr(cluster.router, "corrections", None))
    return summary, cluster


def _fraction_or_off(text: str):
    if text.strip().lower() == "off":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1] or off, got {text!r}")
    return value


def add_router_arguments(parser: argparse.ArgumentParser) -> None:
    """The marconi and oracle routers' flags (beside serve-sim's ``--router-balance-*``,
    whose guard they share with cache_aware)."""
    r = parser.add_argument_group("the marconi and oracle routers")
    r.add_argument("--router-load-penalty", type=float, default=LOAD_PENALTY,
                   help="score = prefill FLOPs saved - this x the replica's queued prefill "
                        "FLOPs (1: TTFT-greedy)")
    r.add_argument("--router-branch-weight", type=float, default=BRANCH_WEIGHT,
                   help="add this x the FLOPs a hit on the branch point the request would "
                        "checkpoint there would save (0: reuse only)")
    r.add_argument("--router-affinity-threshold", type=_fraction_or_off,
                   default=AFFINITY_THRESHOLD,
                   help="cache_aware's rule in FLOPs: the replica where the request would "
                        "save the most when that is above this fraction of its prefill "
                        "FLOPs, else the least queued (default: sglang-router's "
                        "--cache-threshold 0.3); off: the score instead")
    r.add_argument("--router-owner-tokens", type=int, default=OWNER_TOKENS,
                   help="with the affinity threshold: when no replica's reuse passes it, the "
                        "replica the router sent the longest prefix of the request to, if "
                        "above the threshold x its tokens; the router remembers this many "
                        "tokens sent per replica (0: off, the least queued replica)")


def router_options(args) -> dict:
    """``marconi`` and ``oracle`` -> their options from the flags (checked: a bad value is a
    ``UserError`` here, before any replay)."""
    cost = {"balance_abs_threshold": args.router_balance_abs_threshold,
            "balance_rel_threshold": args.router_balance_rel_threshold,
            "load_penalty": args.router_load_penalty,
            "branch_weight": args.router_branch_weight,
            "affinity_threshold": args.router_affinity_threshold,
            "owner_tokens": args.router_owner_tokens}
    CostRouter(["check"], None, **cost)
    return {"marconi": cost, "oracle": dict(cost)}
