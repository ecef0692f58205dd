"""serve-sim's ``CacheTimer`` (``serving/clock.py``) charges the cache's own calls to the
step: the scheduler's calls and the eviction SGLang's allocators run through the cache
(``evict_for_alloc``), nested calls once. A fake clock makes it exact."""
from __future__ import annotations

from sglang_marconi.serving.clock import ENTRY_POINTS, CacheTimer


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeCache:
    """Each call advances the fake clock by its own cost."""

    def __init__(self, clock: FakeClock):
        self.clock = clock

    def evict_for_alloc(self, params=None):
        self.clock.now += 0.004
        return "evicted"

    def match_prefix(self, key=None):
        self.clock.now += 0.001
        self.evict_for_alloc()  # a copy-on-write slot: the walk runs inside the match
        return "matched"

    def helper_not_an_entry_point(self):
        self.clock.now += 1.0


def timed_cache():
    clock = FakeClock()
    cache = FakeCache(clock)
    timer = CacheTimer(cache)
    timer.clock = clock
    return cache, timer


def test_allocator_evictions_are_charged():
    assert "evict_for_alloc" in ENTRY_POINTS
    cache, timer = timed_cache()
    assert cache.evict_for_alloc(object()) == "evicted"   # as an allocator calls it
    assert abs(timer.take() - 0.004) < 1e-12
    assert timer.take() == 0.0


def test_nested_calls_are_counted_once_and_other_methods_not_at_all():
    cache, timer = timed_cache()
    assert cache.match_prefix() == "matched"
    assert abs(timer.take() - 0.005) < 1e-12
    cache.helper_not_an_entry_point()
    assert timer.take() == 0.0
