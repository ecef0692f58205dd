"""The simulator's single byte budget and SGLang's unified memory pool rank the same way.

SGLang side: ``MarconiUnifiedRadixCache`` on SGLang's unified buffer (CPU); simulator side:
``sim_mirror.sglang_image`` with the full cost model (KV tokens and states share the
budget). Where they coincide (``parity_harness``: a buffer the trace does not fill) the
decisions are the same request by request, and the inputs of the joint ranking agree for
every candidate, KV leaves and states alike; the joint walk's order is the order they give.
Why evictions themselves are not compared: ``parity_harness``'s docstring.
"""
from __future__ import annotations

import pytest

pytest.importorskip("sglang")

from sglang_marconi.driver.unified_pools import UnifiedConfig  # noqa: E402
from sglang_marconi.policy.ranking import ranked_efficiency  # noqa: E402
from sglang_marconi.policy.scoring import VictimQueue  # noqa: E402
from sglang_marconi.sglang_integration.unified import (  # noqa: E402
    JointWalk,
    joint_efficiency,
    joint_recency,
)

from parity_harness import (  # noqa: E402
    EXTRA,
    HAND_BUILT,
    NO_BUFFER,
    SPEC,
    SGLangSide,
    SimSide,
    assert_same_decisions,
    generated,
    random_mix,
    sglang_path,
    sim_state_nodes,
)


def unified_pair(regime, requests, alpha=1.0):
    total = sum(len(i) + len(o) for i, o in requests)
    uc = UnifiedConfig(unified_bytes=(4 * total + 4096) * SPEC.kv_bytes_per_token
                       + 4 * len(requests) * SPEC.ssm_state_bytes,
                       kv_bytes_per_token=SPEC.kv_bytes_per_token,
                       state_bytes=SPEC.ssm_state_bytes, mamba_slots=2 * len(requests) + 8)
    sgl = SGLangSide(regime, requests, alpha=alpha, unified=uc)
    return sgl, SimSide(regime.sim(sgl.grid, alpha=alpha, capacity=None, spec=SPEC))


@pytest.mark.parametrize("regime", [EXTRA, NO_BUFFER], ids=lambda r: r.name)
@pytest.mark.parametrize("trace", list(HAND_BUILT), ids=str)
def test_same_admission_and_hits_in_the_unified_pool(regime, trace):
    requests = HAND_BUILT[trace]()
    assert_same_decisions(requests, *unified_pair(regime, requests))


@pytest.mark.parametrize("source,seed", [("fork-join", 0), ("chat", 1), ("mix", 0)])
def test_same_joint_scores_for_every_candidate(source, seed):
    """Every candidate of the joint walk (unlocked states, evictable leaves): its recency
    and its FLOP efficiency per byte freed in the shared buffer equal the simulator's for
    the node at the same path (a leaf: own KV + state; an inner node: its state), and the
    walk's order is the order those values give."""
    requests = random_mix(seed) if source == "mix" else generated(source, seed)
    sgl, sim_side = unified_pair(EXTRA, requests)
    assert_same_decisions(requests, sgl, sim_side)
    cache, tree = sgl.cache, sim_side.sim.tree
    by_path = sim_state_nodes(sim_side.sim)
    root = cache.tree_core.root_node
    walk = JointWalk(cache)
    ours, theirs = {}, {}
    leaves = kinds = 0
    for node in walk.queue.candidates():
        x = node[0]
        path = sglang_path(x, root)
        leaf = walk.is_leaf(x)
        leaves += leaf
        ours[path] = (joint_recency(cache, x), joint_efficiency(cache, x, leaf))
        ref = by_path[path]  # every candidate here holds a state (the extra buffer's tree)
        assert leaf == (not ref.children), len(path)
        efficiency = (tree.efficiency(ref) if tree.is_candidate(ref)
                      else ranked_efficiency(tree.spec, tree, ref, tree.freed_bytes(ref)))
        theirs[path] = (ref.last_access, efficiency)
    kinds = (leaves > 0) + (leaves < len(ours))
    assert kinds == 2, "the case at hand: leaves and inner states"
    assert set(ours) == set(by_path)
    for path, (recency, efficiency) in ours.items():
        assert recency == theirs[path][0], len(path)
        assert efficiency == pytest.approx(theirs[path][1], rel=1e-12), len(path)
    order = []
    while (x := walk.queue.pop_victim()) is not None:
        order.append(sglang_path(x, root))
    reference = VictimQueue(1.0)
    for path, (recency, efficiency) in theirs.items():
        reference.update(path, recency, efficiency)
    reference.refresh()
    assert order == reference.ordered()
