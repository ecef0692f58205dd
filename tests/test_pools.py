"""The replay's pools, built from SGLang's pool classes (``driver.pools.build_pools``), are
the ones SGLang's own unit-test kit builds for the same settings: sizes, tensor shapes and
dtypes, the allocator, every ``CacheInitParams`` field."""
import dataclasses
import functools
from unittest import mock

import pytest

pytest.importorskip("sglang")

from sglang_marconi.driver import pools  # noqa: E402
from sglang_marconi.driver.pools import PoolConfig  # noqa: E402


def _kit_pools(pc: PoolConfig):
    """The same pools through ``sglang.test.kits.unified_radix_cache.fixtures``."""
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.test.kits.unified_radix_cache import fixtures
    from sglang.test.kits.unified_radix_cache.config import CacheConfig

    cfg = CacheConfig(
        page_size=pc.page_size, components=(ComponentType.FULL, ComponentType.MAMBA),
        num_layers=2, full_attention_layer_ids=(1,), enable_mamba_extra_buffer=pc.extra_buffer,
        mamba_cache_size=pc.mamba_slots, mamba_intermediate_size=16, mamba_num_heads=1,
        mamba_head_dim=16, mamba_state_size=8, kv_size=pc.kv_tokens,
        max_num_reqs=pc.max_running_requests, max_context_len=pc.max_context_len, head_num=1,
        head_dim=1)
    pool_cls = fixtures.HybridReqToTokenPool
    if pc.overlap_schedule is not None:
        pool_cls = functools.partial(pool_cls, enable_overlap_schedule=pc.overlap_schedule)
    with (mock.patch.object(fixtures, "get_device", lambda *a, **k: "cpu"),
          mock.patch.object(fixtures, "ServerArgs", pools._server_args_factory(pc)),
          mock.patch.object(fixtures, "TokenToKVPoolAllocator",
                            pools._allocator_factory(pc.page_size)),
          mock.patch.object(fixtures, "HybridReqToTokenPool", pool_cls)):
        cache, allocator, rtp = fixtures.build_fixture(cfg, tree_core_backend="python")
    return cache.cache_init_params, allocator, rtp


def _shapes(tensors):
    return [(tuple(t.shape), t.dtype) for t in tensors]


def _describe(params, allocator, rtp):
    mp = rtp.mamba_pool
    kv = allocator.get_kvcache().full_kv_pool
    fields = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)
              if f.name not in ("req_to_token_pool", "token_to_kv_pool_allocator")}
    fields["kv_event_lora_names"] = vars(fields["kv_event_lora_names"])  # a value object
    return {
        "params": fields,
        "allocator": (type(allocator).__name__, allocator.size, allocator.page_size),
        "req_to_token": (rtp.size, tuple(rtp.req_to_token.shape)),
        "mamba": (mp.size, _shapes(mp.mamba_cache.conv), _shapes([mp.mamba_cache.temporal]),
                  rtp.mamba_ping_pong_track_buffer.shape if hasattr(
                      rtp, "mamba_ping_pong_track_buffer") else None),
        "kv": (_shapes(kv.k_buffer), _shapes(kv.v_buffer)),
    }


@pytest.mark.parametrize("pc", [
    PoolConfig(kv_tokens=4096, mamba_slots=24, page_size=64, max_context_len=2048),
    PoolConfig(kv_tokens=2048, mamba_slots=12, page_size=16, max_context_len=1024,
               overlap_schedule=False, max_running_requests=4),
    PoolConfig(kv_tokens=1000, mamba_slots=10, page_size=1, extra_buffer=False,
               max_context_len=512, overlap_schedule=False),
], ids=["extra_buffer-page64", "extra_buffer-normal-loop", "no_buffer"])
def test_pools_equal_the_kits(pc):
    ours = _describe(*pools.build_pools(pc))
    kit = _describe(*_kit_pools(pc))
    assert ours == kit
