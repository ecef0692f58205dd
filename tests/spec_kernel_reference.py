"""SGLang's own kernels for speculative decoding's ops, run on CPU tensors by Triton's
interpreter: the reference ``tests/test_cpu_kernels.py`` holds the test kit's torch
versions (``cpu_shims/marconi_cpu_testkit/spec_kernels.py``) to.

``python tests/spec_kernel_reference.py CASES OUT`` (with ``TRITON_INTERPRET=1``, which
must be set before Triton decorates the kernels, hence a process of its own): loads the
inputs (``torch.save``d dict of cases), runs on each the installed SGLang's GPU path for
the op (the Triton kernel and, where it has one, its Python wrapper) and saves the
outputs. The wrappers that refuse CPU tensors (the Mamba state scatters check
``is_cuda``) see them as device tensors here, and ``torch.cpu.device`` is a no-op context
(the Mamba2 update's wrapper enters it): this process only runs the reference.
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import torch

SHIMS = Path(__file__).resolve().parent / "live" / "cpu_shims"


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def tree(c):
    from sglang.kernels.ops.speculative.reconstruct_tree import (
        reconstruct_indices_from_tree_mask_triton)

    bs, n = c["bs"], c["n"]
    out = {k: torch.full((bs, n), -7, dtype=torch.int64)
           for k in ("retrieve_index", "retrieve_next_token", "retrieve_next_sibling")}
    out["positions"] = torch.full((bs * n,), -7, dtype=torch.int64)
    reconstruct_indices_from_tree_mask_triton(
        c["tree_mask"], c["seq_lens"], out["positions"], out["retrieve_index"],
        out["retrieve_next_token"], out["retrieve_next_sibling"], bs, n)
    return out


def verify(c):
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    bs, n = c["candidates"].shape
    out = {"predicts": torch.zeros(bs * n, dtype=torch.int32),
           "accept_index": torch.full((bs, c["depth"]), -1, dtype=torch.int32),
           "accept_token_num": torch.zeros(bs, dtype=torch.int32)}
    verify_tree_greedy_triton(out["predicts"], out["accept_index"], out["accept_token_num"],
                              c["candidates"], c["retrieve_index"], c["retrieve_next_token"],
                              c["retrieve_next_sibling"], c["target_predict"])
    return out


def extend_locs(c):
    from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs

    bs = c["req_pool_indices"].numel()
    out = torch.full((int((c["end"] - c["start"]).sum()),), -7, dtype=torch.int64)
    assign_extend_cache_locs[(bs,)](c["req_pool_indices"], c["req_to_token"], c["start"],
                                    c["end"], out, c["req_to_token"].shape[1], _pow2(bs))
    return {"out_cache_loc": out}


def assign_req_to_token(c):
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool

    bs = c["req_pool_indices"].numel()
    r2t = c["req_to_token"].clone()
    assign_req_to_token_pool[(bs,)](c["req_pool_indices"], r2t, c["start"], c["end"],
                                    c["out_cache_loc"], r2t.shape[1], _pow2(bs))
    return {"req_to_token": r2t}


def accept_locs(c):
    from sglang.kernels.ops.speculative.eagle import fill_accept_out_cache_loc

    size = c["accept_index"].numel()
    out = torch.full((size,), -7, dtype=torch.int64)
    fill_accept_out_cache_loc[(size,)](c["accept_index"], c["out_cache_loc"], out,
                                       _pow2(size))
    return {"accept_out_cache_loc": out}


def state_scatter(c):
    from sglang.kernels.ops.mamba import mamba_state_scatter_triton as ms

    dst = c["dst"].clone()
    ms.fused_mamba_state_scatter_with_mask(dst, c["src"], c["dst_indices"], c["steps"],
                                           c.get("src_indices"))
    return {"dst": dst}


def conv_scatter(c):
    from sglang.kernels.ops.mamba import mamba_state_scatter_triton as ms

    dst = c["dst"].clone()
    ms.fused_conv_window_scatter_with_mask(dst, _window_view(c), c["dst_indices"],
                                           c["steps"], c.get("src_indices"))
    return {"dst": dst}


def _window_view(c):
    """The deduplicated conv-window cache SGLang keeps during verify: per (layer, request)
    one ``[dim, steps + K - 2]`` buffer, step t's window its columns ``t .. t + K - 2``."""
    shared = c["shared"]
    layers, reqs, dim, width = shared.shape
    km1 = c["dst"].shape[3]
    steps = width - km1 + 1
    s = shared.stride()
    return shared.as_strided((layers, reqs, steps, dim, km1), (s[0], s[1], s[3], s[2], s[3]))


def conv_verify(c):
    """The causal conv over each row's draft steps, every step's window kept."""
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

    states, windows = c["conv_states"].clone(), c["windows"].clone()
    out = causal_conv1d_update(c["x"].clone(), states, c["weight"], c["bias"], "silu",
                               conv_state_indices=c["slots"], intermediate_conv_window=windows,
                               intermediate_state_indices=c["rows"])
    return {"out": out, "conv_states": states, "windows": windows}


def gdn_verify(c):
    """The gated delta rule over each request's draft steps (``TritonGDNKernel
    .target_verify``'s call): the state after every step kept, the pool left alone."""
    from sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update)

    pool, kept = c["pool"].clone(), c["kept"].clone()
    out = fused_sigmoid_gating_delta_rule_update(
        A_log=c["A_log"], dt_bias=c["dt_bias"], q=c["q"], k=c["k"], v=c["v"], a=c["a"],
        b=c["b"], initial_state_source=pool, initial_state_indices=c["slots"],
        cu_seqlens=c["cu_seqlens"], use_qk_l2norm_in_kernel=True, softplus_beta=1.0,
        softplus_threshold=20.0, is_kda=False, disable_state_update=True,
        intermediate_states_buffer=kept, intermediate_state_indices=c["rows"],
        cache_steps=c["steps"], retrieve_parent_token=None)
    return {"out": out, "pool": pool, "kept": kept}


def mamba_verify(c):
    """The Mamba2 selective state update over each row's draft steps (the mixer's
    target-verify call)."""
    from sglang.kernels.ops.mamba.triton_ops.mamba_ssm import selective_state_update

    pool, kept = c["pool"].clone(), c["kept"].clone()
    out = torch.zeros_like(c["x"])
    selective_state_update(pool, c["x"], c["dt"], c["A"], c["B"], c["C"], c["D"], z=None,
                           dt_bias=c["dt_bias"], dt_softplus=True,
                           state_batch_indices=c["slots"], out=out, disable_state_update=True,
                           intermediate_states_buffer=kept, cache_steps=c["x"].shape[1],
                           intermediate_state_indices=c["rows"])
    return {"out": out, "pool": pool, "kept": kept}


KINDS = {"tree": tree, "verify": verify, "extend_locs": extend_locs,
         "assign_req_to_token": assign_req_to_token, "accept_locs": accept_locs,
         "state_scatter": state_scatter, "conv_scatter": conv_scatter,
         "conv_verify": conv_verify, "gdn_verify": gdn_verify, "mamba_verify": mamba_verify}


def main(cases_path: str, out_path: str) -> int:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("spec_kernel_reference: run with TRITON_INTERPRET=1")
    sys.path.insert(0, str(SHIMS))  # the sgl_kernel stand-in (reconstruct_tree imports it)
    # the state scatters' wrappers refuse non-device tensors; here they run interpreted
    torch.Tensor.is_cuda = property(lambda self: True)
    # and the Mamba2 update's wrapper enters the tensors' device context
    torch.cpu.device = lambda index=None: contextlib.nullcontext()
    cases = torch.load(cases_path)
    torch.save({name: KINDS[case["kind"]](case) for name, case in cases.items()}, out_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
