"""``--enable-int8-mamba-checkpoint``: cached states in SGLang's int8 checkpoint pool.

The replay builds SGLang's ``HybridReqToTokenPool`` with the flag published, so SGLang
builds its ``MambaCheckpointPool`` (2 x the state slots by default) and SGLang's MAMBA
component stores, loads and frees checkpoints; the Marconi cache counts and ranks states
in that pool. After a trace, the pools account for every slot: each state in the tree owns
one checkpoint slot, the rest are free, and no active slot is left held.
"""
import json

import pytest

pytest.importorskip("sglang")

from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402

from sglang_marconi.driver.pools import PoolConfig  # noqa: E402
from sglang_marconi.harness.ab import ABConfig, _run_one, make_cache  # noqa: E402
from sglang_marconi.harness.ab import to_replay_requests  # noqa: E402
from sglang_marconi.model import preset_spec  # noqa: E402
from sglang_marconi.sim.traces import read_trace  # noqa: E402

KV_TOKENS, SLOTS, LIMIT = 400_000, 24, 300


def _run_cli(*argv):
    from cli_helper import run_cli
    from sglang_marconi.cli import ab as ab_cli

    return run_cli(ab_cli, *argv)


def _tree_states(cache) -> list:
    out, stack = [], [cache.tree_core.root_node]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        value = node.component_data[ComponentType.MAMBA].value
        if value is not None and node is not cache.tree_core.root_node:
            out.append(int(value.view(-1)[0]))
    return out


@pytest.fixture(scope="module")
def requests(mooncake_path):
    return to_replay_requests(read_trace(mooncake_path), LIMIT)


@pytest.mark.parametrize("name", ["stock-python", "marconi"])  # python tree cores: walkable
def test_every_checkpoint_slot_is_accounted_for(name, requests):
    spec = preset_spec("qwen3_next")
    pools = PoolConfig(kv_tokens=KV_TOKENS, mamba_slots=SLOTS, int8_checkpoint=True)
    cfg = ABConfig(pools=pools, spec=spec, caches=(name,))
    cache, _, req_pool = make_cache(name, cfg)
    ckpt = req_pool.mamba_ckpt_pool
    assert ckpt is not None and ckpt.num_slots == 2 * SLOTS  # SGLang's default size
    if name == "marconi":
        assert cache.marconi.state_slots == 2 * SLOTS
        assert cache.marconi.spec.ssm_state_bytes == spec.int8_checkpoint_bytes
    result = _run_one(name, cache, requests, cfg, None, False)
    states = _tree_states(cache)
    assert result["states_evicted"] > 0  # the checkpoint pool bound
    assert len(states) == len(set(states)) == result["states_in_tree"]
    assert all(1 <= s <= ckpt.num_slots for s in states)  # checkpoint slot ids (0 reserved)
    assert ckpt.available_size() + len(states) == ckpt.num_slots
    # the running requests' full-precision slots all came back
    assert req_pool.mamba_allocator.available_size() == req_pool.mamba_allocator.size
    assert result["hit_tokens"] > 0


def test_ab_offers_int8_for_every_cache_and_prints_the_pool(mooncake_path):
    out = json.loads(_run_cli("--trace", str(mooncake_path), "--model", "qwen3_next",
                              "--kv-tokens", str(KV_TOKENS), "--mamba-slots", str(SLOTS),
                              "--limit", "40", "--json", "--no-progress",
                              "--caches", "stock,marconi", "--enable-int8-mamba-checkpoint",
                              "--int8-mamba-ckpt-size", "30"))
    pool = out["config"]["int8_checkpoints"]
    assert pool == {"slots": 30, "bytes_per_slot": 21_233_664, "bytes": 31 * 21_233_664,
                    "full_state_bytes": 77_266_944}
    assert set(out["caches"]) == {"stock", "marconi"}
    table = _run_cli("--trace", str(mooncake_path), "--model", "qwen3_next",
                     "--kv-tokens", str(KV_TOKENS), "--mamba-slots", str(SLOTS),
                     "--limit", "10", "--no-progress", "--caches", "stock",
                     "--enable-int8-mamba-checkpoint")
    assert "int8 checkpoint pool: 48 slots of 21,233,664 B" in table


@pytest.mark.parametrize("flags,fragment", [
    (("--int8-mamba-ckpt-size", "8"), "--int8-mamba-ckpt-size needs"),
    (("--enable-int8-mamba-checkpoint", "--hicache-ratio", "2"), "host-offload path"),
])
def test_ab_refuses_what_sglang_refuses_with_int8(mooncake_path, flags, fragment):
    from sglang_marconi.errors import UserError

    with pytest.raises(UserError, match=fragment):
        _run_cli("--trace", str(mooncake_path), "--model", "qwen3_next", "--kv-tokens",
                 str(KV_TOKENS), "--mamba-slots", str(SLOTS), "--limit", "5", *flags)
    with pytest.raises(UserError, match="unified pool builds no checkpoint pool"):
        _run_cli("--trace", str(mooncake_path), "--model", "qwen3_next", "--cache-gb", "20",
                 "--memory", "unified", "--limit", "5", "--enable-int8-mamba-checkpoint")
