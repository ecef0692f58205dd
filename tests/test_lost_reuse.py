"""The reuse a cache loses: prompt tokens whose KV matched past the deepest usable state,
counted per request for stock and Marconi alike (``driver.lost_reuse``), and by the
Marconi cache itself (what ``sglang:marconi_lost_reuse_tokens`` exports)."""
import types

import pytest

pytest.importorskip("sglang")

from sglang_marconi.driver.lost_reuse import lost_reuse_tokens  # noqa: E402
from sglang_marconi.driver.pools import PoolConfig  # noqa: E402
from sglang_marconi.harness.ab import ABConfig, run_ab, to_replay_requests  # noqa: E402
from sglang_marconi.model import preset_spec  # noqa: E402
from sglang_marconi.sim.traces import read_trace  # noqa: E402


def test_lost_reuse_is_kv_past_the_hit_bounded_by_the_prompt():
    r = types.SimpleNamespace(full_kv_hit_length=900, device_prefix_len=256, host_hit_length=0)
    assert lost_reuse_tokens(r, 1000) == 644
    assert lost_reuse_tokens(r, 700) == 699 - 256  # a prefill skips at most input - 1
    r.host_hit_length = 700
    assert lost_reuse_tokens(r, 1000) == 0  # the host tier served past it
    assert lost_reuse_tokens(types.SimpleNamespace(device_prefix_len=0), 10) == 0


def test_ab_counts_lost_reuse_for_stock_and_marconi(mooncake_path):
    requests = to_replay_requests(read_trace(str(mooncake_path)), 200)
    longest = max(len(r.input_ids) + len(r.output_ids) for r in requests)
    # a state pool that binds (12 slots), a token pool that does not: KV outlives states
    cfg = ABConfig(pools=PoolConfig(kv_tokens=1_000_000, mamba_slots=12,
                                    max_context_len=longest + 128),
                   spec=preset_spec("qwen3_next"), caches=("stock", "marconi"))
    out = run_ab(requests, cfg, show_progress=False, per_request=True)["caches"]
    for name in ("stock", "marconi"):
        col = out[name]
        per = col["lost_reuse_tokens_per_request"]
        assert sum(per) == col["lost_reuse_tokens"] > 0, name
        for r, hit, lost in zip(requests, col["hit_tokens_per_request"], per):
            assert hit + lost <= len(r.input_ids) - 1
    # the Marconi cache counts the same tokens itself (its /metrics series)
    assert out["marconi"]["marconi"]["lost_reuse_tokens"] == out["marconi"]["lost_reuse_tokens"]
