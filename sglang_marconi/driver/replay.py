"""Drive a real SGLang tree cache with the calls the scheduler makes for one request (match,
lock, chunked prefill with checkpoints, decode with its track ping-pong, release), each
SGLang's own function but the in-page decode write; HiCache calls from ``host_tier``."""
from __future__ import annotations

import time
import types
import zlib
from array import array
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, Req, ScheduleBatch
from sglang.srt.mem_cache.allocation import alloc_for_decode_default, alloc_for_extend
from sglang.srt.mem_cache.common import (checkpoint_kv_cache, evict_from_tree_cache,
                                         release_kv_cache)
from sglang.srt.runtime_context import get_exec, mamba_checkpoint_grid, mamba_track_grid
from sglang.srt.sampling.sampling_params import SamplingParams

from sglang_marconi.driver import host_tier
from sglang_marconi.driver.lost_reuse import track_lost_reuse

# a decode step's bookkeeping costs about as much as this many prefill tokens (CPU)
DECODE_STEP_WEIGHT = 64


@dataclass
class ReplayRequest:
    """One request: its prompt token ids and the tokens it generates."""

    rid: str
    input_ids: array
    output_ids: Sequence[int]
    abort_after_chunks: Optional[int] = None  # abort once this many chunks ran (tests)
    # finish on a stop token (the last output id, as an EOS) instead of by length: trace
    # requests finish by length (a benchmark client's max_new_tokens with ignore_eos)
    finish_by_stop: bool = False
    # serve-sim: the client aborts this many seconds after the request arrives (SGLang's
    # abort_request: waiting, chunked prefill or running, whatever it is doing then)
    abort_after_s: Optional[float] = None

    @property
    def output_len(self) -> int:
        return len(self.output_ids)


@dataclass
class RequestOutcome:
    input_len: int
    hit_len: int        # tokens matched on device (what prefill skipped)
    output_len: int
    aborted: bool
    seconds: float      # wall time of all cache bookkeeping for the request
    peak_kv_used: int   # KV token slots in use at this request's peak
    peak_mamba_used: int
    host_hit_len: int = 0  # tokens loaded back from the host tier (HiCache)
    storage_hit_len: int = 0  # tokens fetched from the L3 store into the host tier first
    lost_reuse: int = 0  # prompt tokens whose KV matched past the hit (``lost_reuse``)


class ReplayBatch:
    """The attributes of ``ScheduleBatch`` SGLang's allocation helpers read."""

    def __init__(self, tree_cache, req, mamba_chunk_size: int):
        self.tree_cache = tree_cache
        self.reqs = [req]
        self.req_to_token_pool = tree_cache.req_to_token_pool
        self.device = "cpu"
        self.hisparse_coordinator = None
        self.model_config = types.SimpleNamespace(
            is_encoder_decoder=False,
            hf_text_config=types.SimpleNamespace(mamba_chunk_size=mamba_chunk_size),
        )

    def maybe_evict_swa(self) -> None:
        pass

    def is_dllm(self) -> bool:
        return False

    @property
    def prefix_lens(self):
        return [r.prefix_len for r in self.reqs]

    @property
    def extend_lens(self):
        return [r.extend_end - r.prefix_len for r in self.reqs]

    @property
    def extend_num_tokens(self) -> int:
        return sum(self.extend_lens)

    def set_seq_lens(self, lens) -> None:
        self.seq_lens_cpu = torch.tensor(lens, dtype=torch.int64)
        self.seq_lens = self.seq_lens_cpu
        idx = [r.kv.req_pool_idx for r in self.reqs]
        if all(i is not None for i in idx):
            self.req_pool_indices_cpu = torch.tensor(idx, dtype=torch.int64)
            self.req_pool_indices = self.req_pool_indices_cpu


class Replayer:
    """Runs ``ReplayRequest``s one after another through ``tree_cache``."""

    def __init__(self, tree_cache, chunked_prefill_size: int = 8192, mamba_chunk_size: int = 64,
                 overlap: bool = False, evict_every_decode_step: bool = False):
        """``overlap``: the overlap loop's order for one request at a time (the first decode
        step's KV allocation before the last prefill chunk's ``checkpoint_kv_cache``).
        ``evict_every_decode_step``: SGLang's page-per-request eviction call inside a page too
        (serve-sim always makes it; ``ab`` skips it, evicting one step later mid-page)."""
        self.cache = tree_cache
        self.chunk = chunked_prefill_size
        self.mamba_chunk_size = mamba_chunk_size
        self.overlap = overlap
        self.evict_every_decode_step = evict_every_decode_step
        self.extra_buffer = bool(get_exec().mamba.enable_mamba_extra_buffer)
        self.grid = mamba_checkpoint_grid(tree_cache.page_size)
        self.track_grid = mamba_track_grid(tree_cache.page_size)
        # called as on_kv(req, start, end) once positions [start, end) have KV slots: the
        # forward pass's KV writes (tests write token-determined contents through it)
        self.on_kv = None
        self.kv_total = tree_cache.token_to_kv_pool_allocator.size
        self.mamba_allocator = tree_cache.req_to_token_pool.mamba_allocator
        self.mamba_total = self.mamba_allocator.size
        self._lost_reuse = track_lost_reuse(tree_cache)  # rid -> reuse its match lost

    # -- usage ---------------------------------------------------------------------------
    def kv_used(self) -> int:
        return self.kv_total - self.cache.token_to_kv_pool_allocator.available_size()

    def mamba_used(self) -> int:
        return self.mamba_total - self.mamba_allocator.available_size()

    # -- one request ---------------------------------------------------------------------
    def _next_chunk_end(self, req, input_len: int) -> int:
        """``PrefillAdder``: a truncated chunk is page- and mamba-grid-floored."""
        remaining = input_len - req.prefix_len
        if remaining <= self.chunk:
            return input_len
        n = self.chunk // self.cache.page_size * self.cache.page_size
        n = n // self.grid * self.grid or n
        return req.prefix_len + n

    def _extend(self, req, input_len: int):
        req.extend_end = self._next_chunk_end(req, input_len)
        batch = ReplayBatch(self.cache, req, self.mamba_chunk_size)
        batch.set_seq_lens([req.extend_end])
        host_tier.start_loads(self.cache)
        alloc_for_extend(batch)
        if self.on_kv is not None:
            self.on_kv(req, req.prefix_len, req.extend_end)
        if self.extra_buffer:
            ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend(batch, req)
        # The forward pass would now run the deferred copy-on-write / clear of the state.
        req.kv.mamba_cow_src_index = None
        req.kv.mamba_needs_clear = False

    def _track_decode_state(self, req) -> None:
        """SchedulerBatchResultProcessor at a decode track boundary (no overlap/spec)."""
        if not self.extra_buffer or req.kv.kv_committed_len % self.track_grid:
            return
        pool = self.cache.req_to_token_pool
        track_idx = req.kv.mamba_next_track_idx
        req.kv.mamba_last_track_idx = track_idx
        req.kv.mamba_prev_track_seqlen = req.kv.mamba_last_track_seqlen
        req.kv.mamba_last_track_seqlen = req.kv.kv_committed_len
        req.kv.mamba_next_track_idx = pool.get_mamba_ping_pong_other_idx(track_idx)

    def _decode_step(self, req) -> None:
        """One decode step: ``_decode_alloc`` and the track update of its result."""
        self._decode_alloc(req)
        self._track_decode_state(req)

    def _decode_alloc(self, req) -> None:
        """``prepare_for_decode`` of one token (inside a page its effect written directly)."""
        seq_len = req.kv.kv_committed_len
        if seq_len % self.cache.page_size == 0:
            batch = ReplayBatch(self.cache, req, self.mamba_chunk_size)
            batch.set_seq_lens([seq_len])
            alloc_for_decode_default(batch, 1)
        else:
            if self.evict_every_decode_step:  # alloc_paged_token_slots_decode 583-585
                evict_from_tree_cache(self.cache, self.cache.page_size)
            row = self.cache.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
            row[seq_len] = row[seq_len - 1] + 1
            req.kv.kv_allocated_len += 1
            req.kv.kv_committed_len += 1
        req.decode_batch_idx += 1
        if self.on_kv is not None:
            self.on_kv(req, seq_len, seq_len + 1)

    def run(self, rr: ReplayRequest) -> RequestOutcome:
        """Replay ``rr`` to its end (finish or abort)."""
        steps = self.steps(rr)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def steps(self, rr: ReplayRequest, decode_block: int = 64):
        """``run`` in steps, yielding each step's work in token units; returns the outcome."""
        seconds = 0.0
        t0 = time.perf_counter()
        input_len = len(rr.input_ids)
        req = Req(rid=rr.rid, origin_input_text="", origin_input_ids=rr.input_ids,
                  sampling_params=SamplingParams(temperature=0,
                                                 max_new_tokens=max(1, rr.output_len)))
        host_tier.poll(self.cache)
        fetched = host_tier.prefetch(self.cache, req)
        req.init_next_round_input(self.cache)
        hit_len = req.prefix_len
        lost = self._lost_reuse.pop(rr.rid, 0)
        host_hit = host_tier.admit(self.cache, req)
        req.lock = self.cache.lock(req.last_node)
        peak_kv = peak_mamba = 0
        chunks = 0
        while True:
            start = req.prefix_len
            self._extend(req, input_len)
            chunks += 1
            peak_kv, peak_mamba = max(peak_kv, self.kv_used()), max(peak_mamba, self.mamba_used())
            if rr.abort_after_chunks is not None and chunks >= rr.abort_after_chunks:
                req.finished_reason = FINISH_ABORT("aborted by replay")
                release_kv_cache(req, self.cache, checkpoint=False)
                host_tier.poll(self.cache)
                return RequestOutcome(input_len, hit_len, 0, True,
                                      seconds + time.perf_counter() - t0, peak_kv, peak_mamba,
                                      host_hit, fetched, lost)
            if req.extend_end >= input_len:
                req.prefix_len = req.extend_end
                break
            checkpoint_kv_cache(req, self.cache)
            host_tier.poll(self.cache)
            req.init_next_round_input()
            seconds += time.perf_counter() - t0
            yield req.extend_end - (start if chunks > 1 else 0)
            t0 = time.perf_counter()
        # The prefill samples the first output token; each decode step adds KV for the
        # previous token and samples the next one. The last token never gets KV.
        out_ids = list(rr.output_ids) or [_output_token(rr.rid, 0)]
        out_len = len(out_ids)
        for i in range(out_len):
            if i % decode_block == 0:
                seconds += time.perf_counter() - t0
                yield (input_len - (start if chunks > 1 else 0) if i == 0
                       else decode_block * DECODE_STEP_WEIGHT)
                t0 = time.perf_counter()
            req.output_ids.append(int(out_ids[i]))
            if i == out_len - 1:
                req.finished_reason = FINISH_LENGTH(length=out_len)
                break
            early = i == 0 and self.overlap
            if early:
                # event_loop_overlap (scheduler.py 2086-2118): the first decode batch is
                # prepared before the prefill's result is processed
                self._decode_alloc(req)
            if i == 0:
                # the last prefill chunk is published like every other (brp
                # process_batch_result_prefill: checkpoint_kv_cache when not finished)
                checkpoint_kv_cache(req, self.cache)
            if not early:
                self._decode_alloc(req)
            self._track_decode_state(req)
        peak_kv, peak_mamba = max(peak_kv, self.kv_used()), max(peak_mamba, self.mamba_used())
        release_kv_cache(req, self.cache, checkpoint=True)
        host_tier.poll(self.cache)
        return RequestOutcome(input_len, hit_len, out_len, False,
                              seconds + time.perf_counter() - t0, peak_kv, peak_mamba, host_hit,
                              fetched, lost)


def sampling_params(rr: ReplayRequest, out: Sequence[int]):
    """The request's normalized ``SamplingParams``: ``max_new_tokens`` = its output length,
    or with ``finish_by_stop`` a stop token (its last output id, which must not occur
    earlier in the output) and room for ``STOP_HEADROOM`` more tokens."""
    if not rr.finish_by_stop:
        params = SamplingParams(temperature=0, max_new_tokens=len(out))
    else:
        if out[-1] in out[:-1]:
            raise ValueError(f"request {rr.rid}: its stop token {out[-1]} occurs before "
                             "the end of its output")
        params = SamplingParams(temperature=0, max_new_tokens=len(out) + STOP_HEADROOM,
                                stop_token_ids=[int(out[-1])])
    params.normalize(None)                                   # the tokenizer manager's step
    return params


STOP_HEADROOM = 16


def _output_token(rid: str, i: int) -> int:
    """A fresh token for a request with no output (it still samples one token)."""
    return (1 << 40) + (zlib.crc32(rid.encode()) & 0xFFFFFF) * 100000 + i
