"""Print the Marconi settings table of docs/usage.md from the one schema
(``sglang_marconi.sglang_integration.options.MarconiSettings``): the launcher flags first,
then the internal defaults the Python API sets. tests/test_flag_table.py holds the page
equal to this output.

Usage: .venv/bin/python scripts/flag_table.py
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_marconi.sglang_integration.options import MarconiSettings  # noqa: E402

BEGIN = "<!-- flag table: scripts/flag_table.py -->"
END = "<!-- end of flag table -->"


def _default(value) -> str:
    return "unset" if value is None else f"`{value}`"


def table() -> str:
    fields = dataclasses.fields(MarconiSettings)
    rows = ["| launcher flag | `MarconiSettings` field | default | what it does |",
            "| --- | --- | --- | --- |",
            "| `--cache-policy {lru,marconi}` | (selects the cache) | `lru` | `marconi` turns "
            "the Marconi cache on; `marconi+` is a deprecated alias of `marconi` |"]
    for f in sorted(fields, key=lambda f: f.metadata["flag"] is None):
        flag = f"`{f.metadata['flag']}`" if f.metadata["flag"] else "(Python API only)"
        rows.append(f"| {flag} | `{f.name}` | {_default(f.default)} | {f.metadata['help']} |")
    return "\n".join([BEGIN, *rows, END])


if __name__ == "__main__":
    print(table())
