"""Tensor-parallel ranks must take identical cache decisions: each rank runs its own
scheduler and cache, and a rank that hits, admits or evicts differently
builds a different batch and the collectives hang. Two independent caches per policy are
driven with the same request stream while timing is perturbed (threads with random
sleeps and garbage collections between requests, shuffled construction order, allocation
noise that moves object addresses; ``test_tp_hashseed`` adds two processes under
different ``PYTHONHASHSEED`` values); the decisions after every request (hit, alpha,
the paths holding a state, the KV the tree holds) must be identical. Covers lru (stock),
marconi with the paper's ranking (a fixed alpha) and marconi's reuse-weighted ranking."""
import gc
import random
import threading
import time

import pytest

pytest.importorskip("sglang")

from sglang.srt.mem_cache.unified_cache.components import base as clock  # noqa: E402
from tp_rank_probe import POLICIES, decisions, make, stream  # noqa: E402

TURN = threading.Lock()  # SGLang's access-time counter is process-global: one rank at a time


class Rank:
    """A cache with its own copy of SGLang's process-global access-time counter, as in a
    rank's own process (swapped in around each of its calls, ``TURN`` held)."""

    def __init__(self, policy):
        with TURN:
            saved, clock._LAST_ACCESS_TIME_COUNTER_FLOAT = (
                clock._LAST_ACCESS_TIME_COUNTER_FLOAT, clock.float64(1.0))
            self.cache, self.replayer = make(policy)
            self.clock = clock._LAST_ACCESS_TIME_COUNTER_FLOAT
            clock._LAST_ACCESS_TIME_COUNTER_FLOAT = saved
        self.trace = []

    def run(self, requests, seed):
        """The rank's scheduler thread: requests in order, timing perturbed."""
        rng = random.Random(seed)
        for rr in requests:
            time.sleep(rng.random() * 0.002)
            if rng.random() < 0.1:
                gc.collect()
            junk = [object() for _ in range(rng.randrange(200))]  # move object addresses
            with TURN:
                saved, clock._LAST_ACCESS_TIME_COUNTER_FLOAT = (
                    clock._LAST_ACCESS_TIME_COUNTER_FLOAT, self.clock)
                self.trace.append(decisions(self.cache, self.replayer.run(rr)))
                self.clock = clock._LAST_ACCESS_TIME_COUNTER_FLOAT
                clock._LAST_ACCESS_TIME_COUNTER_FLOAT = saved
            del junk


@pytest.mark.parametrize("policy", list(POLICIES))
def test_two_ranks_take_the_same_decisions_under_perturbed_timing(policy):
    requests = stream()
    order = [0, 1]
    random.Random(policy).shuffle(order)
    ranks = {}
    for r in order:  # shuffled construction order, allocation noise in between
        noise = [object() for _ in range(1000 * (r + 1))]
        ranks[r] = Rank(policy)
        del noise
    threads = [threading.Thread(target=ranks[r].run, args=(requests, 100 + r)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    traces = {r: ranks[r].trace for r in (0, 1)}
    assert len(traces[0]) == len(traces[1]) == len(requests)
    for i, (a, b) in enumerate(zip(traces[0], traces[1])):
        assert a == b, f"{policy}: ranks diverge at request {i}"
    hits = sum(step[0] for step in traces[0])
    assert hits > 0  # the stream exercises the cache (hits, and evictions: pool of 1,024)
