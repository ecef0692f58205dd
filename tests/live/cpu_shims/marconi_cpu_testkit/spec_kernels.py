"""Torch versions of the CPU ops SGLang's speculative decoding calls (NGRAM's verify path).

SGLang's CPU engine binds these names from ``sgl_kernel`` (no CPU build on PyPI; the
stand-in package beside this one raises if one is called). They run in the scheduler
process outside the model forward, so the live test server needs them with the forward
replaced as with the real one. Each follows the contract of SGLang's own kernel for the
same op on GPUs (a Triton kernel in the installed package, or a torch path), which is
also what ``tests/test_cpu_kernels.py`` checks them against:

- ``reconstruct_indices_from_tree_mask`` (``sgl_kernel.speculative``;
  ``kernels/ops/speculative/reconstruct_tree.py``): positions and tree links of NGRAM's
  drafts from their ancestor mask;
- ``assign_extend_cache_locs_cpu`` (``kernels/ops/speculative/cache_locs.py``): the KV
  slots of each request's ``[start, end)`` window, packed;
- ``assign_req_to_token_pool_cpu`` (``mem_cache/allocation.py``): the inverse, new slots
  written into ``req_to_token``;
- ``verify_tree_greedy_cpu`` (``kernels/ops/speculative/spec_tree.py``): greedy tree
  verification (accepted path, accepted count, predicted tokens);
- ``fill_accept_out_cache_loc_cpu`` (``kernels/ops/speculative/eagle.py``): the slots of
  the accepted tokens, packed;
- ``copy_all_layer_kv_cache_cpu`` (``kernels/ops/kvcache/cache_move.py``): KV rows moved
  from ``src`` to ``tgt`` slots in every layer's buffer, given raw data pointers and row
  strides in bytes (``MHATokenToKVPool.move_kv_cache``; also called once at start-up).
"""
from __future__ import annotations

import ctypes

import torch


def reconstruct_indices_from_tree_mask(tree_mask, verified_seq_len, positions,
                                       retrieve_index, retrieve_next_token,
                                       retrieve_next_sibling, batch_size, draft_token_num):
    """``tree_mask[b, i, j]``: node j is an ancestor of node i (flat, row-major). Writes
    ``positions = #strict ancestors + verified_seq_len``, ``retrieve_index = b * n + i``,
    the first child (smallest descendant) and the next sibling (-1 for none)."""
    bs, n = int(batch_size), int(draft_token_num)
    if bs == 0:
        return
    mask = tree_mask.reshape(-1)[:bs * n * n].view(bs, n, n).bool()
    node = torch.arange(n, device=mask.device)
    anc = mask & (node[None, :] < node[:, None])[None]           # [b, i, j], j < i
    depth = anc.sum(-1)
    positions.view(-1)[:bs * n].copy_(
        (depth + verified_seq_len[:bs, None].to(depth.dtype)).reshape(-1))
    retrieve_index.view(-1)[:bs * n].copy_(
        (torch.arange(bs, device=mask.device)[:, None] * n + node[None, :]).reshape(-1))
    parent = torch.where(anc, node[None, None, :], -1).max(-1).values         # [b, i]
    child = torch.where(anc, node[None, :, None], n).min(1).values            # [b, tid]
    retrieve_next_token.view(-1)[:bs * n].copy_(
        torch.where(child < n, child, -1).reshape(-1))
    same = ((parent[:, :, None] == parent[:, None, :])
            & (node[:, None] > node[None, :])[None])                       # [b, k, tid]
    sibling = torch.where(same, node[None, :, None], n).min(1).values
    retrieve_next_sibling.view(-1)[:bs * n].copy_(
        torch.where((parent >= 0) & (sibling < n), sibling, -1).reshape(-1))


def _windows(start_offset, end_offset):
    starts = [int(s) for s in start_offset.tolist()]
    ends = [int(e) for e in end_offset.tolist()]
    return starts, ends


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                 out_cache_loc, pool_len):
    """``out_cache_loc`` <- ``req_to_token[req, start:end]`` of each request, packed."""
    starts, ends = _windows(start_offset, end_offset)
    rows = req_to_token.reshape(-1, int(pool_len))
    at = 0
    for req, s, e in zip(req_pool_indices.tolist(), starts, ends):
        out_cache_loc[at:at + e - s] = rows[int(req), s:e].to(out_cache_loc.dtype)
        at += e - s


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                 out_cache_loc, pool_len):
    """``req_to_token[req, start:end]`` <- the request's part of ``out_cache_loc``."""
    starts, ends = _windows(start_offset, end_offset)
    rows = req_to_token.view(-1, int(pool_len))
    at = 0
    for req, s, e in zip(req_pool_indices.tolist(), starts, ends):
        rows[int(req), s:e] = out_cache_loc[at:at + e - s].to(rows.dtype)
        at += e - s


def verify_tree_greedy_cpu(predicts, accept_index, accept_token_num, candidates,
                           retrive_index, retrive_next_token, retrive_next_sibling,
                           target_predict):
    """Walk each request's draft tree from the root: at every depth take the first child
    (then its siblings) whose draft token equals the target's prediction at the last
    accepted node. Writes the accepted nodes' retrieve indices into ``accept_index``
    (the root first, -1 left elsewhere), the number of accepted drafts, and the target's
    token at each accepted node into ``predicts`` (flat over the batch's drafts)."""
    bs, n = candidates.shape
    depth_cap = accept_index.shape[1]
    cand, ridx = candidates.tolist(), retrive_index.tolist()
    nxt, sib = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    target = target_predict.reshape(-1).tolist()
    for b in range(bs):
        last = ridx[b][0]
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, depth_cap):
            cur = nxt[b][cur]
            want = target[last]
            for _ in range(n):  # siblings, at most n (SGLang's kernel's bound)
                if cur == -1 or cand[b][cur] == want:
                    break
                cur = sib[b][cur]
            if cur == -1 or cand[b][cur] != want:
                break
            predicts[last] = want
            accepted += 1
            accept_index[b, accepted] = ridx[b][cur]
            last = ridx[b][cur]
        accept_token_num[b] = accepted
        predicts[last] = target[last]


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    """``accept_out_cache_loc[:m]`` <- ``out_cache_loc`` at the m accepted indices (the
    entries of ``accept_index`` other than -1, in order)."""
    flat = accept_index.reshape(-1).long()
    picked = out_cache_loc[flat[flat != -1]]
    accept_out_cache_loc[:picked.numel()] = picked.to(accept_out_cache_loc.dtype)


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For every buffer (``data_ptrs[i]`` its address, ``strides[i]`` its row in bytes):
    rows ``src_loc`` copied onto rows ``tgt_loc`` (all read before any is written, as
    SGLang's tiled kernel, which is safe for overlapping moves)."""
    tgt, src = tgt_loc.reshape(-1).long(), src_loc.reshape(-1).long()
    if tgt.numel() == 0:
        return
    if tgt.numel() != src.numel():
        raise ValueError(f"copy_all_layer_kv_cache_cpu: {tgt.numel()} targets for "
                         f"{src.numel()} sources")
    rows_needed = int(torch.maximum(tgt.max(), src.max())) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        raw = (ctypes.c_uint8 * (rows_needed * int(stride))).from_address(int(ptr))
        rows = torch.frombuffer(raw, dtype=torch.uint8).view(rows_needed, int(stride))
        rows[tgt] = rows[src].clone()


def _scatter_rows(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw):
    """``dst[:, dst_idx[i]] = src[:, src_idx[i], step[i]]`` for every request i whose
    step is >= 0 and whose indices are in range (SGLang's kernels skip the others)."""
    steps = step_indices_raw.reshape(-1).long()
    dsts = dst_indices_raw.reshape(-1).long()
    srcs = (torch.arange(steps.numel(), device=steps.device) if src_indices_raw is None
            else src_indices_raw.reshape(-1).long())
    if not (dsts.numel() == steps.numel() == srcs.numel()):
        raise ValueError(f"state scatter: {dsts.numel()} destinations, {steps.numel()} "
                         f"steps, {srcs.numel()} sources")
    keep = ((steps >= 0) & (dsts >= 0) & (dsts < dst.shape[1]) & (srcs >= 0)
            & (srcs < src.shape[1]) & (steps < src.shape[2]))
    if bool(keep.any()):
        dst[:, dsts[keep]] = src[:, srcs[keep], steps[keep]].to(dst.dtype)


def fused_mamba_state_scatter_with_mask(dst, src, dst_indices_raw, step_indices_raw,
                                        src_indices_raw=None):
    """The SSM state of each request's accepted verify step committed to its slot
    (``kernels/ops/mamba/mamba_state_scatter_triton.py``; ``dst [layers, slots, ...]``,
    ``src [layers, requests, draft steps, ...]``)."""
    _scatter_rows(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw)


def fused_conv_window_scatter_with_mask(dst, src, dst_indices_raw, step_indices_raw,
                                        src_indices_raw=None):
    """The conv window of each request's accepted verify step committed to its slot
    (``src`` may be an overlapping strided view: indexing reads through its strides)."""
    if dst.numel():
        _scatter_rows(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw)


def fused_conv_window_scatter_multi(pairs, dst_indices_raw, step_indices_raw,
                                    dst_indices2_raw=None, step_indices2_raw=None):
    """``fused_conv_window_scatter_with_mask`` over several (dst, src) conv pairs and up
    to two request-index sets (the accept commit, then the track slots)."""
    for dst, src in pairs:
        fused_conv_window_scatter_with_mask(dst, src, dst_indices_raw, step_indices_raw)
        if step_indices2_raw is not None:
            fused_conv_window_scatter_with_mask(dst, src, dst_indices2_raw,
                                                step_indices2_raw)


# sgl_kernel module -> the names served in place of its loud stand-ins
KERNELS = {
    "sgl_kernel": {
        "assign_extend_cache_locs_cpu": assign_extend_cache_locs_cpu,
        "assign_req_to_token_pool_cpu": assign_req_to_token_pool_cpu,
        "verify_tree_greedy_cpu": verify_tree_greedy_cpu,
        "fill_accept_out_cache_loc_cpu": fill_accept_out_cache_loc_cpu,
        "copy_all_layer_kv_cache_cpu": copy_all_layer_kv_cache_cpu,
    },
    "sgl_kernel.speculative": {
        "reconstruct_indices_from_tree_mask": reconstruct_indices_from_tree_mask,
    },
}

# the modules that bind these names at import (``from sgl_kernel import ...``), often
# before the plugin runs: their bindings are replaced (HookRegistry REPLACE)
_OPS = "sglang.kernels.ops"
BINDINGS = {
    f"{_OPS}.kvcache.cache_move.copy_all_layer_kv_cache_cpu": copy_all_layer_kv_cache_cpu,
    "sglang.srt.mem_cache.allocation.assign_req_to_token_pool_cpu":
        assign_req_to_token_pool_cpu,
    f"{_OPS}.speculative.cache_locs.assign_extend_cache_locs_cpu":
        assign_extend_cache_locs_cpu,
    f"{_OPS}.speculative.spec_tree.sgl_verify_tree_greedy_cpu": verify_tree_greedy_cpu,
    f"{_OPS}.speculative.eagle.fill_accept_out_cache_loc_cpu": fill_accept_out_cache_loc_cpu,
    f"{_OPS}.speculative.reconstruct_tree.reconstruct_indices_from_tree_mask":
        reconstruct_indices_from_tree_mask,
    # CUDA/XPU-only Triton kernels (they raise on CPU tensors)
    f"{_OPS}.mamba.mamba_state_scatter_triton.fused_mamba_state_scatter_with_mask":
        fused_mamba_state_scatter_with_mask,
    f"{_OPS}.mamba.mamba_state_scatter_triton.fused_conv_window_scatter_with_mask":
        fused_conv_window_scatter_with_mask,
    f"{_OPS}.mamba.mamba_state_scatter_triton.fused_conv_window_scatter_multi":
        fused_conv_window_scatter_multi,
}
