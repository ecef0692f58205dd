"""harness/timing.py: the collector's pauses are measured and kept out of a cache's time."""
import gc
import time

from sglang_marconi.harness.timing import CallTimer, GCPauses


class _Cache:
    def match_prefix(self, n):
        junk = []
        for _ in range(n):  # reference cycles: only the collector frees them
            a, b = [], []
            a.append(b)
            b.append(a)
            junk.append(a)
        del junk
        time.sleep(0.01)
        gc.collect()
        return n


def test_a_collection_inside_a_call_is_reported_apart():
    cache = _Cache()
    with GCPauses() as pauses:
        assert gc.get_freeze_count() > 0  # what was alive before the run is frozen
        calls = CallTimer(cache, pauses)
        t0 = time.perf_counter()
        cache.match_prefix(200_000)
        wall = time.perf_counter() - t0
    assert gc.get_freeze_count() == 0
    assert pauses.count >= 1 and pauses.total > 0 and pauses.max <= pauses.total
    own = calls.seconds[0]
    assert own >= 0.009                           # the call's own work stays
    assert abs(own - (wall - pauses.total)) < 0.005  # the pause does not
    d = pauses.as_dict()
    assert d["gc_collections"] == pauses.count and d["gc_pause_s_max"] == pauses.max


def test_without_pauses_the_call_keeps_the_collection():
    cache = _Cache()
    calls = CallTimer(cache)
    t0 = time.perf_counter()
    cache.match_prefix(200_000)
    wall = time.perf_counter() - t0
    assert abs(calls.seconds[0] - wall) < 0.005
