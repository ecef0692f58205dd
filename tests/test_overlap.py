"""serve-sim's two scheduler loops: ``--disable-overlap-schedule`` is the loop as it was
before the overlap loop existed, bit for bit (a golden from commit 60b8b61); the overlap
loop (SGLang's default) keeps SGLang's cache invariants and conserves requests and slots
after every step with retraction and aborts, reproduces ``ab``'s per-request hits for one
client with zero gaps in both loops, and donates the right ping-pong slot of a request that
finishes on a stop token."""
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("sglang")

DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DATA))
import gen_serving_golden as golden  # noqa: E402


def test_normal_loop_is_bit_identical_to_before(mooncake_path):
    want = json.loads((DATA / "serving_normal_loop_golden.json").read_text())
    got = golden.main(str(mooncake_path), "", {"overlap": False},
                      cli_extra=("--disable-overlap-schedule",), cli_caches="marconi+")
    assert want["cli_unified"][1]["cache"] == "marconi+"
    assert want["cli_unified"][1]["token_hit_rate"] > 0  # hits, so the tree is exercised
    assert want["static_retract_marconi+"]["summary"]["retractions"] > 0
    for key, old in want.items():
        new = got[key]
        if isinstance(old, list):
            old_new = [(old[1], new[0])]
        else:
            assert new["records"] == old["records"], key
            old_new = [(old["summary"], new["summary"])]
        for o, n in old_new:
            assert {k: n.get(k) for k in o} == o, key
