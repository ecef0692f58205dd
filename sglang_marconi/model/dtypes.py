"""The dtypes SGLang 0.5.23 stores a hybrid model's cache in, by SGLang's own rules (temporal
and conv state, KV); ``tests/test_server_bytes.py`` holds them equal to SGLang's pools."""
from __future__ import annotations

import os
from dataclasses import dataclass

from sglang_marconi.errors import UserError
from sglang_marconi.model.spec import dtype_bytes

STATE_DTYPES = ("float32", "bfloat16", "float16")  # SGLang's dtype_map
KV_CACHE_DTYPES = ("auto", "bfloat16", "bf16", "float16", "fp8_e4m3", "fp8_e5m2")
# SGLang config classes whose mamba2_cache_params calls mamba2_state_dtype(self)
READS_CONFIG_SSM_DTYPE = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "nemotron_h",
                          "falcon_h1", "lfm2"}


@dataclass(frozen=True)
class CacheDtypes:
    """Bytes per element of the KV cache, the temporal SSM state and the conv state."""

    kv: str
    temporal: str
    conv: str

    @property
    def kv_bytes(self) -> int:
        return dtype_bytes(self.kv, "--kv-cache-dtype")

    @property
    def temporal_bytes(self) -> int:
        return dtype_bytes(self.temporal, "--mamba-ssm-dtype")

    @property
    def conv_bytes(self) -> int:
        return dtype_bytes(self.conv, "SGLANG_MAMBA_CONV_DTYPE")

    def describe(self) -> str:
        return f"KV {self.kv}, SSM temporal state {self.temporal}, conv state {self.conv}"


def _choice(value, choices, what):
    if value not in choices:
        raise UserError(f"{what}: expected one of {', '.join(choices)}, got {value!r}")
    return value


def cache_dtypes(cfg, arch: str, model_dtype: str, *, kv_cache_dtype: str | None = None,
                 mamba_ssm_dtype: str | None = None, env=None) -> CacheDtypes:
    """SGLang's cache dtypes for ``arch`` served in ``model_dtype`` with these flags."""
    env = os.environ if env is None else env
    kv = _choice(kv_cache_dtype or "auto", KV_CACHE_DTYPES, "--kv-cache-dtype")
    kv = model_dtype if kv == "auto" else ("bfloat16" if kv == "bf16" else kv)
    conv = env.get("SGLANG_MAMBA_CONV_DTYPE") or "bfloat16"
    conv = conv if conv in STATE_DTYPES else "bfloat16"  # SGLang falls back silently
    temporal = "float32"
    if arch in READS_CONFIG_SSM_DTYPE and getattr(cfg, "mamba_ssm_dtype", None) in STATE_DTYPES:
        temporal = cfg.mamba_ssm_dtype
    if env.get("SGLANG_MAMBA_SSM_DTYPE") in STATE_DTYPES:
        temporal = env["SGLANG_MAMBA_SSM_DTYPE"]
    if mamba_ssm_dtype is not None:
        temporal = _choice(mamba_ssm_dtype, STATE_DTYPES, "--mamba-ssm-dtype")
    return CacheDtypes(kv=kv, temporal=temporal, conv=conv)
