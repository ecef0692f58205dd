"""Tiny random-weight configs of the hybrid architectures verify-exact runs, with the quirks
that matter for resuming (``token_by_token``, ``prefill_only_dt_clamp``, ``ssm_family``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from sglang_marconi.errors import UserError

VOCAB = 256
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    # 5x transformers' default 0.02, so SSM states move the logits (|logit| ~ 3): with the
    # default, a 1% error in a state changes the logits by < 1e-6 and would go unseen
    initializer_range=0.1,
)


@dataclass(frozen=True)
class Arch:
    """One hybrid architecture: how to build its tiny config and how to continue on a cache."""

    name: str  # canonical CLI name
    title: str  # human-readable model family
    ssm_family: str  # "mamba2" | "gdn" | "mamba1"
    build_config: Callable[[], object] = field(repr=False, compare=False)
    token_by_token: bool = False
    # prefill clamps dt to time_step_min but decode does not (transformers NemotronH, Zamba2)
    prefill_only_dt_clamp: bool = False
    # module of transformers holding the model's chunk-scan function (mamba2 only)
    modeling_module: str | None = None


def _nemotron_h():
    from transformers import NemotronHConfig

    # M = Mamba2, * = attention, - = MLP
    return NemotronHConfig(
        **_COMMON, num_hidden_layers=4, hybrid_override_pattern="M*M-", mamba_num_heads=4,
        mamba_head_dim=16, ssm_state_size=16, n_groups=1, conv_kernel=4, head_dim=16,
        mamba_chunk_size=8,
    )


def _qwen3_next():
    from transformers import Qwen3NextConfig

    # layers alternate gated-delta-net (linear attention) and full attention; MoE MLPs
    return Qwen3NextConfig(
        **_COMMON, num_hidden_layers=4, full_attention_interval=2, head_dim=16,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
    )


def _falcon_h1():
    from transformers import FalconH1Config

    # every layer runs attention and Mamba2 in parallel
    return FalconH1Config(
        **_COMMON, num_hidden_layers=2, head_dim=16, mamba_d_ssm=64, mamba_n_heads=4,
        mamba_d_head=16, mamba_d_state=16, mamba_n_groups=1, mamba_d_conv=4, mamba_chunk_size=8,
    )


def _bamba():
    from transformers import BambaConfig

    return BambaConfig(**_COMMON, num_hidden_layers=4, attn_layer_indices=[1, 3], mamba_n_heads=4,
                       mamba_d_head=32, mamba_d_state=16, mamba_n_groups=1, mamba_d_conv=4,
                       mamba_chunk_size=8)


def _zamba2():
    from transformers import Zamba2Config

    # "hybrid" layers = Mamba2 + a shared attention block
    return Zamba2Config(
        **_COMMON, num_hidden_layers=4, layers_block_type=["mamba", "hybrid", "mamba", "hybrid"],
        mamba_d_state=16, mamba_headdim=16, mamba_ngroups=1, mamba_d_conv=4, chunk_size=8,
        num_mem_blocks=1, attention_head_dim=16, use_mem_rope=True,
    )


def _jamba():
    from transformers import JambaConfig

    return JambaConfig(**_COMMON, num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1,
                       expert_layer_period=2, expert_layer_offset=1, num_experts=2,
                       mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8)


ARCHS: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch("nemotron_h", "NemotronH (Mamba2 + attention + MLP)", "mamba2", _nemotron_h,
             modeling_module="transformers.models.nemotron_h.modeling_nemotron_h",
             prefill_only_dt_clamp=True),
        Arch("qwen3_next", "Qwen3-Next (gated delta net + attention, MoE)", "gdn", _qwen3_next),
        Arch("falcon_h1", "Falcon-H1 (parallel Mamba2 + attention)", "mamba2", _falcon_h1,
             modeling_module="transformers.models.falcon_h1.modeling_falcon_h1"),
        Arch("bamba", "Bamba (Mamba2 + attention)", "mamba2", _bamba,
             modeling_module="transformers.models.bamba.modeling_bamba"),
        Arch("zamba2", "Zamba2 (Mamba2 + shared attention)", "mamba2", _zamba2,
             modeling_module="transformers.models.zamba2.modeling_zamba2",
             prefill_only_dt_clamp=True),
        Arch("jamba", "Jamba (Mamba1 + attention, MoE)", "mamba1", _jamba, token_by_token=True),
    )
}


def _key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def get_arch(name: str) -> Arch:
    """Look an architecture up by name, ignoring case, '-' and '_' ("NemotronH", "qwen3-next")."""
    for arch in ARCHS.values():
        if _key(arch.name) == _key(name):
            return arch
    raise UserError(f"unknown arch {name!r}; known: {', '.join(ARCHS)} (or 'all')")


def build_model(arch: Arch, seed: int, keep_dt_clamp: bool = False):
    """The tiny fp32 model for ``arch`` from ``seed`` (prefill-only dt clamp lifted)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # silence "falling back to the PyTorch implementation"
    torch.manual_seed(seed)
    config = arch.build_config()
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    if arch.prefill_only_dt_clamp and not keep_dt_clamp:
        for module in model.modules():
            if hasattr(module, "time_step_limit"):
                module.time_step_limit = (0.0, float("inf"))
    return model
