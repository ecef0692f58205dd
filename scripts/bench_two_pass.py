"""Cost of a two-pass prefill (stop at the branch point, take the SSM state, continue).

Marconi's admission checkpoints the SSM state at a branch point inside the prompt. Without a
kernel that emits intermediate states, the prefill stops there, copies the states, and goes
on from the cache: a second pass. This script measures, for several prompt lengths L and
branch positions P, the cost of that against a single pass over the L tokens:

- FLOPs from the project's cost model (``HybridModelSpec``): prefill_flops(P) for the first
  pass plus flops_saved(L, P) = prefill_flops(L) - prefill_flops(P) for the second (its L - P
  tokens attend to the P cached ones), over prefill_flops(L);
- CPU wall time of transformers' fp32 model code (best of ``--repeats`` runs, single and
  two-pass interleaved), the state copy included;
- the max |logit difference| of the last token between the two.

Usage: .venv/bin/python scripts/bench_two_pass.py [--arch bamba] [--lengths 512,1024,2048]
       [--fractions 0.1,0.33,0.5,0.9] [--repeats 3] [--threads 1] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from sglang_marconi.exact import runner, snapshot  # noqa: E402
from sglang_marconi.exact.archs import ARCHS  # noqa: E402
from sglang_marconi.model import HybridModelSpec  # noqa: E402, spec_from_hf_config

_COMMON = dict(vocab_size=1024, hidden_size=512, intermediate_size=1024, num_attention_heads=8,
               num_key_value_heads=2, max_position_embeddings=8192, tie_word_embeddings=False)


def bench_config(name: str):
    """A mid-size config (hidden 512, 8 layers, 1 in 4 attention) of the arch, for timing."""
    import transformers as T

    if name == "bamba":
        return T.BambaConfig(**_COMMON, num_hidden_layers=8, attn_layer_indices=[3, 7],
                             mamba_n_heads=16, mamba_d_head=64, mamba_d_state=64,
                             mamba_n_groups=1, mamba_d_conv=4, mamba_chunk_size=128)
    if name == "nemotron_h":
        return T.NemotronHConfig(**_COMMON, num_hidden_layers=8, hybrid_override_pattern="M-M*M-M*",
                                 mamba_num_heads=16, mamba_head_dim=64, ssm_state_size=64,
                                 n_groups=1, conv_kernel=4, head_dim=64, mamba_chunk_size=128)
    if name == "qwen3_next":
        return T.Qwen3NextConfig(**_COMMON, num_hidden_layers=8, full_attention_interval=4,
                                 head_dim=64, linear_num_value_heads=8, linear_num_key_heads=4,
                                 linear_key_head_dim=64, linear_value_head_dim=64,
                                 linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=256, shared_expert_intermediate_size=256)
    raise SystemExit(f"error: no bench config for arch {name!r}; "
                     "have: bamba, nemotron_h, qwen3_next")


def timed_pair(fn_a, fn_b, repeats: int):
    """Best-of-``repeats`` seconds of two functions, runs interleaved (a, b, a, b, ...) after a
    warm-up of each, so that load from other processes hits both alike; and their outputs."""
    fn_a(), fn_b()
    ta, tb = [], []
    for _ in range(repeats):
        for fn, times in ((fn_a, ta), (fn_b, tb)):
            t = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t)
            if fn is fn_a:
                out_a = out
            else:
                out_b = out
    return min(ta), min(tb), out_a, out_b


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="bamba")
    p.add_argument("--lengths", default="512,1024,2048")
    p.add_argument("--fractions", default="0.1,0.33,0.5,0.9",
                   help="branch positions P as fractions of L")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    fractions = [float(x) for x in args.fractions.split(",")]

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    arch = ARCHS[args.arch]
    config = bench_config(args.arch)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    spec = spec_from_hf_config(config, dtype="float32")
    g = torch.Generator().manual_seed(args.seed)

    def single(tokens):
        cache = snapshot.DynamicCache(config=config)
        return runner.extend(model, arch, cache, tokens, 0)[-1]

    def two_pass(tokens, P):
        cache = snapshot.DynamicCache(config=config)
        runner.extend(model, arch, cache, tokens[:P], 0)
        snapshot.take_ssm_states(cache)  # the checkpoint copy is part of the cost
        return runner.extend(model, arch, cache, tokens[P:], P)[-1]

    rows = []
    if not args.json:
        print(f"arch {args.arch}: hidden {config.hidden_size}, {config.num_hidden_layers} layers "
              f"({spec.num_attention_layers} attention, {spec.num_ssm_layers} SSM), fp32, CPU, "
              f"torch threads {torch.get_num_threads()}, best of {args.repeats} interleaved runs "
              "after a warm-up")
        print(f"{'L':>5s} {'P':>5s} {'P/L':>5s} {'FLOPs 1-pass':>13s} {'FLOPs 2-pass':>13s} "
              f"{'ratio':>6s} {'ms 1-pass':>10s} {'ms 2-pass':>10s} {'ratio':>6s} "
              f"{'max|dlogit|':>11s}")
    for L in lengths:
        tokens = torch.randint(0, config.vocab_size, (L,), generator=g).tolist()
        for f in fractions:
            P = max(1, min(L - 1, round(f * L)))
            t1, t2, ref, out = timed_pair(lambda: single(tokens), lambda: two_pass(tokens, P),
                                          args.repeats)
            f1 = spec.prefill_flops(L)
            f2 = spec.prefill_flops(P) + spec.flops_saved(L, P)
            row = dict(L=L, P=P, flops_single=f1, flops_two_pass=f2, flops_ratio=f2 / f1,
                       wall_single_ms=t1 * 1e3, wall_two_pass_ms=t2 * 1e3, wall_ratio=t2 / t1,
                       max_abs_logit_diff=float((out - ref).abs().max()))
            rows.append(row)
            if not args.json:
                print(f"{L:5d} {P:5d} {P / L:5.2f} {f1:13.4e} {f2:13.4e} {row['flops_ratio']:6.3f} "
                      f"{row['wall_single_ms']:10.1f} {row['wall_two_pass_ms']:10.1f} "
                      f"{row['wall_ratio']:6.3f} {row['max_abs_logit_diff']:11.2e}", flush=True)
    if args.json:
        print(json.dumps({"arch": args.arch, "threads": torch.get_num_threads(),
                          "repeats": args.repeats, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
