"""Hugging Face configs -> ``HybridModelSpec``, one builder per architecture.

Configs are read with transformers' own config classes (``AutoConfig.for_model``), so the
layer pattern is whatever the architecture's config class derives (NemotronH's
``hybrid_override_pattern``, Jamba's attention/expert period and offset, Qwen3-Next's
``layer_types``, Bamba's ``attn_layer_indices``, ...). Inside SGLang's server the config is
SGLang's own class for the architecture (``sglang/srt/configs/``: Qwen3-Next, Qwen3.5,
NemotronH, Falcon-H1, GraniteMoeHybrid, Mamba, Mamba2), which stores some fields under other
names or not at all; every builder gives the same spec from either class (the builders read
fields both expose, or try the names in order; tests/test_sglang_configs.py checks each).
Bad input raises ``UserError`` naming the file, the architecture and the field.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from sglang_marconi.errors import UserError
from sglang_marconi.model.layers import (AttentionLayer, MLPLayer, gdn_layer, mamba1_layer,
                                         mamba2_layer)
from sglang_marconi.model.spec import HybridModelSpec, dtype_bytes

MAMBA_TYPES = {"mamba", "mamba2", "linear_attention", "m"}
ATTENTION_TYPES = {"attention", "full_attention", "*"}


def load_hf_config(path):
    """Read a ``config.json`` (or a folder holding one) into a transformers config object."""
    import transformers

    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise UserError(f"config not found: {p}")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{p}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise UserError(f"{p}: no 'model_type' field: cannot tell the architecture")
    model_type = data.pop("model_type")
    try:
        return transformers.AutoConfig.for_model(model_type, **data)
    except (ValueError, KeyError) as exc:
        if "Unrecognized model" in str(exc) or isinstance(exc, KeyError):
            raise UserError(f"{p}: architecture {model_type!r} (field model_type) is not known "
                            f"to transformers {transformers.__version__}") from None
        raise UserError(f"{p}: invalid config for {model_type!r}: {exc}") from None


class _Reader:
    """Typed field access with errors that name the architecture and the field."""

    def __init__(self, cfg, arch: str):
        self.cfg, self.arch = cfg, arch

    def int(self, field: str, default=None) -> int:
        value = getattr(self.cfg, field, None)
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise UserError(f"{self.arch}: config field {field!r} must be a positive integer, "
                            f"got {value!r}")
        return value

    def int0(self, field: str) -> int:
        """A non-negative integer that may be absent (0)."""
        value = getattr(self.cfg, field, None) or 0
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UserError(f"{self.arch}: config field {field!r} must be a non-negative "
                            f"integer, got {value!r}")
        return value

    def first(self, fields):
        """The first of ``fields`` the config sets, as (name, value); (fields[0], None) when
        none is. SGLang's own config classes (what ``model_config.hf_config`` is in the
        server) do not always store a field under transformers' name: SGLang's
        Qwen3NextConfig drops ``layer_types`` and derives ``layers_block_type`` instead."""
        for field in fields:
            value = getattr(self.cfg, field, None)
            if value is not None:
                return field, value
        return fields[0], None

    def types(self, *fields: str) -> list[str]:
        """The per-layer types from the first of ``fields`` the config sets."""
        field, value = self.first(fields)
        if not isinstance(value, (list, tuple)) or not value:
            raise UserError(f"{self.arch}: config field {' or '.join(map(repr, fields))} must "
                            f"list the layer types, got {value!r}")
        out = []
        for i, t in enumerate(value):
            t = str(t).lower()
            if t in MAMBA_TYPES:
                out.append("mamba")
            elif t in ATTENTION_TYPES:
                out.append("attention")
            elif t in ("mlp", "-", "moe", "e", "hybrid"):
                out.append({"-": "mlp", "e": "moe"}.get(t, t))
            else:
                raise UserError(f"{self.arch}: config field {field!r}[{i}] = {t!r} is not a "
                                f"layer type sglang-marconi understands")
        return out


def _attention(r: _Reader, kv_bytes: int, q_factor: int = 1, in_dim: int = 0,
               head_dim_field: str = "head_dim") -> AttentionLayer:
    hidden = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    kv_heads = r.int("num_key_value_heads", heads)
    head_dim = r.int(head_dim_field, hidden // heads)
    if heads % kv_heads:
        raise UserError(f"{r.arch}: num_attention_heads ({heads}) is not a multiple of "
                        f"num_key_value_heads ({kv_heads})")
    return AttentionLayer(hidden, heads, kv_heads, head_dim, kv_bytes, in_dim=in_dim,
                          q_factor=q_factor)


def _nemotron_h(r, b, s):
    hidden = r.int("hidden_size")
    mamba = mamba2_layer(hidden, r.int("mamba_num_heads") * r.int("mamba_head_dim"),
                         r.int("mamba_num_heads"), r.int("ssm_state_size"), r.int("n_groups"),
                         r.int("conv_kernel"), s, b)
    layers = []
    for t in r.types("layers_block_type"):
        if t == "mamba":
            layers.append(mamba)
        elif t == "attention":
            layers.append(_attention(r, b))
        elif t == "mlp":
            layers.append(MLPLayer(hidden, dense_size=r.int("intermediate_size"), gated=False))
        elif t == "moe":
            layers.append(MLPLayer(
                hidden, expert_size=r.int("moe_intermediate_size"),
                active_experts=r.int("num_experts_per_tok"), num_experts=r.int("n_routed_experts"),
                shared_size=r.int0("n_shared_experts") * r.int0("moe_shared_expert_intermediate_size"),
                gated=False, latent=r.int0("moe_latent_size")))
        else:
            raise UserError(f"{r.arch}: layer type {t!r} in 'layers_block_type' not understood")
    return layers


def _qwen3_next(r, b, s):
    """Qwen3-Next and Qwen3.5 (text config): GDN or gated full attention, then MLP/MoE.

    The layer pattern is transformers' ``layer_types`` or, on SGLang's config classes (which
    drop ``layer_types``), ``layers_block_type`` (from ``full_attention_interval``). Dense
    Qwen3.5 (``qwen3_5_text``) has a dense MLP in every layer: SGLang's class inherits
    Qwen3-Next's ``num_experts=512`` default, which its model ignores for that type."""
    hidden = r.int("hidden_size")
    gdn = gdn_layer(hidden, r.int("linear_num_key_heads"), r.int("linear_num_value_heads"),
                    r.int("linear_key_head_dim"), r.int("linear_value_head_dim"),
                    r.int("linear_conv_kernel_dim"), s, b)
    dense = getattr(r.cfg, "model_type", None) == "qwen3_5_text"
    num_experts = 0 if dense else r.int0("num_experts")
    sparse_step = r.int0("decoder_sparse_step") or 1
    mlp_only = set(getattr(r.cfg, "mlp_only_layers", None) or [])
    layers = []
    for i, t in enumerate(r.types("layer_types", "layers_block_type")):
        layers.append(gdn if t == "mamba" else _attention(r, b, q_factor=2))
        if num_experts and i not in mlp_only and (i + 1) % sparse_step == 0:
            layers.append(MLPLayer(hidden, expert_size=r.int("moe_intermediate_size"),
                                   active_experts=r.int("num_experts_per_tok"),
                                   num_experts=num_experts,
                                   shared_size=r.int0("shared_expert_intermediate_size")))
        else:
            layers.append(MLPLayer(hidden, dense_size=r.int("intermediate_size")))
    return layers


def _falcon_h1(r, b, s):
    """Falcon-H1: every layer runs attention and Mamba2 in parallel, then a gated MLP."""
    hidden = r.int("hidden_size")
    d_inner = r.int0("mamba_d_ssm") or r.int("mamba_n_heads") * r.int("mamba_d_head")
    mamba = mamba2_layer(hidden, d_inner, r.int("mamba_n_heads"), r.int("mamba_d_state"),
                         r.int("mamba_n_groups"), r.int("mamba_d_conv"), s, b)
    layers = []
    for _ in range(r.int("num_hidden_layers")):
        layers += [_attention(r, b), mamba, MLPLayer(hidden, dense_size=r.int("intermediate_size"))]
    return layers


def _jamba(r, b, s):
    hidden = r.int("hidden_size")
    dt_rank = getattr(r.cfg, "mamba_dt_rank", "auto")
    dt_rank = math.ceil(hidden / 16) if dt_rank == "auto" else r.int("mamba_dt_rank")
    mamba = mamba1_layer(hidden, r.int("mamba_expand") * hidden, r.int("mamba_d_state"),
                         r.int("mamba_d_conv"), dt_rank, s, b)
    experts = list(r.cfg.layers_num_experts)
    layers = []
    for i, t in enumerate(r.types("layers_block_type")):
        layers.append(mamba if t == "mamba" else _attention(r, b))
        if experts[i] > 1:
            layers.append(MLPLayer(hidden, expert_size=r.int("intermediate_size"),
                                   active_experts=r.int("num_experts_per_tok"),
                                   num_experts=experts[i]))
        else:
            layers.append(MLPLayer(hidden, dense_size=r.int("intermediate_size")))
    return layers


def _bamba_like(r, b, s, types_field, mlp):
    hidden = r.int("hidden_size")
    mamba = mamba2_layer(hidden, r.int("mamba_expand") * hidden, r.int("mamba_n_heads"),
                         r.int("mamba_d_state"), r.int("mamba_n_groups"), r.int("mamba_d_conv"),
                         s, b)
    layers = []
    for t in r.types(types_field):
        layers += [mamba if t == "mamba" else _attention(r, b), mlp]
    return layers


def _bamba(r, b, s):
    mlp = MLPLayer(r.int("hidden_size"), dense_size=r.int("intermediate_size"))
    return _bamba_like(r, b, s, "layers_block_type", mlp)


def _granite_moe_hybrid(r, b, s):
    """Granite-4.0-H: Mamba2 or attention, each followed by MoE plus a shared MLP."""
    experts = r.int0("num_local_experts")
    mlp = MLPLayer(r.int("hidden_size"), shared_size=r.int0("shared_intermediate_size"),
                   expert_size=r.int("intermediate_size") if experts else 0,
                   active_experts=r.int("num_experts_per_tok") if experts else 0,
                   num_experts=experts)
    return _bamba_like(r, b, s, "layer_types", mlp)


def _zamba2(r, b, s):
    """Zamba2: Mamba2 in every layer; 'hybrid' layers also run the shared transformer block
    (attention over the 2*hidden concatenation, own KV per invocation, then a gated MLP)."""
    hidden = r.int("hidden_size")
    mamba = mamba2_layer(hidden, r.int("mamba_expand") * hidden, r.int("n_mamba_heads"),
                         r.int("mamba_d_state"), r.int("mamba_ngroups"), r.int("mamba_d_conv"),
                         s, b)
    attn = _attention(r, b, in_dim=r.int("attention_hidden_size"),
                      head_dim_field="attention_head_dim")
    mlp = MLPLayer(hidden, dense_size=r.int("intermediate_size"))
    layers = []
    for t in r.types("layers_block_type"):
        layers += [attn, mlp, mamba] if t == "hybrid" else [mamba]
    return layers


def _mamba2(r, b, s):
    hidden = r.int("hidden_size")
    return [mamba2_layer(hidden, r.int("num_heads") * r.int("head_dim"), r.int("num_heads"),
                         r.int("state_size"), r.int("n_groups"), r.int("conv_kernel"), s, b)
            ] * r.int("num_hidden_layers")


def _mamba(r, b, s):
    hidden = r.int("hidden_size")
    return [mamba1_layer(hidden, r.int("intermediate_size"), r.int("state_size"),
                         r.int("conv_kernel"), r.int("time_step_rank"), s, b)
            ] * r.int("num_hidden_layers")


BUILDERS = {
    "nemotron_h": _nemotron_h,
    "qwen3_next": _qwen3_next,
    "qwen3_5_text": _qwen3_next,
    "qwen3_5_moe_text": _qwen3_next,
    "falcon_h1": _falcon_h1,
    "jamba": _jamba,
    "bamba": _bamba,
    "granitemoehybrid": _granite_moe_hybrid,
    "zamba2": _zamba2,
    "mamba2": _mamba2,
    "mamba": _mamba,
}
MULTIMODAL_WRAPPERS = {"qwen3_5", "qwen3_5_moe"}  # the language model is in text_config
# The SSM state dtype where the config does not set ``mamba_ssm_cache_dtype``: transformers'
# class default, which SGLang's class for the architecture lacks (SGLang's NemotronHConfig has
# no such field; transformers' defaults it to float32).
SSM_CACHE_DTYPE_DEFAULTS = {"nemotron_h": "float32"}


def _config_dtype(cfg) -> str:
    value = getattr(cfg, "dtype", None)
    return str(value).replace("torch.", "") if value else "bfloat16"


def spec_from_hf_config(cfg, name=None, dtype=None, ssm_dtype=None) -> HybridModelSpec:
    model_type = getattr(cfg, "model_type", None)
    if model_type in MULTIMODAL_WRAPPERS:
        cfg = cfg.text_config
        inner = cfg.model_type
    else:
        inner = model_type
    if inner not in BUILDERS:
        raise UserError(f"architecture {model_type!r} (field model_type) is not a hybrid "
                        f"model sglang-marconi understands; supported: "
                        f"{', '.join(sorted(set(BUILDERS) | MULTIMODAL_WRAPPERS))}")
    dtype = dtype or _config_dtype(cfg)
    ssm_dtype = (ssm_dtype or getattr(cfg, "mamba_ssm_cache_dtype", None)
                 or SSM_CACHE_DTYPE_DEFAULTS.get(inner) or dtype)
    kv_b = dtype_bytes(dtype, "dtype")
    ssm_b = dtype_bytes(ssm_dtype, "SSM state dtype")
    layers = BUILDERS[inner](_Reader(cfg, model_type), kv_b, ssm_b)
    return HybridModelSpec(name=name or model_type, layers=tuple(layers), dtype=dtype,
                           architecture=model_type,
                           num_hidden_layers=getattr(cfg, "num_hidden_layers", 0) or 0)


def spec_from_config_path(path, name=None, dtype=None, ssm_dtype=None) -> HybridModelSpec:
    """From a Hugging Face ``config.json`` (or a model folder holding one)."""
    return spec_from_hf_config(load_hf_config(path), name=name, dtype=dtype, ssm_dtype=ssm_dtype)
