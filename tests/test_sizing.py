"""driver/sizing.py: SGLang 0.5.23's pool sizes from a byte budget (static and unified)."""
import types

import pytest

from sglang_marconi.driver.sizing import GB, PoolSizes, size_pools, slots_per_request
from sglang_marconi.errors import UserError
from sglang_marconi.model import preset_spec


def _spec(kv=65536, state=26787840):
    return types.SimpleNamespace(name="toy", kv_bytes_per_token=kv, ssm_state_bytes=state)


def test_static_split_follows_sglang_formula():
    s = size_pools(_spec(), 100, "static")
    rest = 100 * GB
    budget = rest * 0.9 / 1.9
    assert s.mamba_slots == int((budget - 26787840) // 26787840)
    kv = int((rest - (s.mamba_slots + 1) * 26787840) // 65536) // 64 * 64
    assert s.kv_tokens == kv and s.static_kv_tokens == kv
    assert s.unified_bytes is None and s.mode == "static"
    # the split uses (almost) the whole budget: less than a slot and a page left over
    assert 0 <= rest - (s.mamba_slots + 1) * 26787840 - s.kv_tokens * 65536 < 64 * 65536 + 1


def test_ratio_moves_bytes_between_pools():
    lo, hi = size_pools(_spec(), 100, mamba_full_memory_ratio=0.3), size_pools(_spec(), 100, mamba_full_memory_ratio=2.0)
    assert lo.mamba_slots < hi.mamba_slots and lo.kv_tokens > hi.kv_tokens


def test_slots_per_request_matches_calculate_mamba_ratio():
    assert slots_per_request(True, True) == 5
    assert slots_per_request(True, False) == 4
    assert slots_per_request(False, True) == 3
    assert slots_per_request(True, True, skip_decode_lock=True) == 4


def test_max_running_capped_by_state_slots_and_kv():
    s = size_pools(_spec(), 100)
    assert s.max_running_requests == min(2048, s.kv_tokens // 2, s.mamba_slots // 5)
    assert s.max_running_requests == s.mamba_slots // 5  # the state pool is the cap here
    assert size_pools(_spec(), 100, max_running_requests=10).max_running_requests == 10


def test_unified_one_buffer_holds_both_sides():
    st, un = size_pools(_spec(), 100, "static"), size_pools(_spec(), 100, "unified")
    assert un.mamba_slots == st.mamba_slots and un.static_kv_tokens == st.kv_tokens
    assert un.unified_bytes % 4096 == (st.mamba_slots * 26787840) % 4096
    assert 100 * GB - 26787840 - 4096 <= un.unified_bytes <= 100 * GB - 26787840
    assert un.kv_tokens == un.unified_bytes // 65536 // 64 * 64 > st.kv_tokens


def test_presets_and_describe():
    for name in ("paper-7b", "qwen3_next"):
        for mode in ("static", "unified"):
            s = size_pools(preset_spec(name), 50, mode)
            assert isinstance(s, PoolSizes) and s.max_running_requests > 0
            line = s.describe()
            assert "\n" not in line and f"{s.mamba_slots:,}" in line
            assert s.as_dict()["kv_tokens"] == s.kv_tokens


@pytest.mark.parametrize("kwargs, field", [
    (dict(cache_gb=0.01), "--cache-gb"), (dict(cache_gb=-1), "--cache-gb"),
    (dict(cache_gb=10, memory="shared"), "--memory"),
    (dict(cache_gb=10, mamba_full_memory_ratio=0), "--mamba-full-memory-ratio"),
])
def test_bad_input_one_line_error(kwargs, field):
    with pytest.raises(UserError) as err:
        size_pools(_spec(), **kwargs)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_unified_slot_ids_are_what_sglangs_allocator_hands_out():
    """Under unified memory SGLang's Mamba allocator gets a buffer full of state ids
    (4,006 for paper-7b at 100 GB), not the static split's 1,897: the printed count is
    the built pool's."""
    pytest.importorskip("sglang")
    from sglang_marconi.driver.pools import PoolConfig
    from sglang_marconi.driver.unified_pools import UnifiedConfig, build_unified_cache

    sizes = size_pools(preset_spec("paper-7b"), 100, "unified")
    pc = PoolConfig(kv_tokens=sizes.kv_tokens, mamba_slots=sizes.mamba_slots,
                    max_context_len=20000, max_running_requests=sizes.max_running_requests)
    _, _, req_to_token_pool = build_unified_cache(pc, UnifiedConfig.from_sizes(sizes))
    assert sizes.mamba_slot_ids == req_to_token_pool.mamba_allocator.size == 4006
    assert sizes.mamba_slots == 1897 and sizes.max_running_requests == 379
    assert "4,006 state slot ids" in sizes.describe()
    assert sizes.as_dict()["mamba_slot_ids"] == 4006
    static = size_pools(preset_spec("paper-7b"), 100, "static")
    assert static.mamba_slot_ids == static.mamba_slots == 1897
