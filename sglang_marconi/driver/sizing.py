"""Pool sizes from a byte budget (``--cache-gb``, SGLang's ``rest_memory``), the way SGLang
0.5.23's ``kv_cache_configurator.py`` sizes a hybrid server: state slots, KV tokens, slots
per request, max running requests, and the unified buffer."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from sglang_marconi.errors import UserError

GB = 1 << 30
BASE_SLOTS_PER_REQUEST = 3  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO
DEFAULT_CONTEXT_LEN = 131072
MODES = ("static", "unified")


@dataclass(frozen=True)
class PoolSizes:
    mode: str                  # "static" | "unified"
    cache_bytes: int           # the budget given (--cache-gb)
    kv_tokens: int             # KV token slots (static); unified: tokens the KV side may hold if states take none
    mamba_slots: int           # state slots: SGLang's max_mamba_cache_size (unified: it caps running requests)
    max_running_requests: int  # SGLang's cap: state slots // slots per request (and its other caps)
    slots_per_request: int     # SGLang's mamba ratio (5 = 3 + 2 tracking slots: extra_buffer, overlap)
    unified_bytes: Optional[int]  # the one buffer's bytes (unified), else None
    mamba_full_memory_ratio: float = 0.9
    kv_bytes_per_token: int = 0
    state_bytes: int = 0
    page_size: int = 64
    static_kv_tokens: int = 0  # the static split's KV tokens (unified: SGLang's boot label)

    @property
    def mamba_slot_ids(self) -> int:
        """The state slots SGLang's allocator hands out (unified: a buffer of states)."""
        if self.mode == "unified":
            return self.unified_bytes // self.state_bytes - 1
        return self.mamba_slots

    def describe(self) -> str:
        head = (f"{self.mode} pools from {self.cache_bytes / GB:g} GB "
                f"(--mamba-full-memory-ratio {self.mamba_full_memory_ratio:g})")
        if self.mode == "unified":
            return (f"{head}: one {self.unified_bytes / GB:.2f} GB buffer, up to "
                    f"{self.kv_tokens:,} KV tokens if no state is resident, "
                    f"{self.mamba_slot_ids:,} state slot ids, max running requests "
                    f"{self.max_running_requests:,} ({self.slots_per_request} slots each, "
                    f"of the static split's {self.mamba_slots:,})")
        return (f"{head}: {self.kv_tokens:,} KV tokens, {self.mamba_slots:,} state slots, "
                f"max running requests {self.max_running_requests:,} "
                f"({self.slots_per_request} slots each)")

    def as_dict(self) -> dict:
        return {**asdict(self), "mamba_slot_ids": self.mamba_slot_ids}


def slots_per_request(extra_buffer: bool = True, overlap: bool = True,
                      skip_decode_lock: bool = False) -> int:
    """SGLang's ``_calculate_mamba_ratio`` (radix cache on)."""
    base = BASE_SLOTS_PER_REQUEST - (1 if skip_decode_lock else 0)
    if extra_buffer:
        return base + (2 if overlap else 1)
    return base + (1 if skip_decode_lock else 0)


def _cap_running(kv_tokens: int, mamba_slots: int, ratio: int, context_len: int,
                 requested: Optional[int]) -> int:
    if requested is not None:
        reqs = min(max(1, requested), kv_tokens // 2)
    else:
        estimated = max(min(int(kv_tokens / context_len * 512), 4096), 2048)
        reqs = min(estimated, kv_tokens // 2)
    return min(reqs, mamba_slots // ratio)


def size_pools(spec, cache_gb: float, memory: str = "static", *,
               mamba_full_memory_ratio: float = 0.9, extra_buffer: bool = True,
               page_size: int = 64, max_running_requests: Optional[int] = None,
               overlap: bool = True, context_len: int = DEFAULT_CONTEXT_LEN) -> PoolSizes:
    """The pools SGLang 0.5.23 builds for ``cache_gb`` GB; ``memory``: static or unified."""
    if memory not in MODES:
        raise UserError(f"--memory: expected static or unified, got {memory!r}")
    if not cache_gb > 0:
        raise UserError(f"--cache-gb: expected a positive number, got {cache_gb!r}")
    if not mamba_full_memory_ratio > 0:
        raise UserError("--mamba-full-memory-ratio: expected a positive number, got "
                        f"{mamba_full_memory_ratio!r}")
    if page_size < 1:
        raise UserError(f"--page-size: expected a positive integer, got {page_size!r}")
    kv_per_token, per_slot = int(spec.kv_bytes_per_token), int(spec.ssm_state_bytes)
    if kv_per_token <= 0 or per_slot <= 0:
        raise UserError(f"model {getattr(spec, 'name', '?')}: needs attention KV and SSM "
                        "state bytes (a hybrid model)")
    rest = cache_gb * GB
    mamba_budget = rest * mamba_full_memory_ratio / (1 + mamba_full_memory_ratio)
    slots = int((mamba_budget - per_slot) // per_slot)
    rest_kv = rest - (slots + 1) * per_slot
    kv_tokens = max(0, int(rest_kv // kv_per_token)) // page_size * page_size
    ratio = slots_per_request(extra_buffer, overlap)
    running = _cap_running(kv_tokens, slots, ratio, context_len, max_running_requests)
    if slots <= 0 or kv_tokens <= 0 or running <= 0:
        need = (ratio + 1) * per_slot * (1 + mamba_full_memory_ratio) / mamba_full_memory_ratio
        raise UserError(f"--cache-gb {cache_gb:g} is too small for {getattr(spec, 'name', 'the model')}: "
                        f"{max(slots, 0)} state slots ({per_slot / 2**20:.1f} MiB each), "
                        f"{kv_tokens} KV tokens; SGLang needs room for {ratio} state slots "
                        f"per request (at least {need / GB:.2f} GB at ratio "
                        f"{mamba_full_memory_ratio:g})")
    unified_bytes = None
    total_kv = kv_tokens
    if memory == "unified":
        kv_side = int(rest_kv) - int(rest_kv) % 4096
        unified_bytes = kv_side + slots * per_slot
        total_kv = unified_bytes // kv_per_token // page_size * page_size
    return PoolSizes(mode=memory, cache_bytes=int(rest), kv_tokens=total_kv, mamba_slots=slots,
                     max_running_requests=running, slots_per_request=ratio,
                     unified_bytes=unified_bytes, mamba_full_memory_ratio=mamba_full_memory_ratio,
                     kv_bytes_per_token=kv_per_token, state_bytes=per_slot, page_size=page_size,
                     static_kv_tokens=kv_tokens)

