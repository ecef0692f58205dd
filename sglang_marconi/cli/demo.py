"""``demo`` (what ``make demo`` runs): ``ab`` of stock SGLang's hybrid radix cache against the
Marconi cache on the bundled default trace, model and pools."""
from __future__ import annotations

from pathlib import Path

from sglang_marconi.cli import ab as ab_cli
from sglang_marconi.errors import UserError

DEFAULT_TRACE = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "mooncake" \
    / "synthetic_trace.jsonl"
DEFAULTS = {"model": "qwen3_next", "kv_tokens": 1_500_000, "mamba_slots": 200,
            "caches": "stock,stock-python,marconi,marconi-paper"}


def add_arguments(parser) -> None:
    ab_cli.add_arguments(parser)
    for action in parser._actions:  # the demo has defaults for everything
        if action.dest == "trace":
            action.required, action.default = False, str(DEFAULT_TRACE)
        elif action.dest in DEFAULTS:
            action.required, action.default = False, DEFAULTS[action.dest]
    for group in parser._mutually_exclusive_groups:
        group.required = False


def run(args) -> int:
    if args.config:
        args.model = None
    if args.cache_gb is not None:  # a budget replaces the demo's explicit pool sizes
        for dest in ("kv_tokens", "mamba_slots"):
            if getattr(args, dest) == DEFAULTS[dest]:
                setattr(args, dest, None)
    if not Path(args.trace).is_file():
        raise UserError(f"demo trace not found: {args.trace} (the repository expects the "
                        "shared traces beside it; pass --trace PATH)")
    if not args.json:
        print("sglang-marconi demo: stock SGLang 0.5.23 hybrid radix cache (compiled and python "
              "tree cores) vs MarconiUnifiedRadixCache\n(marconi: what --cache-policy marconi "
              "runs; marconi-paper: the paper's alpha ranking and admission, at most 2 states "
              "per request),\ndriven on CPU with the scheduler's call sequence "
              "(python -m sglang_marconi ab --help for the knobs)\n")
    return ab_cli.run(args)
