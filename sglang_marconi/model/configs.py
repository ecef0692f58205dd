"""Hugging Face configs -> ``HybridModelSpec``, one builder per architecture SGLang serves, the
same spec from transformers' or SGLang's config class; bad input raises ``UserError``."""
from __future__ import annotations

import json
import math
from pathlib import Path

from sglang_marconi.errors import UserError
from sglang_marconi.model.dtypes import cache_dtypes
from sglang_marconi.model.layers import (AttentionLayer, MLAAttentionLayer, MLPLayer, gdn_layer,
                                         kda_layer, mamba1_layer, mamba2_layer, short_conv_layer)
from sglang_marconi.model.spec import HybridModelSpec

MAMBA_TYPES = {"mamba", "mamba2", "linear_attention", "m", "conv", "short_conv"}
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

    def __init__(self, cfg, arch: str, dtypes, tp: int = 1):
        self.cfg, self.arch, self.dtypes, self.tp = cfg, arch, dtypes, tp

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
        """The first of ``fields`` the config sets, as (name, value), else (fields[0], None):
        SGLang's config classes store some fields under other names than transformers'."""
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


def _attention(r: _Reader, q_factor: int = 1) -> AttentionLayer:
    hidden = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    kv_heads = r.int("num_key_value_heads", heads)
    head_dim = r.int("head_dim", hidden // heads)
    if heads % kv_heads:
        raise UserError(f"{r.arch}: num_attention_heads ({heads}) is not a multiple of "
                        f"num_key_value_heads ({kv_heads})")
    return AttentionLayer(hidden, heads, kv_heads, head_dim, r.dtypes.kv_bytes,
                          q_factor=q_factor, tp=r.tp)


def _ssm_bytes(r: _Reader) -> dict:
    d = r.dtypes
    return {"state_bytes": d.temporal_bytes, "conv_bytes": d.conv_bytes, "tp": r.tp}


def _nemotron_h(r):
    hidden = r.int("hidden_size")
    mamba = mamba2_layer(hidden, r.int("mamba_num_heads") * r.int("mamba_head_dim"),
                         r.int("mamba_num_heads"), r.int("ssm_state_size"), r.int("n_groups"),
                         r.int("conv_kernel"), **_ssm_bytes(r))
    layers = []
    for t in r.types("layers_block_type"):
        if t == "mamba":
            layers.append(mamba)
        elif t == "attention":
            layers.append(_attention(r))
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


def _qwen3_next(r):
    """Qwen3-Next and Qwen3.5 (text config): GDN or gated full attention, then MLP/MoE; the
    pattern from ``layer_types`` or SGLang's ``layers_block_type``. Dense Qwen3.5 has a dense
    MLP in every layer (SGLang's class inherits ``num_experts=512``, which its model ignores)."""
    hidden = r.int("hidden_size")
    gdn = gdn_layer(hidden, r.int("linear_num_key_heads"), r.int("linear_num_value_heads"),
                    r.int("linear_key_head_dim"), r.int("linear_value_head_dim"),
                    r.int("linear_conv_kernel_dim"), **_ssm_bytes(r))
    dense = getattr(r.cfg, "model_type", None) == "qwen3_5_text"
    num_experts = 0 if dense else r.int0("num_experts")
    sparse_step = r.int0("decoder_sparse_step") or 1
    mlp_only = set(getattr(r.cfg, "mlp_only_layers", None) or [])
    layers = []
    for i, t in enumerate(r.types("layer_types", "layers_block_type")):
        layers.append(gdn if t == "mamba" else _attention(r, q_factor=2))
        if num_experts and i not in mlp_only and (i + 1) % sparse_step == 0:
            layers.append(MLPLayer(hidden, expert_size=r.int("moe_intermediate_size"),
                                   active_experts=r.int("num_experts_per_tok"),
                                   num_experts=num_experts,
                                   shared_size=r.int0("shared_expert_intermediate_size")))
        else:
            layers.append(MLPLayer(hidden, dense_size=r.int("intermediate_size")))
    return layers


def _falcon_h1(r):
    """Falcon-H1: every layer runs attention and Mamba2 in parallel, then a gated MLP."""
    hidden = r.int("hidden_size")
    d_inner = r.int0("mamba_d_ssm") or r.int("mamba_n_heads") * r.int("mamba_d_head")
    mamba = mamba2_layer(hidden, d_inner, r.int("mamba_n_heads"), r.int("mamba_d_state"),
                         r.int("mamba_n_groups"), r.int("mamba_d_conv"), **_ssm_bytes(r))
    layers = []
    for _ in range(r.int("num_hidden_layers")):
        layers += [_attention(r), mamba, MLPLayer(hidden, dense_size=r.int("intermediate_size"))]
    return layers


def _granite_moe_hybrid(r):
    """Granite-4.0-H: Mamba2 or attention, each followed by MoE plus a shared MLP."""
    hidden = r.int("hidden_size")
    experts = r.int0("num_local_experts")
    mlp = MLPLayer(hidden, shared_size=r.int0("shared_intermediate_size"),
                   expert_size=r.int("intermediate_size") if experts else 0,
                   active_experts=r.int("num_experts_per_tok") if experts else 0,
                   num_experts=experts)
    mamba = mamba2_layer(hidden, r.int("mamba_expand") * hidden, r.int("mamba_n_heads"),
                         r.int("mamba_d_state"), r.int("mamba_n_groups"), r.int("mamba_d_conv"),
                         **_ssm_bytes(r))
    layers = []
    for t in r.types("layer_types"):
        layers += [mamba if t == "mamba" else _attention(r), mlp]
    return layers


def _kimi_linear(r):
    """Kimi-Linear: KDA or MLA full attention, then a dense MLP or MoE."""
    cfg, hidden = r.cfg, r.int("hidden_size")
    lin = getattr(cfg, "linear_attn_config", None)
    if lin:
        kda_ids = {i - 1 for i in lin["kda_layers"]}
        heads, head_dim, conv = lin["num_heads"], lin["head_dim"], lin["short_conv_kernel_size"]
        n = r.int("num_hidden_layers")
        types = ["mamba" if i in kda_ids else "attention" for i in range(n)]
        dense_until = r.int0("first_k_dense_replace")
        moe = [i >= dense_until for i in range(n)]
    else:
        types = r.types("layer_types")
        heads, head_dim = r.int("linear_num_heads"), r.int("linear_head_dim")
        conv = r.int("linear_conv_kernel_dim")
        moe = [t == "sparse" for t in (getattr(cfg, "mlp_layer_types", None) or [])]
    kda = kda_layer(hidden, heads, head_dim, conv, **_ssm_bytes(r))
    mla = MLAAttentionLayer(hidden, r.int("num_attention_heads"), r.int("num_attention_heads"),
                            r.int("qk_nope_head_dim"), r.dtypes.kv_bytes,
                            q_lora_rank=r.int0("q_lora_rank"), kv_lora_rank=r.int("kv_lora_rank"),
                            rope_dim=r.int("qk_rope_head_dim"), v_head_dim=r.int("v_head_dim"))
    experts = MLPLayer(hidden, expert_size=r.int("moe_intermediate_size"),
                       active_experts=r.int(r.first(("num_experts_per_token",
                                                     "num_experts_per_tok"))[0]),
                       num_experts=r.int("num_experts"),
                       shared_size=r.int0("num_shared_experts") * r.int("moe_intermediate_size"))
    layers = []
    for i, t in enumerate(types):
        layers.append(kda if t == "mamba" else mla)
        use_moe = moe[i] if i < len(moe) else True
        layers.append(experts if use_moe else
                      MLPLayer(hidden, dense_size=r.int("intermediate_size")))
    return layers


def _lfm2_ff_dim(r) -> int:
    """LFM2's feed-forward width (``Lfm2MLP``: 2/3, the multiplier, rounded up)."""
    size = r.int("intermediate_size")
    if getattr(r.cfg, "block_auto_adjust_ff_dim", False):
        size = int(2 * size / 3)
        mult = getattr(r.cfg, "block_ffn_dim_multiplier", None)
        if mult is not None:
            step = r.int("block_multiple_of")
            size = step * ((int(mult * size) + step - 1) // step)
    return size


def _lfm2(r):
    """LFM2 / LFM2-MoE: short convolutions or GQA attention, then a gated MLP or MoE."""
    hidden = r.int("hidden_size")
    conv = short_conv_layer(hidden, r.int("conv_L_cache"), r.dtypes.conv_bytes, tp=r.tp)
    moe_model = getattr(r.cfg, "model_type", None) == "lfm2_moe"
    layers = []
    for i, t in enumerate(r.types("layer_types")):
        layers.append(conv if t == "mamba" else _attention(r))
        if moe_model and i >= r.int0("num_dense_layers"):
            layers.append(MLPLayer(hidden, expert_size=r.int("moe_intermediate_size"),
                                   active_experts=r.int("num_experts_per_tok"),
                                   num_experts=r.int("num_experts")))
        else:
            layers.append(MLPLayer(hidden, dense_size=r.int("intermediate_size") if moe_model
                                   else _lfm2_ff_dim(r)))
    return layers


def _mamba2(r):
    hidden = r.int("hidden_size")
    return [mamba2_layer(hidden, r.int("num_heads") * r.int("head_dim"), r.int("num_heads"),
                         r.int("state_size"), r.int("n_groups"), r.int("conv_kernel"),
                         **_ssm_bytes(r))] * r.int("num_hidden_layers")


def _mamba(r):
    hidden = r.int("hidden_size")
    return [mamba1_layer(hidden, r.int("intermediate_size"), r.int("state_size"),
                         r.int("conv_kernel"), r.int("time_step_rank"), **_ssm_bytes(r))
            ] * r.int("num_hidden_layers")


def _jamba(r):
    """Jamba (transformers only): Mamba1 or attention, each followed by an MLP or MoE."""
    hidden = r.int("hidden_size")
    dt_rank = getattr(r.cfg, "mamba_dt_rank", "auto")
    dt_rank = math.ceil(hidden / 16) if dt_rank == "auto" else r.int("mamba_dt_rank")
    mamba = mamba1_layer(hidden, r.int("mamba_expand") * hidden, r.int("mamba_d_state"),
                         r.int("mamba_d_conv"), dt_rank, **_ssm_bytes(r))
    experts = list(r.cfg.layers_num_experts)
    layers = []
    for i, t in enumerate(r.types("layers_block_type")):
        layers.append(mamba if t == "mamba" else _attention(r))
        if experts[i] > 1:
            layers.append(MLPLayer(hidden, expert_size=r.int("intermediate_size"),
                                   active_experts=r.int("num_experts_per_tok"),
                                   num_experts=experts[i]))
        else:
            layers.append(MLPLayer(hidden, dense_size=r.int("intermediate_size")))
    return layers


def _bamba(r):
    """Bamba (transformers only): Mamba2 or attention, each followed by a gated MLP."""
    hidden = r.int("hidden_size")
    mamba = mamba2_layer(hidden, r.int("mamba_expand") * hidden, r.int("mamba_n_heads"),
                         r.int("mamba_d_state"), r.int("mamba_n_groups"), r.int("mamba_d_conv"),
                         **_ssm_bytes(r))
    mlp = MLPLayer(hidden, dense_size=r.int("intermediate_size"))
    layers = []
    for t in r.types("layers_block_type"):
        layers += [mamba if t == "mamba" else _attention(r), mlp]
    return layers


def _zamba2(r):
    """Zamba2 (transformers only): Mamba2 everywhere, 'hybrid' layers add the shared block."""
    hidden = r.int("hidden_size")
    mamba = mamba2_layer(hidden, r.int("mamba_expand") * hidden, r.int("n_mamba_heads"),
                         r.int("mamba_d_state"), r.int("mamba_ngroups"), r.int("mamba_d_conv"),
                         **_ssm_bytes(r))
    heads = r.int("num_attention_heads")
    attn = AttentionLayer(hidden, heads, r.int("num_key_value_heads", heads),
                          r.int("attention_head_dim"), r.dtypes.kv_bytes,
                          in_dim=r.int("attention_hidden_size"), tp=r.tp)
    mlp = MLPLayer(hidden, dense_size=r.int("intermediate_size"))
    layers = []
    for t in r.types("layers_block_type"):
        layers += [attn, mlp, mamba] if t == "hybrid" else [mamba]
    return layers


BUILDERS = {
    "nemotron_h": _nemotron_h,
    "qwen3_next": _qwen3_next,
    "qwen3_5_text": _qwen3_next,
    "qwen3_5_moe_text": _qwen3_next,
    "falcon_h1": _falcon_h1,
    "granitemoehybrid": _granite_moe_hybrid,
    "kimi_linear": _kimi_linear,
    "lfm2": _lfm2,
    "lfm2_moe": _lfm2,
    "mamba2": _mamba2,
    "mamba": _mamba,
    "falcon_mamba": _mamba,
    # transformers-only hybrids that SGLang 0.5.23 does not serve (verify-exact's models)
    "jamba": _jamba,
    "bamba": _bamba,
    "zamba2": _zamba2,
}
MULTIMODAL_WRAPPERS = {"qwen3_5", "qwen3_5_moe"}  # the language model is in text_config
# SGLang 0.5.23 config classes defining mamba2_cache_params that no builder covers, with why
SGLANG_REFUSED = {
    "bailing_hybrid": "Bailing hybrid (Ling linear attention)",
    "gigachat3_5": "GigaChat 3.5 hybrid",
    "glm5_next_text": "GLM-5-Next hybrid",
    "inkling_model": "Inkling hybrid",
    "inkling_mm_model": "Inkling multimodal hybrid",
    "jet_nemotron": "Jet-Nemotron (JetBlock linear attention)",
    "jet_vlm": "Jet-VLM (JetBlock linear attention)",
    "lfm2_vl": "LFM2-VL (vision-language wrapper)",
    "minicpm_sala": "MiniCPM-SALA hybrid (sparse + lightning attention)",
    "zaya": "ZAYA hybrid",
}


def _config_dtype(cfg) -> str:
    """The dtype SGLang serves a config in with ``--dtype auto`` (float32 as float16)."""
    value = str(getattr(cfg, "dtype", None) or "float32").replace("torch.", "")
    return "float16" if value in ("float32", "float") else value


def spec_from_hf_config(cfg, name=None, dtype=None, *, kv_cache_dtype=None,
                        mamba_ssm_dtype=None, tp_size=1, env=None) -> HybridModelSpec:
    """The spec of ``cfg`` as a server with these flags holds it."""
    model_type = getattr(cfg, "model_type", None)
    if model_type in MULTIMODAL_WRAPPERS:
        cfg = cfg.text_config
        inner = cfg.model_type
    else:
        inner = model_type
    if inner in SGLANG_REFUSED:
        raise UserError(f"architecture {model_type!r}: {SGLANG_REFUSED[inner]} has no "
                        "sglang-marconi cost model yet (its layers' FLOPs are not modelled)")
    if inner not in BUILDERS:
        raise UserError(f"architecture {model_type!r} (field model_type) is not a hybrid "
                        f"model sglang-marconi understands; supported: "
                        f"{', '.join(sorted(set(BUILDERS) | MULTIMODAL_WRAPPERS))}")
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise UserError(f"--tp-size: expected a positive integer, got {tp_size!r}")
    dtype = str(dtype or _config_dtype(cfg)).replace("torch.", "")
    dtypes = cache_dtypes(cfg, inner, dtype, kv_cache_dtype=kv_cache_dtype,
                          mamba_ssm_dtype=mamba_ssm_dtype, env=env)
    layers = BUILDERS[inner](_Reader(cfg, model_type, dtypes, tp_size))
    return HybridModelSpec(name=name or model_type, layers=tuple(layers), dtype=dtype,
                           architecture=model_type,
                           num_hidden_layers=getattr(cfg, "num_hidden_layers", 0) or 0,
                           cache_dtypes=dtypes, tp_size=tp_size)


def spec_from_config_path(path, name=None, dtype=None, **server) -> HybridModelSpec:
    """From a ``config.json`` (or its folder); ``server``: ``spec_from_hf_config``'s flags."""
    return spec_from_hf_config(load_hf_config(path), name=name, dtype=dtype, **server)
