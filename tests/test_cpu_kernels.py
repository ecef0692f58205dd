"""The torch versions of SGLang's ``sgl_kernel`` GDN CPU ops (tests/live/cpu_shims/
marconi_cpu_testkit/torch_kernels.py) and of the Mamba2 mixer's Triton kernels
(``mamba2_kernels.py``) against independent references, fp32, random inputs.

References: a naive per-token gated delta rule written here (SGLang's state layout
``[HV, V, K]``), ``F.conv1d`` over the whole sequence for the causal conv, the closed form
of the gates; for Mamba2, mamba-ssm's chunked ``ssd_minimal_discrete`` and
``selective_state_update_ref`` and causal-conv1d's ``causal_conv1d_ref`` /
``causal_conv1d_update_ref`` (loaded from their files,
``sglang_marconi.exact.ssd_reference``). Every op is also checked on packed batches with
slot indirection and in split-and-resume form (the state written by one call, read by
the next, equals one pass), which is what a prefix-cache hit does.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang")
import torch.nn.functional as F  # noqa: E402

SHIMS = Path(__file__).resolve().parent / "live" / "cpu_shims"
if str(SHIMS) not in sys.path:
    sys.path.insert(0, str(SHIMS))

from marconi_cpu_testkit import mamba2_kernels as m2  # noqa: E402
from marconi_cpu_testkit import torch_kernels as tk  # noqa: E402

from sglang_marconi.exact import ssd_reference as ssd_reference_module  # noqa: E402

H, HV, K, V = 2, 4, 16, 8          # q/k heads, value heads, key dim, value dim
DIM, WIDTH = 24, 4                  # conv channels, conv kernel width
TOL = dict(rtol=1e-5, atol=1e-5)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def naive_gated_delta_rule(q, k, v, g, beta, state):
    """Per token: S <- exp(g) S; S <- S + beta (v - S k) k^T; o = S q (q, k l2-normalised,
    q scaled by K^-1/2). q, k ``[T, H, K]``, v ``[T, HV, V]``, g, beta ``[T, HV]``,
    state ``[HV, V, K]``. Returns (o ``[T, HV, V]``, final state)."""
    rep = HV // q.shape[1]
    q = F.normalize(q.double(), dim=-1, eps=0).repeat_interleave(rep, 1) * K ** -0.5
    k = F.normalize(k.double(), dim=-1, eps=0).repeat_interleave(rep, 1)
    s = state.double().clone()
    out = []
    for t in range(q.shape[0]):
        s = s * g[t].double().exp()[:, None, None]
        pred = torch.einsum("hvk,hk->hv", s, k[t])
        s = s + torch.einsum("hv,hk->hvk", (v[t].double() - pred) * beta[t].double()[:, None],
                             k[t])
        out.append(torch.einsum("hvk,hk->hv", s, q[t]))
    o = torch.stack(out) if out else torch.zeros(0, HV, V)
    return o.float(), s.float()


def _gdn_inputs(n: int, seed: int):
    gen = _gen(seed)
    q = torch.randn(1, n, H, K, generator=gen)
    k = torch.randn(1, n, H, K, generator=gen)
    v = torch.randn(1, n, HV, V, generator=gen)
    a = torch.randn(n, HV, generator=gen)
    b = torch.randn(n, HV, generator=gen)
    A_log = torch.rand(HV, generator=gen).log()
    dt_bias = torch.randn(HV, generator=gen) * 0.5
    return q, k, v, a, b, A_log, dt_bias


def test_gdn_gating_matches_the_closed_form():
    _, _, _, a, b, A_log, dt_bias = _gdn_inputs(50, 0)
    a[0, 0] = 30.0  # above softplus's threshold: linear branch
    g, beta = tk.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    x = a + dt_bias
    softplus = torch.where(x <= 20, torch.log1p(torch.exp(x)), x)
    assert g.shape == beta.shape == (1, 50, HV) and g.dtype == torch.float32
    torch.testing.assert_close(g[0], -A_log.exp() * softplus, **TOL)
    torch.testing.assert_close(beta[0], 1 / (1 + torch.exp(-b)), **TOL)
    assert (g <= 0).all()


@pytest.mark.parametrize("lens", [(1,), (70,), (64, 5, 130)])
def test_chunk_rule_matches_the_naive_recurrence_on_packed_slots(lens):
    """Packed sequences (cu_seqlens) on pool slots 3, 0, 5 with random initial states: the
    output and the state written back into each slot equal the naive recurrence, the
    other slots stay untouched, ``h`` holds the state at every 64-token chunk start."""
    n = sum(lens)
    q, k, v, a, b, A_log, dt_bias = _gdn_inputs(n, 1)
    g, beta = tk.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    pool = torch.randn(8, HV, V, K, generator=_gen(2)) * 0.3
    before = pool.clone()
    slots = torch.tensor([3, 0, 5][:len(lens)], dtype=torch.int32)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    out, finals, h = tk.chunk_gated_delta_rule_cpu(
        q=q, k=k, v=v, g=g, beta=beta, initial_state=pool, cu_seqlens=cu, head_first=False,
        use_qk_l2norm_in_kernel=True, initial_state_indices=slots)
    assert out.shape == v.shape
    n_chunks = [(n_i + 63) // 64 for n_i in lens]
    assert h.shape == (1, sum(n_chunks), HV, V, K)
    chunk = 0
    for i, (s0, s1) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        ref_o, ref_s = naive_gated_delta_rule(q[0, s0:s1], k[0, s0:s1], v[0, s0:s1],
                                              g[0, s0:s1], beta[0, s0:s1], before[slots[i]])
        torch.testing.assert_close(out[0, s0:s1], ref_o, **TOL)
        torch.testing.assert_close(pool[slots[i]], ref_s, **TOL)
        torch.testing.assert_close(finals[i], ref_s, **TOL)
        for c in range(n_chunks[i]):
            _, at_c = naive_gated_delta_rule(
                q[0, s0:s0 + 64 * c], k[0, s0:s0 + 64 * c], v[0, s0:s0 + 64 * c],
                g[0, s0:s0 + 64 * c], beta[0, s0:s0 + 64 * c], before[slots[i]])
            torch.testing.assert_close(h[0, chunk], at_c, **TOL)
            chunk += 1
    untouched = [j for j in range(8) if j not in slots.tolist()]
    assert torch.equal(pool[untouched], before[untouched])


def test_chunk_rule_matches_transformers_recurrent_reference():
    """A second, independent reference: transformers' token-by-token
    ``torch_recurrent_gated_delta_rule`` (state ``[K, V]``, so transposed)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import \
        torch_recurrent_gated_delta_rule  # heavy: transformers' model module

    q, k, v, a, b, A_log, dt_bias = _gdn_inputs(90, 3)
    g, beta = tk.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    pool = torch.randn(2, HV, V, K, generator=_gen(4)) * 0.3
    init = pool[1].clone()
    out, _, _ = tk.chunk_gated_delta_rule_cpu(
        q=q, k=k, v=v, g=g, beta=beta, initial_state=pool,
        cu_seqlens=torch.tensor([0, 90], dtype=torch.int32), head_first=False,
        use_qk_l2norm_in_kernel=True, initial_state_indices=torch.tensor([1]))
    ref_o, ref_s = torch_recurrent_gated_delta_rule(
        q.repeat_interleave(2, 2), k.repeat_interleave(2, 2), v, g, beta,
        initial_state=init.transpose(-1, -2)[None], output_final_state=True,
        use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(out, ref_o, **TOL)
    torch.testing.assert_close(pool[1], ref_s[0].transpose(-1, -2), **TOL)


def test_split_prefill_then_decode_equals_one_pass():
    """Prefill 0..37 and 37..70 on one slot, then three decode steps (the recurrent op,
    with its own gating) equal one naive pass over all 73 tokens: outputs and state."""
    q, k, v, a, b, A_log, dt_bias = _gdn_inputs(73, 5)
    g, beta = tk.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    pool = torch.zeros(4, HV, V, K)
    slot = torch.tensor([2], dtype=torch.int32)
    outs = []
    for s0, s1 in ((0, 37), (37, 70)):
        o, _, _ = tk.chunk_gated_delta_rule_cpu(
            q=q[:, s0:s1], k=k[:, s0:s1], v=v[:, s0:s1], g=g[:, s0:s1], beta=beta[:, s0:s1],
            initial_state=pool, cu_seqlens=torch.tensor([0, s1 - s0], dtype=torch.int32),
            head_first=False, use_qk_l2norm_in_kernel=True, initial_state_indices=slot)
        outs.append(o[0])
    for t in range(70, 73):
        o = tk.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log=A_log, dt_bias=dt_bias, q=q[:, t:t + 1], k=k[:, t:t + 1], v=v[:, t:t + 1],
            a=a[t:t + 1], b=b[t:t + 1], initial_state_source=pool, initial_state_indices=slot,
            cu_seqlens=torch.tensor([0, 1], dtype=torch.int32), use_qk_l2norm_in_kernel=True,
            softplus_beta=1.0, softplus_threshold=20.0)
        assert o.shape == (1, 1, HV, V)
        outs.append(o[0])
    ref_o, ref_s = naive_gated_delta_rule(q[0], k[0], v[0], g[0], beta[0], torch.zeros(HV, V, K))
    torch.testing.assert_close(torch.cat(outs), ref_o, **TOL)
    torch.testing.assert_close(pool[2], ref_s, **TOL)


def test_batched_decode_skips_padded_rows():
    q, k, v, a, b, A_log, dt_bias = _gdn_inputs(3, 6)
    g, beta = tk.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    pool = torch.randn(5, HV, V, K, generator=_gen(7))
    before = pool.clone()
    slots = torch.tensor([4, -1, 1], dtype=torch.int32)
    o = tk.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=pool,
        initial_state_indices=slots, cu_seqlens=torch.arange(4, dtype=torch.int32),
        use_qk_l2norm_in_kernel=True)
    for row, slot in ((0, 4), (2, 1)):
        ref_o, ref_s = naive_gated_delta_rule(q[0, row:row + 1], k[0, row:row + 1],
                                              v[0, row:row + 1], g[0, row:row + 1],
                                              beta[0, row:row + 1], before[slot])
        torch.testing.assert_close(o[0, row], ref_o[0], **TOL)
        torch.testing.assert_close(pool[slot], ref_s, **TOL)
    assert torch.equal(pool[[0, 2, 3]], before[[0, 2, 3]])


def _conv_inputs(n: int, seed: int):
    gen = _gen(seed)
    return (torch.randn(DIM, n, generator=gen), torch.randn(DIM, WIDTH, generator=gen),
            torch.randn(DIM, generator=gen))


def _conv_reference(x, weight, bias, prev):
    """``F.conv1d`` over the previous ``WIDTH - 1`` inputs and ``x``, then silu."""
    full = torch.cat([prev, x], dim=-1)
    return F.silu(F.conv1d(full[None], weight[:, None], bias, groups=DIM)[0])


def test_causal_conv_prefill_packed_with_and_without_initial_state():
    lens = (5, 2, 9)
    x, weight, bias = _conv_inputs(sum(lens), 8)
    states = torch.randn(6, DIM, WIDTH - 1, generator=_gen(9))
    before = states.clone()
    slots = torch.tensor([1, 4, 2], dtype=torch.int32)
    has_init = torch.tensor([True, True, False])
    cu = torch.tensor([0, 5, 7, 16], dtype=torch.int32)
    out = tk.causal_conv1d_fn_cpu(x.t().contiguous().t(), weight, bias, activation="silu",
                                  conv_states=states, has_initial_state=has_init,
                                  cache_indices=slots, query_start_loc=cu,
                                  seq_lens_cpu=list(lens))
    for i, (s0, s1) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        prev = before[slots[i]] if has_init[i] else torch.zeros(DIM, WIDTH - 1)
        torch.testing.assert_close(out[:, s0:s1], _conv_reference(x[:, s0:s1], weight, bias,
                                                                  prev), **TOL)
        # the state is the last WIDTH - 1 inputs, older ones from the previous state
        torch.testing.assert_close(states[slots[i]],
                                   torch.cat([prev, x[:, s0:s1]], -1)[:, -(WIDTH - 1):])
    assert torch.equal(states[[0, 3, 5]], before[[0, 3, 5]])


def test_causal_conv_split_prefill_then_decode_equals_one_pass():
    x, weight, bias = _conv_inputs(20, 10)
    states = torch.zeros(3, DIM, WIDTH - 1)
    slot = torch.tensor([1], dtype=torch.int32)
    parts = []
    for s0, s1, init in ((0, 11, False), (11, 17, True)):
        parts.append(tk.causal_conv1d_fn_cpu(
            x[:, s0:s1], weight, bias, activation="silu", conv_states=states,
            has_initial_state=torch.tensor([init]), cache_indices=slot,
            query_start_loc=torch.tensor([0, s1 - s0], dtype=torch.int32),
            seq_lens_cpu=[s1 - s0]))
    for t in range(17, 20):
        parts.append(tk.causal_conv1d_update_cpu(x[:, t][None], states, weight, bias, "silu",
                                                 conv_state_indices=slot).t())
    ref = _conv_reference(x, weight, bias, torch.zeros(DIM, WIDTH - 1))
    torch.testing.assert_close(torch.cat(parts, dim=-1), ref, **TOL)
    torch.testing.assert_close(states[1], x[:, -(WIDTH - 1):])


def test_causal_conv_update_matches_transformers_reference():
    from transformers.models.qwen3_next.modeling_qwen3_next import \
        causal_conv1d_update  # heavy: transformers' model module

    x, weight, bias = _conv_inputs(2, 11)
    states = torch.randn(4, DIM, WIDTH - 1, generator=_gen(12))
    ref_states = states[[3, 0]].clone()
    out = tk.causal_conv1d_update_cpu(x.t(), states, weight, bias, "silu",
                                      conv_state_indices=torch.tensor([3, 0]))
    ref = causal_conv1d_update(x.t()[..., None], ref_states, weight, bias, "silu")[..., 0]
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(states[[3, 0]], ref_states, **TOL)


def test_gated_rmsnorm_and_shared_expert_gate():
    """The two Triton kernels a CPU without AMX reaches, against their definitions."""
    gen = _gen(13)
    x, z = torch.randn(5, 16, generator=gen), torch.randn(5, 16, generator=gen)
    norm = type("Norm", (), dict(weight=torch.randn(16, generator=gen), bias=None, eps=1e-6,
                                 activation="silu"))()
    rms = x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
    torch.testing.assert_close(tk.fused_rmsnorm_gated_forward(norm, x, z),
                               rms * norm.weight * F.silu(z), **TOL)
    h, w = torch.randn(5, 16, generator=gen), torch.randn(16, generator=gen)
    shared, final = torch.randn(5, 16, generator=gen), torch.randn(5, 16, generator=gen)
    expected = final + torch.sigmoid(h @ w)[:, None] * shared
    tk.fused_gate_sigmoid_mul_add(h, w, shared, final)
    torch.testing.assert_close(final, expected, **TOL)


# --- Mamba2 (Nemotron-H): marconi_cpu_testkit/mamba2_kernels.py vs mamba-ssm's and
# causal-conv1d's pure-PyTorch references (ssd_minimal_discrete, selective_state_update_ref,
# causal_conv1d_ref / causal_conv1d_update_ref) ---------------------------------------------
MH, MP, MN, MG = 4, 8, 16, 2       # Mamba2 heads, head dim, state size, groups
SSD_CHUNK = 16                      # chunk of the packed h grid in these tests


def _mamba_inputs(n: int, seed: int):
    gen = _gen(seed)
    return dict(x=torch.randn(1, n, MH, MP, generator=gen),
                dt=torch.randn(1, n, MH, generator=gen),
                A=-torch.rand(MH, generator=gen) * 2 - 0.1,
                B=torch.randn(1, n, MG, MN, generator=gen),
                C=torch.randn(1, n, MG, MN, generator=gen),
                D=torch.randn(MH, generator=gen),
                dt_bias=torch.randn(MH, generator=gen) * 0.5)


def ssd_reference(inp: dict, s0: int, s1: int, init):
    """mamba-ssm's ``ssd_minimal_discrete`` over tokens [s0, s1) from state ``init``
    ``[H, P, N]`` (or None): (y ``[s1 - s0, H, P]`` with the D skip, final state)."""
    ssd = ssd_reference_module.load_ssd_minimal()
    dt = F.softplus(inp["dt"][:, s0:s1] + inp["dt_bias"])
    x = inp["x"][:, s0:s1]
    B = inp["B"][:, s0:s1].repeat_interleave(MH // MG, dim=2)
    C = inp["C"][:, s0:s1].repeat_interleave(MH // MG, dim=2)
    parts = [x * dt[..., None], inp["A"] * dt, B, C]
    pad = (-(s1 - s0)) % 8
    parts = [F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in parts]
    y, final = ssd(*parts, 8, initial_states=None if init is None else init[None, None])
    return y[0, :s1 - s0] + x[0] * inp["D"][:, None], final[0]


def _scan(inp: dict, cu: list, init=None, track=None, out=None):
    return m2.mamba_chunk_scan_combined(
        inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], SSD_CHUNK, D=inp["D"],
        dt_bias=inp["dt_bias"], initial_states=init,
        cu_seqlens=torch.tensor(cu, dtype=torch.int32), dt_softplus=True,
        out=out if out is not None else torch.empty(inp["x"].shape),
        return_varlen_states=True, return_track_states=True,
        track_seq_idx=None if track is None else torch.tensor([t[0] for t in track]),
        track_end_locs=None if track is None else torch.tensor([t[1] for t in track]),
        state_dtype=torch.float32)


def test_mamba2_scan_matches_ssd_minimal_on_packed_sequences():
    """Four packed sequences (lengths 21, 11, 29, 7: the second ends exactly on the chunk
    grid at 32, the others start and end off it), three with initial states: output,
    final states, ``h`` at every packed chunk boundary (Triton layout: the state of the
    sequence holding the token before it) and the tracked states at off-grid end
    positions all equal mamba-ssm's chunked reference."""
    cu = [0, 21, 32, 61, 68]
    inp = _mamba_inputs(cu[-1], 20)
    init = torch.randn(4, MH, MP, MN, generator=_gen(21)) * 0.5
    init[2] = 0  # the mixer zeroes the initial state of a sequence without one
    out = torch.empty(inp["x"].shape)
    track = [(2, 32 + 19), (3, 61 + 5), (0, 13)]
    h, finals, tracked = _scan(inp, cu, init, track, out)
    assert h.shape == (1, 5, MH, MP, MN) and finals.shape == (4, MH, MP, MN)
    assert tracked.shape == (1, 3, MH, MP, MN)
    for n, (s0, s1) in enumerate(zip(cu[:-1], cu[1:])):
        ref_y, ref_final = ssd_reference(inp, s0, s1, init[n])
        torch.testing.assert_close(out[0, s0:s1], ref_y, **TOL)
        torch.testing.assert_close(finals[n], ref_final, **TOL)
    torch.testing.assert_close(h[0, 0], init[0])
    for c, (n, s0) in {1: (0, 0), 2: (1, 21), 3: (2, 32), 4: (3, 61)}.items():
        torch.testing.assert_close(h[0, c], ssd_reference(inp, s0, 16 * c, init[n])[1], **TOL)
    for j, (n, end) in enumerate(track):
        torch.testing.assert_close(tracked[0, j], ssd_reference(inp, cu[n], end, init[n])[1],
                                   **TOL)


def test_mamba2_split_prefill_then_decode_equals_one_pass():
    """A prefix-cache hit in miniature: prefill 0..29 on a pool slot, resume 29..50 from
    that slot's state (as the mixer passes it), then four decode steps with
    ``selective_state_update`` = one reference pass over all 54 tokens."""
    n, pool = 54, torch.zeros(3, MH, MP, MN)
    inp = _mamba_inputs(n, 22)
    outs = []
    for s0, s1 in ((0, 29), (29, 50)):
        part = {k: (v[:, s0:s1] if v.dim() > 1 and v.shape[1] == n else v)
                for k, v in inp.items()}
        out = torch.empty(part["x"].shape)
        _, finals, _ = _scan(part, [0, s1 - s0], init=pool[[2]], out=out)
        pool[2] = finals[0]
        outs.append(out[0])
    ssu = _decode_args(inp, range(50, 54))
    for step in range(4):
        y = torch.empty(1, MH, MP)
        m2.selective_state_update(pool, **{k: v[step:step + 1] for k, v in ssu.items()},
                                  A=ssu_A(inp), D=inp["D"][:, None].expand(-1, MP),
                                  dt_bias=inp["dt_bias"][:, None].expand(-1, MP),
                                  dt_softplus=True, state_batch_indices=torch.tensor([2]),
                                  out=y)
        outs.append(y)
    ref_y, ref_final = ssd_reference(inp, 0, n, None)
    torch.testing.assert_close(torch.cat(outs), ref_y, **TOL)
    torch.testing.assert_close(pool[2], ref_final, **TOL)


def ssu_A(inp: dict) -> torch.Tensor:
    """A as the mixer passes it to the decode step: ``[H, P, N]``."""
    return inp["A"][:, None, None].expand(-1, MP, MN)


def _decode_args(inp: dict, tokens) -> dict:
    """x, dt, B, C of ``tokens`` as decode rows (dt expanded over the head dim)."""
    t = list(tokens)
    return dict(x=inp["x"][0, t], dt=inp["dt"][0, t][..., None].expand(-1, -1, MP),
                B=inp["B"][0, t], C=inp["C"][0, t])


def test_mamba2_decode_matches_selective_state_update_ref_and_skips_padded_rows():
    ref = ssd_reference_module._load_reference_file(  # one recurrent step, pure PyTorch
        "mamba_ssm", "ops/triton/selective_state_update.py").selective_state_update_ref
    inp = _mamba_inputs(3, 23)
    pool = torch.randn(5, MH, MP, MN, generator=_gen(24))
    before = pool.clone()
    slots = torch.tensor([4, -1, 1])
    args = _decode_args(inp, range(3))
    kw = dict(A=ssu_A(inp), D=inp["D"][:, None].expand(-1, MP),
              dt_bias=inp["dt_bias"][:, None].expand(-1, MP), dt_softplus=True)
    out = torch.empty(3, MH, MP)
    m2.selective_state_update(pool, **args, **kw, state_batch_indices=slots, out=out)
    for row, slot in ((0, 4), (2, 1)):
        state = before[slot][None].clone()
        expect = ref(state, **{k: v[row:row + 1] for k, v in args.items()}, **kw)
        torch.testing.assert_close(out[row], expect[0], **TOL)
        torch.testing.assert_close(pool[slot], state[0], **TOL)
    assert torch.equal(pool[[0, 2, 3]], before[[0, 2, 3]])


def test_causal_conv_matches_causal_conv1d_references():
    """The packed prefill conv and the decode update (what the Mamba2 mixer's
    ``causal_conv1d_fn(_triton)`` / ``causal_conv1d_update(_triton)`` are bound to) against
    causal-conv1d's ``causal_conv1d_ref`` (initial and final states) and
    ``causal_conv1d_update_ref``."""
    module = ssd_reference_module._load_reference_file("causal_conv1d",
                                                       "causal_conv1d_interface.py")
    conv_ref, update_ref = module.causal_conv1d_ref, module.causal_conv1d_update_ref
    bound = m2.MODULE_BINDINGS[m2._MIXER]
    x, weight, bias = _conv_inputs(13, 25)
    states = torch.randn(4, DIM, WIDTH - 1, generator=_gen(26))
    init = states[3].clone()
    out = bound["causal_conv1d_fn_triton"](
        x, weight, bias, conv_states=states, query_start_loc=torch.tensor([0, 13]),
        seq_lens_cpu=[13], cache_indices=torch.tensor([3]),
        has_initial_state=torch.tensor([True]), activation="silu")
    ref_out, ref_final = conv_ref(x[None], weight, bias, initial_states=init[None],
                                  return_final_states=True, activation="silu")
    torch.testing.assert_close(out, ref_out[0], **TOL)
    torch.testing.assert_close(states[3], ref_final[0], **TOL)
    step = torch.randn(2, DIM, generator=_gen(27))
    ref_states = states[[3, 0]].clone()
    got = bound["causal_conv1d_update_triton"](step, states, weight, bias, "silu",
                                               conv_state_indices=torch.tensor([3, 0]))
    torch.testing.assert_close(got, update_ref(step, ref_states, weight, bias, "silu"), **TOL)
    torch.testing.assert_close(states[[3, 0]], ref_states, **TOL)


# --- speculative decoding's CPU ops (``spec_kernels.py``) -----------------------------------
# Reference: the installed SGLang's own GPU path for each op (its Triton kernels and their
# wrappers), run on the same CPU tensors by Triton's interpreter in a process of its own
# (``tests/spec_kernel_reference.py``); the KV move against SGLang's torch
# ``move_kv_cache_native``.
from marconi_cpu_testkit import spec_kernels as sk  # noqa: E402

import spec_kernel_reference as spec_ref  # noqa: E402

BS, N = 4, 6  # requests, draft tokens


def _random_tree(gen) -> torch.Tensor:
    """Ancestor masks ``[BS, N, N]`` of random draft trees (node 0 the root, a parent
    before its child), the diagonal set as NGRAM's masks have it, and junk above the
    diagonal that the contract ignores."""
    mask = torch.zeros(BS, N, N, dtype=torch.bool)
    for b in range(BS):
        parent = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, N)]
        if b == 0:
            parent = [-1] + list(range(N - 1))  # a chain (breadth 1)
        for i in range(N):
            mask[b, i, i] = True
            j = parent[i]
            while j >= 0:
                mask[b, i, j] = True
                j = parent[j]
    return mask | (torch.rand(BS, N, N, generator=gen) > 0.7).triu(1)


def _spec_cases() -> dict:
    gen = _gen(40)
    mask = _random_tree(gen)
    seq_lens = torch.tensor([5, 17, 0, 300])
    links = {k: torch.empty(BS, N, dtype=torch.int64)
             for k in ("retrieve_index", "retrieve_next_token", "retrieve_next_sibling")}
    sk.reconstruct_indices_from_tree_mask(mask.flatten(), seq_lens,
                                          torch.empty(BS * N, dtype=torch.int64),
                                          links["retrieve_index"], links["retrieve_next_token"],
                                          links["retrieve_next_sibling"], BS, N)
    # tokens from a 3-letter vocabulary, so that drafts match the target's predictions
    # along some paths and not others
    candidates = torch.randint(0, 3, (BS, N), generator=gen)
    target = torch.randint(0, 3, (BS, N), generator=gen)
    target[0, :-1] = candidates[0, 1:]  # the chain: every draft accepted
    r2t = torch.randint(0, 1000, (5, 40), generator=gen, dtype=torch.int32)
    rpi = torch.tensor([3, 0, 4])
    start, end = torch.tensor([2, 0, 37]), torch.tensor([9, 0, 40])
    accept = torch.tensor([[0, 2, 3, -1], [6, -1, -1, -1], [12, 13, 14, 17]], dtype=torch.int32)
    shared = torch.randn(2, 3, 5, N + 2, generator=gen)  # K - 1 = 3: windows of N steps
    cases = {
        "tree": dict(kind="tree", tree_mask=mask.flatten(), seq_lens=seq_lens, bs=BS, n=N),
        "verify": dict(kind="verify", candidates=candidates, target_predict=target,
                       depth=N, **links),
        "verify-shallow": dict(kind="verify", candidates=candidates, target_predict=target,
                               depth=3, **links),
        "extend_locs": dict(kind="extend_locs", req_to_token=r2t, req_pool_indices=rpi,
                            start=start, end=end),
        "assign_req_to_token": dict(kind="assign_req_to_token", req_to_token=r2t,
                                    req_pool_indices=rpi, start=start, end=end,
                                    out_cache_loc=torch.arange(100, 110)),
        "accept_locs": dict(kind="accept_locs", accept_index=accept,
                            out_cache_loc=torch.randint(0, 999, (BS * N,), generator=gen)),
    }
    # steps: a valid one, a masked one (-1), one past the draft steps (skipped)
    for name, src_indices in (("", None), ("-rows", torch.tensor([2, 0, 1]))):
        cases["state_scatter" + name] = dict(
            kind="state_scatter", dst=torch.randn(2, 6, 3, 4, generator=gen),
            src=torch.randn(2, 3, N, 3, 4, generator=gen), dst_indices=torch.tensor([4, 1, 5]),
            steps=torch.tensor([2, -1, N]) if name else torch.tensor([0, 5, -1]),
            src_indices=src_indices)
        cases["conv_scatter" + name] = dict(
            kind="conv_scatter", dst=torch.randn(2, 6, 5, 3, generator=gen), shared=shared,
            dst_indices=torch.tensor([4, 1, 5]),
            steps=torch.tensor([2, -1, N - 1]) if name else torch.tensor([0, N - 1, 3]),
            src_indices=src_indices)
    cases.update(_verify_cases(gen))
    return {k: {n: v for n, v in c.items() if v is not None} for k, c in cases.items()}


STEPS = 4  # draft tokens of the verify cases


def _verify_cases(gen) -> dict:
    """Three requests' draft chains through the verify forms of the mixers' ops (pool
    slots 3, 0, 4; scratch rows 2, 0, 1)."""
    slots, rows, n = torch.tensor([3, 0, 4], dtype=torch.int32), torch.tensor(
        [2, 0, 1], dtype=torch.int32), 3
    mh, mp, mn, mg = 4, 8, 6, 2  # Mamba2 heads, head dim, state size, groups
    rnd = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    return {
        "conv_verify": dict(kind="conv_verify", x=rnd(n, DIM, STEPS),
                            conv_states=rnd(5, DIM, WIDTH - 1), weight=rnd(DIM, WIDTH),
                            bias=rnd(DIM), slots=slots, rows=rows,
                            windows=torch.zeros(n + 1, STEPS, DIM, WIDTH - 1)),
        "gdn_verify": dict(kind="gdn_verify", q=rnd(1, n * STEPS, H, K), k=rnd(1, n * STEPS, H, K),
                           v=rnd(1, n * STEPS, HV, V), a=rnd(n * STEPS, HV),
                           b=rnd(n * STEPS, HV), A_log=torch.rand(HV, generator=gen).log(),
                           dt_bias=rnd(HV) * 0.5, pool=rnd(5, HV, V, K), slots=slots,
                           cu_seqlens=torch.arange(0, n * STEPS + 1, STEPS, dtype=torch.int32),
                           kept=torch.zeros(n + 1, STEPS, HV, V, K), rows=rows, steps=STEPS),
        "mamba_verify": dict(kind="mamba_verify", pool=rnd(5, mh, mp, mn),
                             x=rnd(n, STEPS, mh, mp), dt=rnd(n, STEPS, mh, mp) * 0.5,
                             A=-torch.rand(mh, 1, 1, generator=gen).expand(mh, mp, mn) - 0.1,
                             B=rnd(n, STEPS, mg, mn), C=rnd(n, STEPS, mg, mn),
                             D=rnd(mh, mp), dt_bias=rnd(mh, mp) * 0.1, slots=slots, rows=rows,
                             kept=torch.zeros(n + 1, STEPS, mh, mp, mn)),
    }


@pytest.fixture(scope="module")
def spec_reference(tmp_path_factory):
    import os
    import subprocess

    folder = tmp_path_factory.mktemp("spec-ref")
    cases = _spec_cases()
    torch.save(cases, folder / "cases.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    proc = subprocess.run([sys.executable, spec_ref.__file__, str(folder / "cases.pt"),
                           str(folder / "out.pt")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cases, torch.load(folder / "out.pt")


def test_reconstruct_tree_links_match_sglang(spec_reference):
    """Positions (depth + verified length), retrieve index, first child and next sibling
    from the ancestor mask: SGLang's Triton kernel, and its host-side derivation of the
    links (``ngram_worker._derive_tree_links``, for the grammar path)."""
    from sglang.srt.speculative.ngram_worker import _derive_tree_links

    cases, ref = spec_reference
    c = cases["tree"]
    got = {k: torch.full_like(v, -9) for k, v in ref["tree"].items()}
    sk.reconstruct_indices_from_tree_mask(c["tree_mask"], c["seq_lens"], got["positions"],
                                          got["retrieve_index"], got["retrieve_next_token"],
                                          got["retrieve_next_sibling"], BS, N)
    for k in got:
        assert torch.equal(got[k], ref["tree"][k]), k
    host_next, host_sibling = _derive_tree_links(c["tree_mask"].numpy(), BS, N)
    mask = c["tree_mask"].view(BS, N, N)
    assert torch.equal(got["retrieve_next_token"], host_next)
    # the host derivation skips the junk above the diagonal only through its j < i rule
    assert torch.equal(got["retrieve_next_sibling"], host_sibling)
    assert torch.equal(got["positions"].view(BS, N)[0], torch.arange(N) + 5)  # the chain
    assert mask.any()


def test_verify_tree_greedy_matches_sglang(spec_reference):
    cases, ref = spec_reference
    for name in ("verify", "verify-shallow"):
        c, want = cases[name], ref[name]
        got = {"predicts": torch.zeros(BS * N, dtype=torch.int32),
               "accept_index": torch.full((BS, c["depth"]), -1, dtype=torch.int32),
               "accept_token_num": torch.zeros(BS, dtype=torch.int32)}
        sk.verify_tree_greedy_cpu(got["predicts"], got["accept_index"], got["accept_token_num"],
                                  c["candidates"], c["retrieve_index"], c["retrieve_next_token"],
                                  c["retrieve_next_sibling"], c["target_predict"])
        for k in got:
            assert torch.equal(got[k], want[k]), (name, k, got[k], want[k])
    # the chain accepts every draft up to the depth; the random trees accept fewer
    assert ref["verify"]["accept_token_num"][0] == N - 1
    assert ref["verify-shallow"]["accept_token_num"][0] == 2
    assert ref["verify"]["accept_token_num"][1:].tolist() != [N - 1] * (BS - 1)


def test_cache_location_ops_match_sglang(spec_reference):
    cases, ref = spec_reference
    c = cases["extend_locs"]
    out = torch.full_like(ref["extend_locs"]["out_cache_loc"], -9)
    sk.assign_extend_cache_locs_cpu(c["req_pool_indices"], c["req_to_token"], c["start"],
                                    c["end"], out, c["req_to_token"].shape[1])
    assert torch.equal(out, ref["extend_locs"]["out_cache_loc"])
    assert out.numel() == 10
    c = cases["assign_req_to_token"]
    r2t = c["req_to_token"].clone()
    sk.assign_req_to_token_pool_cpu(c["req_pool_indices"], r2t, c["start"], c["end"],
                                    c["out_cache_loc"], r2t.shape[1])
    assert torch.equal(r2t, ref["assign_req_to_token"]["req_to_token"])
    assert not torch.equal(r2t, c["req_to_token"])
    c = cases["accept_locs"]
    out = torch.full_like(ref["accept_locs"]["accept_out_cache_loc"], -7)
    sk.fill_accept_out_cache_loc_cpu(c["accept_index"], c["out_cache_loc"], out)
    assert torch.equal(out, ref["accept_locs"]["accept_out_cache_loc"])


def test_mamba_state_scatters_match_sglang(spec_reference):
    """The accepted step's SSM state and conv window committed to the slots (masked,
    out-of-range and re-mapped rows), the conv source an overlapping strided view."""
    cases, ref = spec_reference
    for name in ("state_scatter", "state_scatter-rows"):
        c = cases[name]
        dst = c["dst"].clone()
        sk.fused_mamba_state_scatter_with_mask(dst, c["src"], c["dst_indices"], c["steps"],
                                               c.get("src_indices"))
        assert torch.equal(dst, ref[name]["dst"]), name
        assert not torch.equal(dst, c["dst"])
    for name in ("conv_scatter", "conv_scatter-rows"):
        c = cases[name]
        dst = c["dst"].clone()
        sk.fused_conv_window_scatter_with_mask(dst, spec_ref._window_view(c),
                                               c["dst_indices"], c["steps"],
                                               c.get("src_indices"))
        assert torch.equal(dst, ref[name]["dst"]), name
    # the multi-pair variant: each pair as the single-pair kernel, the track set second
    c = cases["conv_scatter"]
    pairs = [(c["dst"].clone(), spec_ref._window_view(c)) for _ in range(2)]
    track_steps = torch.tensor([-1, -1, -1])
    sk.fused_conv_window_scatter_multi(pairs, c["dst_indices"], c["steps"],
                                       torch.tensor([0, 2, 3]), track_steps)
    for dst, _ in pairs:
        assert torch.equal(dst, ref["conv_scatter"]["dst"])


def test_kv_move_matches_sglang_native_move():
    """Rows moved in every layer's K and V buffer through raw pointers and byte strides,
    overlapping moves included, as ``memory_pool.move_kv_cache_native`` moves them."""
    from sglang.srt.mem_cache.memory_pool import move_kv_cache_native

    gen = _gen(41)
    k = [torch.randn(16, 2, 8, generator=gen) for _ in range(3)]
    v = [torch.randn(16, 2, 8, generator=gen) for _ in range(3)]
    tgt, src = torch.tensor([3, 4, 5, 0]), torch.tensor([4, 5, 9, 15])
    want_k, want_v = [t.clone() for t in k], [t.clone() for t in v]
    move_kv_cache_native(want_k, want_v, tgt, src)
    bufs = k + v
    sk.copy_all_layer_kv_cache_cpu(torch.tensor([b.data_ptr() for b in bufs]),
                                   torch.tensor([b[0].nbytes for b in bufs]), tgt, src)
    for got, want in zip(bufs, want_k + want_v):
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="4 targets for 3 sources"):
        sk.copy_all_layer_kv_cache_cpu(torch.tensor([k[0].data_ptr()]),
                                       torch.tensor([k[0][0].nbytes]), tgt, src[:3])


def test_conv_verify_keeps_every_steps_window_as_sglang(spec_reference):
    """``causal_conv1d_update_cpu`` on a verify batch: SGLang's Triton kernel's outputs,
    conv states (shifted by every draft) and per-step windows; the window kept at step t
    is the conv state t + 1 plain decode steps leave."""
    cases, ref = spec_reference
    c, want = cases["conv_verify"], ref["conv_verify"]
    states, windows = c["conv_states"].clone(), c["windows"].clone()
    out = tk.causal_conv1d_update_cpu(c["x"].clone(), states, c["weight"], c["bias"], "silu",
                                      conv_state_indices=c["slots"],
                                      intermediate_conv_window=windows,
                                      intermediate_state_indices=c["rows"])
    torch.testing.assert_close(out, want["out"], **TOL)
    torch.testing.assert_close(states, want["conv_states"], **TOL)
    torch.testing.assert_close(windows, want["windows"], **TOL)
    decoded = c["conv_states"].clone()
    for t in range(STEPS):
        step = tk.causal_conv1d_update_cpu(c["x"][:, :, t], decoded, c["weight"], c["bias"],
                                           "silu", conv_state_indices=c["slots"])
        torch.testing.assert_close(step, out[:, :, t], **TOL)
        torch.testing.assert_close(windows[c["rows"].long(), t],
                                   decoded[c["slots"].long()], **TOL)


def _gdn_verify(c, pool, kept):
    return tk.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=c["A_log"], dt_bias=c["dt_bias"], q=c["q"], k=c["k"], v=c["v"], a=c["a"],
        b=c["b"], initial_state_source=pool, initial_state_indices=c["slots"],
        cu_seqlens=c["cu_seqlens"], use_qk_l2norm_in_kernel=True, is_kda=False,
        disable_state_update=kept is not None, intermediate_states_buffer=kept,
        intermediate_state_indices=c["rows"], cache_steps=STEPS, retrieve_parent_token=None)


def test_gdn_verify_keeps_every_steps_state_as_sglang(spec_reference):
    """The gated delta rule over each draft chain (``TritonGDNKernel.target_verify``'s
    call): SGLang's Triton kernel's outputs and per-step states, the pool state untouched;
    the last kept state is the one a plain pass over the same tokens writes."""
    cases, ref = spec_reference
    c, want = cases["gdn_verify"], ref["gdn_verify"]
    pool, kept = c["pool"].clone(), c["kept"].clone()
    out = _gdn_verify(c, pool, kept)
    torch.testing.assert_close(out, want["out"].reshape(out.shape), **TOL)
    assert torch.equal(pool, c["pool"]) and torch.equal(want["pool"], c["pool"])
    torch.testing.assert_close(kept, want["kept"], **TOL)
    one_pass = c["pool"].clone()
    torch.testing.assert_close(_gdn_verify(c, one_pass, None), out, **TOL)
    torch.testing.assert_close(kept[c["rows"].long(), STEPS - 1], one_pass[c["slots"].long()],
                               **TOL)


def test_mamba2_verify_keeps_every_steps_state_as_sglang(spec_reference):
    cases, ref = spec_reference
    c, want = cases["mamba_verify"], ref["mamba_verify"]
    pool, kept, out = c["pool"].clone(), c["kept"].clone(), torch.zeros_like(c["x"])
    m2.selective_state_update(pool, c["x"], c["dt"], c["A"], c["B"], c["C"], c["D"],
                              dt_bias=c["dt_bias"], dt_softplus=True,
                              state_batch_indices=c["slots"], out=out,
                              disable_state_update=True, intermediate_states_buffer=kept,
                              cache_steps=STEPS, intermediate_state_indices=c["rows"])
    torch.testing.assert_close(out, want["out"], **TOL)
    assert torch.equal(pool, c["pool"]) and torch.equal(want["pool"], c["pool"])
    torch.testing.assert_close(kept, want["kept"], **TOL)
    assert kept[c["rows"].long()].abs().sum() > 0


class _KVPool:
    """The two buffers of one attention layer, written as SGLang's pool writes them."""

    def __init__(self, slots: int, heads: int, dim: int, gen):
        self.k = torch.randn(slots, heads, dim, generator=gen)
        self.v = torch.randn(slots, heads, dim, generator=gen)

    def set_kv_buffer(self, layer, loc, k, v):
        self.k[loc.loc.long()] = k.view(-1, *self.k.shape[1:])
        self.v[loc.loc.long()] = v.view(-1, *self.v.shape[1:])

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v


def test_verify_attention_follows_the_draft_mask():
    """``verify_forward_extend`` (the torch_native backend under speculative verify): each
    draft attends to its request's whole prefix and to the drafts its mask allows, with
    the drafts' K/V written at their slots; against attention written out by hand, for a
    chain (SGLang's causal extend path) and for a star of padding drafts (NGRAM's fill)."""
    import types

    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.layers.radix_attention import AttentionType
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    gen = _gen(50)
    qh, kh, d, steps = 4, 2, 8, 4
    backend = object.__new__(TorchNativeAttnBackend)
    backend.token_to_kv_pool = _KVPool(64, kh, d, gen)
    backend.swa_out_cache_loc = None
    seq_lens = torch.tensor([5, 9])
    req_to_token = torch.randperm(64, generator=gen)[:2 * 20].view(2, 20).int()
    backend.req_to_token_pool = types.SimpleNamespace(req_to_token=req_to_token)
    star = torch.eye(steps, dtype=torch.bool)
    star[:, 0] = True
    mask = torch.stack([torch.ones(steps, steps, dtype=torch.bool).tril(), star])
    out_loc = torch.cat([req_to_token[b, int(seq_lens[b]):int(seq_lens[b]) + steps]
                         for b in range(2)]).long()
    batch = types.SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY, seq_lens=seq_lens,
        req_pool_indices=torch.tensor([0, 1]), out_cache_loc=out_loc, encoder_lens=None,
        spec_info=types.SimpleNamespace(draft_token_num=steps, custom_mask=mask.flatten()),
        extend_prefix_lens=None, extend_seq_lens=None)
    layer = types.SimpleNamespace(qk_head_dim=d, v_head_dim=d, tp_q_head_num=qh,
                                  tp_k_head_num=kh, is_cross_attention=False,
                                  attn_type=AttentionType.DECODER, scaling=d ** -0.5,
                                  sliding_window_size=None, layer_id=0)
    q = torch.randn(2 * steps, qh * d, generator=gen)
    k = torch.randn(2 * steps, kh * d, generator=gen)
    v = torch.randn(2 * steps, kh * d, generator=gen)
    out = tk.verify_forward_extend(backend, q, k, v, layer, batch).view(2 * steps, qh, d)
    pool = backend.token_to_kv_pool
    assert torch.equal(pool.k[out_loc], k.view(-1, kh, d))
    for b in range(2):
        prefix = int(seq_lens[b])
        slots = req_to_token[b, :prefix + steps].long()
        keys = pool.k[slots].repeat_interleave(qh // kh, 1)      # [kv, qh, d]
        vals = pool.v[slots].repeat_interleave(qh // kh, 1)
        for i in range(steps):
            allowed = torch.cat([torch.ones(prefix, dtype=torch.bool), mask[b, i]])
            qi = q.view(2 * steps, qh, d)[b * steps + i]
            w = torch.softmax(torch.einsum("hd,khd->hk", qi, keys[allowed]) * d ** -0.5, -1)
            want = torch.einsum("hk,khd->hd", w, vals[allowed])
            torch.testing.assert_close(out[b * steps + i], want, **TOL)
