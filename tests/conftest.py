"""Shared test fixtures: the repository root, the shared Mooncake trace, small specs."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "synthetic_trace.jsonl"

# the tests' helper modules (``cli_helper``, ``hand_costs``) import by name under any --import-mode,
# and so does the scripts' library (scripts/lib: ``marconi_reports``, ``marconi_checks``),
# which is not installed
for _path in (ROOT / "tests", ROOT / "scripts" / "lib"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


@pytest.fixture(scope="session")
def mooncake_path():
    if not MOONCAKE.is_file():
        pytest.skip(f"shared Mooncake trace not found at {MOONCAKE}")
    return MOONCAKE


@pytest.fixture(scope="session")
def paper_spec():
    from sglang_marconi.model import preset_spec

    return preset_spec("paper-7b")


@pytest.fixture(autouse=True)
def _restore_marconi_env():
    """Parsing --cache-policy marconi exports SGLANG_MARCONI_* into os.environ: undo it
    after every test."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("SGLANG_MARCONI_")}
    yield
    for k in [k for k in os.environ if k.startswith("SGLANG_MARCONI_")]:
        del os.environ[k]
    os.environ.update(saved)
