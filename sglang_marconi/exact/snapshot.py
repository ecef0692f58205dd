"""Take real tensors out of a transformers hybrid cache and build one back: a ``Checkpoint``
holds a prefix's KV and the SSM states at exactly that length (conv: ``kernel - 1`` columns)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import (DynamicLayer, LinearAttentionCacheLayerMixin,
                                      LinearAttentionLayer)


@dataclass
class SSMState:
    """The conv (last ``kernel - 1`` inputs) and recurrent states of one SSM layer."""

    conv: dict[int, torch.Tensor]
    recurrent: dict[int, torch.Tensor]


@dataclass
class Checkpoint:
    """Everything needed to resume after ``position`` tokens: per-layer KV and SSM states."""

    position: int
    kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    ssm: dict[int, SSMState] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        total = sum(k.nbytes + v.nbytes for k, v in self.kv.values())
        for s in self.ssm.values():
            total += sum(t.nbytes for t in (*s.conv.values(), *s.recurrent.values()))
        return total


def cache_length(cache) -> int:
    """Tokens whose KV the cache holds (0 for a fresh cache)."""
    return max((layer.get_seq_length() for layer in cache.layers if _has_kv(layer)), default=0)


def _has_kv(layer) -> bool:
    return (isinstance(layer, DynamicLayer) and getattr(layer, "is_initialized", False)
            and layer.keys is not None)


def take_ssm_states(cache) -> dict[int, SSMState]:
    """Copies of every SSM layer's states, as they are now (i.e. at the cache's position)."""
    out = {}
    for i, layer in enumerate(cache.layers):
        if not isinstance(layer, LinearAttentionCacheLayerMixin):
            continue
        conv = {k: v[..., 1:].detach().clone()  # the last kernel - 1 columns
                for k, v in layer.conv_states.items() if v is not None}
        rec = {k: v.detach().clone() for k, v in layer.recurrent_states.items() if v is not None}
        if conv or rec:
            out[i] = SSMState(conv, rec)
    return out


def take_kv(cache, length: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Copies of every attention layer's keys/values, sliced to the first ``length`` tokens."""
    out = {}
    for i, layer in enumerate(cache.layers):
        if _has_kv(layer):
            if layer.keys.shape[-2] < length:
                raise ValueError(f"layer {i} holds KV of {layer.keys.shape[-2]} tokens, "
                                 f"need {length}")
            out[i] = (layer.keys[..., :length, :].clone(), layer.values[..., :length, :].clone())
    return out


def restore(config, ckpt: Checkpoint) -> DynamicCache:
    """A fresh cache for ``config`` filled from ``ckpt`` (copies: the stored entry stays intact)."""
    cache = DynamicCache(config=config)
    for i, (k, v) in ckpt.kv.items():
        layer = cache.layers[i]
        DynamicLayer.lazy_initialization(layer, k, v)
        layer.keys, layer.values = k.clone(), v.clone()
    for i, state in ckpt.ssm.items():
        layer = cache.layers[i]
        if not isinstance(layer, LinearAttentionLayer):
            raise TypeError(f"layer {i} of a fresh cache is {type(layer).__name__}, "
                            "not an SSM layer")
        for idx, conv in state.conv.items():
            conv = torch.nn.functional.pad(conv, (1, 0))  # the never-read oldest column
            LinearAttentionLayer.lazy_initialization(layer, conv_states=conv, state_idx=idx,
                                                     conv_kernel_size=conv.shape[-1])
            layer.conv_states[idx].copy_(conv)
            layer.has_previous_state[idx] = True
        for idx, rec in state.recurrent.items():
            LinearAttentionLayer.lazy_initialization(layer, recurrent_states=rec, state_idx=idx)
            layer.recurrent_states[idx].copy_(rec)
            layer.has_previous_state[idx] = True
    return cache
