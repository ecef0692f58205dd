"""SGLang 0.5.23's scheduler loop (``event_loop_overlap`` / ``event_loop_normal``) on CPU with a
virtual clock instead of a forward pass: only the outer loop is written here, with SGLang's
line numbers; every decision inside it is SGLang's own code on the real cache and pools."""
from __future__ import annotations

import contextlib
import heapq
import types
from collections import Counter, deque
from dataclasses import dataclass
from typing import List, Optional

import torch
from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder, SchedulePolicy
from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from sglang_marconi.driver.lost_reuse import track_lost_reuse
from sglang_marconi.errors import sglang_oom
from sglang_marconi.driver import host_tier
from sglang_marconi.policy import defaults
from sglang_marconi.driver.replay import _output_token, sampling_params
from sglang_marconi.harness.ab import instrument, instrument_host
from sglang_marconi.harness.timing import GCPauses
from sglang_marconi.serving.clock import CacheTimer


class ServerCrash(RuntimeError):
    """SGLang's scheduler raised where a real server's scheduler process would exit."""


@dataclass(frozen=True)
class SchedulerConfig:
    max_running_requests: int
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384          # SGLang's --max-prefill-tokens default
    schedule_policy: str = defaults.SCHEDULE_POLICY  # --schedule-policy (SGLang's default)
    measure_bookkeeping: bool = True         # add the cache's measured CPU time to the clock
    bookkeeping_cpu_time: bool = False       # measure it as thread CPU time, not wall time
    mamba_chunk_size: int = 64
    # closed loop: at most this many requests in the server (a request is released when
    # one finishes; its arrival is then). 1 with all arrivals at 0 is the serial replay.
    clients: Optional[int] = None
    overlap: bool = True     # event_loop_overlap (SGLang's default); False: event_loop_normal



@contextlib.contextmanager
def _unpinned_host_memory():
    """CPU-only torch cannot pin host memory: staging tensors are used unpinned."""
    pin = torch.Tensor.pin_memory
    torch.Tensor.pin_memory = lambda t, *a, **k: t
    try:
        yield
    finally:
        torch.Tensor.pin_memory = pin

@dataclass
class RequestRecord:
    rid: str
    arrival: float
    input_len: int
    output_len: int
    hit_len: Optional[int] = None     # prefix matched at first admission
    admitted: Optional[float] = None  # start of its first prefill step
    first_token: Optional[float] = None
    finished: Optional[float] = None
    aborted: bool = False
    abort_reason: str = ""
    retractions: int = 0
    ended: Optional[float] = None     # finished or aborted: the response is complete
    backlog: int = 0                  # requests in the server when it arrived, itself included
    host_hit_len: int = 0             # of hit_len, tokens loaded back from the host tier
    host_load_s: float = 0.0          # the load-back of its first prefill batch, on the clock
    storage_hit_len: int = 0          # tokens the L3 prefetch brought to host on arrival
    lost_reuse: int = 0               # prompt tokens whose KV matched past the hit


@dataclass
class StepRecord:
    kind: str              # "extend" | "decode" | "idle"
    start: float
    gpu_s: float
    cache_s: float
    batch: int             # requests in the batch run
    resident: int          # requests holding a request row (running + chunked)
    state_slots_used: int  # Mamba pool slots in use after the step (and int8 checkpoint slots)
    state_slots_tree: int  # of which the tree holds
    exposed_cpu_s: float = 0.0  # CPU time the GPU waited for before this step's forward
    gpu_start: float = 0.0      # when its forward starts on the clock
    load_bytes: float = 0.0     # host -> device load-back of this batch (HiCache)
    load_s: float = 0.0         # its time over the host link (inside gpu_s: max with forward)
    load_exposed_s: float = 0.0  # of which longer than the forward: what it added to gpu_s


class ServingScheduler:
    def __init__(self, cache, time_model, cfg: SchedulerConfig, requests, arrivals,
                 after_step=None, on_launch=None):
        """``after_step(scheduler)`` runs after every step, ``on_launch(batch)`` when a
        batch is launched (where the forward would run: tests write state markers)."""
        self.cache, self.tm, self.cfg = cache, time_model, cfg
        self.allocator = cache.token_to_kv_pool_allocator
        self.rtp = cache.req_to_token_pool
        self.mamba_allocator = self.rtp.mamba_allocator
        self.policy = SchedulePolicy(cfg.schedule_policy, cache, False, False, False)
        self.ratio = NewTokenRatioTracker.from_config()
        self.model_config = types.SimpleNamespace(
            is_encoder_decoder=False, vocab_size=1 << 62,
            hf_text_config=types.SimpleNamespace(mamba_chunk_size=cfg.mamba_chunk_size))
        # with a host tier: what crossed between the tiers (the controller's loads and
        # backups, host evictions) and what the device evicted
        self.host = instrument_host(cache)
        self.device = instrument(cache) if self.host is not None else None
        self._loaded = (0, 0)          # host counters' (KV tokens, states) loaded so far
        self._step_load = (0.0, 0.0, 0.0)  # (bytes, seconds, exposed) of the batch just run
        self.gc = GCPauses()  # the replay heap's collections, apart from the cache's time
        self.timer = CacheTimer(cache, cfg.measure_bookkeeping, self.gc,
                                cpu=cfg.bookkeeping_cpu_time)
        self.after_step = after_step
        self.on_launch = on_launch
        # each request's last match (SGLang's scheduler keeps only the hit): the reuse it
        # lost, read at its first admission (driver.lost_reuse)
        self.lost_reuse = track_lost_reuse(cache)
        # what the overlap loop did that the normal loop never does: requests left out of a
        # batch as finishing in flight, queued results skipped (finished or retracted)
        self.finishing_inflight = self.skipped_results = 0
        self.client_aborts: List = []       # heap of (time, rid) of the clients' aborts
        self.live: dict = {}                # rid -> Req of requests not finished/aborted
        self.pending_chunked_abort = None   # _pending_chunked_abort_req (scheduler.py 3778)
        self.aborts_by_stage = Counter()    # the clients' aborts: waiting, chunked, running
        order = sorted(range(len(requests)), key=lambda i: (arrivals[i], i))
        self.pending = [(arrivals[i], requests[i]) for i in reversed(order)]  # a stack
        self.records: dict = {}
        self.outputs: dict = {}
        self.waiting: List = []
        self.running = ScheduleBatch(reqs=[], batch_is_full=False)
        self.chunked_req = None
        self.last_batch = None
        self.result_queue = deque()  # (batch copy, virtual time its forward ends)
        self.gpu_free = 0.0          # when the GPU finishes the last launched forward
        self.now = 0.0
        self.steps: List[StepRecord] = []
        self.retractions = 0
        self.ingested = self.completed = 0  # requests arrived / finished or aborted
        self.crash: Optional[str] = None      # what SGLang raised, when the server died

    # -- the loops ----------------------------------------------------------------------
    def done(self) -> bool:
        return not (self.pending or self.waiting or self.chunked_req is not None
                    or not self.running.is_empty() or self.result_queue
                    or (self.last_batch is not None and not self.last_batch.is_empty()))

    def step(self) -> None:
        """One loop iteration; an SGLang allocation failure raises ``ServerCrash``."""
        if self.crash is not None:
            raise ServerCrash(self.crash)
        try:
            if self.cfg.overlap:
                self._step_overlap()
            else:
                self._step_normal()
        except RuntimeError as exc:
            if (oom := sglang_oom(exc)) is None:
                raise
            self.crash = f"{oom} at t={self.now:.1f} s, after {self.completed:,} " \
                         "requests completed"
            raise ServerCrash(self.crash) from exc

    def _wait_for_arrival(self) -> None:
        """Nothing to run, nothing in flight: the clock moves to the next arrival."""
        self.now = max(self.now, self.pending[-1][0])
        self._ingest()

    # event_loop_normal (scheduler.py:2026-2060)
    def _step_normal(self) -> None:
        self._ingest()                                       # ingest_requests
        if self._idle() and self.pending and not self.in_flight:
            self._wait_for_arrival()
        self._client_aborts()
        start = self.now
        batch = self._get_next_batch_to_run()
        sched_s = self.timer.take()
        self.now += sched_s
        gpu_s = self._run_batch(batch) if batch is not None else 0.0
        self.now += gpu_s
        if batch is not None and self.on_launch is not None:
            self.on_launch(batch)
        if batch is not None:
            self._process_batch_result(batch)
        elif self.waiting and self._idle(ignore_waiting=True):
            self._abort(self.waiting.pop(0), "does not fit the pools")
        proc_s = self.timer.take()
        self.now += proc_s
        self.last_batch = batch
        # the CPU runs in series with the forward: all of it is exposed
        self._record_step(batch, start, gpu_s, sched_s + proc_s,
                          0.0 if batch is None else sched_s + proc_s, start + sched_s)

    # event_loop_overlap (scheduler.py:2061-2134)
    def _step_overlap(self) -> None:
        self._ingest()                                       # 2080
        woke = float("-inf")
        if self._idle() and self.pending and not self.in_flight:
            self._wait_for_arrival()
            woke = self.now
        self._client_aborts()
        start = self.now
        batch = self._get_next_batch_to_run()                # 2086-2091
        sched_s = self.timer.take()
        self.now += sched_s
        # is_disable_overlap_for_batch (2136-2171): False (consecutive-prefill switch off,
        # no grammar, no speculative decoding): the queued result is processed after launch
        gpu_s = exposed = 0.0
        gpu_start = self.now
        if batch is not None:                                # 2107-2111: launch, queue
            gpu_s = self._run_batch(batch)
            # the GPU starts batch k when the CPU launches it and batch k-1 is done; the
            # CPU time it waited for is exposed (first batch after idle, a drained result)
            exposed = max(0.0, self.now - max(self.gpu_free, woke))
            gpu_start = max(self.now, self.gpu_free)
            self.gpu_free = gpu_start + gpu_s
            if self.on_launch is not None:
                self.on_launch(batch)
            self.result_queue.append((batch.copy(), self.gpu_free))
        if self.last_batch is not None:                      # 2116-2118: process k-1
            prev, ready = self.result_queue.popleft()
            self.now = max(self.now, ready)                  # copy_done.synchronize()
            self._process_batch_result(prev)
        elif batch is None and self.waiting and self._idle(ignore_waiting=True):
            self._abort(self.waiting.pop(0), "does not fit the pools")  # on_idle
        proc_s = self.timer.take()
        self.now += proc_s
        self.last_batch = batch                              # 2127
        self._record_step(batch, start, gpu_s, sched_s + proc_s, exposed, gpu_start)

    def _record_step(self, batch, start, gpu_s, cache_s, exposed, gpu_start) -> None:
        tree = self.cache.mamba_evictable_size() + self.cache.mamba_protected_size()
        used = self.mamba_allocator.size - self.mamba_allocator.available_size()
        ckpt = getattr(self.cache.req_to_token_pool, "mamba_ckpt_pool", None)
        if ckpt is not None:  # int8 checkpoints: the tree's states are in their own pool
            used += ckpt.num_slots - ckpt.available_size()
        kind = "idle" if batch is None else ("decode" if batch.forward_mode.is_decode()
                                             else "extend")
        load = self._step_load
        self._step_load = (0.0, 0.0, 0.0)
        self.steps.append(StepRecord(kind, start, gpu_s, cache_s,
                                     0 if batch is None else batch.batch_size(),
                                     self.rtp.size - self.rtp.available_size(), used, tree,
                                     exposed, gpu_start, *load))
        if self.after_step is not None:
            self.after_step(self)

    def submit(self, arrival: float, rr) -> None:
        """Add one request arriving at ``arrival`` (no earlier than any pending)."""
        if self.pending and arrival < self.pending[0][0]:
            raise ValueError(f"{rr.rid} arrives at {arrival}, before a pending request")
        self.pending.insert(0, (arrival, rr))

    @property
    def in_flight(self) -> int:
        return self.ingested - self.completed

    def run(self, progress=None) -> None:
        """Steps until every request is done, or SGLang crashes the server."""
        reported = 0
        with self.gc:
            while not self.done():
                try:
                    self.step()
                except ServerCrash:
                    return
                if progress is not None and self.completed != reported:
                    progress(self.completed - reported)
                    reported = self.completed
            self.finish()

    def finish(self) -> None:
        """The idle server's next iterations: the last acks (and L3 backups) drained."""
        host_tier.poll(self.cache)
        host_tier.settle(self.cache)

    def _idle(self, ignore_waiting: bool = False) -> bool:
        return ((ignore_waiting or not self.waiting) and self.chunked_req is None
                and self.running.is_empty()
                and (self.last_batch is None or self.last_batch.is_empty()))

    def _ingest(self) -> None:
        while self.pending and self.pending[-1][0] <= self.now:
            if self.cfg.clients is not None and self.in_flight >= self.cfg.clients:
                break
            arrival, rr = self.pending.pop()
            arrival = max(arrival, self.now) if self.cfg.clients is not None else arrival
            self.ingested += 1
            out = list(rr.output_ids) or [_output_token(rr.rid, 0)]
            rec = RequestRecord(rr.rid, arrival, len(rr.input_ids), len(out),
                                backlog=self.in_flight)
            self.records[rr.rid] = rec
            self.outputs[rr.rid] = out
            params = sampling_params(rr, out)
            req = Req(rid=rr.rid, origin_input_text="", origin_input_ids=rr.input_ids,
                      sampling_params=params)
            if rec.input_len + rec.output_len > self.allocator.size - 2 * self.allocator.page_size:
                rec.aborted, rec.abort_reason = True, "longer than the KV pool"  # tokenizer check
                rec.ended = arrival
                self.completed += 1
                continue
            rec.storage_hit_len = host_tier.prefetch(self.cache, req)  # 3324, 3342-3392
            self.waiting.append(req)                         # _add_request_to_queue
            self.live[rr.rid] = req
            if rr.abort_after_s is not None:
                heapq.heappush(self.client_aborts, (arrival + rr.abort_after_s, rr.rid))

    def _abort(self, req, why: str) -> None:
        rec = self.records[req.rid]
        rec.aborted, rec.abort_reason = True, why
        rec.ended = self.now
        self.completed += 1
        self.live.pop(req.rid, None)

    # -- abort_request (scheduler.py:5675-5812, not disaggregated) ------------------------
    def _client_aborts(self) -> None:
        """The clients' aborts due by now, as ``AbortReq``s the scheduler receives."""
        while self.client_aborts and self.client_aborts[0][0] <= self.now:
            _, rid = heapq.heappop(self.client_aborts)
            req = self.live.get(rid)
            if req is not None:
                self._abort_request(req)

    def _abort_request(self, req) -> None:
        if self.chunked_req is req:                          # 5676-5678
            self.pending_chunked_abort = req
            self.aborts_by_stage["chunked"] += 1
        if any(r is req for r in self.waiting):              # 5685-5722: method 1
            self.aborts_by_stage["waiting"] += 1
            self.waiting = [r for r in self.waiting if r is not req]
            if req.kv.holds_mamba:
                release_kv_cache(req, self.cache, checkpoint=False)
            self._abort(req, "client abort")
            return
        inflight = [self.running, self.last_batch]           # collect_inflight_reqs 5657-5673
        if any(b is not None and any(r is req for r in b.reqs) for b in inflight):
            if not req.finished():                           # 5797-5811: method 3

                req.to_finish = FINISH_ABORT()
                self.aborts_by_stage["running"] += self.chunked_req is not req

    def _process_pending_chunked_abort(self) -> None:
        """scheduler.py:3778-3822: the chunk already launched is drained by its result."""
        req, self.pending_chunked_abort = self.pending_chunked_abort, None
        if req is None:
            return
        if self.chunked_req is not req:                      # 3795-3805
            if not (req.finished() or not req.kv.holds_kv):
                self._abort_request(req)
            return
        req.finished_reason = FINISH_ABORT("Aborted")        # prepare_abort
        req.to_finish = None
        release_kv_cache(req, self.cache, checkpoint=False)
        self.chunked_req = None
        self._abort(req, "client abort")

    # -- get_next_batch_to_run (scheduler.py:3894-4012) ----------------------------------
    def _get_next_batch_to_run(self):
        self._process_pending_chunked_abort()                # 3897
        host_tier.poll(self.cache)                           # 3898: _process_hicache_events
        # L3 backups are waited for here (not on the clock): a later arrival's prefetch then
        # finds what earlier iterations stored, whatever the storage threads' timing
        host_tier.settle(self.cache)
        exclude = []
        if self.chunked_req is not None:                     # 3911-3919
            exclude.append(self.chunked_req)
            if self.chunked_req.extend_end > self.chunked_req.prefix_len:
                self._stash_chunked_request(self.chunked_req)
        last, running = self.last_batch, self.running
        if last is not None and last.forward_mode.is_extend():  # 3933-3956
            last_bs = last.batch_size()
            last.filter_batch(reqs_to_exclude=exclude)
            if last.batch_size() < last_bs:
                running.batch_is_full = False
            if not last.is_empty() and last is not running:
                if running.is_empty():
                    running = last
                else:
                    running.merge_batch(last)
        running_bs = running.batch_size()                    # 3960-3963
        running.filter_batch()
        if running.batch_size() < running_bs:
            running.batch_is_full = False
        self.running = running
        new_batch = self._get_new_batch_prefill()            # 3967-3972
        if new_batch is not None:                            # 3986-3999
            return new_batch
        if not self.running.is_empty():
            batch = self._update_running_batch(self.running)
            return batch if batch is not None and not batch.is_empty() else None
        return None

    def _stash_chunked_request(self, req) -> None:           # scheduler.py:3772-3776

        checkpoint_kv_cache(req, self.cache)

    def _num_allocatable_reqs(self, running_bs: int, num_held_rows: int = 0) -> int:
        # get_num_allocatable_reqs (4024-4050); pp_max_micro_batch_size defaults to
        # max_running_requests (1237-1243); no beams
        return min(self.cfg.max_running_requests - running_bs,
                   max(self.rtp.available_size() + num_held_rows, 0))

    # -- _get_new_batch_prefill_raw (scheduler.py:4079-4320) -----------------------------
    def _get_new_batch_prefill(self):
        running = self.running
        if running.is_empty():                               # 4093-4096
            running.batch_is_full = False
        if (running.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None                                      # 4098-4101
        running_bs = len(running.reqs)
        if self._num_allocatable_reqs(running_bs) <= 0 and self.chunked_req is None:
            running.batch_is_full = True                     # 4122-4130
            return None
        self.policy.calc_priority(self.waiting, running)     # 4133-4137
        adder = PrefillAdder(                                # 4161-4178
            self.cache.page_size, self.cache, self.allocator, running,
            self.ratio.current, self.cfg.max_prefill_tokens, self.cfg.chunked_prefill_size,
            0, 0, max_prefill_bs=0, max_running_requests=self.cfg.max_running_requests,
            prefill_max_requests=None, waiting_queue_len=len(self.waiting),
            prefill_tile_block_m=64)
        if self.chunked_req is not None:                     # 4180-4188
            self.chunked_req.init_next_round_input()
            adder.chunked_req_limit = self.policy.shortest_prefill_chunk_limit(
                self.chunked_req, self.waiting, adder.rem_chunk_tokens or 0,
                self.cache.page_size)
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        self.mamba_allocator.alloc_group_begin(len(self.waiting))  # 4203-4205
        for req in self.waiting:                             # 4208-4303
            if adder.budget_state() == AddReqResult.OTHER:
                break
            held = sum(r.kv.holds_kv for r in adder.can_run_list)
            if len(adder.can_run_list) >= self._num_allocatable_reqs(len(running.reqs), held):
                running.batch_is_full = True
            if running.batch_is_full:
                break
            req.init_next_round_input(self.cache)
            res = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None,
                                    truncation_align_size=None)
            if res != AddReqResult.CONTINUE:
                if res == AddReqResult.NO_TOKEN:
                    running.batch_is_full = (len(adder.can_run_list) > 0 or not running.is_empty())
                added = bool(adder.can_run_list) and req is adder.can_run_list[-1]
                if not added:
                    req.kv.mamba_cow_src_index = None
                    req.kv.mamba_needs_clear = False
                    if req.kv.holds_mamba:
                        self.mamba_allocator.free(req.kv.mamba_pool_idx.unsqueeze(-1))
                        req.kv.mamba_pool_idx = None
                break
        self.mamba_allocator.alloc_group_end()
        can_run = adder.can_run_list                         # 4309-4331
        if not can_run:
            return None
        chosen = set(map(id, can_run))
        self.waiting = [r for r in self.waiting if id(r) not in chosen]
        if adder.new_chunked_req is not None:
            assert self.chunked_req is None
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.inflight_middle_chunks += 1
        load_bytes = self._load_bytes()  # PrefillAdder.add_one_req's init_load_back calls
        load_s = self.tm.load_seconds(load_bytes)
        for req in can_run:
            rec = self.records[req.rid]
            if rec.admitted is None:
                rec.admitted, rec.hit_len = self.now, req.prefix_len
                rec.lost_reuse = self.lost_reuse.pop(req.rid, 0)
                rec.host_hit_len = req.host_loaded_length
                rec.host_load_s = load_s if req.host_loaded_length else 0.0
        batch = ScheduleBatch.init_new(                      # 4335-4350
            can_run, self.rtp, self.allocator, self.cache, self.model_config, self.cfg.overlap,
            SpeculativeAlgorithm.NONE, chunked_req=self.chunked_req)
        batch.contains_last_prefill_chunk = self.chunked_req is None or len(can_run) != 1
        if host_tier.enabled(self.cache):                    # 4352-4355
            batch.hicache_consumer_index = self.cache.ready_to_load_host_cache()
        batch.host_load_bytes = load_bytes
        batch.prepare_for_extend()
        batch.decoding_reqs = None                           # no mixed chunk (4411)
        return batch

    # -- update_running_batch (scheduler.py:4459-4555) -----------------------------------
    def _reqs_finishing_inflight(self, batch) -> list:
        """scheduler.py:4444-4457: requests the queued result finishes by length."""
        if not self.cfg.overlap or not self.result_queue:
            return []
        assert len(self.result_queue) == 1
        queued = set(self.result_queue[0][0].reqs)
        return [r for r in batch.reqs if r in queued and r.next_output_finishes_by_length()]

    def _update_running_batch(self, batch):
        initial_bs = batch.batch_size()
        finishing = self._reqs_finishing_inflight(batch)    # 4463-4467
        self.finishing_inflight += len(finishing)
        batch.filter_batch(reqs_to_exclude=finishing)
        if batch.is_empty():
            batch.batch_is_full = False
            return batch
        kv_full = not batch.check_decode_mem()
        if kv_full and finishing:                            # 4469-4473
            # the queued result frees the finishing requests' KV at the end of this step
            batch.batch_is_full = False
            return None
        if kv_full:
            retracted, new_ratio, to_abort = batch.retract_decode()
            self.ratio.current = new_ratio
            for req in to_abort:
                self._abort(req, "retracted beyond recovery")
            for req in retracted:
                self.records[req.rid].retractions += 1
                self.retractions += 1
                self.waiting.append(req)
        else:
            self.ratio.decay_step()
        if batch.batch_size() < initial_bs:
            batch.batch_is_full = False
        if batch.is_empty():
            return batch
        with _unpinned_host_memory():
            batch.prepare_for_decode()
        return batch

    # -- run_batch: the GPU time model ---------------------------------------------------
    def _load_bytes(self) -> float:
        """Bytes the controller queued host -> device since the last call."""
        if self.host is None:
            return 0.0
        now = (self.host.kv_tokens_loaded, self.host.states_loaded)
        kv, states = now[0] - self._loaded[0], now[1] - self._loaded[1]
        self._loaded = now
        return kv * self.tm.kv_bytes_per_token + states * self.tm.state_bytes

    def _run_batch(self, batch) -> float:
        if batch.forward_mode.is_decode():
            return self.tm.decode_seconds(int(batch.seq_lens_cpu.sum()), batch.batch_size())
        flops = sum(self.tm.extend_flops(r.prefix_len, r.extend_end) for r in batch.reqs)
        load_bytes = batch.host_load_bytes
        load_s = self.tm.load_seconds(load_bytes)
        self._step_load = (load_bytes, load_s, max(0.0, load_s - flops / self.tm.prefill_flops_s))
        return self.tm.prefill_seconds(flops, load_s)

    # -- process_batch_result (scheduler.py:5074-5100) -----------------------------------
    def _process_batch_result(self, batch) -> None:
        """The cache's lines of ``process_batch_result_prefill`` / ``_decode`` (brp)."""
        decode = batch.forward_mode.is_decode()
        for i, req in enumerate(batch.reqs):
            if decode:
                if self.cfg.overlap and (req.finished() or req.is_retracted):
                    self.skipped_results += 1
                    continue                                 # brp 1022-1027
            elif (req.finished() and req.inflight_middle_chunks <= 0) or req.is_retracted:
                continue                                     # brp 343-349
            elif req.inflight_middle_chunks > 0:
                req.inflight_middle_chunks -= 1              # brp 426-431: chunked branch
                continue
            rec = self.records[req.rid]
            req.output_ids.append(int(self.outputs[req.rid][len(req.output_ids)]))
            req.update_finish_state()
            if decode:
                # _handle_finish_state_updated_req (brp 1366-1427): the ping-pong track
                # update for the step's boundary happens before the release
                self._track_decode_state(batch, i, req)
            if rec.first_token is None:
                rec.first_token = self.now
            if req.finished():                               # prefill 376-383, decode 1459
                release_kv_cache(req, self.cache, checkpoint=True)
                if isinstance(req.finished_reason, FINISH_ABORT):  # a client's abort
                    self._abort(req, "client abort")
                else:
                    rec.finished = rec.ended = self.now
                    self.completed += 1
                    self.live.pop(req.rid, None)
            elif not decode:
                checkpoint_kv_cache(req, self.cache)         # prefill 384-386

    def _track_decode_state(self, batch, i: int, req) -> None:
        """brp 1376-1427 and ``_mamba_prefix_cache_update`` (1527-1580)."""
        if batch.mamba_track_mask_cpu is None or req.kv.mamba_ping_pong_track_buffer is None:
            return                                           # no extra_buffer
        completed = bool(batch.mamba_track_mask_cpu[i])
        lookahead = req.decode_batch_idx - batch.mamba_decode_batch_idx_cpu[i]
        assert lookahead in (0, 1), f"{req.rid}: overlap lookahead {lookahead}"
        known = completed if lookahead == 0 else bool(batch.mamba_track_mask_next_cpu[i])
        if completed:
            req.kv.mamba_last_track_idx = batch.mamba_track_buffer_indices[i]
            req.kv.mamba_prev_track_seqlen = req.kv.mamba_last_track_seqlen
            req.kv.mamba_last_track_seqlen = req.kv.kv_committed_len - lookahead
        if known:                                            # known_boundary=True (1550-1580)
            req.kv.mamba_next_track_idx = self.rtp.get_mamba_ping_pong_other_idx(
                req.kv.mamba_next_track_idx)
