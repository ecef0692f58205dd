"""Torch versions of the Triton kernels SGLang's Nemotron-H (Mamba2) forward calls on CPU.

SGLang 0.5.23 runs ``MambaMixer2`` (``layers/attention/mamba/mamba.py``) on CUDA/NPU/XPU
only: on CPU the module never binds its causal-conv names (a ``NameError`` when called),
and its SSM scans are Triton kernels. The live test server with the real forward
(``MARCONI_CPU_TESTKIT_FORWARD=real``) gets these instead, with the arguments SGLang passes
at its call sites and SGLang's state layouts:

- ``causal_conv1d_fn`` / ``causal_conv1d_update`` (and the ``_triton`` names the mixer
  picks with ``use_triton_causal_conv=True``, which Nemotron-H passes): the same packed
  causal conv as the GDN ops (``torch_kernels.causal_conv1d_fn_cpu`` /
  ``causal_conv1d_update_cpu``): conv states ``[slots, dim, width - 1]``, read when
  ``has_initial_state``, written in place at the sequence's slot.
- ``mamba_chunk_scan_combined`` (prefill, ``ssd_combined.py``): the Mamba2 scan over every
  packed sequence (``cu_seqlens``) from its initial state, output written in place into
  ``out``; returns what the mixer unpacks with ``return_varlen_states=True,
  return_track_states=True``: ``h`` (the state at every ``chunk_size`` boundary of the
  packed token stream, FLA/Triton layout ``[1, chunks, H, P, N]``: entry 0 is sequence 0's
  initial state, entry ``c`` the state after packed position ``c * chunk_size`` of the
  sequence holding token ``c * chunk_size - 1``, as the Triton state-passing kernel
  stores it), the final state of every sequence ``[seqs, H, P, N]``, and the states at
  ``track_end_locs`` (packed positions) of sequences ``track_seq_idx``
  ``[1, tracks, H, P, N]`` (extra_buffer snapshots off the chunk grid), or None.
- ``selective_state_update`` (decode): one step of every row from the pool state
  ``[slots, H, P, N]`` at ``state_batch_indices``, written back in place; padded rows
  (slot -1) skipped. Speculative verify (inputs ``[rows, steps, ...]``): the steps one
  after the other, each step's state kept in ``intermediate_states_buffer``, the pool
  left alone (draft chains only).

The scan is the Mamba2 recurrence token by token, in fp32: ``dt = softplus(dt + dt_bias)``
clamped to ``dt_limit``, ``S <- exp(dt A) S + dt x B^T``, ``y = S C + D x`` (times
``silu(z)`` when given), B and C shared by the heads of a group. Token by token, a state
resumed from a checkpoint continues exactly as one pass would (split-invariant); the
chunked SSD form of the Triton kernels regroups the same sums. Checked against mamba-ssm's
references in ``tests/test_cpu_kernels.py``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from marconi_cpu_testkit.torch_kernels import causal_conv1d_fn_cpu, causal_conv1d_update_cpu

PAD_SLOT_ID = -1


def _discretised_dt(dt, dt_bias, dt_softplus: bool, dt_limit) -> torch.Tensor:
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    if dt_softplus:
        dt = F.softplus(dt)
    lo, hi = dt_limit
    return dt.clamp(min=lo, max=hi) if (lo, hi) != (0.0, float("inf")) else dt


def _per_head(t: torch.Tensor, heads: int) -> torch.Tensor:
    """B or C ``[..., groups, N]`` -> ``[..., heads, N]`` (head ``i`` in group ``i // (H/G)``)."""
    return t.float().repeat_interleave(heads // t.shape[-2], dim=-2)


def _scan(state, x, dt, A, B, C, D, z, capture=()):
    """The recurrence over one sequence from ``state`` ``[H, P, N]`` (fp32).
    x ``[T, H, P]``, dt ``[T, H]`` (discretised), B, C ``[T, H, N]``. Returns
    (y ``[T, H, P]``, final state, {t: state after the first t tokens for t in capture})."""
    dA = torch.exp(dt * A.float())                                   # [T, H]
    dBx = (dt[..., None] * x.float())[..., None] * B[:, :, None, :]  # [T, H, P, N]
    ys, captured = [], {t: state.clone() for t in capture if t == 0}
    for t in range(x.shape[0]):
        state = state * dA[t, :, None, None] + dBx[t]
        ys.append(torch.einsum("hpn,hn->hp", state, C[t]))
        if t + 1 in capture:
            captured[t + 1] = state.clone()
    y = torch.stack(ys) if ys else x.new_zeros(x.shape, dtype=torch.float32)
    if D is not None:
        y = y + x.float() * (D.float()[:, None] if D.dim() == 1 else D.float())
    if z is not None:
        y = y * F.silu(z.float())
    return y, state, captured


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                              initial_states=None, seq_idx=None, chunk_indices=None,
                              chunk_offsets=None, cu_seqlens=None, dt_softplus=False,
                              dt_limit=(0.0, float("inf")), out=None,
                              return_final_states=False, return_varlen_states=False,
                              return_intermediate_states=False, state_dtype=None,
                              return_track_states=False, track_seq_idx=None,
                              track_end_locs=None):
    if cu_seqlens is None or not return_varlen_states or x.shape[0] != 1:
        raise NotImplementedError("mamba_chunk_scan_combined (torch): packed varlen prefill "
                                  "only (batch 1, cu_seqlens, return_varlen_states)")
    if return_final_states:
        raise NotImplementedError("mamba_chunk_scan_combined (torch): no return_final_states")
    total, heads, head_dim = x.shape[1:]
    dstate = B.shape[-1]
    dt = _discretised_dt(dt[0], dt_bias, dt_softplus, dt_limit)      # [T, H]
    Bh, Ch = _per_head(B[0], heads), _per_head(C[0], heads)
    starts = cu_seqlens.tolist()
    tracks: dict = {}
    if return_track_states and track_end_locs is not None and track_end_locs.numel():
        for j, (n, end) in enumerate(zip(track_seq_idx.tolist(), track_end_locs.tolist())):
            tracks.setdefault(n, []).append((j, end - starts[n]))
    n_chunks = -(-total // chunk_size)
    zero = torch.zeros(heads, head_dim, dstate)
    h = torch.zeros(n_chunks, heads, head_dim, dstate)
    y_all = torch.zeros(total, heads, head_dim)
    finals, tracked = [], [None] * sum(len(v) for v in tracks.values())
    for n in range(len(starts) - 1):
        s0, s1 = starts[n], starts[n + 1]
        init = zero if initial_states is None else initial_states[n].float()
        if n == 0:
            h[0] = init
        # chunk boundaries c * chunk_size inside (s0, s1]: h[c] belongs to this sequence
        bounds = {c * chunk_size - s0: c for c in range(s0 // chunk_size + 1, n_chunks)
                  if s0 < c * chunk_size <= s1}
        capture = set(bounds) | {t for _, t in tracks.get(n, [])}
        y, final, captured = _scan(init.clone(), x[0, s0:s1], dt[s0:s1], A, Bh[s0:s1],
                                   Ch[s0:s1], D, None if z is None else z[0, s0:s1],
                                   capture)
        y_all[s0:s1] = y
        finals.append(final)
        for t, c in bounds.items():
            h[c] = captured[t]
        for j, t in tracks.get(n, []):
            tracked[j] = captured[t]
    out_dtype = state_dtype if state_dtype is not None else C.dtype
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype)
    out.copy_(y_all[None].to(out.dtype))
    varlen = torch.stack(finals).to(out_dtype) if finals else zero[:0]
    states = h[None].to(out_dtype)
    if return_track_states:
        track = torch.stack(tracked)[None].to(out_dtype) if tracked else None
        return states, varlen, track
    if return_intermediate_states:
        return states, varlen
    return varlen


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None,
                           dt_softplus=False, state_batch_indices=None,
                           pad_slot_id=PAD_SLOT_ID, out=None, disable_state_update=False,
                           intermediate_states_buffer=None, cache_steps=None,
                           retrieve_parent_token=None, intermediate_state_indices=None):
    """One decode step per row: x, dt ``[batch, H, P]``, A ``[H, P, N]``, B, C
    ``[batch, G, N]``, D, dt_bias ``[H, P]``; pool ``state`` ``[slots, H, P, N]``.
    Speculative verify (x, dt ``[batch, steps, H, P]``, B, C ``[batch, steps, G, N]``): the
    steps of each row's draft chain one after the other, the state after step t kept in
    ``intermediate_states_buffer[intermediate_state_indices[row], t]``, the pool state left
    as it was with ``disable_state_update``."""
    if x.dim() == 4:
        if retrieve_parent_token is not None:
            raise NotImplementedError("selective_state_update (torch): draft trees (topk > 1)")
        return _verify_steps(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                             state_batch_indices, pad_slot_id, out, disable_state_update,
                             intermediate_states_buffer, intermediate_state_indices)
    if disable_state_update or intermediate_states_buffer is not None or x.dim() != 3:
        raise NotImplementedError("selective_state_update (torch): plain decode or verify "
                                  "of [batch, steps, heads, dim] inputs only")
    heads = x.shape[1]
    dt = _discretised_dt(dt, dt_bias, dt_softplus, (0.0, float("inf")))   # [b, H, P]
    Bh, Ch = _per_head(B, heads), _per_head(C, heads)                     # [b, H, N]
    rows = (range(x.shape[0]) if state_batch_indices is None else
            [r for r, s in enumerate(state_batch_indices.tolist()) if s != pad_slot_id])
    result = torch.zeros(x.shape, dtype=torch.float32)
    for r in rows:
        slot = r if state_batch_indices is None else int(state_batch_indices[r])
        s = state[slot].float() * torch.exp(dt[r, ..., None] * A.float()) + (
            (dt[r] * x[r].float())[..., None] * Bh[r][:, None, :])
        y = torch.einsum("hpn,hn->hp", s, Ch[r])
        if D is not None:
            y = y + x[r].float() * D.float()
        if z is not None:
            y = y * F.silu(z[r].float())
        result[r] = y
        state[slot] = s.to(state.dtype)
    if out is None:
        return result.to(x.dtype)
    out.copy_(result.to(out.dtype))
    return None


def _verify_steps(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                  pad_slot_id, out, disable_state_update, kept, kept_rows):
    """``selective_state_update`` over ``steps`` tokens per row (a verify batch)."""
    slots = (torch.arange(x.shape[0]) if state_batch_indices is None
             else state_batch_indices.long())
    scratch = state[slots.clamp(min=0)].clone()  # rows' states, stepped here
    result = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[1]):
        step_out = torch.zeros(x[:, t].shape, dtype=x.dtype)
        selective_state_update(scratch, x[:, t], dt[:, t], A, B[:, t], C[:, t], D,
                               None if z is None else z[:, t], dt_bias, dt_softplus,
                               out=step_out)
        result[:, t] = step_out.float()
        if kept is not None:
            for r in range(x.shape[0]):
                if int(slots[r]) != pad_slot_id:
                    kept[int(kept_rows[r]), t] = scratch[r].to(kept.dtype)
    if not disable_state_update:
        live = slots != pad_slot_id
        state[slots[live]] = scratch[live].to(state.dtype)
    if out is None:
        return result.to(x.dtype)
    out.copy_(result.to(out.dtype))
    return None


_MIXER = "sglang.srt.layers.attention.mamba.mamba"
# HookRegistry REPLACE targets (names the mixer module imports from Triton)
FORWARD_REPLACEMENTS = {
    f"{_MIXER}.mamba_chunk_scan_combined": mamba_chunk_scan_combined,
    f"{_MIXER}.selective_state_update": selective_state_update,
}
# names the mixer module binds on CUDA/NPU/XPU only (absent on CPU, so not hookable):
# set on the module
MODULE_BINDINGS = {
    _MIXER: {
        "causal_conv1d_fn": causal_conv1d_fn_cpu,
        "causal_conv1d_update": causal_conv1d_update_cpu,
        "causal_conv1d_fn_triton": causal_conv1d_fn_cpu,
        "causal_conv1d_update_triton": causal_conv1d_update_cpu,
    },
}
