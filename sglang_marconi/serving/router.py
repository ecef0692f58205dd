"""sglang-router 0.3.2's routing policies (cache_aware, round_robin, random) in Python, rule by
rule from the Rust sources (cited by path and line): a router sees the request text and the
workers' in-flight counts, nothing else; defaults are ``smg launch --help``'s."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

from sglang_marconi.errors import UserError
from sglang_marconi.serving.router_tree import CharTree

ROUTERS = ("cache_aware", "round_robin", "random", "dp_round_robin")
# dp_round_robin: SGLang's own DP controller (``--dp-size N``), not the router


def text_for_input_ids(input_ids: Sequence[int]) -> str:
    """What the router matches for ``/generate`` with ``input_ids`` (generate.rs 220-226)."""
    return " ".join(str(int(i)) for i in input_ids)


def tokens_within_chars(input_ids: Sequence[int], chars: int) -> int:
    """Leading tokens of ``input_ids`` wholly inside the first ``chars`` characters."""
    count, end = 0, 0
    for token in input_ids:
        end += len(str(int(token)))
        if end > chars:
            break
        count += 1
        end += 1                                   # the separating space
    return count


@dataclass(frozen=True)
class Decision:
    """One routing decision: the worker index, which rule chose it, the tree's belief."""
    worker: int
    rule: str   # "balance" | "cache_hit" | "min_load" | "round_robin" | "random" | ...
    matched_chars: int = 0
    input_chars: int = 0
    ambiguous: bool = False       # a cache hit whose tenant was a hash-order pick (router_tree)
    believed_tokens: Optional[int] = None   # tokens it expected the worker to reuse


def f32(x) -> np.float32:
    return np.float32(x)


def first_min(loads: Sequence[int]) -> int:
    """Rust ``min_by_key``: the first index of the smallest load."""
    return min(range(len(loads)), key=loads.__getitem__)


class CacheAwareRouter:
    """cache_aware of sglang-router 0.3.2 for one model's workers (see the module doc)."""

    name = "cache_aware"

    def __init__(self, workers: Sequence[str], cache_threshold: float = 0.3,
                 balance_abs_threshold: int = 64, balance_rel_threshold: float = 1.5,
                 eviction_interval_secs: int = 60, max_tree_size: int = 1 << 26,
                 first_epoch: int = 0, start_time: float = 0.0):
        if not workers:
            raise UserError("router: at least one worker is needed")
        if not 0.0 <= cache_threshold <= 1.0:
            raise UserError(f"router: cache_threshold must lie in [0, 1], got {cache_threshold}")
        if balance_abs_threshold < 0 or balance_rel_threshold < 0:
            raise UserError("router: the balance thresholds must be >= 0, got "
                            f"{balance_abs_threshold} and {balance_rel_threshold}")
        if eviction_interval_secs < 0:
            raise UserError(f"router: eviction_interval_secs must be >= 0 (0: never), got "
                            f"{eviction_interval_secs}")
        self.workers: List[str] = list(workers)
        self.cache_threshold = f32(cache_threshold)
        self.balance_abs_threshold = int(balance_abs_threshold)
        self.balance_rel_threshold = f32(balance_rel_threshold)
        self.eviction_interval_secs = int(eviction_interval_secs)
        self.max_tree_size = int(max_tree_size)
        self.tree = CharTree(first_epoch)
        for url in self.workers:                        # init_workers, cache_aware.rs 160-162
            self.tree.insert("", url)
        self.next_eviction = (start_time + self.eviction_interval_secs
                              if self.eviction_interval_secs > 0 else None)
        self.evictions = 0

    def imbalanced(self, loads: Sequence[int]) -> bool:
        """cache_aware.rs 364-372 (f32 as in Rust)."""
        lo, hi = min(loads), max(loads)
        return (max(hi - lo, 0) > self.balance_abs_threshold
                and f32(hi) > f32(lo) * self.balance_rel_threshold)

    def route(self, text: str, loads: Sequence[int]) -> Decision:
        if len(loads) != len(self.workers):
            raise ValueError(f"{len(loads)} loads for {len(self.workers)} workers")
        if self.imbalanced(loads):
            idx = first_min(loads)
            self.tree.insert(text, self.workers[idx])
            return Decision(idx, "balance", input_chars=len(text))
        match = self.tree.prefix_match(text)
        rate = (f32(0.0) if match.input_chars == 0
                else f32(match.matched_chars) / f32(match.input_chars))
        idx: Optional[int] = None
        if rate > self.cache_threshold:
            rule = "cache_hit"
            if match.tenant in self.workers:
                idx = self.workers.index(match.tenant)
        else:
            rule = "min_load"
            idx = first_min(loads)
        if idx is None:       # a tenant that is no worker (cache_aware.rs 441-461)
            return Decision(0, "fallback_first", match.matched_chars, match.input_chars,
                            match.ambiguous)
        self.tree.insert(text, self.workers[idx])
        # a hash-order tenant pick matters only when the cache-hit path uses it (a match
        # that stops at the root picks one too, but its rate is 0)
        return Decision(idx, rule, match.matched_chars, match.input_chars,
                        match.ambiguous and rule == "cache_hit")

    def tick(self, now: float) -> int:
        """Run the periodic evictions due by ``now`` (seconds); returns how many ran."""
        ran = 0
        while self.next_eviction is not None and now >= self.next_eviction:
            self.tree.evict_tenant_by_size(self.max_tree_size)
            self.next_eviction += self.eviction_interval_secs
            ran += 1
        self.evictions += ran
        return ran


class RoundRobinRouter:
    """``src/policies/round_robin.rs`` 27-45: counter modulo the healthy workers."""

    name = "round_robin"

    def __init__(self, workers: Sequence[str]):
        self.workers = list(workers)
        self.counter = 0

    def route(self, text: str, loads: Sequence[int]) -> Decision:
        idx = self.counter % len(self.workers)
        self.counter += 1
        return Decision(idx, "round_robin", input_chars=len(text))

    def tick(self, now: float) -> int:
        return 0


class RandomRouter:
    """``src/policies/random.rs`` 21-37: uniform over the workers (seeded here)."""

    name = "random"

    def __init__(self, workers: Sequence[str], seed: int = 0):
        self.workers = list(workers)
        self.rng = random.Random(seed)

    def route(self, text: str, loads: Sequence[int]) -> Decision:
        return Decision(self.rng.randrange(len(self.workers)), "random", input_chars=len(text))

    def tick(self, now: float) -> int:
        return 0


class DataParallelRoundRobin(RoundRobinRouter):
    """SGLang 0.5.23's ``--dp-size N`` default round robin over DP ranks."""

    name = "dp_round_robin"

    def route(self, text: str, loads: Sequence[int]) -> Decision:
        idx = self.counter % len(self.workers)
        self.counter = (self.counter + 1) % len(self.workers)
        return Decision(idx, "dp_round_robin", input_chars=len(text))


def make_router(name: str, workers: Sequence[str], seed: int = 0, **cache_aware_options):
    """cache_aware, round_robin, random or dp_round_robin for ``workers``."""
    if name == "cache_aware":
        return CacheAwareRouter(workers, **cache_aware_options)
    if name == "round_robin":
        return RoundRobinRouter(workers)
    if name == "random":
        return RandomRouter(workers, seed)
    if name == "dp_round_robin":
        return DataParallelRoundRobin(workers)
    raise UserError(f"--router: unknown router {name!r} (choose from {', '.join(ROUTERS)})")
