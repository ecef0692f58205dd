"""How much prefix reuse a Mooncake trace holds at all: the ceiling no router can pass.

For every request in order it counts the input tokens one cache that never evicts could
reuse: (a) KV only (any earlier request's prefix, a pure-attention model), and (b) for a
hybrid model under stock SGLang's extra_buffer rule, only up to the deepest state such a
cache would hold on the request's path: the end of an earlier prompt, a branch point an
earlier request planted (its KV match past its reusable state), or a chunk end (every
``--chunk`` tokens from an earlier request's hit). Positions are counted in the trace's
hash blocks (``--block`` tokens, 512 in the Mooncake traces): a state inside a block is
counted only where it falls on a block boundary, so (b) is a slight underestimate. It also
prints the trace's distinct tokens, to set against a cluster's KV capacity, and, for each
``--models`` preset, the same two ceilings as fractions of the prefill FLOPs (a hit of h
tokens on an n-token prompt saves the cost model's ``flops_saved(h)``; the measure every
``ab``, ``sim`` and ``serve-sim`` "FLOPs saved" figure uses). No cache, router or number
of replicas can save more than the KV-only figure on the same requests: each replica's
cache only ever holds prefixes of requests it has seen.

Usage: python scripts/trace_reuse_ceiling.py [--trace PATH] [--skip S] [--block 512]
       [--models paper-7b,qwen3_next]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

from sglang_marconi.model import resolve_model  # noqa: E402
from marconi_reports.sweeps import MOONCAKE_TRACE  # noqa: E402


def ceilings(requests: list, block: int, chunk: int, grid: int = 64, specs=()) -> dict:
    """Token hit counts of a never-evicting cache, KV-only and hybrid (see the module doc),
    and for each cost model in ``specs`` (name -> spec) the prefill FLOPs of all prompts
    and the FLOPs the two kinds of hits save."""
    kv, states = set(), set()        # prefixes as tuples of block hashes
    kv_hit = hybrid_hit = total = 0
    flops = {name: [0.0, 0.0, 0.0] for name in specs}  # prefill, KV-only saved, hybrid saved
    for r in requests:
        hashes, n = r["hash_ids"], r["input_length"]
        key_limit = n - 1            # SGLang matches at most input - 1 tokens
        matched = reusable = 0
        for j in range(len(hashes)):
            prefix = tuple(hashes[:j + 1])
            if prefix not in kv:
                break
            matched = j + 1
            if prefix in states and (j + 1) * block <= key_limit:
                reusable = j + 1
        kv_hit += min(matched * block, key_limit)
        hybrid_hit += reusable * block
        total += n
        for name, spec in specs.items():
            f = flops[name]
            f[0] += spec.prefill_flops(n)
            f[1] += spec.flops_saved(min(matched * block, key_limit))
            f[2] += spec.flops_saved(reusable * block)
        branch = min(matched * block, key_limit) // grid * grid
        points = [branch] if branch > reusable * block else []
        points += range(reusable * block + chunk, n, chunk)
        points.append(n // grid * grid)
        for p in points:
            if p and p % block == 0:
                states.add(tuple(hashes[:p // block]))
        for j in range(len(hashes)):
            kv.add(tuple(hashes[:j + 1]))
    distinct = len({h for r in requests for h in r["hash_ids"]}) * block
    return {"requests": len(requests), "input_tokens": total, "kv_hit_tokens": kv_hit,
            "hybrid_hit_tokens": hybrid_hit, "distinct_tokens": distinct, "flops": flops}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(MOONCAKE_TRACE))
    ap.add_argument("--skip", type=int, default=0, help="count hits only from request S on "
                    "(the cache still sees the requests before)")
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=8192, help="--chunked-prefill-size")
    ap.add_argument("--models", default="paper-7b,qwen3_next",
                    help="model presets whose FLOPs ceilings to print (comma-separated; "
                         "empty: tokens only)")
    args = ap.parse_args(argv)
    specs = {m: resolve_model(preset=m) for m in args.models.split(",") if m}
    lines = [json.loads(ln) for ln in Path(args.trace).read_text().splitlines() if ln.strip()]
    whole = ceilings(lines, args.block, args.chunk, specs=specs)
    head = (ceilings(lines[:args.skip], args.block, args.chunk, specs=specs)
            if args.skip else None)
    for name, c in (("whole trace", whole),) + ((("before --skip", head),) if head else ()):
        print(f"{name}: {c['requests']} requests, {c['input_tokens']:,} input tokens, "
              f"{c['distinct_tokens']:,} distinct; a cache that never evicts reuses "
              f"{c['kv_hit_tokens'] / c['input_tokens']:.1%} (KV only), "
              f"{c['hybrid_hit_tokens'] / c['input_tokens']:.1%} (hybrid, SGLang's states)")
    if head:
        rest = {k: whole[k] - head[k] for k in ("input_tokens", "kv_hit_tokens",
                                                "hybrid_hit_tokens")}
        print(f"requests {args.skip} on: {rest['kv_hit_tokens'] / rest['input_tokens']:.1%} "
              f"(KV only), {rest['hybrid_hit_tokens'] / rest['input_tokens']:.1%} (hybrid)")
    for name in specs:
        f = [w - (head["flops"][name][i] if head else 0.0)
             for i, w in enumerate(whole["flops"][name])]
        where = f"requests {args.skip} on" if head else "whole trace"
        print(f"{name}, {where}: a cache that never evicts saves {f[1] / f[0]:.1%} of the "
              f"prefill FLOPs (KV only), {f[2] / f[0]:.1%} (hybrid, SGLang's states)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
