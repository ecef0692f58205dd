"""Named model presets: ``paper-7b`` (the Marconi paper's 7B hybrid exactly) and one preset
per hybrid architecture SGLang serves whose config class the pinned transformers ships,
named after its ``model_type`` (the class's defaults, with ``PRESET_OVERRIDES``)."""
from __future__ import annotations

from sglang_marconi.errors import UserError
from sglang_marconi.model.layers import AttentionLayer, MLPLayer, SSMLayer
from sglang_marconi.model.configs import spec_from_hf_config
from sglang_marconi.model.spec import HybridModelSpec, dtype_bytes

PAPER_D = 4096
PAPER_N = 128


def paper_7b(dtype: str | None = None) -> HybridModelSpec:
    """The paper's model and FLOP formulas exactly (fp16, conv window of 4)."""
    dtype = dtype or "float16"
    b = dtype_bytes(dtype)
    D, N = PAPER_D, PAPER_N
    attn = AttentionLayer(hidden=D, num_heads=32, num_kv_heads=32, head_dim=D // 32,
                          kv_dtype_bytes=b)
    mamba = SSMLayer("mamba", temporal_elems=D * N, conv_elems=(2 * D + 2 * N) * 4,
                     state_dtype_bytes=b, conv_dtype_bytes=b,
                     proj_flops_per_token=12 * D * D + 10 * D, scan_flops_per_token=16 * D * N)
    mlp = MLPLayer(hidden=D, dense_size=4 * D, gated=False)  # 2 matrices: 16 L D^2
    layers = []
    for block in range(28):
        layers += [attn if block % 7 == 3 else mamba, mlp]
    return HybridModelSpec("paper-7b", tuple(layers), dtype=dtype, architecture="paper-7b",
                           num_hidden_layers=28)


# preset name -> transformers config class name (the class's defaults are the preset)
ARCH_PRESETS = {
    "nemotron_h": "NemotronHConfig",
    "qwen3_next": "Qwen3NextConfig",
    "qwen3_5": "Qwen3_5Config",
    "qwen3_5_moe": "Qwen3_5MoeConfig",
    "falcon_h1": "FalconH1Config",
    "granitemoehybrid": "GraniteMoeHybridConfig",
    "kimi_linear": "KimiLinearConfig",
    "lfm2": "Lfm2Config",
}
# transformers' Lfm2Config defaults to attention in every layer: LFM2-1.2B's sizes and
# pattern (16 layers, attention at 2, 5, 8, 10, 12, 14, the rest short convolutions)
_LFM2_ATTENTION = {2, 5, 8, 10, 12, 14}
PRESET_OVERRIDES = {
    # transformers' NemotronHConfig defaults to 4 layers: Nemotron-H-8B's shape instead
    "nemotron_h": {"hidden_size": 4096, "num_hidden_layers": 52, "intermediate_size": 21504,
                   "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*"
                                              "-M-M-M-M-M-",
                   "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8,
                   "ssm_state_size": 128, "conv_kernel": 4, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "head_dim": 128, "mlp_hidden_act": "relu2"},
    "lfm2": {"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 12288,
             "layer_types": ["full_attention" if i in _LFM2_ATTENTION else "conv"
                             for i in range(16)]},
}
PRESETS = ["paper-7b", *ARCH_PRESETS]


def preset_config(name: str):
    """The transformers config object a preset is built from."""
    import transformers

    key = name.replace("-", "_").lower()
    if key not in ARCH_PRESETS:
        raise UserError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
    cls = getattr(transformers, ARCH_PRESETS[key], None)
    if cls is None:
        raise UserError(f"preset {name!r} needs transformers' {ARCH_PRESETS[key]}, which "
                        f"transformers {transformers.__version__} does not ship")
    return cls(**PRESET_OVERRIDES.get(key, {}))


def preset_spec(name: str, dtype: str | None = None, **server) -> HybridModelSpec:
    """A preset as a server holds it; ``server``: ``spec_from_hf_config``'s flags."""
    if name == "paper-7b":
        if any(v not in (None, 1) for v in server.values()):
            raise UserError("paper-7b is the paper's model: it takes no server dtype or "
                            "tensor-parallel flags")
        return paper_7b(dtype)
    key = name.replace("-", "_").lower()
    # transformers' class defaults name no dtype; the published checkpoints are bfloat16
    return spec_from_hf_config(preset_config(name), name=key, dtype=dtype or "bfloat16",
                               **server)
