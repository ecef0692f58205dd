"""``python -m sglang_marconi``: the command-line entry point."""
from sglang_marconi.cli import main

raise SystemExit(main())
