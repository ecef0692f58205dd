"""Marconi in SGLang's unified memory pool (``--enable-unified-memory``) on CPU: the pool is
SGLang's (``init_unified_mamba_pools``, eager compaction), the tree cache stock or Marconi.
alpha 0 makes stock's decisions; with alpha > 0 one ranking over KV leaves and states frees
bytes for either side; no byte, KV token or slot id leaks and locked nodes are never
victims (hypothesis)."""
import functools
from array import array

import pytest

pytest.importorskip("sglang")
pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

from sglang_marconi.driver.pools import PoolConfig  # noqa: E402
from sglang_marconi.driver.replay import Replayer, ReplayRequest  # noqa: E402
from sglang_marconi.driver.unified_pools import UnifiedConfig, build_unified_cache  # noqa: E402
from marconi_checks.invariants import (  # noqa: E402
    check_idle,
    check_joint_build,
    fresh_joint_rows,
    guard_locked_evictions,
)
from sglang_marconi.model import preset_spec  # noqa: E402
from sglang_marconi.sglang_integration.cache import MarconiUnifiedRadixCache  # noqa: E402
from sglang_marconi.sglang_integration.components import SAVED, cached_flops_saved  # noqa: E402
from sglang_marconi.sglang_integration.options import MarconiSettings  # noqa: E402
from tests.test_sglang_cache import BASES, request_specs, to_requests  # noqa: E402

SPEC = preset_spec("paper-7b")
PC = PoolConfig(kv_tokens=1024, mamba_slots=10, page_size=16, max_context_len=1024,
                chunked_prefill_size=128, mamba_track_interval=64)
# 1,400 tokens' worth of bytes: ~3 states (409 tokens each) and a few hundred KV tokens,
# or all KV; 10 slot ids
UC = UnifiedConfig(unified_bytes=1400 * SPEC.kv_bytes_per_token,
                   kv_bytes_per_token=SPEC.kv_bytes_per_token,
                   state_bytes=SPEC.ssm_state_bytes, mamba_slots=10)
# bytes for ~14 states or 6,000 KV tokens, but only 5 slot ids: ids bind before bytes
UC_IDS = UnifiedConfig(unified_bytes=6000 * SPEC.kv_bytes_per_token,
                       kv_bytes_per_token=SPEC.kv_bytes_per_token,
                       state_bytes=SPEC.ssm_state_bytes, mamba_slots=5)
FAST = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def unified_cache(settings=None, uc=UC):
    cls = None if settings is None else functools.partial(
        MarconiUnifiedRadixCache, spec=SPEC, settings=settings)
    return build_unified_cache(PC, uc, cache_class=cls, tree_core="python")[0]


def replay_checked(cache, requests):
    guard_locked_evictions(cache)
    replayer = Replayer(cache, chunked_prefill_size=PC.chunked_prefill_size)
    hits = []
    for rr in requests:
        hits.append(replayer.run(rr).hit_len)
        check_idle(cache)  # bytes, KV tokens, slot ids, locks, victim queues
    return hits


def test_the_pool_is_sglangs_unified_buffer():
    cache = unified_cache(MarconiSettings(alpha=1.0))
    allocator = cache.token_to_kv_pool_allocator
    assert type(allocator).__name__ == "UnifiedMambaTokenToKVPoolAllocator"
    assert allocator.mamba_full_cache_donor() is allocator and cache.unified
    assert not allocator.lazy_compaction
    # KV alone may take the whole buffer: more tokens than the KV side SGLang labels
    assert allocator.size >= 1400 - 10 * 409 // 10  # scaled bytes, within a state's rounding


@FAST
@given(specs=request_specs())
def test_alpha_zero_makes_stocks_decisions(specs):
    """alpha 0 (LRU) takes SGLang's own evict_for_alloc: hit by hit, and what the trees
    hold, the same as stock UnifiedRadixCache on the same unified buffer."""
    from marconi_checks.invariants import tree_holdings

    requests = to_requests(specs)
    stock = unified_cache()
    stock_hits = replay_checked(stock, requests)
    marconi = unified_cache(MarconiSettings(alpha=0.0, max_states_per_request=-1))
    assert replay_checked(marconi, requests) == stock_hits
    a, b = tree_holdings(stock), tree_holdings(marconi)
    assert (a["kv"], a["states"]) == (b["kv"], b["states"])
    assert sum(marconi.marconi.stats.evicted[r] for r in ("unified_state", "unified_leaf")) == 0


@pytest.mark.parametrize("settings", [
    MarconiSettings(alpha=1.0, max_states_per_request=2),
    MarconiSettings(alpha=2.0, max_states_per_request=-1),
    MarconiSettings(alpha=1.0, max_states_per_request=-1, renormalise_limit=0),
    MarconiSettings(max_states_per_request=-1),
    MarconiSettings(max_states_per_request=-1, decay=True),
], ids=["a1-cap2", "a2", "a1-amortised", "marconi+", "decay"])
@pytest.mark.parametrize("uc", [UC, UC_IDS], ids=["bytes-bind", "ids-bind"])
@FAST
@given(specs=request_specs())
def test_invariants_hold_in_the_unified_pool(settings, uc, specs):
    """No leaked bytes, KV tokens or slot ids, evictable + protected = held, the victim
    queues consistent, and no locked data evicted, after every request (aborts too)."""
    replay_checked(unified_cache(settings, uc), to_requests(specs))


def two_chunk_requests():
    """Twelve requests over three shared bases, two prefill chunks each (350 tokens in
    three made every chunk state of a request compete with its running slots: the walk
    then took only leaves)."""
    return [ReplayRequest(f"r{i}", array("q", BASES[i % 3][:100] + [10**6 + 1000 * i + j
                                                                    for j in range(100)]),
                          [1, 2, 3]) for i in range(12)]


def test_kv_shortage_can_free_a_state_one_ranking():
    """Stock frees only KV leaves for a KV shortage; the joint ranking may take a state
    (it shares the bytes), and takes candidates of both kinds over a run."""
    cache = unified_cache(MarconiSettings(alpha=4.0, max_states_per_request=-1))
    calls = []
    original = cache._evict

    def spy(params, *args, **kwargs):
        calls.append((params.num_tokens, params.mamba_num, cache.joint_walk is not None))
        return original(params, *args, **kwargs)

    cache._evict = spy
    replay_checked(cache, two_chunk_requests())
    evicted = cache.marconi.stats.evicted
    assert evicted["unified_state"] > 0 and evicted["unified_leaf"] > 0
    assert any(joint for _, _, joint in calls)


@pytest.mark.parametrize("settings", [
    MarconiSettings(alpha=4.0, max_states_per_request=-1),
    MarconiSettings(max_states_per_request=-1),
    MarconiSettings(max_states_per_request=-1, decay=True),
], ids=["marconi", "marconi+", "decay"])
def test_the_joint_build_equals_a_fresh_computation(settings):
    """A joint walk's build reads values kept between walks (each state's FLOPs saved over
    its nearest checkpointed ancestor, that ancestor's depth) and the persistent queues'
    aging bases: after every request of a replay whose walks take leaves and states, a
    build holds the values and order a fresh computation gives (``check_joint_build``, run
    by ``check_idle``), and one kept value gone stale makes that check fail."""
    cache = unified_cache(settings)
    builds = []
    original = cache._evict

    def spy(params, *args, **kwargs):
        builds.append(cache.joint_walk is not None)
        return original(params, *args, **kwargs)

    cache._evict = spy
    replay_checked(cache, two_chunk_requests())
    assert any(builds), "no joint walk ran"
    rows = fresh_joint_rows(cache)
    leaves = cache.tree_core.evictable_device_leaves
    ranked = [node for node, _, efficiency, _ in rows if efficiency > 0]
    assert any(n in leaves for n in ranked) and any(n not in leaves for n in ranked), (
        "the case at hand: leaves and inner states with a state to rank")
    check_joint_build(cache)
    node = ranked[-1]
    setattr(node, SAVED, 1.5 * cached_flops_saved(SPEC, node))  # as if never forgotten
    with pytest.raises(AssertionError, match="joint walk"):
        check_joint_build(cache)


@pytest.mark.parametrize("policy", ["marconi", "marconi+"])
def test_the_plugin_accepts_unified_memory(policy):
    """``--cache-policy marconi|marconi+ --enable-unified-memory`` selects the Marconi
    backend (whose cache detects the unified allocator and ranks jointly)."""
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    load_plugins()
    args = prepare_server_args(["--model-path", "dummy", "--cache-policy", policy,
                                "--enable-unified-memory"])
    assert args.radix_cache_backend == "marconi" and args.enable_unified_memory
