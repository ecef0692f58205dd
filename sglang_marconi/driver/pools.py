"""Real SGLang cache objects on CPU, built through SGLang's own unit-test fixtures.

``build_cache`` asks ``sglang.test.kits.unified_radix_cache.fixtures.build_fixture`` for the
pools (``HybridReqToTokenPool`` with its ``MambaPool``, ``HybridLinearKVPool`` and a token
allocator), with three CPU adjustments: the device is "cpu", the global server args carry
the scheduler settings the replay needs (chunk size, track interval, extra_buffer, a
non-triton attention backend), and a paged allocator replaces the token allocator when the
page is larger than one token (the scheduler allocates pages). The tree cache is then built
anew on those pools with the requested class and tree core ("rust" = the compiled core
SGLang uses by default, "python" = the reference core).

``PoolConfig.hicache_write_policy`` adds SGLang's host tier (``--enable-hierarchical-cache``):
``UnifiedRadixCache.init_hicache``, exactly as the registry calls it in a server, with the
CUDA-only copy kernels replaced by ``hicache_cpu`` and, with ``hicache_storage_dir``, the L3
``file`` backend in that directory.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from dataclasses import dataclass
from typing import Optional
from unittest import mock

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
    # the model's mamba chunk (SGLang reads it from the HF config; the fixture's default is
    # max(64, page)): extra_buffer snapshots land on lcm(this, page). Tests set 1 to get a
    # one-token checkpoint grid.
    mamba_cache_chunk_size: Optional[int] = None
    # SGLang's host tier (--enable-hierarchical-cache) when a write policy is given:
    # --hicache-write-policy, --hicache-ratio (host/device), --hicache-size (GB, overrides
    # the ratio), --hicache-storage-backend file in ``hicache_storage_dir``
    hicache_write_policy: Optional[str] = None
    hicache_ratio: float = 2.0
    hicache_size_gb: int = 0
    hicache_storage_dir: Optional[str] = None
    # the scheduler loop the pools are built for: SGLang sizes a running request's
    # ping-pong track buffer by it (``allocation_sizing.get_mamba_tracking_slots``: 2 slots
    # under the overlap schedule, 1 without; ``memory_pool.HybridReqToTokenPool`` 1393-1400).
    # None keeps each builder's own default (the test fixture's static pools: 2; the
    # unified pools: 1), as before this option existed.
    overlap_schedule: Optional[bool] = None


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
        **host_tier,
    )


def _allocator_factory(page_size: int):
    from sglang.srt.mem_cache.allocator import (
        PagedTokenToKVPoolAllocator,
        TokenToKVPoolAllocator,
    )

    def make(size, dtype, device, kvcache, need_sort):
        if page_size == 1:
            return TokenToKVPoolAllocator(size=size, dtype=dtype, device=device,
                                          kvcache=kvcache, need_sort=need_sort)
        return PagedTokenToKVPoolAllocator(size=size, page_size=page_size, dtype=dtype,
                                           device=device, kvcache=kvcache, need_sort=need_sort)

    return make


def _tracking_slots(fixtures, overlap_schedule: Optional[bool]):
    """The fixture builds ``HybridReqToTokenPool`` without ``enable_overlap_schedule`` (its
    default, True: 2 tracking slots); pass the loop's value when one is given."""
    if overlap_schedule is None:
        return contextlib.nullcontext()
    return mock.patch.object(fixtures, "HybridReqToTokenPool", functools.partial(
        fixtures.HybridReqToTokenPool, enable_overlap_schedule=overlap_schedule))


def cache_config(pc: PoolConfig):
    """The test kit's ``CacheConfig`` for FULL + MAMBA pools of these sizes (tiny tensors:
    the replay never runs a forward pass, so only slot counts matter)."""
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.test.kits.unified_radix_cache.config import CacheConfig

    if pc.page_size > 1 and not pc.extra_buffer:
        raise ValueError("no_buffer (extra_buffer=False) needs page_size 1, as in SGLang")
    return CacheConfig(
        page_size=pc.page_size,
        components=(ComponentType.FULL, ComponentType.MAMBA),
        num_layers=2,
        full_attention_layer_ids=(1,),
        enable_mamba_extra_buffer=pc.extra_buffer,
        mamba_cache_size=pc.mamba_slots,
        mamba_intermediate_size=16,
        mamba_num_heads=1,
        mamba_head_dim=16,
        mamba_state_size=8,
        kv_size=pc.kv_tokens,
        max_num_reqs=pc.max_running_requests,
        max_context_len=pc.max_context_len,
        head_num=1,
        head_dim=1,
    )


def build_pools(pc: PoolConfig):
    """(CacheInitParams, allocator, req_to_token_pool) from SGLang's fixtures, on CPU."""
    check_sglang_version()
    import torch

    # The replay never runs a forward pass; its small tensor ops are 100x slower with two
    # contending intra-op threads once sglang is imported (measured on 2 cores).
    torch.set_num_threads(1)
    from sglang.test.kits.unified_radix_cache import fixtures

    with (
        mock.patch.object(fixtures, "get_device", lambda *a, **k: "cpu"),
        mock.patch.object(fixtures, "ServerArgs", _server_args_factory(pc)),
        mock.patch.object(fixtures, "TokenToKVPoolAllocator", _allocator_factory(pc.page_size)),
        _tracking_slots(fixtures, pc.overlap_schedule),
    ):
        fixture_cache, allocator, req_to_token_pool = fixtures.build_fixture(
            cache_config(pc), tree_core_backend="python",
            mamba_cache_chunk_size=pc.mamba_cache_chunk_size,
        )
    params = fixture_cache.cache_init_params
    return params, allocator, req_to_token_pool


def build_cache(pc: PoolConfig, cache_class=None, tree_core: str = "rust",
                params_override: Optional[dict] = None):
    """A fresh cache of ``cache_class`` (default: stock ``UnifiedRadixCache``) on new pools.

    Returns (cache, allocator, req_to_token_pool). ``cache_class`` may be any callable taking
    ``CacheInitParams`` (e.g. a ``functools.partial`` of ``MarconiUnifiedRadixCache``).
    """
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    params, allocator, req_to_token_pool = build_pools(pc)
    params = dataclasses.replace(params, tree_core_backend=tree_core,
                                 **(params_override or {}))
    cache = (cache_class or UnifiedRadixCache)(params)
    cache.cache_init_params = params
    if pc.hicache_write_policy is not None:
        attach_host_tier(cache, params)
    return cache, allocator, req_to_token_pool


def attach_host_tier(cache, params) -> None:
    """SGLang's registry step for ``--enable-hierarchical-cache`` (``registry.py``:
    ``cache.init_hicache(server_args, params)``) on the published CPU server args."""
    from sglang.srt.runtime_context import get_server_args  # heavy: sglang

    hicache_cpu.install()
    server_args = get_server_args()
    if not server_args.enable_hierarchical_cache:
        raise ValueError("attach_host_tier: the published server args have no host tier")
    with hicache_cpu.host_budget(), hicache_cpu.single_rank():
        cache.init_hicache(server_args, params)
    hicache_cpu.unpin(cache)
