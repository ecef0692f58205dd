"""Torch versions of the ``sgl_kernel`` CPU ops that SGLang's Qwen3-Next forward calls.

SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``) runs the gated-delta-net (GDN) layers
with five ops from the CPU build of ``sgl_kernel`` (none is on PyPI); the live test
server with the real forward (``MARCONI_CPU_TESTKIT_FORWARD=real``) gets these instead.
Each takes the arguments SGLang passes at its call site and keeps SGLang's state layouts:

- ``causal_conv1d_fn_cpu`` (``gdn_backend.py`` ``_convolve_prefill``): x ``[dim, tokens]``
  of all sequences packed (``query_start_loc``), weight ``[dim, width]``, conv states
  ``[slots, dim, state_len]`` read when ``has_initial_state`` and written in place at
  ``cache_indices`` with the last ``state_len`` inputs; returns ``[dim, tokens]``.
- ``causal_conv1d_update_cpu`` (decode): x ``[batch, dim]`` (or ``[batch, dim, L]``), one
  step per column, states shifted left in place; under speculative verify (a draft chain
  of L steps) also the window after every step, ``intermediate_conv_window[row, t]``
  (SGLang's dense CPU layout ``[rows, steps, dim, K - 1]``), which the accepted step's
  conv state is rolled back to after the verify.
- ``fused_gdn_gating_cpu``: ``g = -exp(A_log) * softplus(a + dt_bias)`` and
  ``beta = sigmoid(b)``, each ``[1, tokens, heads]``.
- ``chunk_gated_delta_rule_cpu`` (``kernels/gdn_triton.py`` ``extend``): the gated delta
  rule over each packed sequence from the pool state ``[slots, HV, V, K]`` at
  ``initial_state_indices``, written back in place. It returns the output, the final
  states and ``h``, the state at the start of every 64-token chunk of every sequence
  (FLA's layout ``[1, chunks, HV, V, K]``), which SGLang's extra_buffer tracking reads
  for a snapshot that is not at the end of the extend (the real CPU kernel returns
  ``h = None``: extra_buffer is not a CPU feature of SGLang; the test plugin enables it).
- ``fused_sigmoid_gating_delta_rule_update_cpu`` (decode): gating plus the recurrent
  update of the pool state, output ``[1, tokens, HV, V]``; under speculative verify
  (``TritonGDNKernel.target_verify``'s call) the state after every draft step goes to
  ``intermediate_states_buffer[row, t]`` and the pool state is left alone
  (``disable_state_update``). Draft chains only (no ``retrieve_parent_token``: SGLang
  passes one for ``--speculative-eagle-topk`` > 1).
- ``TorchNativeAttnBackend.forward_extend`` under speculative verify (SGLang's needs the
  ``extend_prefix_lens`` a verify batch lacks, ``torch_native_backend.py`` 101): its own
  extend path with the drafts as the extend, then any request whose draft mask is not
  causal (NGRAM hangs padding drafts off the root) recomputed with that mask.

The arithmetic of the delta rule is transformers' (``torch_chunk_gated_delta_rule``,
``torch_recurrent_gated_delta_rule``, ``causal_conv1d`` reference in
``models/qwen3_next``); this module adds SGLang's packing, slot indexing, layouts and
in-place state writes. Padded rows (a negative slot index) are skipped, as in the
Triton kernels. Everything runs in fp32 and is cast back to the input dtype.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from sglang.kernels.ops.attention.fla.layernorm_gated import rms_norm_ref
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from transformers.models.qwen3_next.modeling_qwen3_next import (
    torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule)

FLA_CHUNK = 64  # the chunk of SGLang's GDN prefill kernels (``h`` is per chunk)


def _activate(out: torch.Tensor, activation) -> torch.Tensor:
    if activation in (True, "silu", "swish"):
        return F.silu(out)
    if activation in (None, False):
        return out
    raise ValueError(f"causal conv activation {activation!r}: expected silu, swish or None")


def _conv_window(window: torch.Tensor, weight: torch.Tensor, bias, activation,
                 out_len: int) -> torch.Tensor:
    """Depthwise causal conv of ``window`` ``[n, dim, S+L]``: the last ``out_len`` outputs."""
    out = F.conv1d(window, weight.float().unsqueeze(1),
                   None if bias is None else bias.float(), groups=weight.shape[0])
    return _activate(out[..., -out_len:], activation)


def _sequences(cu_seqlens, slots):
    """(index, slot, start, end) of each packed sequence; padded rows (slot < 0) skipped."""
    starts = cu_seqlens.tolist()
    for n in range(len(starts) - 1):
        if int(slots[n]) >= 0:
            yield n, int(slots[n]), starts[n], starts[n + 1]


def causal_conv1d_fn_cpu(x, weight, bias, activation=None, conv_states=None,
                         has_initial_state=None, cache_indices=None, query_start_loc=None,
                         seq_lens_cpu=None, block_table=None, **_):
    if block_table is not None:
        raise NotImplementedError("causal_conv1d_fn_cpu (torch): block_table is not supported")
    dim, width = weight.shape
    state_len = conv_states.shape[-1]
    out = torch.zeros(x.shape, dtype=torch.float32)
    for n, slot, s0, s1 in _sequences(query_start_loc, cache_indices):
        xs = x[:, s0:s1].float()
        prev = (conv_states[slot].float() if has_initial_state is not None
                and bool(has_initial_state[n]) else torch.zeros(dim, state_len))
        window = torch.cat([prev, xs], dim=-1)
        out[:, s0:s1] = _conv_window(window[None], weight, bias, activation, s1 - s0)[0]
        conv_states[slot] = window[:, -state_len:].to(conv_states.dtype)
    return out.to(x.dtype)


def causal_conv1d_update_cpu(x, conv_states, weight, bias=None, activation=None,
                             conv_state_indices=None, intermediate_conv_window=None,
                             intermediate_state_indices=None, retrieve_next_token=None, **_):
    if retrieve_next_token is not None:
        raise NotImplementedError("causal_conv1d_update_cpu (torch): tree verify (draft "
                                  "topk > 1) is not supported, only a draft chain")
    squeeze = x.dim() == 2
    xs = (x[..., None] if squeeze else x).float()          # [batch, dim, L]
    slots = conv_state_indices.long()
    valid = slots >= 0
    prev = torch.zeros(xs.shape[0], *conv_states.shape[1:])
    prev[valid] = conv_states[slots[valid]].float()
    window = torch.cat([prev, xs], dim=-1)
    out = _conv_window(window, weight, bias, activation, xs.shape[-1])
    conv_states[slots[valid]] = window[valid, :, -conv_states.shape[-1]:].to(
        conv_states.dtype)
    if intermediate_conv_window is not None:  # target verify: every step's window kept
        _keep_windows(window, conv_states.shape[-1], intermediate_conv_window,
                      intermediate_state_indices, valid)
    return (out[..., 0] if squeeze else out).to(x.dtype)


def _keep_windows(window, state_len: int, dest, rows, valid) -> None:
    """``dest[row, t]`` <- the last ``K - 1`` inputs after draft step t (the window the
    accepted step's conv state is rolled back to, ``[rows, steps, dim, K - 1]``)."""
    win, steps = dest.shape[-1], window.shape[-1] - state_len
    kept = torch.stack([window[..., state_len + t + 1 - win:state_len + t + 1]
                        for t in range(steps)], dim=1)
    dest[rows.long()[valid], :steps] = kept[valid].to(dest.dtype)


def gdn_gates(A_log, a, b, dt_bias, softplus_beta: float = 1.0,
              softplus_threshold: float = 20.0):
    """``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)`` (fp32)."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float(), beta=softplus_beta,
                                          threshold=softplus_threshold)
    return g, b.float().sigmoid()


def fused_gdn_gating_cpu(A_log, a, b, dt_bias):
    g, beta = gdn_gates(A_log, a, b, dt_bias)
    return g[None], beta[None].to(b.dtype)


def _heads_as_v(t: torch.Tensor, num_v_heads: int) -> torch.Tensor:
    """q/k ``[1, T, H, K]`` repeated to the value heads (head ``i`` serves ``i // (HV/H)``)."""
    return t.float().repeat_interleave(num_v_heads // t.shape[2], dim=2)


def chunk_gated_delta_rule_cpu(q, k, v, g, beta, initial_state, cu_seqlens,
                               head_first=False, use_qk_l2norm_in_kernel=True,
                               initial_state_indices=None, **_):
    if head_first:
        raise NotImplementedError("chunk_gated_delta_rule_cpu: head_first is not supported")
    num_v_heads = v.shape[2]
    q, k = _heads_as_v(q, num_v_heads), _heads_as_v(k, num_v_heads)
    out = torch.zeros(v.shape, dtype=torch.float32)
    finals, chunk_states = [], []
    for _, slot, s0, s1 in _sequences(cu_seqlens, initial_state_indices):
        state = initial_state[slot].float().transpose(-1, -2)[None]  # [1, HV, K, V]
        for c0 in range(s0, s1, FLA_CHUNK):
            chunk_states.append(state[0].transpose(-1, -2).clone())
            c1 = min(c0 + FLA_CHUNK, s1)
            o, state = torch_chunk_gated_delta_rule(
                q[:, c0:c1], k[:, c0:c1], v[:, c0:c1].float(), g[:, c0:c1].float(),
                beta[:, c0:c1].float(), chunk_size=FLA_CHUNK, initial_state=state,
                output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
            out[:, c0:c1] = o
        final = state[0].transpose(-1, -2)
        initial_state[slot] = final.to(initial_state.dtype)
        finals.append(final)
    h = torch.stack(chunk_states)[None] if chunk_states else None
    return out.to(v.dtype), torch.stack(finals), h


def fused_sigmoid_gating_delta_rule_update_cpu(A_log, dt_bias, q, k, v, a, b,
                                               initial_state_source, initial_state_indices,
                                               cu_seqlens, use_qk_l2norm_in_kernel=True,
                                               softplus_beta=1.0, softplus_threshold=20.0,
                                               **extra):
    if extra.get("is_kda") or extra.get("retrieve_parent_token") is not None:
        raise NotImplementedError("fused_sigmoid_gating_delta_rule_update_cpu (torch): GDN "
                                  "decode and chain verify only (no KDA, no draft tree)")
    kept, rows = extra.get("intermediate_states_buffer"), extra.get("intermediate_state_indices")
    num_v_heads = v.shape[2]
    q, k = _heads_as_v(q, num_v_heads), _heads_as_v(k, num_v_heads)
    g, beta = gdn_gates(A_log, a, b, dt_bias, softplus_beta, softplus_threshold)
    out = torch.zeros(v.shape, dtype=torch.float32)
    for n, slot, s0, s1 in _sequences(cu_seqlens, initial_state_indices):
        state = initial_state_source[slot].float().transpose(-1, -2)[None]
        # target verify keeps the state after every draft step (``[row, step, HV, V, K]``)
        for t0, t1 in ([(s0, s1)] if kept is None else [(t, t + 1) for t in range(s0, s1)]):
            o, state = torch_recurrent_gated_delta_rule(
                q[:, t0:t1], k[:, t0:t1], v[:, t0:t1].float(), g[None, t0:t1],
                beta[None, t0:t1], initial_state=state, output_final_state=True,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
            out[:, t0:t1] = o
            if kept is not None:
                kept[int(rows[n]), t0 - s0] = state[0].transpose(-1, -2).to(kept.dtype)
        if not extra.get("disable_state_update", False):
            initial_state_source[slot] = state[0].transpose(-1, -2).to(
                initial_state_source.dtype)
    return out.to(v.dtype)


def fused_rmsnorm_gated_forward(self, x, g, residual=None, prenorm=False,
                                residual_in_fp32=False):
    """``FusedRMSNormGated.forward`` (the GDN output norm): ``rmsnorm(x) * silu(g)`` by
    SGLang's own torch reference ``rms_norm_ref``, which is what the AMX CPU op
    ``fused_rmsnorm_gated_cpu`` computes (a CPU without AMX would run a Triton kernel)."""
    if residual is not None or prenorm or self.activation not in ("silu", "swish"):
        raise NotImplementedError("FusedRMSNormGated (torch): silu gate, no residual only")
    return rms_norm_ref(x, self.weight, self.bias, z=g, eps=self.eps, norm_before_gate=True)


def fused_gate_sigmoid_mul_add(hidden_states, gate_weight, shared_output,
                               final_hidden_states):
    """The MoE block's shared-expert gate (a Triton kernel off AMX):
    ``final += sigmoid(hidden @ gate_weight) * shared``, in place, as SGLang's unfused
    path (``qwen2_moe.py`` ``_forward_shared_experts``) computes it."""
    gate = torch.sigmoid(hidden_states @ gate_weight.reshape(-1, 1))
    final_hidden_states += gate * shared_output


def _track_rows(cache_indices, mamba_track_mask, mamba_track_indices, batch_size,
                check_freed_slots):
    """(source, destination) slots of the rows the track mask selects."""
    mask = mamba_track_mask[:batch_size].bool()
    src = cache_indices[:batch_size].long()[mask]
    dst = mamba_track_indices[:batch_size].long()[mask]
    if check_freed_slots:
        keep = (src >= 0) & (dst >= 0)
        src, dst = src[keep], dst[keep]
    return src, dst


def track_mamba_states_if_needed(conv_states, ssm_states, cache_indices, mamba_track_mask,
                                 mamba_track_indices, batch_size, check_freed_slots=False):
    """extra_buffer's decode snapshot (a Triton kernel in SGLang): copy the running
    slot's conv and SSM state into its track slot, for the rows the mask selects."""
    src, dst = _track_rows(cache_indices, mamba_track_mask, mamba_track_indices,
                           batch_size, check_freed_slots)
    conv_states[dst] = conv_states[src]
    ssm_states[dst] = ssm_states[src]


def track_mamba_states_all_layers(conv_states_pool, ssm_states_pool, cache_indices,
                                  mamba_track_mask, mamba_track_indices, batch_size,
                                  check_freed_slots=False):
    """The same copy for every layer at once (pools ``[layers, slots, ...]``)."""
    src, dst = _track_rows(cache_indices, mamba_track_mask, mamba_track_indices,
                           batch_size, check_freed_slots)
    conv_states_pool[:, dst] = conv_states_pool[:, src]
    ssm_states_pool[:, dst] = ssm_states_pool[:, src]


# SGLang's own (in a dict: HookRegistry re-points module-level names bound to a target)
_NATIVE = {"forward_extend": TorchNativeAttnBackend.forward_extend}


def verify_forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
    """``TorchNativeAttnBackend.forward_extend`` that also serves a speculative verify
    batch (a verify batch carries no ``extend_prefix_lens``: ``torch_native_backend.py``
    101): SGLang's own extend path writes the drafts' K/V at their slots and attends
    causally (prefix = the verified length, ``draft_token_num`` new tokens each); a
    request whose draft mask (``spec_info.custom_mask``, NGRAM's ``[drafts, drafts]``
    ancestor mask on CPU) is not causal, e.g. padding drafts hung off the root, is then
    recomputed with that mask over its prefix."""
    if not forward_batch.forward_mode.is_target_verify():
        return _NATIVE["forward_extend"](self, q, k, v, layer, forward_batch, save_kv_cache)
    spec = forward_batch.spec_info
    steps, bs = spec.draft_token_num, forward_batch.seq_lens.shape[0]
    batch = copy.copy(forward_batch)
    batch.extend_prefix_lens = forward_batch.seq_lens
    batch.extend_seq_lens = torch.full_like(forward_batch.seq_lens, steps)
    batch.seq_lens = forward_batch.seq_lens + steps
    out = _NATIVE["forward_extend"](self, q, k, v, layer, batch, save_kv_cache)
    mask = spec.custom_mask.reshape(-1)[:bs * steps * steps].view(bs, steps, steps).bool()
    causal = torch.ones(steps, steps, dtype=torch.bool).tril()
    k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
    v_cache = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
    q_ = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
    o_ = out.view(-1, layer.tp_q_head_num, layer.v_head_dim)
    for b in range(bs):
        if torch.equal(mask[b], causal):
            continue
        prefix = int(forward_batch.seq_lens[b])
        slots = self.req_to_token_pool.req_to_token[forward_batch.req_pool_indices[b],
                                                    :prefix + steps].long()
        allowed = torch.cat([torch.ones(steps, prefix, dtype=torch.bool), mask[b]], dim=1)
        rows = slice(b * steps, (b + 1) * steps)
        o_[rows] = F.scaled_dot_product_attention(
            q_[rows].movedim(0, 1)[None], k_cache[slots].movedim(0, 1)[None].to(q.dtype),
            v_cache[slots].movedim(0, 1)[None].to(q.dtype), attn_mask=allowed,
            scale=layer.scaling,
            enable_gqa=layer.tp_q_head_num != layer.tp_k_head_num)[0].movedim(0, 1)
    return out


_BACKEND = "sglang.srt.layers.attention.hybrid_linear_attn_backend"
# HookRegistry REPLACE targets -> their torch versions
FORWARD_REPLACEMENTS = {
    f"{_BACKEND}.track_mamba_states_if_needed": track_mamba_states_if_needed,
    f"{_BACKEND}.track_mamba_states_all_layers": track_mamba_states_all_layers,
    "sglang.kernels.ops.attention.fla.fused_norm_gate.FusedRMSNormGated.forward":
        fused_rmsnorm_gated_forward,
    "sglang.srt.models.qwen2_moe.fused_gate_sigmoid_mul_add": fused_gate_sigmoid_mul_add,
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend":
        verify_forward_extend,
}

# module of the stand-in package -> its ops that this module provides
KERNELS = {
    "sgl_kernel.mamba": {
        "causal_conv1d_fn_cpu": causal_conv1d_fn_cpu,
        "causal_conv1d_update_cpu": causal_conv1d_update_cpu,
        "chunk_gated_delta_rule_cpu": chunk_gated_delta_rule_cpu,
    },
    "sgl_kernel.ops": {
        "fused_gdn_gating_cpu": fused_gdn_gating_cpu,
        "fused_sigmoid_gating_delta_rule_update_cpu":
            fused_sigmoid_gating_delta_rule_update_cpu,
    },
}
