"""docs/sglang.md's feature table has a row for every ``--mamba-*``, ``--speculative-*``
and ``--disaggregation-*`` server flag SGLang defines, so a new SGLang release cannot add
one the documentation (and its check) never considered."""
import re
from pathlib import Path

import pytest

pytest.importorskip("sglang")

from sglang.srt.arg_groups.arg_utils import record_fields  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

PAGE = Path(__file__).resolve().parents[1] / "docs" / "sglang.md"
PREFIXES = ("mamba_", "speculative_", "disaggregation_")


def _table() -> str:
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## SGLang feature combinations", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("|"))


def test_every_mamba_speculative_disaggregation_flag_has_a_row():
    flags = [f"--{f.name.replace('_', '-')}" for f in record_fields(ServerArgs)
             if f.name.startswith(PREFIXES)]
    assert len(flags) > 40  # SGLang 0.5.23 has 58
    table = _table()
    # a family written once as `--speculative-ngram-*` (`min-bfs-breadth`, ...) counts
    families = {m.group(1): m.group(2) for m in re.finditer(r"`(--[a-z-]+)-\*` \(([^)]*)\)", table)}

    def covered(flag):
        if f"`{flag}`" in table or f"`{flag} " in table:
            return True
        return any(flag.startswith(fam + "-") and f"`{flag[len(fam) + 1:]}`" in names
                   for fam, names in families.items())

    missing = [flag for flag in flags if not covered(flag)]
    assert not missing, f"docs/sglang.md's feature table has no row for {missing}"
