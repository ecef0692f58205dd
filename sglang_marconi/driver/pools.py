"""Real SGLang cache objects on CPU, built from SGLang's own pool classes as its unit-test kit
does, with the requested tree class and core, and SGLang's host tier (``init_hicache``) when
``PoolConfig.hicache_write_policy`` asks for one."""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
from dataclasses import dataclass
from typing import Optional

from sglang_marconi.driver import hicache_cpu
from sglang_marconi.sglang_version import check_sglang_version


@dataclass(frozen=True)
class PoolConfig:
    """Pool sizes and the scheduler settings that decide where states are taken."""

    kv_tokens: int
    mamba_slots: int
    page_size: int = 64
    max_context_len: int = 262144
    max_running_requests: int = 2
    extra_buffer: bool = True  # --mamba-radix-cache-strategy extra_buffer (else no_buffer)
    chunked_prefill_size: int = 8192
    mamba_track_interval: int = 256
    mamba_max_states_per_path: int = -1
    # the model's mamba chunk: extra_buffer snapshots land on lcm(this, page) (tests: 1)
    mamba_cache_chunk_size: Optional[int] = None
    # SGLang's host tier (--enable-hierarchical-cache) when a write policy is given
    hicache_write_policy: Optional[str] = None
    hicache_ratio: float = 2.0
    hicache_size_gb: int = 0
    hicache_storage_dir: Optional[str] = None
    # the scheduler loop: a request's ping-pong track buffer has 2 slots under overlap, 1
    # without (``get_mamba_tracking_slots``); None: each builder's default (static 2, unified 1)
    overlap_schedule: Optional[bool] = None
    # SGLang's int8 checkpoint pool (--enable-int8-mamba-checkpoint; slots None: 2 x mamba_slots)
    int8_checkpoint: bool = False
    int8_checkpoint_slots: Optional[int] = None


def _server_args_factory(pc: PoolConfig):
    from sglang.srt.server_args import ServerArgs

    host_tier = {}
    if pc.hicache_write_policy is not None:
        host_tier = dict(
            enable_hierarchical_cache=True, hicache_write_policy=pc.hicache_write_policy,
            hicache_ratio=pc.hicache_ratio, hicache_size=pc.hicache_size_gb,
            hicache_io_backend="kernel", hicache_mem_layout="page_first")
        if pc.hicache_storage_dir is not None:
            host_tier.update(
                hicache_storage_backend="file", hicache_storage_prefetch_policy="wait_complete",
                hicache_storage_backend_extra_config=json.dumps(
                    {"file_storage_path": pc.hicache_storage_dir}))
    return functools.partial(
        ServerArgs,
        attention_backend="torch_native",
        chunked_prefill_size=pc.chunked_prefill_size,
        mamba_track_interval=pc.mamba_track_interval,
        mamba_radix_cache_strategy="extra_buffer" if pc.extra_buffer else "no_buffer",
        mamba_max_states_per_path=pc.mamba_max_states_per_path,
        enable_int8_mamba_checkpoint=pc.int8_checkpoint,
        int8_mamba_ckpt_size=pc.int8_checkpoint_slots,
        **host_tier,
    )


def _allocator_factory(page_size: int):
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

    def make(size, dtype, device, kvcache, need_sort):
        if page_size == 1:
            return TokenToKVPoolAllocator(size=size, dtype=dtype, device=device,
                                          kvcache=kvcache, need_sort=need_sort)
        return PagedTokenToKVPoolAllocator(size=size, page_size=page_size, dtype=dtype,
                                           device=device, kvcache=kvcache, need_sort=need_sort)

    return make


# the replay's tiny model: one SSM layer (0) and one attention layer (1), the kit's sizes
MAMBA_LAYERS, FULL_LAYERS = [0], [1]
TINY_MAMBA = dict(intermediate_size=16, n_groups=1, num_heads=1, head_dim=16, state_size=8,
                  conv_kernel=4)
FLA_CHUNK = 64  # SGLang's FLA chunk: the mamba cache chunk is max(this, page) by default


def build_pools(pc: PoolConfig):
    """(CacheInitParams, allocator, req_to_token_pool) from SGLang's pool classes, on CPU."""
    check_sglang_version()
    import torch

    # the replay's small tensor ops are much slower with contending intra-op threads
    torch.set_num_threads(1)
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
    from sglang.srt.environ import envs
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.events import KvEventLoraNames
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.srt.server_args import set_global_server_args_for_scheduler

    if pc.page_size > 1 and not pc.extra_buffer:
        raise ValueError("no_buffer (extra_buffer=False) needs page_size 1, as in SGLang")
    server_args = _server_args_factory(pc)(model_path="dummy", page_size=pc.page_size)
    # no HF config to read the mamba chunk from: SGLang's default, max(FLA chunk, page)
    server_args._mamba_cache_chunk_size = (max(FLA_CHUNK, pc.page_size)
                                           if pc.mamba_cache_chunk_size is None
                                           else pc.mamba_cache_chunk_size)
    set_global_server_args_for_scheduler(server_args)
    with envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
        params = Mamba2CacheParams(shape=Mamba2StateShape.create(tp_world_size=1, **TINY_MAMBA),
                                   layers=MAMBA_LAYERS)
    overlap = {} if pc.overlap_schedule is None else {
        "enable_overlap_schedule": pc.overlap_schedule}
    # the checkpoint pool's start-up lines speak of HBM headroom: not the replay's tiny tensors
    logging.getLogger("sglang.srt.mem_cache.mamba_checkpoint_pool").setLevel(logging.ERROR)
    req_to_token_pool = HybridReqToTokenPool(
        size=pc.max_running_requests, mamba_size=pc.mamba_slots,
        mamba_spec_state_size=pc.max_running_requests, max_context_len=pc.max_context_len,
        device="cpu", enable_memory_saver=False, cache_params=params,
        mamba_layer_ids=MAMBA_LAYERS, enable_mamba_extra_buffer=pc.extra_buffer,
        speculative_num_draft_tokens=3, **overlap)
    kv_pool = HybridLinearKVPool(
        size=pc.kv_tokens, dtype=torch.bfloat16, page_size=pc.page_size, head_num=1,
        head_dim=1, full_attention_layer_ids=FULL_LAYERS, device="cpu",
        enable_memory_saver=False, mamba_pool=req_to_token_pool.mamba_pool)
    allocator = _allocator_factory(pc.page_size)(pc.kv_tokens, torch.bfloat16, "cpu", kv_pool,
                                                 False)
    init = CacheInitParams(
        req_to_token_pool=req_to_token_pool, token_to_kv_pool_allocator=allocator,
        page_size=pc.page_size, disable=False, sliding_window_size=None, draft_swa_window=0,
        decoder_swa_bounded_replay=False,
        tree_components=(ComponentType.FULL, ComponentType.MAMBA),
        enable_mamba_extra_buffer=pc.extra_buffer, enable_kv_cache_events=False,
        dynamo_kv_event_format=False, kv_event_lora_names=KvEventLoraNames(),
        enable_session_radix_cache=False, eviction_policy="lru", is_eagle=False,
        component_registry_override=None)
    return init, allocator, req_to_token_pool


def build_cache(pc: PoolConfig, cache_class=None, tree_core: str = "rust",
                params_override: Optional[dict] = None):
    """A fresh ``cache_class`` cache on new pools: (cache, allocator, req_to_token_pool)."""
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    params, allocator, req_to_token_pool = build_pools(pc)
    params = dataclasses.replace(params, tree_core_backend=tree_core, **(params_override or {}))
    cache = (cache_class or UnifiedRadixCache)(params)
    cache.cache_init_params = params
    # before raising out of memory SGLang's allocators print the whole radix tree
    # (allocation.py 169/245/619): callers report a one-line ``errors.sglang_oom`` instead
    cache.pretty_print = lambda: None
    if pc.hicache_write_policy is not None:
        attach_host_tier(cache, params)
    return cache, allocator, req_to_token_pool


def attach_host_tier(cache, params) -> None:
    """SGLang's registry step ``cache.init_hicache(server_args, params)`` on CPU."""
    from sglang.srt.runtime_context import get_server_args  # heavy: sglang

    hicache_cpu.install()
    server_args = get_server_args()
    if not server_args.enable_hierarchical_cache:
        raise ValueError("attach_host_tier: the published server args have no host tier")
    with hicache_cpu.host_budget(), hicache_cpu.single_rank():
        cache.init_hicache(server_args, params)
    hicache_cpu.unpin(cache)
