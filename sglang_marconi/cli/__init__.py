"""Every command-line entry point: ``python -m sglang_marconi <command>`` (``main``) and one
module per command (``add_arguments(parser)`` + ``run(args) -> int``)."""
from sglang_marconi.cli.main import main

__all__ = ["main"]
