"""``verify-exact``: resume from cached checkpoints on real hybrid model code and compare
(``--live``: SGLang's own code in live CPU servers); exit 0 PASS, 1 FAIL, 2 bad input."""
from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from sglang_marconi.errors import UserError

LIVE_HARNESS = Path(__file__).resolve().parents[2] / "tests" / "live"
LIVE_TITLES = {"qwen3_next": "tiny Qwen3-Next (3 GDN + 1 gated attention layer, MoE)",
               "nemotron_h": "tiny Nemotron-H (2 Mamba2 + 1 attention + 3 MLP layers)"}


def add_arguments(parser) -> None:
    parser.add_argument("--arch", help="architecture name (see --list), or 'all'")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the weights and request tokens (default 0)")
    parser.add_argument("--json", action="store_true", help="print the full results as JSON")
    parser.add_argument("--list", action="store_true", help="list the architectures and exit")
    parser.add_argument("--live", action="store_true",
                        help="SGLang's own Qwen3-Next and Nemotron-H code in live CPU "
                             "servers: stock, marconi "
                             "and marconi-paper (no_buffer, extra_buffer) against a server with "
                             "the radix cache off, plus the negative control (minutes)")
    parser.add_argument("--live-model", choices=sorted(LIVE_TITLES),
                        help="with --live: only this model (default: both)")
    g = parser.add_argument_group("controls (each should make the check FAIL)")
    g.add_argument("--ssm-offset", type=int, default=0, metavar="N",
                   help="negative control: take branch-point SSM states N tokens off")
    g.add_argument("--keep-dt-clamp", action="store_true",
                   help="keep NemotronH/Zamba2's prefill-only dt clamp (decode then disagrees)")
    g.add_argument("--chunked-continuation", action="store_true",
                   help="continue on a cached state with multi-token calls even where only "
                        "token-by-token is exact (Jamba)")


def run(args) -> int:
    from sglang_marconi.exact.archs import ARCHS, get_arch

    if args.live:
        return run_live(args)
    if args.list:
        for arch in ARCHS.values():
            print(f"{arch.name:12s} {arch.title}")
        return 0
    if not args.arch:
        raise UserError("give --arch NAME (or 'all'), or --list")
    archs = list(ARCHS.values()) if args.arch.lower() == "all" else [get_arch(args.arch)]
    if args.ssm_offset and args.ssm_offset not in range(-8, 9):
        raise UserError(f"--ssm-offset must be within -8..8, got {args.ssm_offset}")

    from sglang_marconi.exact.scenario import run_arch

    results = []
    for arch in archs:
        if args.chunked_continuation:
            arch = replace(arch, token_by_token=False)
        res = run_arch(arch, seed=args.seed, ssm_offset=args.ssm_offset,
                       keep_dt_clamp=args.keep_dt_clamp)
        results.append(res)
        if not args.json:
            print_result(res, arch)
    if args.json:
        data = [r.to_dict() for r in results]
        print(json.dumps(data if len(data) > 1 else data[0], indent=2))
    elif len(results) > 1:
        verdicts = (f"{r.arch} {'PASS' if r.passed else 'FAIL'}" for r in results)
        print("summary: " + ", ".join(verdicts))
    return 0 if all(r.passed for r in results) else 1


def _pos(xs) -> str:
    return ",".join(map(str, xs)) or "-"


def print_result(res, arch) -> None:
    yes = lambda b: "yes" if b else "NO"  # noqa: E731
    print(f"verify-exact {arch.name}: {arch.title}; seed {res.seed}, fp32, random weights")
    print(f"{'request':12s} {'input':>5s} {'hit':>4s} {'mid-prompt ckpt':>15s} {'expected':>8s} "
          f"{'stored':>8s} {'next-tok |d|':>12s} {'16-tok |d|':>10s}  greedy")
    for r in res.requests:
        print(f"{r.name:12s} {r.input_len:5d} {r.hit_len:4d} {_pos(r.checkpoint_positions):>15s} "
              f"{_pos(r.expected_positions):>8s} {_pos(r.stored_positions):>8s} "
              f"{r.next_token_max_abs_diff:12.2e} {r.continuation_max_abs_diff:10.2e}  "
              f"{'same' if r.tokens_match else 'DIFFERENT'}")
    print(f"max abs logit diff vs uncached full forward: {res.max_abs_logit_diff:.2e} "
          f"(tolerance {res.tolerance:.0e})")
    print(f"tree checkpoints at the request sequence's branch points: {yes(res.positions_match)}; "
          f"resumed from branch-point states: {res.branch_hits}, from end-of-request states: "
          f"{res.output_hits}")
    print("checkpoint bytes = P * kv_bytes_per_token + ssm_state_bytes of the cost model: "
          f"{yes(res.checkpoint_bytes_match_cost_model)}")
    if res.ssd_crosscheck:
        s = res.ssd_crosscheck
        print(f"Mamba2 states vs mamba-ssm ssd_minimal_discrete: {s['checked_states']} layer "
              f"states, max rel diff {s['max_rel_diff']:.2e} (rtol {s['rtol']:.0e}): "
              f"{yes(s['passed'])}")
    if res.ssm_offset:
        print(f"negative control: branch-point states taken {res.ssm_offset:+d} token(s) off")
    print("PASS" if res.passed else "FAIL")


def run_live(args) -> int:
    if not (LIVE_HARNESS / "exact_live.py").is_file():
        raise UserError(f"--live needs a source checkout: {LIVE_HARNESS} not found")
    sys.path.insert(0, str(LIVE_HARNESS))
    import exact_live  # heavy: the live harness (sglang, servers)
    import exact_report

    log = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
    with tempfile.TemporaryDirectory(prefix="verify-exact-live-") as root:
        result = exact_live.run_all(Path(root), seed=args.seed, log=log,
                                    models=[args.live_model] if args.live_model
                                    else exact_live.MODELS)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        exact_report.print_live(result, exact_live, LIVE_TITLES)
    return 0 if result["passed"] else 1
