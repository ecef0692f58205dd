"""Where stock SGLang 0.5.23 (``--mamba-radix-cache-strategy extra_buffer``) takes the states
it publishes, and which of them the Marconi plugin keeps: the marconi router's model of its
replicas (``cost_routers.MarconiRouter``).

A state at every chunked-prefill boundary (the branch point instead when it falls inside a
chunk), the last chunk's state, and the last decode-track snapshot; the tree keeps the
sequence up to the last published state. Paths are relative to the installed
``sglang/srt/``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from sglang_marconi.policy.admission import AdmissionPlan


def _floor(x: int, grid: int) -> int:
    return (x // grid) * grid


def sglang_grid(page: int, mamba_chunk: int = 64) -> int:
    """The checkpoint grid: ``lcm(mamba chunk, page)`` (``runtime_context.
    mamba_checkpoint_grid``; 64 is the FLA chunk of the hybrid models)."""
    return math.lcm(mamba_chunk, page)


def sglang_track_grid(grid: int, track_interval: int) -> int:
    """The decode-track grid: ``lcm(grid, --mamba-track-interval)``
    (``runtime_context.mamba_track_grid``)."""
    return math.lcm(grid, track_interval)


def sglang_branch_point(kv_len: int, hit_len: int, grid: int) -> int:
    """SGLang's branch rule (``MambaComponent.finalize_match_result_in_tree_core``): the KV
    match floored to the grid, when it lies beyond the deepest reusable state (the hit);
    0: no branch point."""
    branch = _floor(kv_len, grid)
    return branch if branch > hit_len else 0


def sglang_chunk_end(prefix_len: int, input_len: int, chunk: int, page: int, grid: int) -> int:
    """Where the prefill chunk that starts at ``prefix_len`` ends (``PrefillAdder``): the
    rest of the input when it fits in ``chunk`` tokens (``--chunked-prefill-size``), else a
    truncated chunk floored to the page and the grid. ``chunk`` <= 0: chunked prefill off
    (the server's -1), one chunk."""
    if chunk <= 0 or input_len - prefix_len <= chunk:
        return input_len
    n = _floor(chunk, page)
    return prefix_len + (_floor(n, grid) or n)


def sglang_chunk_snapshot(prefix_len: int, end: int, branch_len: int, grid: int) -> int:
    """The state a prefill chunk ``[prefix_len, end)`` snapshots
    (``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend``): the branch point when
    it falls strictly inside the chunk, else the chunk's end floored to the grid (relative
    to the chunk's start); 0 when the chunk is shorter than the grid (no snapshot)."""
    ext = end - prefix_len
    if ext < grid:
        return 0
    if branch_len and prefix_len < branch_len < end:
        return branch_len
    return prefix_len + _floor(ext, grid)


def sglang_prefill_chunks(input_len: int, hit_len: int, branch_len: int, chunk: int,
                          page: int, grid: int) -> list:
    """The prefill of a request as SGLang chunks it: ``[(start, end, snapshot), ...]`` from
    the hit to the end of the input (snapshot 0: the chunk takes none)."""
    out, start = [], hit_len
    while True:
        end = sglang_chunk_end(start, input_len, chunk, page, grid)
        out.append((start, end, sglang_chunk_snapshot(start, end, branch_len, grid)))
        if end >= input_len:
            return out
        start = end


def sglang_decode_snapshot(input_len: int, output_len: int, track_grid: int) -> int:
    """The last decode-track snapshot (0: none): the last multiple of the track grid among
    the positions ``input_len + 1 .. input_len + output_len - 1`` (KV exists for input +
    output - 1 tokens; ``SchedulerBatchResultProcessor`` tracks when ``kv_committed_len``
    reaches the grid). At finish SGLang publishes only the last tracked snapshot
    (``MambaComponent._select_finished_checkpoint``)."""
    last = _floor(input_len + max(0, output_len - 1), track_grid)
    return last if last > input_len else 0


def plan_sglang_checkpoints(input_len: int, output_len: int, hit_len: int, branch_len: int,
                            chunk: int = 8192, page: int = 64, grid: int = 64,
                            track_grid: int = 256) -> AdmissionPlan:
    """Every state stock SGLang publishes for one request, and the KV its tree keeps.

    - each unfinished prefill chunk publishes its snapshot (``checkpoint_kv_cache``);
    - the last chunk's snapshot is published too: when the prefill completes if the
      request goes on to decode (``process_batch_result_prefill``), else at finish;
    - at finish the last decode-track snapshot, if any;
    - the tree keeps the sequence only up to the last published state.

    ``branch_len``: ``sglang_branch_point`` of the request's match (0: none)."""
    positions = [s for _, _, s in sglang_prefill_chunks(input_len, hit_len, branch_len, chunk,
                                                        page, grid) if s]
    decode = sglang_decode_snapshot(input_len, output_len, track_grid)
    if decode:
        positions.append(decode)
    cached = positions[-1] if positions else 0
    return AdmissionPlan(tuple(positions), cached,
                         branch_len if branch_len and branch_len in positions else 0)


@dataclass(frozen=True)
class SGLangGrids:
    """Where SGLang 0.5.23 (extra_buffer) can take states: prefill chunks of ``chunk`` tokens
    (--chunked-prefill-size; <= 0: off), the checkpoint ``grid`` (``sglang_grid``), pages
    of ``page`` tokens, decode-track snapshots on ``track_grid`` (``sglang_track_grid``)."""
    chunk: int = 8192
    page: int = 64
    grid: int = 64
    track_grid: int = 256


@dataclass(frozen=True)
class MaterialisedPlan:
    """What Marconi's plan becomes inside SGLang: the states SGLang snapshots that the
    plugin keeps (``intermediate``: the branch point and chunk-boundary states within the
    per-request cap), the end-state candidates it offers (``ends``: the last prefill
    chunk's snapshot and, at finish, the last decode-track snapshot: kept or dropped
    together by the end-state rule), and ``end``, where the request's end state is for the
    ghost index and the end-state reuse rate (0: none beyond the hit)."""
    intermediate: tuple
    ends: tuple
    end: int
    branch: int


def plan_marconi_in_sglang(input_len: int, output_len: int, hit_len: int, branch: int,
                           grids: SGLangGrids, chunk_budget: int) -> MaterialisedPlan:
    """Marconi's admission as the SGLang plugin applies it to the snapshots SGLang takes
    (``sglang_integration.admission_plans``, one decision per snapshot):

    - each prefill chunk snapshots once (``sglang_chunk_snapshot``: the branch point when it
      falls inside the chunk); an unfinished chunk's snapshot is kept if it is the planned
      ``branch`` (``branch_checkpoint``'s), else while ``chunk_budget`` lasts;
    - the last chunk's snapshot (published when the prefill completes) is the branch or an
      end-state candidate; so is the last decode-track snapshot at finish (SGLang publishes
      only the last tracked snapshot)."""
    chunks = sglang_prefill_chunks(input_len, hit_len, branch, grids.chunk, grids.page,
                                   grids.grid)
    intermediate, ends = [], []
    for _, _, snap in chunks[:-1]:
        if snap and snap == branch:
            intermediate.append(snap)
        elif snap and chunk_budget > 0:
            chunk_budget -= 1
            intermediate.append(snap)
    last = chunks[-1][2]
    if last and last == branch:
        intermediate.append(last)
    elif last:
        ends.append(last)
    final = sglang_decode_snapshot(input_len, output_len, grids.track_grid) or last
    if final and final != branch and final not in ends:
        ends.append(final)
    # the end state as ``snapshot_admission.count_end`` sees it first: the last chunk's
    # snapshot, else the final one; the branch snapshot in the end state's place stands
    # for the input's grid-floored end
    end = ends[0] if ends else (_floor(input_len, grids.grid) if final else 0)
    return MaterialisedPlan(tuple(intermediate), tuple(ends), end if end > hit_len else 0,
                            branch if branch in intermediate else 0)
