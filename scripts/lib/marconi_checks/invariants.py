"""SGLang's cache invariants, checked on a python-core tree (used by the tests).

- evictable + protected = what the tree holds, for KV tokens and for SSM states;
- with no request running: nothing is protected, every lock count is zero, and every slot
  is either free in its allocator or held by the tree (no leak);
- Marconi's persistent victim queues hold exactly the candidates (unlocked states; the
  evictable leaves) with the inputs a fresh computation gives (a leaf's recency may lag
  its ``last_access_time``: the walk re-keys it when popped), and a state's kept nearest
  checkpointed ancestor depth, and the FLOPs a hit there saves over it, are the ones a
  walk up the tree gives; marconi+: a queued state's key holds the reuse weight it has now;
- unified memory: a joint walk built now (``unified.JointWalk``, from the persistent
  queues and the kept values) holds, in the same order, exactly the candidates and values
  that ``joint_recency`` / ``ranking.ranked_efficiency`` give computed afresh
  (``check_joint_build``);
- unified memory (``--enable-unified-memory``): no byte of the shared buffer leaked (SGLang's
  own ``verify_byte_accounting``), its KV and state sub-allocators hold exactly what the tree
  holds, and the Mamba slot ids likewise;
- ``guard_locked_evictions`` makes evicting data that a lock (device or host) protects fail
  loudly.
"""
from __future__ import annotations

import math

from sglang.srt.mem_cache.unified_cache.components.base import ComponentType, EvictLayer

from sglang_marconi.policy.ranking import freed_bytes, nearest_state_depth, ranked_efficiency
from sglang_marconi.sglang_integration.components import (KEYED_WEIGHT, SAVED, SGLANG_TREE,
                                                           STATE_DEPTH, has_state,
                                                           state_recency, token_depth)
from sglang_marconi.sglang_integration.unified import (JointWalk, droppable_inner_state,
                                                        joint_recency)

FULL, MAMBA = ComponentType.FULL, ComponentType.MAMBA


def walk(cache):
    """All nodes of the tree but the root."""
    root = cache.tree_core.root_node
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def tree_holdings(cache) -> dict:
    kv = states = kv_locked = states_locked = 0
    locks = []
    for node in walk(cache):
        full, mamba = node.component_data[FULL], node.component_data[MAMBA]
        if full.value is not None:
            kv += len(full.value)
            kv_locked += len(full.value) if full.lock_ref > 0 else 0
        if mamba.value is not None:
            states += 1
            states_locked += 1 if mamba.lock_ref > 0 else 0
        if full.lock_ref or mamba.lock_ref:
            locks.append((node.id, full.lock_ref, mamba.lock_ref))
    return {"kv": kv, "states": states, "kv_locked": kv_locked,
            "states_locked": states_locked, "locks": locks}


def check_sizes(cache) -> dict:
    """evictable + protected = held, per pool. Returns the holdings."""
    h = tree_holdings(cache)
    kv_ev, kv_pr = cache.full_evictable_size(), cache.full_protected_size()
    st_ev, st_pr = cache.mamba_evictable_size(), cache.mamba_protected_size()
    assert kv_ev + kv_pr == h["kv"], f"KV: evictable {kv_ev} + protected {kv_pr} != {h['kv']}"
    assert kv_pr == h["kv_locked"], f"KV protected {kv_pr} != locked tokens {h['kv_locked']}"
    assert st_ev + st_pr == h["states"], (
        f"states: evictable {st_ev} + protected {st_pr} != {h['states']}")
    assert st_pr == h["states_locked"], (
        f"states protected {st_pr} != locked states {h['states_locked']}")
    if hasattr(cache, "marconi"):
        check_queues(cache)
    return h


def check_queues(cache) -> None:
    """The persistent victim queues agree with the tree (see the module docstring)."""
    policy = cache.marconi
    mamba_q = cache.components[MAMBA].queue
    full_q = cache.components[FULL].queue
    leaves = cache.tree_core.evictable_device_leaves
    for node in walk(cache):
        cd = node.component_data[MAMBA]
        if cd.value is None:
            assert mamba_q.entry(node) is None, f"node {node.id}: no state, still queued"
        else:
            assert (node in mamba_q) == (cd.lock_ref == 0), (
                f"node {node.id}: lock_ref {cd.lock_ref}, queued {node in mamba_q}")
            kept = getattr(node, STATE_DEPTH, None)
            nearest = nearest_state_depth(SGLANG_TREE, node)
            assert kept is None or kept == nearest, (
                f"node {node.id}: kept nearest state depth {kept}")
            saved = getattr(node, SAVED, None)
            assert saved is None or saved == policy.spec.flops_saved(token_depth(node),
                                                                     nearest), (
                f"node {node.id}: kept FLOPs saved {saved}")
            r, e = mamba_q.entry(node)
            assert r == state_recency(node), f"node {node.id}: recency {r}"
            if policy.ranking.weighs_nodes and node in mamba_q:
                # the joint walk's build reads a candidate's weight from its key
                keyed = getattr(node, KEYED_WEIGHT, None)
                assert keyed == policy.ranking.weight(node), (
                    f"node {node.id}: keyed reuse weight {keyed}, now "
                    f"{policy.ranking.weight(node)}")
            assert math.isclose(e, policy.state_pool_efficiency(node), rel_tol=1e-9), (
                f"node {node.id}: state efficiency {e}")
        assert (node in full_q) == (node in leaves), (
            f"node {node.id}: evictable leaf {node in leaves}, queued {node in full_q}")
        if node in leaves:
            r, e = full_q.entry(node)
            assert r <= node.last_access_time, f"leaf {node.id}: recency ahead of the tree"
            assert math.isclose(e, policy.kv_pool_efficiency(node), rel_tol=1e-9), (
                f"leaf {node.id}: KV efficiency {e}")
    if getattr(cache, "unified", False) and not policy.ranking.is_lru:
        check_joint_build(cache)


def fresh_joint_rows(cache) -> list:
    """What a joint walk's queue must hold: (node, recency, efficiency, aging base) of every
    valid candidate of the persistent queues (FULL's first, a state's base winning), oldest
    first (stable), each value computed afresh (no kept depth or FLOPs: a walk up the tree)."""
    policy = cache.marconi
    spec = policy.spec
    weight = policy.ranking.weight_fn
    leaves = cache.tree_core.evictable_device_leaves
    bases = {}
    for ct in (FULL, MAMBA):
        bases.update((node, base) for node, _, _, base in cache.components[ct].queue.candidates())
    rows = []
    for node, base in bases.items():
        leaf = node in leaves
        if leaf or droppable_inner_state(node):
            freed = freed_bytes(spec.kv_bytes_per_token, spec.ssm_state_bytes, len(node.key),
                                leaf, has_state(node))
            rows.append((node, joint_recency(cache, node),
                         ranked_efficiency(spec, SGLANG_TREE, node, freed, weight), base))
    rows.sort(key=lambda row: row[1])
    return rows


def check_joint_build(cache) -> None:
    """A joint walk built now ranks what ``fresh_joint_rows`` gives, value for value (exact
    floats: the same keys, so the same victims, ties included) and in the same order."""
    built = JointWalk(cache).queue.candidates()  # insertion order: the tie-break order
    fresh = fresh_joint_rows(cache)
    assert len(built) == len(fresh), f"joint walk: {len(built)} candidates, {len(fresh)} fresh"
    for got, want in zip(built, fresh):
        assert got == want, (f"joint walk: node {got[0].id} (recency, efficiency, base) "
                             f"{got[1:]}, fresh node {want[0].id} {want[1:]}")


def check_idle(cache) -> dict:
    """No request running: no locks, nothing protected, every slot accounted for."""
    h = check_sizes(cache)
    assert not h["locks"], f"locks left with no request running: {h['locks'][:5]}"
    allocator = cache.token_to_kv_pool_allocator
    free_kv = allocator.available_size()
    assert free_kv + h["kv"] == allocator.size, (
        f"KV slots leaked: free {free_kv} + tree {h['kv']} != {allocator.size}")
    mamba = cache.req_to_token_pool.mamba_allocator
    free_states = mamba.available_size()
    assert free_states + h["states"] == mamba.size, (
        f"state slots leaked: free {free_states} + tree {h['states']} != {mamba.size}")
    assert cache.req_to_token_pool.available_size() == cache.req_to_token_pool.size, (
        "request rows leaked")
    if hasattr(allocator, "unified_buffer"):
        check_unified_idle(allocator, h)
    return h


def check_unified_idle(allocator, h: dict) -> None:
    """The shared buffer with no request running: bytes and both sides accounted for."""
    violations = allocator.verify_byte_accounting()
    assert not violations, f"unified buffer byte accounting: {violations[:3]}"
    kv = allocator.full_attn_allocator.allocated_count()
    assert kv == h["kv"], f"unified KV side holds {kv} tokens, the tree {h['kv']}"
    states = allocator.mamba_allocator.allocated_count()
    assert states == h["states"], f"unified state side holds {states}, the tree {h['states']}"


def guard_locked_evictions(cache) -> None:
    """Wrap every component's ``evict_component`` to assert that the data it frees is not
    locked: device data under a lock (``lock_ref``), host data under a host lock
    (``host_lock_ref``, HiCache)."""
    for ct, component in cache.components.items():
        original = component.evict_component

        def checked(node, *args, _orig=original, _ct=ct, **kwargs):
            target = kwargs.get("target", EvictLayer.DEVICE)
            cd = node.component_data[_ct]
            if EvictLayer.DEVICE in target and cd.value is not None:
                assert cd.lock_ref == 0, (
                    f"evicting {_ct.name} data of node {node.id} with lock_ref {cd.lock_ref}")
            if EvictLayer.HOST in target and cd.host_value is not None:
                assert cd.host_lock_ref == 0, (
                    f"evicting {_ct.name} host data of node {node.id} with host_lock_ref "
                    f"{cd.host_lock_ref}")
            return _orig(node, *args, **kwargs)

        component.evict_component = checked
