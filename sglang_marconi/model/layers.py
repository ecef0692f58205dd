"""Per-layer cost formulas: bytes a layer keeps per cached token / per checkpoint, and the
FLOPs it spends to prefill tokens.

Conventions (documented in docs/design.md):
- a matmul of (L x a) by (a x b) costs 2*L*a*b FLOPs;
- attention scores and the weighted sum cost 2*L^2*(heads*head_dim) each, without causal
  halving (the paper's 4*L^2*D term), so saved FLOPs include the quadratic term;
- the LM head and embeddings are left out: a prefill computes logits for the last token only,
  so they do not change with the cached prefix;
- SSM layers are linear in L; their state is fixed-size: temporal (recurrent) state plus the
  convolution window.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionLayer:
    """Full (global) softmax attention with GQA. ``q_factor`` is 2 for gated attention
    (Qwen3-Next's q_proj also emits the output gate); ``in_dim`` is the width the Q/K/V
    projections read (2*hidden for Zamba2's shared block)."""

    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    kv_dtype_bytes: int
    in_dim: int = 0
    q_factor: int = 1

    kind = "attention"

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes

    def prefill_flops(self, L: float) -> float:
        d_in = self.in_dim or self.hidden
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        proj = 2 * L * d_in * (q * self.q_factor + 2 * kv) + 2 * L * q * self.hidden
        return proj + 4 * L * L * q


@dataclass(frozen=True)
class SSMLayer:
    """A recurrent layer with a fixed-size state: Mamba1, Mamba2 or gated delta net.

    ``proj_flops_per_token`` covers in/out projections and the convolution;
    ``scan_flops_per_token`` the recurrence. State bytes: ``temporal_elems`` in
    ``state_dtype_bytes`` plus ``conv_elems`` in ``conv_dtype_bytes``.
    """

    kind: str  # "mamba1" | "mamba2" | "gdn" | "mamba" (the paper's own formula)
    temporal_elems: int
    conv_elems: int
    state_dtype_bytes: int
    conv_dtype_bytes: int
    proj_flops_per_token: float
    scan_flops_per_token: float

    @property
    def state_bytes(self) -> int:
        return (self.temporal_elems * self.state_dtype_bytes
                + self.conv_elems * self.conv_dtype_bytes)

    def prefill_flops(self, L: float) -> float:
        return L * (self.proj_flops_per_token + self.scan_flops_per_token)


@dataclass(frozen=True)
class MLPLayer:
    """Dense MLP or MoE. FLOPs count only what runs for a token: ``active_experts`` routed
    experts of width ``expert_size`` plus shared experts of ``shared_size`` total width, the
    router, and a dense MLP of width ``dense_size``. ``gated`` MLPs (SwiGLU) have three
    matrices, plain ones (ReLU^2, GELU) two. ``latent`` (NemotronH latent MoE) routes experts
    in a narrower width, with a down and up projection around them."""

    hidden: int
    dense_size: int = 0
    expert_size: int = 0
    active_experts: int = 0
    num_experts: int = 0
    shared_size: int = 0
    gated: bool = True
    latent: int = 0

    @property
    def kind(self) -> str:
        return "moe" if self.num_experts else "mlp"

    def flops_per_token(self) -> float:
        mats = 3 if self.gated else 2
        d = self.hidden
        f = 2 * mats * d * (self.dense_size + self.shared_size)
        if self.num_experts:
            d_e = self.latent or d
            f += 2 * mats * d_e * self.expert_size * self.active_experts
            f += 2 * d * self.num_experts  # router
            if self.latent:
                f += 2 * 2 * d * self.latent
        return f

    def prefill_flops(self, L: float) -> float:
        return L * self.flops_per_token()


def mamba2_layer(hidden, d_inner, nheads, d_state, n_groups, d_conv, state_bytes, conv_bytes,
                 conv_window=None) -> SSMLayer:
    """A Mamba2 mixer. in_proj emits z, x, B, C, dt; conv1d over x, B, C; SSD scan
    (per state element: decay, input, output ~ 6 FLOPs); out_proj. The conv state keeps the
    last ``conv_window`` inputs (d_conv - 1 in SGLang's MambaPool, the default)."""
    conv_dim = d_inner + 2 * n_groups * d_state
    window = d_conv - 1 if conv_window is None else conv_window
    proj = 2 * hidden * (2 * d_inner + 2 * n_groups * d_state + nheads) + 2 * d_inner * hidden
    proj += 2 * conv_dim * d_conv
    return SSMLayer("mamba2", temporal_elems=d_inner * d_state, conv_elems=conv_dim * window,
                    state_dtype_bytes=state_bytes, conv_dtype_bytes=conv_bytes,
                    proj_flops_per_token=proj, scan_flops_per_token=6 * d_inner * d_state)


def mamba1_layer(hidden, d_inner, d_state, d_conv, dt_rank, state_bytes, conv_bytes) -> SSMLayer:
    """A Mamba1 mixer (Jamba): in_proj (x, z), conv1d, x_proj (dt, B, C), dt_proj, selective
    scan (~9 FLOPs per state element), out_proj."""
    proj = (2 * hidden * 2 * d_inner + 2 * d_inner * (dt_rank + 2 * d_state)
            + 2 * dt_rank * d_inner + 2 * d_inner * hidden + 2 * d_inner * d_conv)
    return SSMLayer("mamba1", temporal_elems=d_inner * d_state, conv_elems=d_inner * (d_conv - 1),
                    state_dtype_bytes=state_bytes, conv_dtype_bytes=conv_bytes,
                    proj_flops_per_token=proj, scan_flops_per_token=9 * d_inner * d_state)


def gdn_layer(hidden, num_k_heads, num_v_heads, head_k_dim, head_v_dim, d_conv, state_bytes,
              conv_bytes) -> SSMLayer:
    """A gated delta net (Qwen3-Next / Qwen3.5 linear attention): in_proj_qkvz and in_proj_ba,
    conv1d over q, k, v, the delta-rule recurrence (per head a dk x dv state: decay, k^T S,
    rank-1 update, q S ~ 8 FLOPs per state element), out_proj."""
    key_dim = num_k_heads * head_k_dim
    value_dim = num_v_heads * head_v_dim
    conv_dim = 2 * key_dim + value_dim
    proj = (2 * hidden * (2 * key_dim + 2 * value_dim) + 2 * hidden * 2 * num_v_heads
            + 2 * value_dim * hidden + 2 * conv_dim * d_conv)
    state = num_v_heads * head_k_dim * head_v_dim
    return SSMLayer("gdn", temporal_elems=state, conv_elems=conv_dim * (d_conv - 1),
                    state_dtype_bytes=state_bytes, conv_dtype_bytes=conv_bytes,
                    proj_flops_per_token=proj, scan_flops_per_token=8 * state)
