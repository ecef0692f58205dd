"""The scheduler's HiCache calls for one request, for the replay: ``prefetch`` (L3, on
arrival), ``admit`` (the host hit's load-back), ``start_loads`` and ``poll``, nothing else;
L2 copies run synchronously on CPU."""
from __future__ import annotations

import contextlib
import time

PREFETCH_WAIT_S = 30.0  # an L3 prefetch not done by then is a failure, not a wait


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


def prefetch(cache, req) -> int:
    """L3 -> host for a new request (cache mode); returns the tokens fetched."""
    if not enabled(cache) or not cache.enable_storage:
        return 0
    req.init_next_round_input(cache, cow_mamba=False)
    last_host = req.last_host_node
    matched = req.prefix_len + req.host_hit_length
    if not (cache.is_backuped(last_host) or cache.is_root(last_host)):
        return 0
    ids = req.full_untruncated_fill_ids
    end = req._compute_max_prefix_len(len(ids))
    handle = req.cache_request_handle
    cache.prefetch_from_storage(
        handle, last_host, ids[matched:end], cache.get_last_hash_value(last_host), None,
        matched_prefix_tokens=ids[:matched], extra_key=req.extra_key,
        cache_salt=req.cache_salt)
    deadline = time.monotonic() + PREFETCH_WAIT_S
    while not cache.check_prefetch_progress(handle):
        if time.monotonic() > deadline:
            raise TimeoutError(f"L3 prefetch of {req.rid} not done in {PREFETCH_WAIT_S} s")
        time.sleep(0.001)
        poll(cache)
    loaded, _ = cache.pop_prefetch_loaded_span(handle)
    return loaded


def settle(cache) -> None:
    """Wait until the L3 backend's pending backups are acknowledged."""
    deadline = time.monotonic() + PREFETCH_WAIT_S
    while enabled(cache) and cache.ongoing_backup:
        if time.monotonic() > deadline:
            raise TimeoutError("L3 backups not acknowledged")
        time.sleep(0.001)
        poll(cache)


def admit(cache, req) -> int:
    """Load the request's host hit back to the device; returns the tokens loaded."""
    from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams  # heavy: sglang

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
