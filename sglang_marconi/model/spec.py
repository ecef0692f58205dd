"""``HybridModelSpec``: what a hybrid model's cache entries weigh (``kv_bytes_per_token``,
``ssm_state_bytes``, one rank's) and what a hit saves (``flops_saved``)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

from sglang_marconi.errors import UserError
from sglang_marconi.model.layers import AttentionLayer, MLPLayer, SSMLayer

DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
}


def dtype_bytes(name, what: str = "dtype") -> int:
    """Bytes per element of a dtype name ("bfloat16", "torch.float16", "fp8", ...)."""
    key = str(name).replace("torch.", "").lower()
    if key not in DTYPE_BYTES:
        raise UserError(f"unknown {what} {name!r}; known: {', '.join(sorted(DTYPE_BYTES))}")
    return DTYPE_BYTES[key]


@dataclass(frozen=True)
class HybridModelSpec:
    """An ordered list of layers with cached byte and FLOP totals."""

    name: str
    layers: tuple = field(repr=False)
    dtype: str = "bfloat16"
    architecture: str = "custom"
    num_hidden_layers: int = 0  # decoder blocks as the config counts them
    cache_dtypes: object = None  # dtypes.CacheDtypes the bytes are in (None: set by hand)
    tp_size: int = 1  # the bytes are one tensor-parallel rank's
    # the bytes a server's built pools hold, where they were read (``with_pool_bytes``)
    pool_kv_bytes_per_token: int = 0
    pool_state_bytes: int = 0
    # cached states live in SGLang's int8 checkpoint pool (``with_int8_checkpoints``)
    int8_checkpoints: bool = False

    # -- layer views ---------------------------------------------------------------------
    @cached_property
    def attention_layers(self) -> tuple:
        return tuple(x for x in self.layers if isinstance(x, AttentionLayer))

    @cached_property
    def ssm_layers(self) -> tuple:
        return tuple(x for x in self.layers if isinstance(x, SSMLayer))

    @cached_property
    def mlp_layers(self) -> tuple:
        return tuple(x for x in self.layers if isinstance(x, MLPLayer))

    @property
    def num_attention_layers(self) -> int:
        return len(self.attention_layers)

    @property
    def num_ssm_layers(self) -> int:
        return len(self.ssm_layers)

    @property
    def is_hybrid(self) -> bool:
        return self.num_ssm_layers > 0

    # -- bytes -----------------------------------------------------------------------------
    @cached_property
    def kv_bytes_per_token(self) -> int:
        return self.pool_kv_bytes_per_token or self.config_kv_bytes_per_token

    @cached_property
    def ssm_state_bytes(self) -> int:
        return self.pool_state_bytes or self.config_state_bytes

    @cached_property
    def config_kv_bytes_per_token(self) -> int:
        """KV bytes per token as the layers and dtypes give them."""
        return sum(x.kv_bytes_per_token for x in self.attention_layers)

    @cached_property
    def config_state_bytes(self) -> int:
        """A cached state's bytes from the layers and dtypes (int8: the checkpoint's)."""
        if self.int8_checkpoints:
            return self.int8_checkpoint_bytes
        return self.full_state_bytes

    @cached_property
    def full_state_bytes(self) -> int:
        """One state in the active pool (the running requests' full-precision slots)."""
        return sum(x.state_bytes for x in self.ssm_layers)

    @cached_property
    def int8_checkpoint_bytes(self) -> int:
        """One state in SGLang's int8 checkpoint pool (``SSMLayer.int8_checkpoint_bytes``)."""
        return sum(x.int8_checkpoint_bytes for x in self.ssm_layers)

    def with_int8_checkpoints(self) -> "HybridModelSpec":
        """This spec with cached states in SGLang's int8 checkpoint pool."""
        return replace(self, int8_checkpoints=True)

    def with_pool_bytes(self, kv_bytes_per_token: int, state_bytes: int) -> "HybridModelSpec":
        """This spec with the bytes a server's pools were measured to hold (0 keeps)."""
        return replace(self, pool_kv_bytes_per_token=int(kv_bytes_per_token),
                       pool_state_bytes=int(state_bytes))

    # -- FLOPs -----------------------------------------------------------------------------
    @cached_property
    def _coeffs(self) -> tuple[float, float]:
        """prefill_flops(L) = a*L + b*L^2: every layer is linear but attention's scores."""
        a = sum(x.prefill_flops(1.0) for x in self.layers)
        b = sum(x.quadratic_coeff for x in self.attention_layers)
        return a - b, b

    def prefill_flops(self, L: float) -> float:
        a, b = self._coeffs
        return a * L + b * L * L

    def flops_saved(self, T: float, P: float = 0) -> float:
        """FLOPs saved by a hit of length T rather than a hit of length P (P <= T)."""
        return self.prefill_flops(T) - self.prefill_flops(P)

    def breakdown(self, L: float) -> dict:
        """Bytes and FLOPs by layer kind, for ``model-info``."""
        out: dict[str, dict] = {}
        for layer in self.layers:
            row = out.setdefault(layer.kind, {"layers": 0, "prefill_flops": 0.0,
                                              "kv_bytes_per_token": 0, "state_bytes": 0})
            row["layers"] += 1
            row["prefill_flops"] += layer.prefill_flops(L)
            row["kv_bytes_per_token"] += getattr(layer, "kv_bytes_per_token", 0)
            row["state_bytes"] += getattr(layer, "state_bytes", 0)
        return out

    def summary(self, L: int = 1024) -> dict:
        return {
            "name": self.name,
            "architecture": self.architecture,
            "dtype": self.dtype,
            "cache_dtypes": (vars(self.cache_dtypes) if self.cache_dtypes is not None
                             else None),
            "tp_size": self.tp_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_layers": self.num_attention_layers,
            "num_ssm_layers": self.num_ssm_layers,
            "num_mlp_layers": len(self.mlp_layers),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "ssm_state_bytes": self.ssm_state_bytes,
            "tokens": L,
            "prefill_flops": self.prefill_flops(L),
            "breakdown": self.breakdown(L),
        }
