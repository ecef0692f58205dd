"""The two-tier rule (SGLang's HiCache): what a prefix segment or a state is worth in host
memory (``host_efficiency``: FLOPs saved less the load-back, per host byte) and on the device
once demoted (``demoted_efficiency``); both tiers' states count as checkpoints."""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from sglang_marconi.model.cost import CostModel
from sglang_marconi.model.gpus import DEFAULT_HOST_GPU, preset
from sglang_marconi.policy.ranking import TreeAdapter, nearest_state_depth
from sglang_marconi.policy.scoring import utility

MODES = ("gdsf", "marconi")


@dataclass(frozen=True)
class HostLink:
    """The host -> device copy and the GPU it feeds: a load's cost in FLOPs forgone."""

    bytes_s: float          # host -> device bandwidth (bytes/s)
    prefill_flops_s: float  # the GPU's prefill FLOP rate (FLOP/s)

    def load_flops(self, nbytes: float) -> float:
        """FLOPs the GPU could compute in the time ``nbytes`` take to load."""
        return nbytes / self.bytes_s * self.prefill_flops_s


def host_hit_value(spec: CostModel, link: HostLink, depth: int, ancestor_depth: int,
                   load_bytes: float) -> float:
    """FLOPs a hit at ``depth`` saves over ``ancestor_depth``, less its load; >= 0."""
    return max(0.0, spec.flops_saved(depth, ancestor_depth) - link.load_flops(load_bytes))


def demoted_efficiency(link: HostLink, efficiency: float, freed_bytes: float,
                       state_bytes: float, weight: float = 1.0) -> float:
    """A demoted node's device worth per byte: min(``efficiency``, its load cost)."""
    if freed_bytes <= 0 or not efficiency:
        return efficiency
    return min(efficiency, link.load_flops(freed_bytes + state_bytes) / freed_bytes * weight)


def tail_counts_toward_backup(write_back: bool, backup_threshold: int) -> bool:
    """Whether the host backs a node up only on a later insert (then a tail is admitted)."""
    return not write_back and backup_threshold > 1


def host_efficiency(spec: CostModel, link: HostLink, tree: TreeAdapter, node, own_tokens: int,
                    held_bytes: float, weight: Optional[Callable] = None) -> float:
    """The host worth of ``node`` per host byte (0 without a state at its end)."""
    if held_bytes <= 0 or not tree.has_state(node):
        return 0.0
    load = own_tokens * spec.kv_bytes_per_token + spec.ssm_state_bytes
    value = host_hit_value(spec, link, tree.depth(node), nearest_state_depth(tree, node), load)
    e = value / held_bytes
    return e * weight(node) if weight is not None and e else e


class HostClock:
    """marconi+'s GDSF inflation clock of one host pool (bases stamped on the nodes)."""

    def __init__(self, attr: str = "_host_clock_stamp"):
        self.value = 0.0
        self.attr = attr

    def base(self, node, marker) -> float:
        seen = getattr(node, self.attr, None)
        if seen is None or seen[0] != marker:
            seen = (marker, self.value)
            setattr(node, self.attr, seen)
        return seen[1]

    def evicted(self, node, key: float) -> None:
        self.value = max(self.value, key)
        self.forget(node)

    def forget(self, node) -> None:
        if getattr(node, self.attr, None) is not None:
            setattr(node, self.attr, None)


class HostRanking:
    """Keys of host victims, lowest first (``gdsf`` aged or the paper's utility)."""

    def __init__(self, mode: str, efficiency: Callable, recency: Callable,
                 alpha: float = 0.0, clock: Optional[HostClock] = None):
        if mode not in MODES:
            raise ValueError(f"host ranking: unknown mode {mode!r} (expected one of {MODES})")
        if mode == "gdsf" and clock is None:
            raise ValueError("host ranking: gdsf needs a HostClock")
        self.mode, self.efficiency, self.recency = mode, efficiency, recency
        self.alpha, self.clock = float(alpha), clock
        self._bounds = (0.0, 1.0, 0.0, 1.0)
        self._seq = itertools.count()

    def key(self, node) -> float:
        if self.mode == "gdsf":
            return self.clock.base(node, self.recency(node)) + self.efficiency(node)
        if self.alpha == 0.0:
            return self.recency(node)
        r_lo, r_span, e_lo, e_span = self._bounds
        return utility((self.recency(node) - r_lo) / r_span,
                       (self.efficiency(node) - e_lo) / e_span, self.alpha)

    def entry(self, node) -> tuple:
        """A heap entry (key, seq, node): ties keep the order of entry."""
        return (self.key(node), next(self._seq), node)

    def heap(self, candidates: Iterable) -> list:
        """A heap over ``candidates`` (normalisation bounds taken from them first)."""
        nodes = list(candidates)
        if self.mode == "marconi" and self.alpha and nodes:
            rec = [self.recency(n) for n in nodes]
            eff = [self.efficiency(n) for n in nodes]
            self._bounds = (min(rec), (max(rec) - min(rec)) or 1.0,
                            min(eff), (max(eff) - min(eff)) or 1.0)
        heap = [self.entry(n) for n in nodes]
        heapq.heapify(heap)
        return heap


def host_link_preset(name: str = DEFAULT_HOST_GPU, **overrides) -> HostLink:
    """A preset's host-load cost: PCIe bytes/s and the prefill FLOP rate it forgoes."""
    gpu = preset(name, **overrides)
    return HostLink(gpu.pcie_bytes_s, gpu.mfu * gpu.peak_flops)
