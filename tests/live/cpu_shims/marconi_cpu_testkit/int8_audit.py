"""The int8 audit of the CPU test servers (``--enable-int8-mamba-checkpoint``).

SGLang's ``MambaCheckpointPool`` quantizes a state when the radix cache stores it
(``store_from_active``) and dequantizes it into a request's slot on a hit
(``load_to_active``). The audit keeps the full-precision state each store read, per
checkpoint slot, forgets it when the slot is freed, and after every load checks the
request's slot against ``Int8CheckpointStore``'s own round trip of that state: bitwise
equal, or a ``MISMATCH`` line; a load from a slot with no stored state (freed, or never
written) is an ``ORPHAN`` line. With the negative control's perturbation the loaded
temporal state is scaled by ``1 + x`` after the load (so the audit must fail).
"""
from __future__ import annotations

import logging

import torch

logger = logging.getLogger("marconi_cpu_testkit")
POOL = "sglang.srt.mem_cache.mamba_checkpoint_pool.MambaCheckpointPool"
_stored: dict = {}  # (pool id, checkpoint slot) -> (temporal, [conv, ...]) at full precision


def _slots(t) -> list:
    return [int(x) for x in torch.as_tensor(t).view(-1).tolist()]


def store_from_active(original, self, active_pool, active_slots, ckpt_slots):
    original(self, active_pool, active_slots, ckpt_slots)
    cache = active_pool.mamba_cache
    for a, c in zip(_slots(active_slots), _slots(ckpt_slots)):
        _stored[(id(self), c)] = (cache.temporal[:, a].clone(),
                                  [conv[:, a].clone() for conv in cache.conv])


def free(original, self, slots):
    for c in _slots(slots):
        _stored.pop((id(self), c), None)
    return original(self, slots)


def clear(original, self):
    for key in [k for k in _stored if k[0] == id(self)]:
        del _stored[key]
    return original(self)


def round_trip(store, temporal, out_dtype):
    """What ``Int8CheckpointStore.store`` then ``load`` make of ``temporal``."""
    q, scale = store.quantize(temporal)
    return store.dequantize(q, scale.to(store.scale.dtype), out_dtype)


def _load(perturb: float):
    def load_to_active(original, self, active_pool, ckpt_slots, active_slots):
        original(self, active_pool, ckpt_slots, active_slots)
        cache = active_pool.mamba_cache
        for c, a in zip(_slots(ckpt_slots), _slots(active_slots)):
            if perturb:
                cache.temporal[:, a] *= 1.0 + perturb
            entry = _stored.get((id(self), c))
            if entry is None:
                logger.error("int8 audit: ORPHAN load from checkpoint slot %d (no stored "
                             "state) into slot %d", c, a)
                continue
            temporal, conv = entry
            want = round_trip(self.temporal, temporal, cache.temporal.dtype)
            same = torch.equal(cache.temporal[:, a], want) and all(
                torch.equal(cache.conv[i][:, a], x.to(cache.conv[i].dtype))
                for i, x in enumerate(conv))
            if same:
                logger.warning("int8 audit: load %d -> %d bitwise equal to the round trip",
                               c, a)
            else:
                diff = (cache.temporal[:, a].float() - want.float()).abs().max().item()
                logger.error("int8 audit: MISMATCH load %d -> %d (max |diff| %.3e)", c, a,
                             diff)
    return load_to_active


def hooks(perturb: float) -> dict:
    """HookRegistry AROUND hooks on the checkpoint pool's methods."""
    return {f"{POOL}.store_from_active": store_from_active, f"{POOL}.free": free,
            f"{POOL}.clear": clear, f"{POOL}.load_to_active": _load(perturb)}
