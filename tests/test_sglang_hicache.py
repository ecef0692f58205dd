"""SGLang's HiCache (--enable-hierarchical-cache) on CPU, stock and Marconi, every write
policy: the stand-in copies, the invariants of both tiers after every request (slots, host
slots, locks, KV contents on each tier), marconi at alpha 0 behaving exactly like stock,
the write_back state backup, marconi+'s end states under write_through_selective, and a
hypothesis state machine with aborts, load-backs and explicit evictions on both tiers."""
import functools
import os
import random
from array import array

import pytest

pytest.importorskip("sglang")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (  # noqa: E402
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from sglang_marconi.driver import host_tier  # noqa: E402
from sglang_marconi.driver.pools import PoolConfig, build_cache  # noqa: E402
from sglang_marconi.driver.replay import Replayer, ReplayRequest  # noqa: E402
from marconi_checks.host_invariants import (  # noqa: E402
    TokenKV,
    check_host_idle,
    host_pools,
    kv_stamp,
    storage_files,
)
from marconi_checks.invariants import (  # noqa: E402
    check_idle,
    guard_locked_evictions,
    walk,
)
from sglang_marconi.model import preset_spec  # noqa: E402
from sglang_marconi.sglang_integration.cache import MarconiUnifiedRadixCache  # noqa: E402
from sglang_marconi.sglang_integration.options import MarconiSettings  # noqa: E402

POLICIES = ("write_through", "write_through_selective", "write_back")
SPEC = preset_spec("paper-7b")
CACHES = {  # name -> cache class (None: stock UnifiedRadixCache)
    "stock": None,
    "marconi-a0": MarconiSettings(alpha=0.0, max_states_per_request=-1),
    "marconi": MarconiSettings(alpha=1.0, max_states_per_request=-1),
    "marconi+": MarconiSettings(max_states_per_request=-1),
    # SGLang's host LRU under marconi+ (--marconi-host-rule lru)
    "marconi+-host-lru": MarconiSettings(max_states_per_request=-1,
                                         host_rule="lru"),
}
BASES = [[1000 * b + i for i in range(300)] for b in range(4)]


def pool_config(policy, ratio=1.5, **extra):
    sizes = dict(kv_tokens=512, mamba_slots=8, page_size=16, max_context_len=1024,
                 chunked_prefill_size=128, mamba_track_interval=64)
    return PoolConfig(**{**sizes, **extra}, hicache_write_policy=policy, hicache_ratio=ratio)


def build(policy, kind, **extra):
    s = CACHES[kind]
    cls = None if s is None else functools.partial(MarconiUnifiedRadixCache, spec=SPEC,
                                                   settings=s)
    cache = build_cache(pool_config(policy, **extra), cache_class=cls, tree_core="python")[0]
    guard_locked_evictions(cache)
    replayer = Replayer(cache, chunked_prefill_size=128)
    replayer.on_kv = TokenKV(cache)
    return cache, replayer


def request(i, base, shared, fresh, output, abort, rng):
    ids = BASES[base][:shared] + [rng.randrange(10**6, 2 * 10**6) for _ in range(fresh)]
    outs = [5 * 10**6 + 100 * i + j for j in range(output)]
    return ReplayRequest(f"r{i}", array("q", ids), outs,
                         abort_after_chunks=1 if abort else None)


def random_requests(n, seed, output=None):
    """Requests on four shared bases; ``output``: every request's output length (else
    random)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        base, shared = rng.randrange(4), rng.randrange(300)
        ids = BASES[base][:shared] + [rng.randrange(10**6, 2 * 10**6)
                                      for _ in range(rng.randrange(1, 60))]
        n_out = output or rng.randrange(1, 25)
        out.append(ReplayRequest(f"r{i}", array("q", ids),
                                 [5 * 10**6 + 100 * i + j for j in range(n_out)],
                                 abort_after_chunks=1 if rng.random() < 0.15 else None))
    return out


def fingerprint(cache):
    """What each tier holds, node by node (token path, KV and state on device / host)."""
    out = []
    for node in walk(cache):
        path, cur = [], node
        while cur.parent is not None:
            path[:0] = list(cur.key.token_ids)
            cur = cur.parent
        full, mamba = node.component_data[0], node.component_data[2]
        out.append((tuple(path), full.value is not None, full.host_value is not None,
                    mamba.value is not None, mamba.host_value is not None))
    return sorted(out)


def test_cpu_stand_ins_copy_exact_rows():
    """The KV and Mamba host pools' D->H and H->D copies (torch stand-ins) move exactly
    the named rows, every layer, and nothing else."""
    import torch

    cache, replayer = build("write_through", "stock")
    kv, mamba = host_pools(cache)
    assert type(kv).__name__ == "MHATokenToKVPoolHost" and type(mamba).__name__ == "MambaPoolHost"
    dev, host = torch.tensor([5, 9, 17]), torch.tensor([2, 30, 31])
    for layer, k in enumerate(kv.device_k_buffers):
        k[dev] = torch.tensor([1.0, 2.0, 3.0]).to(k.dtype).view(-1, 1, 1)
    temporal = mamba.buffer_info.temporal
    s_dev, s_host, s_back = torch.tensor([1, 5]), torch.tensor([3, 7]), torch.tensor([2, 6])
    temporal[:, s_dev] = 4.0
    kv.backup_from_device_all_layer(None, host, dev, "kernel")
    mamba.backup_from_device_all_layer(None, s_host, s_dev, "kernel")
    assert kv.k_data_refs[0][host].reshape(-1).tolist() == [1.0, 2.0, 3.0]
    assert kv.k_data_refs[0][torch.tensor([0, 1, 3])].abs().sum() == 0
    assert (mamba.temporal_buffer[s_host] == 4.0).all()
    assert mamba.temporal_buffer[torch.tensor([0, 4])].abs().sum() == 0
    back = torch.tensor([40, 41, 42])
    for layer in range(kv.layer_num):
        kv.load_to_device_per_layer(None, host, back, layer, "kernel")
    for layer in range(temporal.shape[0]):
        mamba.load_to_device_per_layer(None, s_host, s_back, layer, "kernel")
    assert kv.device_k_buffers[0][back].reshape(-1).tolist() == [1.0, 2.0, 3.0]
    assert (temporal[:, s_back] == 4.0).all() and (temporal[:, torch.tensor([0, 3])] != 4.0).all()


@pytest.mark.parametrize("policy", POLICIES)
def test_marconi_at_alpha_zero_keeps_stock_host_tier(policy):
    """Same requests (aborts included) through stock HiCache and Marconi at alpha 0 (its
    order is stock LRU): the same device and host hits per request, the same tree on both
    tiers after every request, every invariant of both tiers holding."""
    stock, stock_replay = build(policy, "stock")
    marconi, marconi_replay = build(policy, "marconi-a0")
    host_hits = 0
    for rr in random_requests(30, seed=1):
        a, b = stock_replay.run(rr), marconi_replay.run(rr)
        assert (a.hit_len, a.host_hit_len) == (b.hit_len, b.host_hit_len), rr.rid
        for cache in (stock, marconi):
            check_idle(cache)
            check_host_idle(cache)
        assert fingerprint(stock) == fingerprint(marconi), rr.rid
        host_hits += a.host_hit_len
    assert host_hits > 0  # load-backs happened
    assert marconi.marconi.stats.loaded_back > 0


@pytest.mark.parametrize("kind", ["marconi", "marconi+"])
def test_write_back_backs_up_internal_states_before_dropping_them(kind, monkeypatch):
    """Under write_back the MAMBA walk returns SGLang's ``InternalStateBackup`` for an
    internal state with no host copy, as stock does: the state reaches the host tier."""
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

    finished = []
    original = UnifiedTreeCore.finish_mamba_state_eviction

    def spy(self, node_id):
        node = self.node_by_id(node_id)
        finished.append(node.component_data[2].host_value is not None)
        return original(self, node_id)

    monkeypatch.setattr(UnifiedTreeCore, "finish_mamba_state_eviction", spy)
    cache, replayer = build("write_back", kind)
    for rr in random_requests(60, seed=0, output=20):
        replayer.run(rr)
        check_idle(cache)
        check_host_idle(cache)
    assert finished and all(finished), finished  # each backed up before the tombstone


@pytest.mark.parametrize("kind", ["marconi", "marconi+"])
def test_a_victim_sglang_keeps_stays_a_candidate(kind):
    """SGLang may decline to evict the victim a walk hands it (write_back: the backup
    failed and the subtree could not be dropped; a state backup whose victim changed):
    after the walk it is a candidate again."""
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

    cache, replayer = build("write_back", kind)
    for rr in random_requests(12, seed=2, output=20):
        replayer.run(rr)
    tree = cache.tree_core
    for ct in (ComponentType.FULL, ComponentType.MAMBA):
        queue = cache.components[ct].queue
        tree.evict_device_start(ct, 10**6)
        victim = None
        while victim is None:  # the walk may drop inner states itself first
            step = tree.evict_device_next_node(ct, {c: 0 for c in cache.tree_components})
            cache._apply_eviction_result(step)
            victim = step.node_id if step.node_id is not None else step.mamba_backup_node_id
        tree.evict_device_end(ct)  # declined: nothing evicted, the pending backup dropped
        victim = tree.node_by_id(victim)
        assert victim in queue, ct.name
        check_idle(cache)  # and ranked by the inputs a fresh computation gives
        check_host_idle(cache)


def test_token_kv_stamps_are_what_the_tiers_are_checked_against():
    cache, replayer = build("write_through", "stock")
    rr = ReplayRequest("one", array("q", BASES[0][:100]), [1, 2])
    replayer.run(rr)
    kv, _ = host_pools(cache)
    (node,) = [n for n in walk(cache)]
    want = kv_stamp(__import__("torch").tensor(list(node.key.token_ids)),
                    __import__("torch").arange(len(node.key)))
    assert kv.device_k_buffers[0][node.component_data[0].value.long()].reshape(-1).float(
    ).tolist() == want.float().tolist()
    assert check_host_idle(cache)["compared"] == 2  # the device and the host copy


@pytest.mark.parametrize("kind", ["stock", "marconi", "marconi+-host-lru"])
def test_l3_file_store_round_trip(kind, tmp_path):
    """The L3 ``file`` backend in a temporary directory: host pages are written through
    to it, pages evicted from the host pool are prefetched back (SGLang's
    wait_complete policy) and loaded to the device; both tiers' invariants hold after
    every request (the backups' host locks released), every stored page is whole.
    marconi (alpha 1) ranks its host victims by the two-tier rule; marconi+ runs with
    SGLang's host LRU here because its own ranking keeps every page this traffic reuses
    on the host tier (nothing to fetch: test_two_tier_rule_keeps_host_hits)."""
    try:
        cache, replayer = build("write_through", kind, hicache_storage_dir=str(tmp_path))
    except RuntimeError as exc:  # SGLang compiles its page-hash extension (g++, libcrypto)
        pytest.skip(f"SGLang's L3 page hash did not build here: {exc}")
    try:
        fetched = 0
        for rr in random_requests(60, seed=0, output=20):
            fetched += replayer.run(rr).storage_hit_len
            host_tier.settle(cache)
            check_idle(cache)
            check_host_idle(cache)
        assert fetched > 0
        assert len(storage_files(tmp_path)) > 0
    finally:
        cache.cache_controller._stop_storage_threads()


@pytest.mark.skipif(not os.environ.get("MARCONI_HICACHE_SOAK"),
                    reason="long run: MARCONI_HICACHE_SOAK=1 (10^4 operations per cache)")
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("kind", ["stock", "marconi", "marconi+"])
def test_soak_no_leaks_over_ten_thousand_operations(policy, kind):
    """10^4 random operations (requests with aborts, device and host evictions) on a
    small host pool: no slot, host slot or lock leaked, checked every 100 operations."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

    cache, replayer = build(policy, kind, ratio=0.5)
    rng = random.Random(7)
    for op in range(10_000):
        roll = rng.random()
        if roll < 0.8:
            replayer.run(request(op, rng.randrange(4), rng.randrange(300),
                                 rng.randrange(1, 60), rng.randrange(1, 25),
                                 rng.random() < 0.15, rng))
        elif roll < 0.9:
            cache.evict(EvictParams(num_tokens=rng.randrange(1, 512),
                                    mamba_num=rng.randrange(0, 8)))
            cache.check_hicache_events()
        else:
            cache.evict_host(rng.randrange(1, 256),
                             rng.choice([ComponentType.FULL, ComponentType.MAMBA]))
        if op % 100 == 99:
            check_idle(cache)
            check_host_idle(cache)


class HostTierMachine(RuleBasedStateMachine):
    """Random requests (aborts mid prefill), explicit device and host evictions; after
    every step both tiers' invariants hold and nothing leaks."""

    @initialize(policy=st.sampled_from(POLICIES), kind=st.sampled_from(sorted(CACHES)),
                ratio=st.sampled_from([0.25, 1.5]))
    def setup(self, policy, kind, ratio):
        # a host pool a quarter of the device's: write_back backups fail under host
        # pressure and SGLang keeps (or drops) the victims its walk was given
        self.cache, self.replayer = build(policy, kind, ratio=ratio)
        self.rng = random.Random(0)
        self.i = 0

    @rule(base=st.integers(0, 3), shared=st.integers(0, 300), fresh=st.integers(1, 60),
          output=st.integers(1, 25), abort=st.booleans())
    def run_request(self, base, shared, fresh, output, abort):
        self.replayer.run(request(self.i, base, shared, fresh, output, abort, self.rng))
        self.i += 1

    @rule(tokens=st.integers(1, 512), states=st.integers(0, 8))
    def evict_device(self, tokens, states):
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        self.cache.evict(EvictParams(num_tokens=tokens, mamba_num=states))
        self.cache.check_hicache_events()

    @rule(tokens=st.integers(1, 768), states=st.booleans())
    def evict_host(self, tokens, states):
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

        self.cache.evict_host(tokens, ComponentType.MAMBA if states else ComponentType.FULL)

    @invariant()
    def tiers_consistent(self):
        if hasattr(self, "cache"):
            check_idle(self.cache)
            check_host_idle(self.cache)


TestHostTierMachine = HostTierMachine.TestCase
TestHostTierMachine.settings = settings(
    max_examples=40, stateful_step_count=15, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective"])
def test_two_tier_rule_keeps_host_hits(policy):
    """marconi+ ranks the host tier's victims by the two-tier rule (policy/host_tier.py),
    and on the device a node the host holds too by the load its demotion costs: on a small
    host pool under pressure (write_through) it chooses its host victims itself (counted), both tiers'
    invariants hold after every request (the device keys included), and it serves more
    prefix tokens (device + host hits) than marconi+ with SGLang's host LRU and the
    device's plain keys on the same traffic."""
    served = {}
    for kind in ("marconi+", "marconi+-host-lru"):
        cache, replayer = build(policy, kind)
        served[kind] = 0
        for rr in random_requests(60, seed=0, output=20):
            out = replayer.run(rr)
            served[kind] += out.hit_len + out.host_hit_len
            check_idle(cache)
            check_host_idle(cache)
        ranked = cache.marconi.stats.host_evicted
        if kind == "marconi+" and policy == "write_through":  # selective: the host never fills
            assert ranked["full"] > 0
        else:
            assert sum(ranked.values()) == 0
    assert served["marconi+"] > served["marconi+-host-lru"], served


@pytest.mark.parametrize("policy,kind", [
    ("write_through_selective", k) for k in ("stock", "marconi+", "marconi+-host-lru")] + [
    (p, "marconi+") for p in ("write_through", "write_back")])
def test_selective_backup_counts_the_tail_marconi_plus_would_not_keep(policy, kind):
    """Under write_through_selective SGLang backs a node up on its second insert. marconi+
    learns that end states are never reused here (``end_threshold`` 1: refused) and, with
    no end state, SGLang inserts nothing of a request's tail; the two-tier rule admits them
    anyway under that policy (``host_tier.tail_counts_toward_backup``). Request 0 ends at
    256 tokens; requests 1-3 share its first 200 and branch at 192, the device tier emptied
    before requests 2 and 3. With the tail inserted, request 1's insert (a split at 192) is
    the segment's second and backs it up, request 2 re-inserts the state, which follows it
    to host, and request 3 hits 192 tokens from host, as stock does. Without it, each
    insert of the segment is its first and the device drops it: no host hit. Under the
    other policies the rule is off: marconi+ still refuses the end states."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    settings = {"marconi+": MarconiSettings(end_threshold=1.0),
                "marconi+-host-lru": MarconiSettings(end_threshold=1.0,
                                                     host_rule="lru")}.get(kind)
    cls = None if settings is None else functools.partial(
        MarconiUnifiedRadixCache, spec=SPEC, settings=settings)
    cache = build_cache(pool_config(policy, chunked_prefill_size=512, kv_tokens=1024),
                        cache_class=cls, tree_core="python")[0]
    replayer = Replayer(cache, chunked_prefill_size=512)
    replayer.on_kv = TokenKV(cache)
    base = BASES[0]
    prompts = [base[:256]] + [base[:200] + [2000 + 100 * k + j for j in range(60)]
                              for k in range(3)]
    served = []
    for i, ids in enumerate(prompts):
        if i >= 2:
            cache.evict(EvictParams(num_tokens=10**6, mamba_num=10**6))
            cache.check_hicache_events()
        out = replayer.run(ReplayRequest(f"r{i}", array("q", ids),
                                         [9000 + 100 * i + j for j in range(8)]))
        served.append((out.hit_len, out.host_hit_len))
        check_idle(cache)
        check_host_idle(cache)
    rule_on = kind == "marconi+" and policy == "write_through_selective"
    if kind != "stock":
        assert (cache.marconi.stats.end_states_skipped == 0) is rule_on
    if policy == "write_through_selective":
        assert served[3] == ((0, 192) if kind == "stock" or rule_on else (0, 0)), served
    else:  # backed up at the first insert or at eviction: every cache hits from host
        assert served[3] == (0, 192), served
