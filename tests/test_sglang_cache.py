"""MarconiUnifiedRadixCache on real SGLang pools (CPU): SGLang's invariants under random
request sequences, aborts mid chunked prefill, and alpha = 0 equals stock LRU."""
import functools
import random
from array import array

import pytest

pytest.importorskip("sglang")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sglang_marconi.model import preset_spec  # noqa: E402
from sglang_marconi.sglang_integration.cache import MarconiUnifiedRadixCache  # noqa: E402
from marconi_checks.invariants import (  # noqa: E402
    check_idle,
    check_sizes,
    guard_locked_evictions,
)
from sglang_marconi.sglang_integration.options import MarconiSettings  # noqa: E402
from sglang_marconi.driver.pools import PoolConfig, build_cache  # noqa: E402
from sglang_marconi.driver.replay import Replayer, ReplayRequest  # noqa: E402

SPEC = preset_spec("paper-7b")
# extra_buffer (what SGLang picks for Qwen3-Next, Nemotron-H): page 16, chunk 128
PAGED = PoolConfig(kv_tokens=1024, mamba_slots=10, page_size=16, max_context_len=1024,
                   chunked_prefill_size=128, mamba_track_interval=64)
# no_buffer: page 1, the state at the end of every chunk and sequence
UNPAGED = PoolConfig(kv_tokens=600, mamba_slots=8, page_size=1, max_context_len=1024,
                     extra_buffer=False, chunked_prefill_size=100)
FAST = settings(max_examples=30, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def marconi_cache(pc, alpha=1.0, max_states=2, **extra):
    settings = MarconiSettings(alpha=alpha, max_states_per_request=max_states, **extra)
    cls = functools.partial(MarconiUnifiedRadixCache, spec=SPEC, settings=settings)
    return build_cache(pc, cache_class=cls, tree_core="python")[0]


BASES = [[1000 * b + i for i in range(400)] for b in range(3)]


@st.composite
def request_specs(draw, max_len=360):
    """(base, shared prefix length, fresh suffix length, output length, abort?)"""
    n = draw(st.integers(3, 10))
    return [(draw(st.integers(0, 2)), draw(st.integers(0, max_len)),
             draw(st.integers(1, 80)), draw(st.integers(1, 70)),
             draw(st.booleans()) and draw(st.booleans()))
            for _ in range(n)]


def to_requests(specs, seed=0, max_len=360):
    rng = random.Random(seed)
    out = []
    for i, (base, shared, fresh, output, abort) in enumerate(specs):
        ids = BASES[base][:shared] + [rng.randrange(10**6, 2 * 10**6) for _ in range(fresh)]
        ids = ids[:max_len]
        outs = [3 * 10**6 + 1000 * i + j for j in range(output)]
        out.append(ReplayRequest(f"r{i}", array("q", ids), outs,
                                 abort_after_chunks=1 if abort else None))
    return out


def replay_checked(cache, pc, requests):
    guard_locked_evictions(cache)
    replayer = Replayer(cache, chunked_prefill_size=pc.chunked_prefill_size)
    hits = []
    for rr in requests:
        hits.append(replayer.run(rr).hit_len)
        check_idle(cache)
    return hits


@pytest.mark.parametrize("pc", [PAGED, UNPAGED], ids=["extra_buffer", "no_buffer"])
@pytest.mark.parametrize("alpha,max_states,extra", [
    (1.0, 2, {}), (2.0, -1, {}), (1.0, -1, {"renormalise_limit": 0}),
    (None, -1, {}), (None, -1, {"decay": True}), (None, -1, {"ghost_branch": "beyond"})],
    ids=["a1-cap2", "a2", "a1-amortised", "marconi", "decay", "ghost-beyond"])
@FAST
@given(specs=request_specs())
def test_invariants_hold_for_random_sequences(pc, alpha, max_states, extra, specs):
    """SGLang's invariants and the victim queues' consistency (``check_idle``) after every
    request, aborts included."""
    cache = marconi_cache(pc, alpha, max_states, **extra)
    replay_checked(cache, pc, to_requests(specs))


def test_locked_node_is_never_evicted():
    """A node pinned by a lock keeps its KV and state while later requests evict around it."""
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

    pc = PAGED
    cache = marconi_cache(pc, alpha=2.0, max_states=-1)
    guard_locked_evictions(cache)
    replayer = Replayer(cache, chunked_prefill_size=pc.chunked_prefill_size)
    replayer.run(ReplayRequest("pin", array("q", BASES[2][:200]), [1, 2]))
    pinned_id = cache.match_prefix(_match_params(BASES[2][:200])).last_device_node
    pinned = cache.tree_core.node_by_id(pinned_id)
    assert pinned is not cache.tree_core.root_node
    lock = cache.lock(pinned_id)
    evicted_before = cache.marconi.stats.evicted.copy()
    for i in range(8):  # 8 x ~250 fresh tokens through a 1024-token pool
        ids = [7 * 10**6 + 1000 * i + j for j in range(240)]
        replayer.run(ReplayRequest(f"f{i}", array("q", ids), [1, 2, 3]))
        check_sizes(cache)
        assert pinned.component_data[ComponentType.FULL].value is not None
        assert pinned.component_data[ComponentType.MAMBA].value is not None
    assert sum(cache.marconi.stats.evicted.values()) > sum(evicted_before.values())
    cache.unlock(lock)
    check_idle(cache)


def _match_params(tokens):
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return MatchPrefixParams(key=RadixKey(array("q", tokens)))


@pytest.mark.parametrize("pc", [PAGED, UNPAGED], ids=["extra_buffer", "no_buffer"])
def test_abort_mid_chunked_prefill_releases_everything(pc):
    cache = marconi_cache(pc)
    replayer = Replayer(cache, chunked_prefill_size=pc.chunked_prefill_size)
    shared = BASES[0][:300]
    replayer.run(ReplayRequest("warm", array("q", shared + [7, 8, 9]), [1, 2, 3]))
    before = check_idle(cache)
    aborted = ReplayRequest("abort", array("q", shared + list(range(5000, 5090))), [1],
                            abort_after_chunks=2)
    outcome = replayer.run(aborted)
    assert outcome.aborted and outcome.hit_len > 0
    after = check_idle(cache)
    assert after["kv"] >= before["kv"] - 0  # nothing of the warm request was lost
    assert cache.marconi.stats.requests == 1  # the aborted request is not counted


def _holdings(cache):
    from marconi_checks.invariants import tree_holdings

    h = tree_holdings(cache)
    return h["kv"], h["states"]


@pytest.mark.parametrize("pc", [PAGED, UNPAGED], ids=["extra_buffer", "no_buffer"])
@FAST
@given(specs=request_specs())
def test_alpha_zero_is_stock_lru(pc, specs):
    """alpha 0 with SGLang's own admission (no cap) = stock UnifiedRadixCache, hit by hit."""
    requests = to_requests(specs)
    stock = build_cache(pc, tree_core="python")[0]
    stock_hits = replay_checked(stock, pc, requests)
    stock_hold = _holdings(stock)
    marconi = marconi_cache(pc, alpha=0.0, max_states=-1)
    marconi_hits = replay_checked(marconi, pc, requests)
    assert marconi_hits == stock_hits
    assert _holdings(marconi) == stock_hold


def test_admission_caps_states_per_request():
    pc = PAGED
    cache = marconi_cache(pc, alpha=0.0, max_states=2)
    replayer = Replayer(cache, chunked_prefill_size=pc.chunked_prefill_size)
    long_prompt = array("q", BASES[1][:380])  # 3 chunks of 128
    replayer.run(ReplayRequest("a", long_prompt, [1, 2]))
    s = cache.marconi.stats
    # no branch point: the final state plus one chunk state fit the cap of 2
    assert s.admitted["final"] == 1 and s.admitted["chunk"] == 1 and s.rejected == 1
    check_idle(cache)


def test_metrics_are_logged_and_exported(caplog):
    """--enable-metrics: sglang:marconi_* series; the log line every ``log_every`` requests."""
    prometheus_client = pytest.importorskip("prometheus_client")
    from sglang.srt.runtime_context import get_parallel

    settings = MarconiSettings(alpha=1.0)
    cls = functools.partial(MarconiUnifiedRadixCache, spec=SPEC, settings=settings)
    with get_parallel().override(tp_rank=0, pp_rank=0, attn_tp_rank=0, attn_dp_rank=0):
        cache = build_cache(PAGED, cls, tree_core="python",
                            params_override={"enable_metrics": True})[0]
    assert cache.marconi.exporter is not None
    cache.marconi.log_every = 2
    replayer = Replayer(cache, chunked_prefill_size=PAGED.chunked_prefill_size)
    with caplog.at_level("INFO", logger="sglang_marconi.cache"):
        for i in range(4):
            replayer.run(ReplayRequest(f"m{i}", array("q", BASES[0][:200] + [9 * 10**6 + i]),
                                       [1, 2]))
    assert any("Marconi cache: alpha=1" in r.getMessage() for r in caplog.records)
    text = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    labels = 'cache_type="MarconiUnifiedRadixCache"'
    for name in ("sglang:marconi_alpha{", "sglang:marconi_hit_tokens_total{",
                 "sglang:marconi_flops_saved_total{", "sglang:marconi_states_admitted_total{"):
        assert any(line.startswith(name) and labels in line for line in text.splitlines()), name
    hit = [line for line in text.splitlines()
           if line.startswith("sglang:marconi_hit_tokens_total{") and labels in line]
    assert float(hit[0].split()[-1]) >= cache.marconi.stats.hit_tokens > 0


# one prefill chunk, no decode snapshot, a one-token checkpoint grid: one state per request
ONE_STATE = PoolConfig(kv_tokens=4096, mamba_slots=5, page_size=1, max_context_len=1024,
                       chunked_prefill_size=1 << 20, mamba_track_interval=1 << 20,
                       mamba_cache_chunk_size=1)


@pytest.mark.parametrize("max_states,stock", [(2, False), (-1, False), (-1, True)])
def test_a_kv_only_leaf_is_not_a_branch_point(max_states, stock):
    """A chat session whose states were evicted leaves its KV behind (a KV-only leaf).
    SGLang reports a branch where the next turn's KV match ends, at that leaf's end, and
    the turn's one state goes there. With a state cap (Marconi admission) the turn extends
    the leaf, as speculative insertion sees it, and keeps its state at its own end; without
    a cap the cache keeps stock SGLang's placement."""
    pc = ONE_STATE
    cache = (build_cache(pc, tree_core="python")[0] if stock
             else marconi_cache(pc, alpha=0.0, max_states=max_states))
    replayer = Replayer(cache, chunked_prefill_size=pc.chunked_prefill_size)
    fresh = iter(range(10**6, 2 * 10**6))

    def take(n):
        return [next(fresh) for _ in range(n)]

    turn = take(20)
    hits = []
    for i in range(5):
        out = take(5)
        hits.append(replayer.run(ReplayRequest(f"s{i}", array("q", turn), out)).hit_len)
        if i == 1:  # three other requests: the pool (2 states besides a running request)
            for j in range(3):  # evicts the session's states, its KV stays
                replayer.run(ReplayRequest(f"o{j}", array("q", take(30)), [1, 2]))
        if i < 4:
            turn = turn + out + take(15)
        check_idle(cache)
    # turn 2 finds its session's states evicted and [0, 20) as KV only; it keeps its one
    # state at its end (60) with a cap, at 20 without, which is all turn 3 can then hit
    assert hits == ([0, 20, 0, 60, 80] if max_states > 0 else [0, 20, 0, 20, 80])
