"""Per-layer cost formulas: bytes a layer keeps per cached token / per checkpoint, and the
FLOPs it spends to prefill tokens (docs/design.md): a matmul costs 2*L*a*b; attention
2*L^2*(heads*head_dim) twice, without causal halving; LM head and embeddings left out; SSM
layers linear in L with a fixed-size state (temporal plus convolution window)."""
from __future__ import annotations

from dataclasses import dataclass

from sglang_marconi.errors import UserError


@dataclass(frozen=True)
class AttentionLayer:
    """Full softmax attention with GQA (KV bytes one rank's, FLOPs the whole model's)."""

    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    kv_dtype_bytes: int
    in_dim: int = 0
    q_factor: int = 1
    tp: int = 1

    kind = "attention"

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * max(1, self.num_kv_heads // self.tp) * self.head_dim * self.kv_dtype_bytes

    def prefill_flops(self, L: float) -> float:
        d_in = self.in_dim or self.hidden
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        proj = 2 * L * d_in * (q * self.q_factor + 2 * kv) + 2 * L * q * self.hidden
        return proj + self.quadratic_coeff * L * L

    @property
    def quadratic_coeff(self) -> float:
        """FLOPs per L^2: scores and the weighted sum, 2*L^2*(heads*head_dim) each."""
        return 4.0 * self.num_heads * self.head_dim


@dataclass(frozen=True)
class MLAAttentionLayer(AttentionLayer):
    """Multi-head latent attention (Kimi-Linear): latent + rope key per token, every rank."""

    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    rope_dim: int = 0
    v_head_dim: int = 0

    @property
    def kv_bytes_per_token(self) -> int:
        return (self.kv_lora_rank + self.rope_dim) * self.kv_dtype_bytes

    def prefill_flops(self, L: float) -> float:
        h, d = self.num_heads, self.hidden
        qk = self.head_dim + self.rope_dim
        q = 2 * L * (d * self.q_lora_rank + self.q_lora_rank * h * qk) if self.q_lora_rank \
            else 2 * L * d * h * qk
        kv = 2 * L * d * (self.kv_lora_rank + self.rope_dim)
        kv += 2 * L * self.kv_lora_rank * h * (self.head_dim + self.v_head_dim)
        return q + kv + 2 * L * h * self.v_head_dim * d + self.quadratic_coeff * L * L

    @property
    def quadratic_coeff(self) -> float:
        return 2.0 * self.num_heads * (self.head_dim + self.rope_dim + self.v_head_dim)


@dataclass(frozen=True)
class SSMLayer:
    """A recurrent layer with a fixed-size state (Mamba1, Mamba2, gated delta net): projection
    and scan FLOPs per token, temporal and conv elements in their dtypes; ``state_head_dim``
    is the axis an int8 checkpoint keeps one scale per."""

    kind: str  # "mamba1" | "mamba2" | "gdn" | "mamba" (the paper's own formula)
    temporal_elems: int
    conv_elems: int
    state_dtype_bytes: int
    conv_dtype_bytes: int
    proj_flops_per_token: float
    scan_flops_per_token: float
    state_head_dim: int = 1

    @property
    def state_bytes(self) -> int:
        return (self.temporal_elems * self.state_dtype_bytes
                + self.conv_elems * self.conv_dtype_bytes)

    @property
    def int8_checkpoint_bytes(self) -> int:
        """The state in SGLang's int8 checkpoint pool (``--enable-int8-mamba-checkpoint``,
        ``mamba_checkpoint_pool.py``): int8 temporal values, one scale in the state dtype
        per (head, state channel), the conv window at its own dtype."""
        scales = self.temporal_elems // self.state_head_dim
        return (self.temporal_elems + scales * self.state_dtype_bytes
                + self.conv_elems * self.conv_dtype_bytes)

    def prefill_flops(self, L: float) -> float:
        return L * (self.proj_flops_per_token + self.scan_flops_per_token)


@dataclass(frozen=True)
class MLPLayer:
    """Dense MLP or MoE, counting only what runs for a token."""

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


def _split(n: int, tp: int, what: str) -> int:
    """``n`` split over ``tp`` ranks (SGLang's ``divide`` asserts it divides)."""
    if n % tp:
        raise UserError(f"--tp-size {tp} does not divide the {n} {what}")
    return n // tp


def _groups(n_groups: int, tp: int) -> int:
    """SGLang's ``Mamba2StateShape.create``: uneven groups replicated up to the ranks."""
    return n_groups if n_groups % tp == 0 else n_groups + tp - n_groups


def mamba2_layer(hidden, d_inner, nheads, d_state, n_groups, d_conv, state_bytes, conv_bytes,
                 tp=1) -> SSMLayer:
    """A Mamba2 mixer (SSD scan ~6 FLOPs per state element); one rank's state."""
    conv_dim = d_inner + 2 * n_groups * d_state
    proj = 2 * hidden * (2 * d_inner + 2 * n_groups * d_state + nheads) + 2 * d_inner * hidden
    proj += 2 * conv_dim * d_conv
    head_dim = d_inner // nheads
    rank_conv = _split(d_inner + 2 * _groups(n_groups, tp) * d_state, tp, "conv channels")
    return SSMLayer("mamba2", temporal_elems=_split(nheads, tp, "SSM heads") * head_dim * d_state,
                    conv_elems=rank_conv * (d_conv - 1), state_dtype_bytes=state_bytes,
                    conv_dtype_bytes=conv_bytes, proj_flops_per_token=proj,
                    scan_flops_per_token=6 * d_inner * d_state, state_head_dim=head_dim)


def mamba1_layer(hidden, d_inner, d_state, d_conv, dt_rank, state_bytes, conv_bytes,
                 tp=1) -> SSMLayer:
    """A Mamba1 mixer (selective scan ~9 FLOPs per state element); full-rank state."""
    proj = (2 * hidden * 2 * d_inner + 2 * d_inner * (dt_rank + 2 * d_state)
            + 2 * dt_rank * d_inner + 2 * d_inner * hidden + 2 * d_inner * d_conv)
    rank_inner = _split(d_inner, tp, "SSM channels")
    return SSMLayer("mamba1", temporal_elems=rank_inner * d_state,
                    conv_elems=rank_inner * (d_conv - 1),
                    state_dtype_bytes=state_bytes, conv_dtype_bytes=conv_bytes,
                    proj_flops_per_token=proj, scan_flops_per_token=9 * d_inner * d_state)


def gdn_layer(hidden, num_k_heads, num_v_heads, head_k_dim, head_v_dim, d_conv, state_bytes,
              conv_bytes, tp=1) -> SSMLayer:
    """A gated delta net (Qwen3-Next / Qwen3.5); state in SGLang's Mamba2 shape."""
    key_dim = num_k_heads * head_k_dim
    value_dim = num_v_heads * head_v_dim
    conv_dim = 2 * key_dim + value_dim
    proj = (2 * hidden * (2 * key_dim + 2 * value_dim) + 2 * hidden * 2 * num_v_heads
            + 2 * value_dim * hidden + 2 * conv_dim * d_conv)
    state = num_v_heads * head_k_dim * head_v_dim
    rank_conv = _split(value_dim + 2 * _groups(num_k_heads, tp) * head_k_dim, tp, "conv channels")
    return SSMLayer("gdn",
                    temporal_elems=_split(num_v_heads, tp, "value heads") * head_k_dim * head_v_dim,
                    conv_elems=rank_conv * (d_conv - 1),
                    state_dtype_bytes=state_bytes, conv_dtype_bytes=conv_bytes,
                    proj_flops_per_token=proj, scan_flops_per_token=8 * state,
                    state_head_dim=head_v_dim)


def kda_layer(hidden, num_heads, head_dim, d_conv, state_bytes, conv_bytes, tp=1) -> SSMLayer:
    """Kimi Delta Attention (~8 FLOPs per state element); ``KimiLinearStateShape``."""
    proj_dim = num_heads * head_dim
    proj = (2 * hidden * 3 * proj_dim  # q, k, v
            + 2 * hidden * head_dim + 2 * head_dim * proj_dim  # low-rank decay gate f
            + 2 * hidden * num_heads  # beta
            + 2 * hidden * head_dim + 2 * head_dim * proj_dim  # low-rank output gate g
            + 2 * proj_dim * hidden + 2 * 3 * proj_dim * d_conv)
    state = num_heads * head_dim * head_dim
    return SSMLayer("kda", temporal_elems=_split(num_heads, tp, "KDA heads") * head_dim * head_dim,
                    conv_elems=(d_conv - 1) * 3 * _split(proj_dim, tp, "KDA channels"),
                    state_dtype_bytes=state_bytes, conv_dtype_bytes=conv_bytes,
                    proj_flops_per_token=proj, scan_flops_per_token=8 * state,
                    state_head_dim=head_dim)


def short_conv_layer(hidden, d_conv, conv_bytes, tp=1) -> SSMLayer:
    """LFM2's gated short convolution: only a conv window of state."""
    proj = 2 * hidden * 3 * hidden + 2 * hidden * d_conv + 2 * hidden * hidden
    return SSMLayer("short_conv", temporal_elems=0,
                    conv_elems=_split(hidden, tp, "conv channels") * (d_conv - 1),
                    state_dtype_bytes=0, conv_dtype_bytes=conv_bytes,
                    proj_flops_per_token=proj, scan_flops_per_token=0)
