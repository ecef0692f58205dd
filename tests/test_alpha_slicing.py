"""alpha = auto off the hot path: the tuner replays the window in slices of a fixed token
budget, one slice per finished request, and picks the alpha a one-shot tuning picks, at a
request index that depends only on the request stream; a failing replay is an error and a
metric, never another tuner."""
import functools
import logging

import pytest

from sglang_marconi.policy.alpha import AlphaTuner

pytest.importorskip("sglang")

from sglang_marconi.driver.pools import PoolConfig, build_cache  # noqa: E402
from sglang_marconi.driver.replay import Replayer, ReplayRequest  # noqa: E402
from sglang_marconi.model import preset_spec  # noqa: E402
from sglang_marconi.sglang_integration.cache import MarconiUnifiedRadixCache  # noqa: E402
from sglang_marconi.sglang_integration.options import MarconiSettings  # noqa: E402

SPEC = preset_spec("paper-7b")
PC = PoolConfig(kv_tokens=1024, mamba_slots=10, page_size=16, max_context_len=1024,
                chunked_prefill_size=128, mamba_track_interval=64)


def fake_steps(costs):
    """steps(window, alpha): one (saved, cost) per request; saved favours alpha 1."""
    def steps(window, alpha):
        for i, _ in enumerate(window):
            yield (10.0 - abs(alpha - 1.0)) * (i + 1), costs[i]
    return steps


def test_sliced_tuning_picks_the_one_shot_alpha_and_bounds_each_slice():
    costs = [5, 40, 7, 7, 100, 3]
    steps = fake_steps(costs)
    one_shot = AlphaTuner(lambda w, a: sum(s for s, _ in steps(w, a)), grid=(0.0, 1.0, 2.0),
                          multiplier=1)
    sliced = AlphaTuner(None, grid=(0.0, 1.0, 2.0), multiplier=1, steps=steps, slice_cost=20)
    replayed = []
    sliced.steps = lambda w, a: ((replayed.append(c) or (s, c)) for s, c in steps(w, a))
    for t in (one_shot, sliced):
        t.observe_eviction()  # first eviction before any request: window of 1... grow it
        t.first_eviction_at = len(costs)
    results = []
    for i in range(len(costs)):
        one_shot.observe_request(i)
        results.append(sliced.observe_request(i))
    assert one_shot.tuned and one_shot.alpha == 1.0
    assert results[-1] is None and not sliced.tuned and sliced.tuning
    n = len(costs)
    while not sliced.tuned:
        before = len(replayed)
        results.append(sliced.observe_request(n))
        n += 1
        chunk = replayed[before:]
        # a slice stops once it reached the budget: all but its last request fit below it
        assert sum(chunk[:-1]) < 20 if chunk else True
    assert results[-1] == 1.0 and sliced.scores == one_shot.scores
    assert sliced.tuned_at == n and sliced.slices == n - len(costs) + 1
    assert sliced.window == [] and sliced.observe_request(0) is None


def test_slice_count_depends_only_on_the_costs():
    def run():
        t = AlphaTuner(None, grid=(0.0, 0.5), multiplier=1, steps=fake_steps([3, 9, 30, 1]),
                       slice_cost=10)
        t.first_eviction_at = 4
        i = 0
        while not t.tuned:
            t.observe_request(i)
            i += 1
        return t.tuned_at, t.slices, t.alpha
    # slices: [3, 9] [30] [1 | 3, 9] [30] [1]: tuned with the 5th slice, request 8
    assert run() == run() == (8, 5, 0.5)


def requests(n, seed=0):
    from tp_rank_probe import stream

    return stream(n, seed)


def auto_cache(slice_tokens, multiplier=2.0):
    cls = type("Sliced", (MarconiUnifiedRadixCache,), {})
    settings = MarconiSettings(alpha="auto", bootstrap_multiplier=multiplier)
    cache = build_cache(PC, cache_class=functools.partial(cls, spec=SPEC, settings=settings),
                        tree_core="python")[0]
    cache.marconi.tuner.slice_cost = slice_tokens
    return cache


def run_until_tuned(cache, reqs):
    replayer = Replayer(cache, chunked_prefill_size=PC.chunked_prefill_size)
    for rr in reqs:
        replayer.run(rr)
    return cache.marconi


def test_sglang_auto_tunes_in_slices_to_the_one_shot_alpha():
    reqs = requests(120)
    one = run_until_tuned(auto_cache(slice_tokens=1 << 40), reqs)
    sliced = run_until_tuned(auto_cache(slice_tokens=400), reqs)
    assert one.tuner.tuned and sliced.tuner.tuned
    assert one.tuner.slices == 1 and sliced.tuner.slices > 5
    assert sliced.tuner.scores == one.tuner.scores and sliced.alpha == one.alpha
    assert sliced.stats.tuned_at == one.stats.tuned_at + sliced.tuner.slices - 1
    again = run_until_tuned(auto_cache(slice_tokens=400), reqs)
    assert (again.stats.tuned_at, again.alpha) == (sliced.stats.tuned_at, sliced.alpha)


def test_a_failing_replay_is_an_error_and_a_metric(caplog):
    cache = auto_cache(slice_tokens=400)
    policy = cache.marconi

    def broken(window, alpha):
        raise RuntimeError("shadow pools unavailable")
        yield  # a generator, as ShadowReplay.steps

    policy.tuner.steps = broken
    with caplog.at_level(logging.ERROR, logger="sglang_marconi.cache"):
        run_until_tuned(cache, requests(60))
    assert policy.stats.tuner_failures == 1
    assert policy.alpha == 0.0 and policy.tuner.tuned  # left where it was; no other tuner
    assert policy.stats.as_dict()["tuner_failures"] == 1
    assert any("alpha tuning failed" in r.getMessage() and r.levelno == logging.ERROR
               for r in caplog.records)
