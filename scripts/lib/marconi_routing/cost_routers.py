"""The ``marconi`` and ``oracle`` routers: replicas behind a router that scores prefill FLOPs.

Both score each replica by the prefill FLOPs a request would save there minus a load
penalty, and keep cache_aware's balance guard (same rule, same thresholds:
``router.CacheAwareRouter.imbalanced``): when the in-flight counts are imbalanced the
least loaded replica takes the request, the first on ties.

score(k) = flops_saved(reusable tokens on k)
           + branch_weight x flops_saved(branch point on k) beyond that reuse
           - load_penalty x queued prefill FLOPs of k

- queued prefill FLOPs: for every request routed to k whose first token has not come back
  yet, its prefill FLOPs minus those of the reuse the router expected when it routed it
  (what the replica still has to compute before it can start this one). ``load_penalty``
  1 is TTFT-greedy: the wait behind k's queue plus this request's own prefill, in FLOPs.
- branch point: where the request's KV match on k (floored to the checkpoint grid) runs
  past the reusable state, SGLang snapshots a state there during this prefill
  (``sglang_branch_point``); the next request with this prefix reuses it only if it goes to
  k too. ``branch_weight`` values that future hit (0: score today's reuse only).
- ties: the least queued prefill FLOPs, then the fewest requests in flight, then the
  lowest replica index.
- ``affinity_threshold`` T (serve-sim's default 0.3, sglang-router's ``--cache-threshold``)
  replaces the score by cache_aware's rule in FLOPs: the value of k is the score without
  the load term; when the best value is above T x the request's prefill FLOPs the request
  goes there (rule ``affinity``), else to the least queued replica (``flops_load``).
- owners (``owner_tokens``, default cache_aware's ``--max-tree-size``, 2^26): before that
  fallback, the replica the router sent the longest prefix of the request to, by its own
  memory of what it sent (chained block hashes, an LRU of ``owner_tokens`` per replica,
  which outlives what the replica still holds), when that prefix is above T x the
  request's tokens (cache_aware's rule on its own tree: rule ``owner``). A family whose
  states the replica evicted goes back to where its KV was: a hybrid replica needs two
  visits to a prefix before a third can reuse it, and scattering the family over the least
  queued replicas restarts that count on each. 0 turns it off.
  Every call is O(replicas x blocks of the request); the request's blocks are hashed once
  per call (``route_request``) and every record lookup reuses those hashes.

``marconi`` (``MarconiRouter``) knows only what a router can know. Per replica it keeps
a record of what it sent there as chained hashes of the request's tokens in blocks of the
checkpoint grid (64 tokens: SGLang's states lie on that grid), an LRU bounded by the
replica's KV tokens, and the blocks at whose end it believes the replica holds an SSM state
(an LRU bounded by the replica's state slots). The reusable prefix is the deepest believed
state on the matched path (the match key capped at input - 1 tokens, as SGLang's is).
Beliefs come from the replica's admission rule, stock SGLang's (extra_buffer,
``replica_admission.plan_sglang_checkpoints``): chunk-end snapshots, the branch point where
the request leaves what the router sent there before (KV match floored to the grid,
``sglang_branch_point``), the end of the prefill and the last decode-track snapshot. They
are added when the response is complete, from the ``cached_tokens`` it reports: states the
router believed beyond what the replica reused are dropped (evicted there), the state it did
reuse is added, and the plan is made from the real hit. marconi+ replicas keep a subset of
those states; the feedback corrects the rest.

``oracle`` (``OracleRouter``) asks every replica's real cache how many tokens a match would
reuse, by a read-only walk over the tree core's nodes (``readonly_match``): SGLang's
``match_prefix`` splits nodes and refreshes access times. It needs the python tree core, so
stock replicas behind it run ``stock-python`` (the same cache, hit for hit:
tests/test_bench_overhead.py). It is the ceiling for routing on reuse, not deployable.
"""
from __future__ import annotations

import math
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from marconi_routing.replica_admission import (SGLangGrids, plan_marconi_in_sglang,
                                               plan_sglang_checkpoints, sglang_branch_point,
                                               sglang_grid, sglang_track_grid)
from sglang_marconi.errors import UserError
from sglang_marconi.serving.router import CacheAwareRouter, Decision, first_min

COST_ROUTERS = ("marconi", "oracle")
# the replica admission rules the marconi router can model: stock SGLang's, and marconi+'s
# (SGLang's snapshots without the end-state candidates, which it admits only while their
# measured reuse rate is high: the router believes the branch point and chunk states)
ADMISSION_RULES = ("sglang", "marconi+")
# defaults: picked on the first 1,500 requests of the shared Mooncake trace (docs/scale-out.md,
# "Choosing the weights"); 1 and 0 are the plain rule (TTFT-greedy, reuse only)
LOAD_PENALTY = 0.1
BRANCH_WEIGHT = 1.0
# serve-sim's default rule for both (``--router-affinity-threshold``): sglang-router's own
# --cache-threshold default, in FLOPs of the reusable prefix (docs/scale-out.md)
AFFINITY_THRESHOLD = 0.3
# what the router remembers sending to each replica, in tokens: sglang-router's
# cache_aware --max-tree-size default (characters per worker, CacheAwareConfig::default)
OWNER_TOKENS = 1 << 26


def block_hashes(ids: Sequence[int], grid: int, limit: Optional[int] = None) -> List[int]:
    """Chained hashes of the first ``limit`` tokens (all by default) in whole blocks of
    ``grid``: entry i stands for the prefix of (i + 1) x grid tokens. Python hashes of int
    tuples are the same in every process (no hash seed)."""
    n = len(ids) if limit is None else min(limit, len(ids))
    out, h = [], 0
    for start in range(0, n - grid + 1, grid):
        h = hash((h, tuple(ids[start:start + grid])))
        out.append(h)
    return out


class LRUSet:
    """Keys in recency order, at most ``cap`` (the oldest go first)."""

    def __init__(self, cap: int):
        self.cap = max(1, int(cap))
        self.keys: OrderedDict = OrderedDict()

    def __contains__(self, key) -> bool:
        return key in self.keys

    def __len__(self) -> int:
        return len(self.keys)

    def touch(self, key) -> None:
        if key in self.keys:
            self.keys.move_to_end(key)

    def add(self, key) -> list:
        """Add or refresh ``key``; returns the keys evicted to stay within the cap."""
        self.keys[key] = None
        self.keys.move_to_end(key)
        evicted = []
        while len(self.keys) > self.cap:
            evicted.append(self.keys.popitem(last=False)[0])
        return evicted

    def discard(self, key) -> None:
        self.keys.pop(key, None)


class ReplicaRecord:
    """What the marconi router believes one replica holds: the blocks it sent there (KV)
    and the block ends where it believes a state is."""

    def __init__(self, kv_blocks: int, state_slots: int):
        self.blocks = LRUSet(kv_blocks)
        self.states = LRUSet(state_slots)

    def match(self, hashes: Sequence[int]) -> tuple:
        """(blocks of KV matched, blocks up to the deepest believed state within them)."""
        kv = state = 0
        for i, h in enumerate(hashes):
            if h not in self.blocks:
                break
            kv = i + 1
            if h in self.states:
                state = i + 1
        return kv, state

    def touch_path(self, hashes: Sequence[int], state_blocks: int) -> None:
        """A hit refreshes the path, parents last (most recent: evicted after children),
        and the state it reuses."""
        for h in reversed(hashes):
            self.blocks.touch(h)
        if state_blocks:
            self.states.touch(hashes[state_blocks - 1])

    def record(self, hashes: Sequence[int]) -> None:
        for h in reversed(hashes):
            for gone in self.blocks.add(h):
                self.states.discard(gone)

    def believe_state(self, h) -> None:
        if h in self.blocks:
            self.states.add(h)


@dataclass
class InFlight:
    """A routed request whose response is not complete."""
    replica: int
    input_ids: Sequence[int]
    kv_tokens: int                 # the router's KV match on the chosen replica at routing
    believed_tokens: int           # what it expected the replica to reuse
    queued_flops: float            # its prefill FLOPs still to run (until its first token)


class CostRouter:
    """The scoring, the balance guard and the queue bookkeeping both routers share."""

    name = "cost"

    grid = 64

    def __init__(self, workers: Sequence[str], spec, load_penalty: float = LOAD_PENALTY,
                 branch_weight: float = BRANCH_WEIGHT,
                 balance_abs_threshold: int = 64, balance_rel_threshold: float = 1.5,
                 affinity_threshold: Optional[float] = None, owner_tokens: int = OWNER_TOKENS):
        if not workers:
            raise UserError("router: at least one worker is needed")
        if not (math.isfinite(load_penalty) and load_penalty >= 0):
            raise UserError(f"--router-load-penalty: expected a number >= 0, got {load_penalty}")
        self.workers = list(workers)
        self.spec = spec
        self.load_penalty = float(load_penalty)
        if not (math.isfinite(branch_weight) and branch_weight >= 0):
            raise UserError(f"--router-branch-weight: expected a number >= 0, got {branch_weight}")
        self.branch_weight = float(branch_weight)
        if affinity_threshold is not None and not 0 <= affinity_threshold <= 1:
            raise UserError("--router-affinity-threshold: expected a fraction in [0, 1], got "
                            f"{affinity_threshold}")
        self.affinity_threshold = affinity_threshold
        if owner_tokens < 0:
            raise UserError(f"--router-owner-tokens: expected a number >= 0, got {owner_tokens}")
        self.owner_tokens = int(owner_tokens)
        self.owners = [LRUSet(max(1, self.owner_tokens // self.grid)) for _ in self.workers]
        # the balance guard is cache_aware's own rule (and its threshold checks)
        self.guard = CacheAwareRouter(workers, balance_abs_threshold=balance_abs_threshold,
                                      balance_rel_threshold=balance_rel_threshold,
                                      eviction_interval_secs=0)
        self.in_flight: Dict[str, InFlight] = {}
        self.queued: List[Dict[str, float]] = [{} for _ in self.workers]

    # -- what each router knows ------------------------------------------------------------
    def reusable(self, k: int, input_ids: Sequence[int],
                 hashes: Optional[Sequence[int]] = None) -> tuple:
        """(tokens replica ``k`` would reuse, its KV match in tokens) as this router knows;
        ``hashes``: ``block_hashes(input_ids, grid)`` if the caller has them (a routing
        call hashes once)."""
        raise NotImplementedError

    def on_routed(self, k: int, input_ids: Sequence[int], hashes: Sequence[int]) -> None:
        pass

    def on_complete(self, flight: InFlight, cached_tokens: int, output_ids) -> None:
        pass

    # -- routing ---------------------------------------------------------------------------
    def queued_flops(self, k: int) -> float:
        return math.fsum(self.queued[k].values())

    def value(self, reusable: int, kv: int, input_len: int) -> float:
        """The FLOPs a request saves on a replica: its reuse there, plus ``branch_weight``
        x what a hit on the branch point it would plant there would save beyond that."""
        saved = self.spec.flops_saved(reusable)
        if self.branch_weight:
            branch = sglang_branch_point(min(kv, input_len - 1), reusable, self.grid)
            if branch:
                saved += self.branch_weight * self.spec.flops_saved(branch, reusable)
        return saved

    def score(self, k: int, reusable: int, kv: int, input_len: int) -> float:
        return self.value(reusable, kv, input_len) - self.load_penalty * self.queued_flops(k)

    def least_queued(self, candidates, loads: Sequence[int]) -> int:
        """The least queued prefill FLOPs, then the fewest in flight, then the lowest index."""
        return min(candidates, key=lambda k: (self.queued_flops(k), loads[k], k))

    def choose(self, views, loads: Sequence[int], input_len: int, hashes=()) -> tuple:
        """(replica, rule) once the balance guard has let the request through;
        ``hashes``: the request's key in blocks (the owner fallback)."""
        n = range(len(self.workers))
        if self.affinity_threshold is None:
            scores = [self.score(k, *views[k], input_len) for k in n]
            # ties (e.g. no reuse anywhere): least_queued's order
            best = max(scores)
            idx = self.least_queued([k for k in n if scores[k] == best], loads)
            return idx, "flops_hit" if views[idx][0] > 0 else "flops_load"
        values = [self.value(*views[k], input_len) for k in n]
        best = max(values)
        if best > self.affinity_threshold * self.spec.prefill_flops(input_len):
            return self.least_queued([k for k in n if values[k] == best], loads), "affinity"
        if self.owner_tokens and hashes:
            sent = [self.owned_blocks(k, hashes) for k in n]
            most = max(sent)
            if most * self.grid > self.affinity_threshold * input_len:
                return self.least_queued([k for k in n if sent[k] == most], loads), "owner"
        return self.least_queued(n, loads), "flops_load"

    def owned_blocks(self, k: int, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` the router remembers sending to replica ``k``."""
        owned = self.owners[k]
        for i, h in enumerate(hashes):
            if h not in owned:
                return i
        return len(hashes)

    def remember_owner(self, k: int, hashes: Sequence[int]) -> None:
        """Replica ``k`` was sent the request of block ``hashes``: refresh its path, parents
        last."""
        if self.owner_tokens:
            owned = self.owners[k]
            for h in reversed(hashes):
                owned.add(h)

    def key_blocks(self, input_ids: Sequence[int], hashes: Sequence[int]) -> Sequence[int]:
        """The blocks of the match key (input - 1 tokens, as SGLang's) among ``hashes``: a
        chained hash stands for its prefix only, so they are the leading ones."""
        return hashes[:max(0, len(input_ids) - 1) // self.grid]

    def route_request(self, rid: str, input_ids: Sequence[int], loads: Sequence[int]) -> Decision:
        if len(loads) != len(self.workers):
            raise ValueError(f"{len(loads)} loads for {len(self.workers)} workers")
        hashes = block_hashes(input_ids, self.grid)   # the one hashing of this call
        views = [self.reusable(k, input_ids, hashes) for k in range(len(self.workers))]
        if self.guard.imbalanced(loads):
            idx, rule = first_min(loads), "balance"
        else:
            idx, rule = self.choose(views, loads, len(input_ids),
                                    self.key_blocks(input_ids, hashes)
                                    if self.owner_tokens else ())
        believed, kv = views[idx]
        flops = self.spec.prefill_flops(len(input_ids)) - self.spec.prefill_flops(believed)
        self.in_flight[rid] = InFlight(idx, input_ids, kv, believed, flops)
        self.queued[idx][rid] = flops
        self.on_routed(idx, input_ids, hashes)
        self.remember_owner(idx, hashes)
        return Decision(idx, rule, input_chars=len(input_ids), believed_tokens=believed)

    def prefill_done(self, rid: str) -> None:
        """The replica sent the request's first token: its prefill is no longer queued."""
        flight = self.in_flight.get(rid)
        if flight is not None:
            self.queued[flight.replica].pop(rid, None)

    def complete(self, rid: str, cached_tokens: Optional[int], output_ids=()) -> None:
        """The response is complete; ``cached_tokens`` is what the replica reports it reused
        (None: aborted before admission)."""
        flight = self.in_flight.pop(rid, None)
        if flight is None:
            return
        self.queued[flight.replica].pop(rid, None)
        if cached_tokens is not None:
            self.on_complete(flight, int(cached_tokens), output_ids)

    def tick(self, now: float) -> int:
        return 0


class MarconiRouter(CostRouter):
    """The rule a router can run: its own record per replica (see the module doc)."""

    name = "marconi"

    def __init__(self, workers: Sequence[str], spec, kv_tokens: int, state_slots: int,
                 page_size: int = 64, chunked_prefill_size: int = 8192,
                 mamba_track_interval: int = 256, admission: str = "sglang", **options):
        self.grid = sglang_grid(page_size)  # before the base sizes its records in blocks
        super().__init__(workers, spec, **options)
        if admission not in ADMISSION_RULES:
            raise UserError(f"router: admission rule must be one of {', '.join(ADMISSION_RULES)}"
                            f", got {admission!r}")
        self.admission = admission
        self.page = page_size
        self.chunk = chunked_prefill_size
        self.track_grid = sglang_track_grid(self.grid, mamba_track_interval)
        self.records = [ReplicaRecord(max(1, kv_tokens // self.grid), state_slots)
                        for _ in self.workers]
        self.corrections = {"dropped": 0, "added": 0}

    def reusable(self, k: int, input_ids: Sequence[int],
                 hashes: Optional[Sequence[int]] = None) -> tuple:
        if hashes is None:
            hashes = block_hashes(input_ids, self.grid)
        kv, state = self.records[k].match(self.key_blocks(input_ids, hashes))
        return state * self.grid, kv * self.grid

    def on_routed(self, k: int, input_ids: Sequence[int], hashes: Sequence[int]) -> None:
        record = self.records[k]
        _, state = record.match(hashes)
        record.touch_path(hashes, state)
        record.record(hashes)

    def on_complete(self, flight: InFlight, cached_tokens: int, output_ids) -> None:
        record = self.records[flight.replica]
        seq = array("q", flight.input_ids)
        seq.extend(int(t) for t in list(output_ids)[:-1])   # the last token has no KV
        hashes = block_hashes(seq, self.grid)
        hit_blocks = min(cached_tokens // self.grid, len(hashes))
        believed_blocks = min(flight.believed_tokens // self.grid, len(hashes))
        for i in range(hit_blocks, believed_blocks):     # states it did not have (evicted)
            if hashes[i] in record.states:
                record.states.discard(hashes[i])
                self.corrections["dropped"] += 1
        if hit_blocks and hashes[hit_blocks - 1] not in record.states:
            self.corrections["added"] += hit_blocks > believed_blocks
        if hit_blocks:
            record.believe_state(hashes[hit_blocks - 1])
        input_len = len(flight.input_ids)
        branch = sglang_branch_point(flight.kv_tokens, cached_tokens, self.grid)
        plan = plan_sglang_checkpoints(input_len, len(output_ids), cached_tokens, branch,
                                       self.chunk, self.page, self.grid, self.track_grid)
        if plan.cached_len:
            record.record(hashes[:plan.cached_len // self.grid])
        positions = plan.positions
        if self.admission == "marconi+":
            grids = SGLangGrids(self.chunk, self.page, self.grid, self.track_grid)
            positions = plan_marconi_in_sglang(input_len, len(output_ids), cached_tokens,
                                               branch, grids, len(positions)).intermediate
        for pos in positions:
            if 0 < pos <= len(hashes) * self.grid:
                record.believe_state(hashes[pos // self.grid - 1])


def readonly_match(cache, input_ids: Sequence[int]) -> tuple:
    """(tokens ``cache``'s match would reuse, its KV match) for a request with
    ``input_ids`` (the key capped at input - 1 tokens, page-aligned), by a walk over the
    python tree core's nodes that writes nothing: the reuse ends at the deepest fully
    matched node every component validates on device (a partial edge match would split
    the node, and the upper half of a split holds no state); the KV match runs on into a
    partial edge, as SGLang's does."""
    from sglang.srt.mem_cache.radix_cache import RadixKey  # heavy: sglang

    core = cache.tree_core
    try:
        root = core.root_node
    except NotImplementedError:     # the compiled (rust) core keeps its nodes to itself
        root = None
    if root is None or not hasattr(core, "components"):
        raise UserError("--router oracle: the cache's tree core cannot be walked read-only "
                        "(the compiled core); use a python-core cache")
    page = core.page_size
    key = RadixKey(array("q", input_ids[:max(0, len(input_ids) - 1)])).page_aligned(page)
    validators = [c.create_match_validator(match_device_only=True) for c in core.components]
    node, offset, best = root, 0, 0
    while offset < len(key):
        child = node.children.get(key.child_key_at(offset, page))
        if child is None or child.evicted:
            break
        matched = child.key.match_at(key, offset, page_size=page)
        offset += matched
        if matched < len(child.key):
            break
        node = child
        if all(v(node) for v in validators):
            best = offset
    return best, offset


class OracleRouter(CostRouter):
    """Asks every replica's real cache (read-only): the ceiling, not deployable."""

    name = "oracle"

    def __init__(self, workers: Sequence[str], spec, caches: Sequence, **options):
        if len(caches) != len(workers):
            raise ValueError(f"{len(caches)} caches for {len(workers)} workers")
        self.caches = list(caches)
        self.grid = sglang_grid(self.caches[0].page_size)  # before the base's records
        super().__init__(workers, spec, **options)

    def reusable(self, k: int, input_ids: Sequence[int],
                 hashes: Optional[Sequence[int]] = None) -> tuple:
        return readonly_match(self.caches[k], input_ids)


def make_cost_router(name: str, workers: Sequence[str], spec, pools=None, caches=None,
                     admission: str = "sglang", **options) -> CostRouter:
    """``marconi`` (sized from the replicas' ``PoolConfig``, modelling their ``admission``
    rule) or ``oracle`` (their caches)."""
    if name == "marconi":
        return MarconiRouter(workers, spec, pools.kv_tokens, pools.mamba_slots,
                             pools.page_size, pools.chunked_prefill_size,
                             pools.mamba_track_interval, admission=admission, **options)
    if name == "oracle":
        return OracleRouter(workers, spec, caches, **options)
    raise UserError(f"--router: unknown router {name!r} (choose from {', '.join(COST_ROUTERS)})")
