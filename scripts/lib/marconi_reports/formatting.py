"""Number formatters and markdown tables shared by every report (docs/results.md, the
benchmark scripts' tables): one copy, so the same number reads the same everywhere."""
from __future__ import annotations

import math
import os
from pathlib import Path


def pct(x, sign=False):
    """A fraction as a percentage (``0.123`` -> ``12.3%``); ``-`` for None, ``inf`` for a
    non-finite value."""
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf"
    return f"{100 * x:+.1f}%" if sign else f"{100 * x:.1f}%"


def pp(x):
    """A difference of two fractions in percentage points."""
    return f"{100 * x:+.1f} pp"


def times(x):
    """A ratio (``2.5`` -> ``2.50x``); ``-`` for None, ``inf`` for a non-finite value."""
    if x is None:
        return "-"
    return "inf" if not math.isfinite(x) else f"{x:.2f}x"


def gb(n):
    """Bytes as GB (3 significant digits); ``unlimited`` for None."""
    return "unlimited" if n is None else f"{n / 1e9:.3g} GB"


def ms(s):
    """Seconds as whole milliseconds; ``-`` for None."""
    return "-" if s is None else f"{s * 1e3:.0f} ms"


def pflop(f):
    """FLOPs as PFLOP."""
    return f"{f / 1e15:,.1f}"


def rate_of(r):
    """A replay record's token hit rate."""
    return pct(r["token_hit_rate"])


def table(header, rows):
    """A markdown table: a header row, the separator, one row per tuple of cells."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def text_table(columns, rows) -> list:
    """A plain-text table's lines: ``columns`` = ((title, alignment and width, e.g. ``">9"``),
    ...); each row: its cells, in the columns' order, each padded as its column says."""
    def line(cells):
        return "".join(f"{str(c):{spec}}" for c, (_, spec) in zip(cells, columns))
    return [line([title for title, _ in columns])] + [line(row) for row in rows]


def slug(name: str) -> str:
    """``name`` with every non-alphanumeric character as ``_`` (file names of plots)."""
    return "".join(c if c.isalnum() else "_" for c in name)


def relpath(target: Path, start: Path) -> str:
    """``target`` relative to ``start``, both resolved (links from a report to its plots)."""
    return os.path.relpath(Path(target).resolve(), Path(start).resolve())


def display_path(path: str, root: Path) -> str:
    """``path`` relative to ``root`` where it lies at most one folder above ``root``;
    otherwise as given."""
    try:
        rel = relpath(Path(path), root)
    except ValueError:
        return path
    return path if rel.startswith("../..") else rel
