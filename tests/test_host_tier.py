"""The two-tier rule (``policy/host_tier.py``): a host hit's worth net of its PCIe load,
per host byte; the host victims' order (GDSF aging for marconi+, the alpha utility for
marconi, LRU at alpha 0); end states kept for a host tier that backs up on a later insert;
the PCIe constants of the time model."""
import heapq
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from sglang_marconi.model import preset_spec
from sglang_marconi.policy.defaults import NO_CAP
from sglang_marconi.policy.host_tier import (HostClock, HostLink, HostRanking,
                                             demoted_efficiency, host_efficiency,
                                             host_hit_value, host_link_preset,
                                             tail_counts_toward_backup)
from sglang_marconi.policy.likelihood import EndStateUsefulness
from sglang_marconi.policy.snapshot_admission import SnapshotAdmission, new_plan
from sglang_marconi.serving.gpu_model import PRESETS

SPEC = preset_spec("paper-7b")
LINK = HostLink(bytes_s=64e9, prefill_flops_s=445e12)


@dataclass(eq=False)
class Node:
    depth: int
    state: bool
    parent: "Node" = None
    children: list = field(default_factory=list)


# the ranking's view of these nodes (policy.ranking.TreeAdapter)
Tree = SimpleNamespace(depth=lambda n: n.depth, has_state=lambda n: n.state,
                       parent=lambda n: n.parent, children=lambda n: n.children)


def chain(*specs):
    """root -> nodes of (depth, state) in order; returns them (root first)."""
    nodes = [Node(0, False)]
    for depth, state in specs:
        n = Node(depth, state, parent=nodes[-1])
        nodes[-1].children.append(n)
        nodes.append(n)
    return nodes


def test_load_costs_flops_at_the_link_rate():
    assert LINK.load_flops(64e9) == pytest.approx(445e12)  # one second of the GPU
    saved = SPEC.flops_saved(4096, 1024)
    load = 3072 * SPEC.kv_bytes_per_token + SPEC.ssm_state_bytes
    assert host_hit_value(SPEC, LINK, 4096, 1024, load) == pytest.approx(
        saved - LINK.load_flops(load))
    assert 0 < host_hit_value(SPEC, LINK, 4096, 1024, load) < saved
    # a load slower than the recompute is worth nothing, never negative
    slow = HostLink(bytes_s=1.0, prefill_flops_s=445e12)
    assert host_hit_value(SPEC, slow, 4096, 1024, load) == 0.0


def test_a_device_node_on_the_host_too_is_worth_the_load_its_demotion_costs():
    freed = 3072 * SPEC.kv_bytes_per_token
    full = SPEC.flops_saved(4096, 1024) / freed          # its device efficiency
    load = LINK.load_flops(freed + SPEC.ssm_state_bytes) / freed
    assert 0 < load < full                               # PCIe is cheaper than the prefill
    assert demoted_efficiency(LINK, full, freed, SPEC.ssm_state_bytes) == pytest.approx(load)
    # the reuse weight scales it as it scales the efficiency
    assert demoted_efficiency(LINK, 3 * full, freed, SPEC.ssm_state_bytes, 3.0) == \
        pytest.approx(3 * load)
    # never above what the node saves (a link slower than the prefill), 0 stays 0
    slow = HostLink(bytes_s=1.0, prefill_flops_s=445e12)
    assert demoted_efficiency(slow, full, freed, SPEC.ssm_state_bytes) == full
    assert demoted_efficiency(LINK, 0.0, freed, SPEC.ssm_state_bytes) == 0.0


def test_efficiency_is_net_worth_per_host_byte_from_the_nearest_state_on_either_tier():
    root, a, b, c = chain((1024, True), (2048, False), (4096, True))
    own = 2048
    held = own * SPEC.kv_bytes_per_token + SPEC.ssm_state_bytes
    load = own * SPEC.kv_bytes_per_token + SPEC.ssm_state_bytes
    want = host_hit_value(SPEC, LINK, 4096, 1024, load) / held  # b has no state: from a
    assert host_efficiency(SPEC, LINK, Tree, c, own, held) == pytest.approx(want)
    assert host_efficiency(SPEC, LINK, Tree, c, own, held, weight=lambda n: 3.0) == \
        pytest.approx(3 * want)
    assert host_efficiency(SPEC, LINK, Tree, b, 1024, held) == 0.0  # no state: no hit ends
    assert host_efficiency(SPEC, LINK, Tree, c, own, 0) == 0.0
    a.state = False  # the nearest state is now the root
    assert host_efficiency(SPEC, LINK, Tree, c, own, held) == pytest.approx(
        host_hit_value(SPEC, LINK, 4096, 0, load) / held)


def pops(heap):
    return [heapq.heappop(heap)[2] for _ in range(len(heap))]


def test_gdsf_ranks_by_worth_then_ages_with_the_clock():
    x, y, z = Node(1, True), Node(2, True), Node(3, True)
    eff = {x: 5.0, y: 1.0, z: 3.0}
    touched = {x: 0, y: 0, z: 0}
    clock = HostClock()
    ranking = HostRanking("gdsf", eff.get, touched.get, clock=clock)
    heap = ranking.heap([x, y, z])
    assert pops(list(heap)) == [y, z, x]
    key, _, victim = heapq.heappop(heap)
    clock.evicted(victim, key)
    assert clock.value == 1.0
    # z touched after the clock moved: its base is now 1.0 (1 + 3 = 4 < x's 0 + 5 = 5);
    # x untouched keeps base 0
    touched[z] = 7
    assert ranking.key(z) == 4.0 and ranking.key(x) == 5.0
    eff[x] = 3.5  # x loses worth: it now ages out before z
    assert pops(ranking.heap([x, z])) == [x, z]


def test_marconi_mode_is_lru_at_alpha_zero_and_the_utility_otherwise():
    old, new = Node(1, True), Node(2, True)
    eff = {old: 10.0, new: 1.0}
    rec = {old: 1.0, new: 2.0}
    assert pops(HostRanking("marconi", eff.get, rec.get).heap([new, old])) == [old, new]
    # alpha 2: norm(rec) + 2 norm(eff): old = 0 + 2, new = 1 + 0
    ranking = HostRanking("marconi", eff.get, rec.get, alpha=2.0)
    assert pops(ranking.heap([new, old])) == [new, old]
    assert ranking.key(old) == pytest.approx(2.0) and ranking.key(new) == pytest.approx(1.0)


def test_bad_modes_are_named():
    with pytest.raises(ValueError, match="unknown mode 'lfu'"):
        HostRanking("lfu", float, float)
    with pytest.raises(ValueError, match="gdsf needs a HostClock"):
        HostRanking("gdsf", float, float)


def test_pcie_constants_are_one_direction_of_the_datasheets_figure():
    assert PRESETS["a100"].pcie_bytes_s == 32e9  # "PCIe Gen4: 64 GB/s"
    assert PRESETS["h100"].pcie_bytes_s == PRESETS["h200"].pcie_bytes_s == 64e9  # Gen5 128
    link = host_link_preset("h200", pcie_bytes_s=32e9)
    assert link.bytes_s == 32e9
    assert link.prefill_flops_s == pytest.approx(PRESETS["h200"].mfu * 989e12)


def test_only_a_backup_on_a_later_insert_makes_the_tail_count():
    # SGLang: write_through backs up at the first insert (threshold 1), selective at the
    # second (2), write_back at eviction whatever the count
    assert tail_counts_toward_backup(write_back=False, backup_threshold=2)
    assert not tail_counts_toward_backup(write_back=False, backup_threshold=1)
    assert not tail_counts_toward_backup(write_back=True, backup_threshold=2)


class _Admission(SnapshotAdmission):
    """The mixin's inputs: marconi+'s end-state usefulness and a ghost index (whose answer
    is not read here), no cap."""

    max_states, grid, ghost, reuse = NO_CAP, 64, object(), None

    def __init__(self, keeps_tail: bool):
        self.end_usefulness = EndStateUsefulness(threshold=0.05)
        self.end_usefulness.ends = 100  # end states learned to be never reused
        self.stats = SimpleNamespace(end_states_skipped=0)
        self._keeps_tail = keeps_tail

    def keeps_tail_for_backup(self) -> bool:
        return self._keeps_tail

    def snapshot_rejected(self) -> None:
        raise AssertionError("no cap here")


@pytest.mark.parametrize("keeps_tail", [False, True])
def test_a_host_tier_that_counts_inserts_keeps_the_end_state(keeps_tail):
    admission = _Admission(keeps_tail)
    assert not admission.end_usefulness.admit()
    plan = new_plan(input_len=1000, hit_len=0, branch_len=None, grid=64, max_states=NO_CAP)
    assert admission.offer_final(plan, 960, 1000) is keeps_tail
    assert admission.stats.end_states_skipped == (0 if keeps_tail else 1)
