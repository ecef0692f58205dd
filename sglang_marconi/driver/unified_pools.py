"""SGLang's unified memory pool (``--enable-unified-memory``) on CPU at a model's byte ratio,
with its two Triton-only allocation kernels pointed at SGLang's torch equivalents on CPU
tensors; the buffer is scaled down, only bytes and ids matter."""
from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass

from sglang_marconi.driver.pools import PoolConfig, build_pools

KV_ENTRY_BYTES = 32  # one full-attention layer, 1 head of dim 8, fp16 K and V (SGLang needs 16-byte rows)
CONV_BYTES = 4      # one fp32 conv element (entries stay 4-byte aligned); the temporal state carries the rest


@dataclass(frozen=True)
class UnifiedConfig:
    """The unified buffer in real bytes and the model's two entry sizes."""

    unified_bytes: int
    kv_bytes_per_token: int
    state_bytes: int
    mamba_slots: int            # Mamba slot ids (SGLang's max_mamba_cache_size)
    lazy_compaction: bool = False  # SGLang's default is lazy; tests use eager (see notes)

    @classmethod
    def from_sizes(cls, sizes) -> "UnifiedConfig":
        """The buffer ``sizing.size_pools(..., "unified")`` describes."""
        return cls(sizes.unified_bytes, sizes.kv_bytes_per_token, sizes.state_bytes,
                   sizes.mamba_slots)

    @classmethod
    def for_tokens(cls, spec, kv_tokens: int, states: int, mamba_slots: int) -> "UnifiedConfig":
        """A buffer for ``kv_tokens`` KV tokens plus ``states`` states (tests)."""
        return cls(kv_tokens * spec.kv_bytes_per_token + states * spec.ssm_state_bytes,
                   spec.kv_bytes_per_token, spec.ssm_state_bytes, mamba_slots)

    def scaled_total_bytes(self) -> int:
        tokens = self.unified_bytes // self.kv_bytes_per_token
        # the state bytes SGLang adds on top of the KV side's budget are inside unified_bytes
        return tokens * KV_ENTRY_BYTES


class _CpuKernel:
    """``kernel[grid](*args)`` that runs a torch equivalent for CPU tensors."""

    def __init__(self, kernel, naive):
        self.kernel, self.naive = kernel, naive

    def __getitem__(self, grid):
        def launch(*args):
            if args[0].is_cuda:
                return self.kernel[grid](*args)
            return self.naive(*args)
        return launch


def _extend_naive(prefix_lens, seq_lens, last_loc, free_pages, out, _bs_pow2, page_size):
    from sglang.srt.mem_cache.allocator.paged import alloc_extend_naive

    alloc_extend_naive(prefix_lens, seq_lens, last_loc, free_pages, out, page_size, out.device)


def _decode_naive(seq_lens, last_loc, free_pages, out, _bs_pow2, page_size):
    from sglang.srt.mem_cache.allocator.paged import alloc_decode_naive

    new_pages = int(((seq_lens - 1) % page_size == 0).sum())
    alloc_decode_naive(seq_lens, last_loc, free_pages, out, page_size, new_pages)


def install_cpu_alloc_kernels() -> None:
    """Give the unified allocator's two Triton-only alloc kernels a CPU path (idempotent)."""
    from sglang.srt.mem_cache.allocator import unified_sub_pool as usp

    if not isinstance(usp.alloc_extend_kernel, _CpuKernel):
        usp.alloc_extend_kernel = _CpuKernel(usp.alloc_extend_kernel, _extend_naive)
    if not isinstance(usp.alloc_decode_kernel, _CpuKernel):
        usp.alloc_decode_kernel = _CpuKernel(usp.alloc_decode_kernel, _decode_naive)


def _mamba_params(ucfg: UnifiedConfig):
    import torch

    scaled = round(KV_ENTRY_BYTES * ucfg.state_bytes / ucfg.kv_bytes_per_token)  # a state's
    temporal = (max(CONV_BYTES + 4, scaled) - CONV_BYTES) // 4  # bytes on the scaled buffer
    return types.SimpleNamespace(
        shape=types.SimpleNamespace(conv=[(1, 1)], temporal=(1, 1, temporal)),
        dtype=types.SimpleNamespace(conv=torch.float32, temporal=torch.float32),
        layers=[0],
    )


def build_unified_pools(pc: PoolConfig, ucfg: UnifiedConfig):
    """(CacheInitParams, allocator, req_to_token_pool, bundle) on one unified CPU buffer."""
    import torch
    from sglang.srt.mem_cache.unified_memory_pool import init_unified_mamba_pools

    install_cpu_alloc_kernels()
    small = dataclasses.replace(pc, kv_tokens=4 * pc.page_size, mamba_slots=8)
    params, _, _ = build_pools(small)
    cp = _mamba_params(ucfg)
    state_entry = CONV_BYTES + 4 * cp.shape.temporal[-1]
    slots = ucfg.mamba_slots
    kv_side = max(0, ucfg.scaled_total_bytes() - slots * state_entry)
    bundle = init_unified_mamba_pools(
        device="cpu", kv_cache_dtype=torch.float16, head_num=1, head_dim=8, v_head_dim=8,
        page_size=pc.page_size, start_layer=0, end_layer=2, is_draft_worker=False,
        use_mla_backend=False, mamba_layer_ids=[0], full_attention_layer_ids=[1],
        mamba2_cache_params=cp, model_context_len=pc.max_context_len,
        extra_max_context_len=4, max_total_num_tokens=kv_side // KV_ENTRY_BYTES,
        max_mamba_cache_size=slots, max_num_reqs=pc.max_running_requests,
        enable_memory_saver=False, enable_mamba_extra_buffer=pc.extra_buffer,
        enable_mamba_extra_buffer_lazy=False, speculative_num_draft_tokens=None,
        # None: 1 tracking slot per request, as before PoolConfig.overlap_schedule existed
        disable_overlap_schedule=not pc.overlap_schedule, need_sort=False,
        lazy_compaction=ucfg.lazy_compaction, unified_total_bytes=kv_side,
    )
    allocator = bundle.token_to_kv_pool_allocator
    req_to_token_pool = bundle.req_to_token_pool
    params = dataclasses.replace(params, req_to_token_pool=req_to_token_pool,
                                 token_to_kv_pool_allocator=allocator)
    return params, allocator, req_to_token_pool, bundle


def build_unified_cache(pc: PoolConfig, ucfg: UnifiedConfig, cache_class=None,
                        tree_core: str = "rust"):
    """A fresh cache on a new unified buffer: (cache, allocator, req_to_token_pool)."""
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    params, allocator, req_to_token_pool, _ = build_unified_pools(pc, ucfg)
    params = dataclasses.replace(params, tree_core_backend=tree_core)
    cache = (cache_class or UnifiedRadixCache)(params)
    cache.cache_init_params = params
    return cache, allocator, req_to_token_pool
