"""The two-tier rule (SGLang's HiCache: a host tier behind the device pools): what a
prefix segment or a state is worth in host memory.

A hit that finds its prefix on the host tier instead of the device skips the prefill of
the segment as a device hit would, but first loads the segment's KV and the state at its
end back over PCIe. Its worth is the FLOPs it saves minus the load it costs, the load
counted in the FLOPs the GPU could have computed meanwhile (bytes / PCIe bandwidth x the
prefill FLOP rate: ``HostLink``), per byte of host memory it occupies, times marconi+'s
reuse weight when given. One rule, ``host_efficiency``; the host victims are ranked by it:

- marconi+ (``gdsf``): Greedy-Dual-Size-Frequency aging as on the device
  (``scoring.VictimQueue``): key = L + efficiency, L the host tier's inflation clock when
  the node was last touched (demoted, backed up or hit), the clock raised to each victim's
  key;
- marconi (``marconi``): the paper's utility over the current host candidates,
  norm(recency) + alpha x norm(efficiency); alpha 0 is LRU, SGLang's own host order.

A node with no state at its end on either tier is worth 0 (no hit can end there): it
goes first.

On the device (``demoted_efficiency``): a node whose KV is on the host tier too (written
through, or backed up on its second insert under ``write_through_selective``) is only
demoted by its eviction, and a later hit pays the load of its KV and state instead of the
prefill; one that is not is dropped. The device ranks the first by that load (in FLOPs, per
device byte it frees), the second by the FLOPs it saves: under ``write_through_selective``
the device keeps what the host does not hold yet, long enough for its second insert to
back it up.

Admission (``tail_counts_toward_backup``): under a write policy that backs a node up on
its second insert (``write_through_selective``) a request's tail is worth inserting for
the host's sake even when its end state is rarely hit. marconi+ refuses such end states
(``likelihood.EndStateUsefulness``), and without its end state SGLang inserts nothing of
the tail, so the tail's first insert never happens: the next request that shares part of
it inserts that part for the first time and only a third one backs it up. With the tail
inserted, the second request's insert (through it, or splitting it at its branch point)
is the one that backs the shared part up.

Both tiers' states count as checkpoints here (``TierTree``): a hit can end at a state on
either tier, so the marginal FLOPs of a segment are measured from its nearest ancestor
with a state on the device or the host.
"""
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
    """FLOPs a hit ending at ``depth`` saves over one ending at ``ancestor_depth``, minus
    the load of ``load_bytes`` it needs first; never below 0."""
    return max(0.0, spec.flops_saved(depth, ancestor_depth) - link.load_flops(load_bytes))


def demoted_efficiency(link: HostLink, efficiency: float, freed_bytes: float,
                       state_bytes: float, weight: float = 1.0) -> float:
    """The device worth per freed byte of a node whose KV is on the host tier too: the
    smaller of its ``efficiency`` (FLOPs saved per byte, reuse-weighted) and the load a
    hit pays once its eviction has demoted it (its KV and a state, in FLOPs forgone, per
    byte), times ``weight`` (marconi+'s reuse weight)."""
    if freed_bytes <= 0 or not efficiency:
        return efficiency
    return min(efficiency, link.load_flops(freed_bytes + state_bytes) / freed_bytes * weight)


def tail_counts_toward_backup(write_back: bool, backup_threshold: int) -> bool:
    """Whether the host tier backs a node up only on a later insert: SGLang counts the
    inserts through a node (``hit_count``) and writes it to host when the count reaches
    ``write_through_threshold`` (``write_through``: 1, at its first insert;
    ``write_through_selective``: 2), except under write_back (``is_write_back``), which
    backs up at eviction, never by count. When it does, an end state marconi+'s learned
    usefulness would refuse is admitted: its insert is the first of the tail's count (the
    module doc)."""
    return not write_back and backup_threshold > 1


def host_efficiency(spec: CostModel, link: HostLink, tree: TreeAdapter, node, own_tokens: int,
                    held_bytes: float, weight: Optional[Callable] = None) -> float:
    """The host worth of ``node`` per byte it holds on the host tier: a hit at its end
    over its nearest checkpointed ancestor (either tier), less the load of its own KV and
    its state, times ``weight(node)`` (marconi+'s reuse weight) when given. 0 when no
    state ends the node (``tree.has_state``: on either tier)."""
    if held_bytes <= 0 or not tree.has_state(node):
        return 0.0
    load = own_tokens * spec.kv_bytes_per_token + spec.ssm_state_bytes
    value = host_hit_value(spec, link, tree.depth(node), nearest_state_depth(tree, node), load)
    e = value / held_bytes
    return e * weight(node) if weight is not None and e else e


class HostClock:
    """marconi+'s GDSF inflation clock of one host pool: a node's base is the clock when
    it was last touched (``base`` stamps it lazily: the caller names the event that marks
    a touch, e.g. the node's access time). The stamp is kept on the node itself (attribute
    ``attr``, one per clock), so it lives as long as the node."""

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
    """Keys of host victims, lowest first: ``gdsf`` L (``clock.base(node, recency(node))``)
    + efficiency; ``marconi`` the paper's utility with min-max bounds over the candidates
    of ``heap`` (recency alone at alpha 0)."""

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
    """The two-tier rule's cost of a host load on a preset: PCIe bytes/s and the prefill
    FLOP rate (mfu x peak) whose FLOPs a load's time forgoes."""
    gpu = preset(name, **overrides)
    return HostLink(gpu.pcie_bytes_s, gpu.mfu * gpu.peak_flops)
