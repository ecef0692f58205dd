"""``gen-trace``: write a seeded synthetic workload as a session JSONL trace."""
from __future__ import annotations

from sglang_marconi.cli.common import parse_params, print_json
from sglang_marconi.errors import UserError
from sglang_marconi.sim.generators import WORKLOADS, generate, workload_params
from sglang_marconi.sim.traces import write_sessions


def add_arguments(parser) -> None:
    parser.add_argument("--workload", required=False,
                        help="chat, agent, shared-prompt, fork-join or drift")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="generator parameter override, repeatable")
    parser.add_argument("--out", "-o", help="output JSONL path")
    parser.add_argument("--list", action="store_true",
                        help="list workloads and their default parameters")
    parser.add_argument("--json", action="store_true", help="print a JSON summary")


def run(args) -> int:
    if args.list:
        info = {name: workload_params(name) for name in WORKLOADS}
        if args.json:
            print_json(info)
        else:
            for name, params in info.items():
                print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in params.items()))
        return 0
    if not args.workload or not args.out:
        raise UserError("give --workload NAME and --out PATH (or --list)")
    trace = generate(args.workload, seed=args.seed, **parse_params(args.param))
    write_sessions(trace, args.out)
    summary = {"workload": args.workload, "seed": args.seed, "requests": len(trace),
               "input_tokens": trace.input_tokens, "out": args.out}
    if args.json:
        print_json(summary)
    else:
        print(f"wrote {len(trace):,} requests ({trace.input_tokens:,} input tokens) to {args.out}")
    return 0
