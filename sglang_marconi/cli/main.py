"""Command-line front end (``python -m sglang_marconi <command>``): maps command names to their
modules (``add_arguments``, ``run``), imported lazily."""
from __future__ import annotations

import argparse
import importlib
import sys

from sglang_marconi.errors import UserError

# command name -> (module, one-line help)
COMMANDS = {
    "demo": ("sglang_marconi.cli.demo", "install check + A/B on the bundled default trace"),
    "model-info": ("sglang_marconi.cli.model_info", "bytes and FLOPs of a hybrid model"),
    "sim": ("sglang_marconi.cli.sim", "trace-driven simulation of cache policies"),
    "gen-trace": ("sglang_marconi.cli.gen_trace", "write a seeded synthetic trace"),
    "ab": ("sglang_marconi.cli.ab", "A/B: stock SGLang cache vs Marconi on CPU"),
    "verify-exact": ("sglang_marconi.cli.verify_exact", "prove resuming from a checkpoint is exact"),
    "serve-sim": ("sglang_marconi.cli.serve_sim",
                  "stock vs Marconi under concurrent traffic: SGLang's scheduler, virtual GPU clock"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang-marconi", description="Marconi prefix caching "
                                     "for hybrid (attention + SSM) LLMs in SGLang.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, help_text) in COMMANDS.items():  # arguments: only the chosen command's
        sub.add_parser(name, help=help_text, description=help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # Find the command first, then let its module add its own arguments.
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser.parse_args(argv)  # prints help / usage error and exits
        return 2
    name = argv[0]
    module = importlib.import_module(COMMANDS[name][0])
    cmd_parser = argparse.ArgumentParser(prog=f"sglang-marconi {name}",
                                         description=COMMANDS[name][1])
    module.add_arguments(cmd_parser)
    args = cmd_parser.parse_args(argv[1:])
    try:
        return int(module.run(args) or 0)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
