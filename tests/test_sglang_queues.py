"""The SGLang cache's persistent victim queues and ``--cache-policy marconi+``.

- An eviction does not rescan the tree: the number of candidates scored while requests
  evict is the same for a small and a 6x larger tree (counted, not timed).
- The per-walk normalisation limit switches between the paper's rule and the amortised one.
- marconi+ in SGLang: the ghost index finds a branch point after the KV that showed it was
  evicted; end-of-request states are skipped on traffic that never extends them and kept
  on traffic that does; the queues stay consistent (``check_idle`` checks them).
"""
import functools
from array import array

import pytest

pytest.importorskip("sglang")

from sglang_marconi.model import preset_spec  # noqa: E402
from sglang_marconi.sglang_integration.cache import MarconiUnifiedRadixCache  # noqa: E402
from sglang_marconi.sglang_integration.components import FULL, MAMBA  # noqa: E402
from marconi_checks.invariants import check_idle  # noqa: E402
from sglang_marconi.sglang_integration.options import (  # noqa: E402
    MarconiSettings,
    add_cli_args,
    settings_from_namespace,
)
from sglang_marconi.driver.pools import PoolConfig, build_cache  # noqa: E402
from sglang_marconi.driver.replay import Replayer, ReplayRequest  # noqa: E402
from sglang_marconi.sim.generators import generate  # noqa: E402

SPEC = preset_spec("paper-7b")


def make_cache(pc, **settings):
    cls = functools.partial(MarconiUnifiedRadixCache, spec=SPEC,
                            settings=MarconiSettings(**settings))
    return build_cache(pc, cache_class=cls, tree_core="python")[0]


class Fresh:
    def __init__(self):
        self.next = 10**6

    def __call__(self, n):
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


# -- no rescan ------------------------------------------------------------------------------
def scored_per_request(n_seqs: int, pool: str) -> list:
    """Fill a cache with ``n_seqs`` distinct 32-token sequences (one node and one state
    each), with the state pool (``pool="state"``) or the token pool (``"kv"``) just full,
    then count the candidates scored during each of 8 further requests that evict."""
    seq, out = 32, 1
    per = seq + out
    if pool == "state":
        pc = PoolConfig(kv_tokens=(n_seqs + 40) * per, mamba_slots=n_seqs + 3, page_size=1,
                        max_context_len=256, extra_buffer=False, chunked_prefill_size=256)
    else:
        pc = PoolConfig(kv_tokens=n_seqs * seq + 8, mamba_slots=n_seqs + 40, page_size=1,
                        max_context_len=256, extra_buffer=False, chunked_prefill_size=256)
    cache = make_cache(pc, alpha=1.0, renormalise_limit=0)  # amortised from the start
    replayer = Replayer(cache, chunked_prefill_size=256)
    fresh = Fresh()
    for i in range(n_seqs + 4):  # a few more than fit: the pool is full
        replayer.run(ReplayRequest(f"fill{i}", array("q", fresh(seq)), fresh(out)))
    policy = cache.marconi
    counts = {"n": 0}
    for name in ("state_pool_efficiency", "kv_pool_efficiency"):
        original = getattr(policy, name)

        def counted(node, _orig=original):
            counts["n"] += 1
            return _orig(node)

        setattr(policy, name, counted)
    per_request = []
    for i in range(8):
        before = counts["n"]
        replayer.run(ReplayRequest(f"r{i}", array("q", fresh(seq)), fresh(out)))
        per_request.append(counts["n"] - before)
    stats = policy.stats
    assert sum(stats.evicted.values()) >= 8, stats.evicted  # every request evicted
    check_idle(cache)
    return per_request


@pytest.mark.parametrize("pool", ["state", "kv"])
def test_an_eviction_does_not_rescan_the_candidates(pool):
    small, large = scored_per_request(60, pool), scored_per_request(360, pool)
    assert max(large) <= 12, large  # a handful of re-keyed nodes, not the 360 candidates
    assert sum(large) <= sum(small) + 8, (small, large)


def test_renormalise_limit_picks_the_rule():
    pc = PoolConfig(kv_tokens=4000, mamba_slots=8, page_size=1, max_context_len=512,
                    extra_buffer=False, chunked_prefill_size=256)
    fresh = Fresh()
    requests = [ReplayRequest(f"r{i}", array("q", fresh(40)), fresh(2)) for i in range(20)]
    rebuilds = {}
    for limit in (-1, 0):
        cache = make_cache(pc, alpha=1.0, renormalise_limit=limit)
        replayer = Replayer(cache, chunked_prefill_size=256)
        walks = 0
        component = cache.components[MAMBA]
        # counts eviction walks by wrapping SGLang's walk-start hook
        # (``_evict_device_start``, which the MAMBA component overrides): no public counter
        start = component._evict_device_start

        def counting(cnt, _start=start):
            nonlocal walks
            walks += 1
            _start(cnt)

        component._evict_device_start = counting
        for rr in requests:
            replayer.run(rr)
        check_idle(cache)
        rebuilds[limit] = (component.queue.rebuilds, walks)
    per_walk, amortised = rebuilds[-1], rebuilds[0]
    assert per_walk[1] >= 10 and per_walk[0] >= per_walk[1]  # one refresh per walk at least
    assert amortised[0] < per_walk[0] / 2, rebuilds


def test_internal_settings_are_python_api_only():
    """renormalise_limit, ghost_factor, end_threshold and the ranking's ablation fields are
    internal defaults: fields of MarconiSettings (handed over to the scheduler), no
    launcher flag."""
    import argparse

    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--cache-policy", "marconi", "--marconi-renormalise-limit", "-1"])
    assert MarconiSettings().renormalise_limit == 1024
    s = MarconiSettings(renormalise_limit=7, ghost_factor=2.0, end_threshold=0.0)
    assert MarconiSettings.from_env(s.to_env()) == s
    with pytest.raises(ValueError, match="renormalise_limit: expected an integer >= -1"):
        MarconiSettings(renormalise_limit=-2)
    with pytest.raises(ValueError, match="end_threshold: expected a number in"):
        MarconiSettings(end_threshold=2.0)
    s = MarconiSettings(branch_bonus=0.0, chain_weight=0.5, ghost_branch="beyond", decay=True)
    assert MarconiSettings.from_env(s.to_env()) == s
    assert (MarconiSettings().ghost_branch, MarconiSettings().chain_weight) == ("fill", None)
    with pytest.raises(ValueError, match="ghost_branch: expected one of beyond, fill, off"):
        MarconiSettings(ghost_branch="deeper")
    with pytest.raises(ValueError, match="chain_weight: expected a number >= 0"):
        MarconiSettings(chain_weight=-1)


# -- the reuse-weighted ranking (the default) -------------------------------------------------
def test_marconi_flags():
    import argparse

    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    s = settings_from_namespace(parser.parse_args(["--cache-policy", "marconi"]))
    assert s.plus and s.alpha is None
    assert MarconiSettings.from_env(s.to_env()).plus
    s = settings_from_namespace(parser.parse_args(
        ["--cache-policy", "marconi+", "--marconi-max-states-per-request", "2"]))
    assert s.plus and s.max_states_per_request == 2
    s = settings_from_namespace(parser.parse_args(
        ["--cache-policy", "marconi", "--marconi-alpha", "1"]))
    assert not s.plus and s.alpha == 1.0


GHOST_POOLS = PoolConfig(kv_tokens=1024, mamba_slots=10, page_size=16, max_context_len=1024,
                         chunked_prefill_size=512, mamba_track_interval=64)


def ghost_scenario(plus: bool) -> list:
    """A = P + a; long fillers evict all of A; B = P + b; C = P + c. Only a cache that
    remembers A's tokens can tell that B branches from it at |P|."""
    cache = make_cache(GHOST_POOLS, **({} if plus else {"alpha": 0.0}))
    replayer = Replayer(cache, chunked_prefill_size=GHOST_POOLS.chunked_prefill_size)
    fresh = Fresh()
    prefix = list(range(1, 261))
    requests = [ReplayRequest("a", array("q", prefix + fresh(120)), fresh(4))]
    requests += [ReplayRequest(f"f{i}", array("q", fresh(500)), fresh(4)) for i in range(3)]
    requests += [ReplayRequest("b", array("q", prefix + fresh(60)), fresh(4)),
                 ReplayRequest("c", array("q", prefix + fresh(70)), fresh(4))]
    hits = [replayer.run(rr).hit_len for rr in requests]
    check_idle(cache)
    return hits, cache


def test_marconi_plus_finds_branch_points_past_evictions():
    hits, _ = ghost_scenario(plus=False)
    assert hits[-1] == 0  # A's KV is gone: SGLang sees no branch at |P| when B arrives
    hits, cache = ghost_scenario(plus=True)
    grid = cache.marconi.grid
    assert hits[-1] == 260 // grid * grid  # B snapshotted the ghost branch; C hits it
    assert hits[-2] == 0  # B itself had nothing to hit
    assert cache.marconi.stats.admitted["branch"] >= 1


def replay_trace(name: str, plus: bool, **params):
    trace = generate(name, seed=0, **params)
    pc = PoolConfig(kv_tokens=24000, mamba_slots=16, page_size=16, max_context_len=8192,
                    chunked_prefill_size=512, mamba_track_interval=64)
    cache = make_cache(pc, **({} if plus else {"alpha": 0.0}))
    replayer = Replayer(cache, chunked_prefill_size=pc.chunked_prefill_size)
    for i, r in enumerate(trace.requests[:120]):
        replayer.run(ReplayRequest(f"r{i}", array("q", r.input_tokens.tolist()),
                                   r.output_tokens.tolist()))
    check_idle(cache)
    return cache.marconi.stats


def test_marconi_plus_learns_whether_end_states_are_reused():
    # single-turn requests over shared prompts with questions longer than the checkpoint
    # grid: no later request reaches a request's (grid-floored) end
    single = replay_trace("shared-prompt", True, requests=120, prompt_min=400,
                          prompt_max=1500, question_median=300, output_median=20)
    assert single.end_states_skipped > 60, single.as_dict()
    # multi-turn chat: the next turn extends the previous turn's end
    chat = replay_trace("chat", True, sessions=12, session_rate=0.05)
    assert chat.end_states_skipped == 0, chat.as_dict()
    assert chat.admitted["final"] > 20
    assert "reuse-weighted" in chat.summary_line()


def test_marconi_plus_keeps_the_queues_consistent():
    """GDSF queues in both pools under a mix of chat and shared prompts (check_idle checks
    every queue entry against a fresh computation after each request)."""
    stats = replay_trace("chat", True, sessions=20, session_rate=0.5)
    assert stats.requests > 50 and sum(stats.evicted.values()) > 0, stats.as_dict()


def test_marconi_plus_counts_one_hit_per_request():
    """SGLang re-matches a waiting request every scheduling round; only the request that
    finishes counts as a hit on the state it consumed (once), and both victim queues hold
    the new weight afterwards (check_idle compares them with a fresh computation)."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.common import match_kv_cache
    from sglang.srt.sampling.sampling_params import SamplingParams

    pc = PoolConfig(kv_tokens=4000, mamba_slots=16, page_size=16, max_context_len=1024,
                    chunked_prefill_size=256, mamba_track_interval=64)
    cache = make_cache(pc)
    replayer = Replayer(cache, chunked_prefill_size=256)
    prompt = list(range(1, 300))
    replayer.run(ReplayRequest("a", array("q", prompt), [5000, 5001]))
    waiting = Req(rid="w", origin_input_text="", origin_input_ids=array("q", prompt + [7] * 20),
                  sampling_params=SamplingParams(max_new_tokens=2))
    for _ in range(5):  # queued: matched every round, never run
        result = match_kv_cache(waiting, cache)
    assert result.device_prefix_len > 0
    node = cache.tree_core.node_by_id(result.best_match_node)
    assert getattr(node, "hit_score", 0.0) == 0.0
    replayer.run(ReplayRequest("b", array("q", prompt + [8] * 20), [5002, 5003]))
    assert node.hit_score == 1.0
    check_idle(cache)
