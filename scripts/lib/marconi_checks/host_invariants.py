"""Invariants of SGLang's host tier (HiCache), checked on a python-core tree (tests).

With no request running and every transfer acknowledged (``check_host_idle``):
- slots: the host KV pool's allocated slots are exactly the tree's FULL host values, and
  the Mamba host pool's exactly its MAMBA host values (no leak, no double use);
- locks: no host lock is held, no write-through, load-back or prefetch is in flight;
- structure: a node whose KV left the device keeps a host copy (else the tree deletes it),
  and a MAMBA host value sits on a node whose KV is backed up;
- host values: the replay's stand-in forward pass (``TokenKV``, hooked on
  ``Replayer.on_kv``) writes each position's K and V as a function of its token and
  position; every cached token then holds exactly that value on every tier it is on
  (``check_kv_contents``), so a backup or a load-back that copied the wrong rows, or a
  node whose slots were reused under it, fails. Mamba state contents are not checked:
  the replay computes no states (their slots and host slots are).
- L3 (``file`` backend): every stored page is a file in the storage directory
  (``storage_files``), none is left half-written.
"""
from __future__ import annotations

import os

import torch
from sglang.srt.mem_cache.hicache_storage import PoolName
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

from marconi_checks.invariants import walk

FULL, MAMBA = ComponentType.FULL, ComponentType.MAMBA
STAMP_PERIOD = 251  # stamps stay exact in bfloat16 (8 significant bits)


def host_pools(cache):
    group = cache.host_pool_group
    return group.get_pool(PoolName.KV), group.get_pool(PoolName.MAMBA)


def kv_stamp(tokens, positions):
    """The K stamp of these tokens at these positions (V: +1); exact in bfloat16."""
    return (tokens * 31 + positions) % STAMP_PERIOD


class TokenKV:
    """``Replayer.on_kv``: writes the stamp of each new position into its KV slot, every
    layer (the forward pass's KV writes). ``sequences`` (rid -> prompt + every output
    token): where a position's token is not yet in ``req.output_ids`` when its KV is
    written (the overlap loop launches a decode before the previous token is appended)."""

    def __init__(self, cache, sequences=None):
        self.cache = cache
        self.sequences = sequences
        self.kv_host, _ = host_pools(cache)

    def __call__(self, req, start: int, end: int) -> None:
        if end <= start:
            return
        row = self.cache.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
        slots = row[start:end].long()
        tokens = (self.sequences[req.rid] if self.sequences is not None
                  else req.origin_input_ids + req.output_ids)
        ids = tokens[start:end]
        stamp = kv_stamp(torch.tensor(ids, dtype=torch.int64), torch.arange(start, end))
        for k, v in zip(self.kv_host.device_k_buffers, self.kv_host.device_v_buffers):
            k[slots] = stamp.to(k.dtype).view(-1, *[1] * (k.dim() - 1)).expand(-1, *k.shape[1:])
            v[slots] = (stamp + 1).to(v.dtype).view(-1, *[1] * (v.dim() - 1)).expand(
                -1, *v.shape[1:])


def _path_stamp(node):
    """The stamp every layer of ``node``'s own tokens must hold."""
    depth, cur = 0, node.parent
    while cur is not None and cur.parent is not None:
        depth += len(cur.key)
        cur = cur.parent
    tokens = torch.tensor(list(node.key.token_ids), dtype=torch.int64)
    return kv_stamp(tokens, torch.arange(depth, depth + len(tokens)))


def check_kv_contents(cache) -> int:
    """Every cached token's K and V equal its stamp on each tier it is on; returns the
    (node, tier) pairs compared."""
    kv_host, _ = host_pools(cache)
    compared = 0
    for node in walk(cache):
        full = node.component_data[FULL]
        if full.value is None and full.host_value is None:
            continue
        want = _path_stamp(node)
        tiers = [("device", full.value, kv_host.device_k_buffers, kv_host.device_v_buffers),
                 ("host", full.host_value, kv_host.k_data_refs, kv_host.v_data_refs)]
        for tier, slots, ks, vs in tiers:
            if slots is None:
                continue
            idx = slots.long()
            for layer in range(kv_host.target_layer_num):
                k = ks[layer][idx].reshape(len(idx), -1)[:, 0].float()
                v = vs[layer][idx].reshape(len(idx), -1)[:, 0].float()
                assert torch.equal(k, want.float()) and torch.equal(v, want.float() + 1), (
                    f"node {node.id}: {tier} KV of layer {layer} is not its tokens' "
                    f"(slots {idx[:4].tolist()}...)")
            compared += 1
    return compared


def host_holdings(cache) -> dict:
    kv_slots, state_slots, host_locks, orphans = [], [], [], []
    for node in walk(cache):
        full, mamba = node.component_data[FULL], node.component_data[MAMBA]
        if full.host_value is not None:
            kv_slots.extend(full.host_value.tolist())
        if mamba.host_value is not None:
            state_slots.extend(mamba.host_value.reshape(-1).tolist())
            if full.host_value is None and full.value is None:
                orphans.append(node.id)
        if full.value is None and full.host_value is None:
            orphans.append(node.id)
        if full.host_lock_ref or mamba.host_lock_ref:
            host_locks.append((node.id, full.host_lock_ref, mamba.host_lock_ref))
    return {"kv": kv_slots, "states": state_slots, "host_locks": host_locks,
            "orphans": orphans}


def _used_slots(pool) -> set:
    if hasattr(pool, "slot_used"):
        return set(torch.nonzero(pool.slot_used).reshape(-1).tolist())
    free = set(pool.free_slots.tolist())
    for chunk in pool.release_slots:
        free.update(chunk.tolist())
    return set(range(pool.size)) - free


def check_host_idle(cache) -> dict:
    """No request running, every ack drained: the host tier is exactly the tree's."""
    h = host_holdings(cache)
    assert not h["host_locks"], f"host locks left: {h['host_locks'][:5]}"
    assert not h["orphans"], f"nodes with no KV on either tier: {h['orphans'][:5]}"
    assert not cache.ongoing_write_through, "write-through acks not drained"
    assert not cache.ongoing_load_back, "load-backs not acknowledged"
    assert not cache.ongoing_prefetch, "prefetches in flight"
    kv_host, mamba_host = host_pools(cache)
    for name, pool, held in (("KV", kv_host, h["kv"]), ("Mamba", mamba_host, h["states"])):
        assert len(held) == len(set(held)), f"{name} host slots held twice"
        used = _used_slots(pool)
        assert used == set(held), (
            f"{name} host slots: pool uses {len(used)}, the tree holds {len(held)} "
            f"(leaked {sorted(used - set(held))[:5]}, unaccounted {sorted(set(held) - used)[:5]})")
    h["compared"] = check_kv_contents(cache)
    return h


def storage_files(directory) -> list:
    """The pages the L3 ``file`` backend stored: ``<key>.bin`` files, none half-written
    (its temporaries are ``.<uuid>.tmp``, renamed into place or removed)."""
    names = sorted(os.listdir(directory))
    stray = [n for n in names if not n.endswith(".bin")]
    assert not stray, f"half-written or foreign files in the L3 store: {stray[:3]}"
    return names
