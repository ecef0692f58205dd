"""The cache's own CPU time per scheduler step for the virtual clock: ``CacheTimer`` wraps the
cache's entry points (nested calls once, GC pauses apart); ``enabled=False`` is deterministic."""
from __future__ import annotations

import functools
import time

from sglang_marconi.harness.timing import GCPauses

ENTRY_POINTS = ("match_prefix", "checkpoint", "evict", "insert", "inc_lock_ref",
                "dec_lock_ref", "lock", "unlock", "free_kv_row", "on_release",
                # the eviction SGLang's own allocators run through the cache
                "evict_for_alloc",
                # the scheduler's HiCache calls (called only with a host tier)
                "init_load_back", "ready_to_load_host_cache", "check_hicache_events",
                "prefetch_from_storage", "check_prefetch_progress")


class CacheTimer:
    def __init__(self, cache, enabled: bool = True, gc_pauses: GCPauses | None = None,
                 cpu: bool = False):
        self.enabled = enabled
        self.clock = time.thread_time if cpu else time.perf_counter
        self.gc = gc_pauses
        self._depth = 0
        self._seconds = 0.0
        if enabled:
            for name in ENTRY_POINTS:
                if hasattr(cache, name):
                    setattr(cache, name, self._wrap(getattr(cache, name)))

    def _wrap(self, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            outer = not self._depth
            self._depth += 1
            t0 = self.clock() if outer else 0.0
            gc0 = self.gc.total if outer and self.gc is not None else 0.0
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                if outer:
                    own = self.clock() - t0
                    self._seconds += own if self.gc is None else self.gc.exclude(own, gc0)
        return timed

    def take(self) -> float:
        s, self._seconds = self._seconds, 0.0
        return s
