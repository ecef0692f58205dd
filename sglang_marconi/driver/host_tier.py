"""The scheduler's HiCache calls for one request, for the replay (``replay.Replayer``).

With ``--enable-hierarchical-cache`` SGLang 0.5.23's scheduler adds, around the calls the
replay already makes:

- ``PrefillAdder.add_one_req`` (``managers/schedule_policy.py`` 1470-1571): when the match
  left a host hit (``Req.needs_host_load_back``), it pins the host match
  (``inc_host_lock_ref`` + ``lock`` of ``best_match_node``), calls
  ``tree_cache.init_load_back`` (which queues the host -> device copies, KV and the Mamba
  state, and re-materialises the nodes) and adds the loaded tokens to the prefix;
- ``get_new_batch_prefill`` (``managers/scheduler.py`` 4352-4355):
  ``ready_to_load_host_cache()`` starts the queued loads before the batch's allocation;
- every loop iteration (``_process_hicache_events``, scheduler.py 3878-3890):
  ``check_hicache_events()`` acknowledges finished backups (releasing write-through locks)
  and loads (releasing load-back locks), and drains the L3 queues.

``admit`` and ``poll`` are those calls, nothing else; the copies run synchronously on CPU
(``hicache_cpu``), so one ``poll`` after a step finds every ack ready.
"""
from __future__ import annotations

import contextlib


def enabled(cache) -> bool:
    return getattr(cache, "cache_controller", None) is not None


@contextlib.contextmanager
def _pinned(cache, node, lock_host: bool = False):
    """``PrefillAdder._lock_node``: a temporary pin of a matched node."""
    host = cache.inc_host_lock_ref(node).to_dec_params() if lock_host else None
    try:
        lock = cache.lock(node)
        try:
            yield
        finally:
            cache.unlock(lock)
    finally:
        if host is not None:
            cache.dec_host_lock_ref(node, host)


def admit(cache, req) -> int:
    """Load the request's host hit back to the device (``PrefillAdder``); returns the
    tokens loaded (0 when there was none or the load-back declined)."""
    from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams

    if not enabled(cache) or not req.needs_host_load_back():
        return 0
    with _pinned(cache, req.last_node), _pinned(cache, req.best_match_node, lock_host=True):
        promised = req.host_hit_length
        loaded = cache.init_load_back(InitLoadBackParams(
            best_match_node=req.best_match_node, host_hit_length=promised, req=req))
    req.host_loaded_length, req.last_node = loaded
    if 0 < req.host_loaded_length < promised:
        raise RuntimeError(f"HiCache load-back of {req.rid}: promised {promised} tokens, "
                           f"loaded {req.host_loaded_length}")
    req.prefix_len += req.host_loaded_length
    if cache.load_back_is_cache_owned():
        req.kv.cache_protected_len = req.prefix_len
    return req.host_loaded_length


def start_loads(cache) -> None:
    """``ready_to_load_host_cache`` when a prefill batch is formed."""
    if enabled(cache):
        cache.ready_to_load_host_cache()


def poll(cache) -> None:
    """``check_hicache_events`` (one scheduler loop iteration)."""
    if enabled(cache):
        cache.check_hicache_events()
