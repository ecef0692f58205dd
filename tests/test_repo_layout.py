"""The repository's layout: data files live in tests/data/, docs/ is documentation.

- no tracked ``.json`` / ``.jsonl`` / ``.csv`` file outside ``tests/data/``, no ``.txt``
  outside ``tests/data/``, ``requirements/`` and ``tests/live/`` (pip requirement files and
  the CPU test kit's ``entry_points.txt`` are configuration, not data);
- ``docs/*.md`` together at most 25,000 words (``cat docs/*.md | wc -w``);
- no issue numbers ("issue 18", "issue #18", "(#21)") and no "stale until" banners in
  ``docs/*.md`` or ``README.md``: a page says what is true now, the history is git's.

Skipped outside a git checkout (an unpacked sdist has no ``git ls-files``)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_DOC_WORDS = 25_000
DATA_SUFFIXES = (".json", ".jsonl", ".csv")
TXT_ALLOWED = ("tests/data/", "requirements/", "tests/live/")
ISSUE_REF = re.compile(r"\bissues?\s+#?\d+|\(#\d+\)", re.IGNORECASE)
STALE = re.compile(r"stale\s+until", re.IGNORECASE)


def _tracked_files() -> list[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if proc.returncode != 0:
        pytest.skip("not a git checkout")
    return [p for p in proc.stdout.decode("utf-8").split("\0") if p]


def _pages() -> list[Path]:
    _tracked_files()  # the same skip outside a checkout
    return sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def test_no_data_files_outside_tests_data():
    bad = []
    for path in _tracked_files():
        name = path.lower()
        if name.endswith(DATA_SUFFIXES) and not path.startswith("tests/data/"):
            bad.append(path)
        elif name.endswith(".txt") and not path.startswith(TXT_ALLOWED):
            bad.append(path)
    assert not bad, f"data files outside tests/data/: {bad}"


def test_docs_are_at_most_25000_words():
    _tracked_files()
    words = sum(len(p.read_text(encoding="utf-8").split())
                for p in sorted((ROOT / "docs").glob("*.md")))
    assert words <= MAX_DOC_WORDS, f"docs/*.md hold {words:,} words (at most {MAX_DOC_WORDS:,})"


def test_docs_name_no_issue_numbers_and_no_stale_banners():
    found = []
    for page in _pages():
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for pattern in (ISSUE_REF, STALE):
                for m in pattern.finditer(line):
                    found.append(f"{page.relative_to(ROOT)}:{n}: {m.group(0)!r}")
    assert not found, "issue references or stale banners:\n" + "\n".join(found)


@pytest.mark.parametrize("text, hit", [
    ("after issue 18's learned chain weight", True),
    ("issue #18", True),
    ("the router (#21) and", True),
    ("Issues 11-14 were merged", True),
    ("stale until re-measured", True),
    ("a known issue with the time model", False),
    ("a tensor of shape (#heads, dim)", False),
])
def test_the_patterns_match_what_they_should(text, hit):
    assert bool(ISSUE_REF.search(text) or STALE.search(text)) is hit
