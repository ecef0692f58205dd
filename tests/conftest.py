"""Shared test fixtures: the repository root, the shared Mooncake trace, small specs."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "synthetic_trace.jsonl"


@pytest.fixture(scope="session")
def mooncake_path():
    if not MOONCAKE.is_file():
        pytest.skip(f"shared Mooncake trace not found at {MOONCAKE}")
    return MOONCAKE


@pytest.fixture(scope="session")
def paper_spec():
    from sglang_marconi.model import HybridModelSpec

    return HybridModelSpec.from_preset("paper-7b")
