"""docs/usage.md's Marconi settings table is the one ``scripts/flag_table.py`` prints from
the settings schema, so the page cannot drift from the flags the launcher has."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_usage_page_holds_the_generated_table():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "flag_table.py")],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out.startswith("<!-- flag table") and "--marconi-alpha" in out
    page = (REPO / "docs" / "usage.md").read_text(encoding="utf-8")
    assert out in page, "docs/usage.md: paste the output of scripts/flag_table.py"
