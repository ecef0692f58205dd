"""scripts/trace_reuse_ceiling.py: the never-evicting ceilings, in tokens and in FLOPs.

The FLOPs figure is what docs/scale-out.md sets against the scale-out issue's target; it
must bound every cache the simulator runs on the same requests.
"""
import importlib.util
import json
from pathlib import Path

import pytest

from hand_costs import SquareCost
from sglang_marconi.sim.policies import parse_policies
from sglang_marconi.sim.runner import simulate
from sglang_marconi.sim.traces import read_trace

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "trace_reuse_ceiling.py"


@pytest.fixture(scope="module")
def ceiling():
    spec = importlib.util.spec_from_file_location("trace_reuse_ceiling", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module



def test_hand_built_trace(ceiling):
    # blocks of 4 tokens: A = [1, 2] (8 tokens), then B = C = [1, 2, 3] (12 tokens)
    reqs = [{"input_length": 8, "hash_ids": [1, 2]},
            {"input_length": 12, "hash_ids": [1, 2, 3]},
            {"input_length": 12, "hash_ids": [1, 2, 3]}]
    c = ceiling.ceilings(reqs, block=4, chunk=1 << 20, grid=4, specs={"sq": SquareCost()})
    # KV only: B reuses A's 8 tokens, C 11 of B's 12 (SGLang matches at most n - 1)
    assert c["kv_hit_tokens"] == 8 + 11
    # hybrid: A's end state (8) serves B and C; B's end state (12) is past C's limit (11)
    assert c["hybrid_hit_tokens"] == 8 + 8
    prefill, kv_saved, hybrid_saved = c["flops"]["sq"]
    assert prefill == 64 + 144 + 144
    assert kv_saved == 64 + 121 and hybrid_saved == 64 + 64


def test_flops_ceiling_bounds_every_cache(ceiling, mooncake_path, paper_spec):
    """No cache saves more than a never-evicting KV-only cache; SGLang's stock cache with
    room for everything comes within the block rounding of the hybrid ceiling."""
    n = 400
    lines = [json.loads(x) for x in Path(mooncake_path).read_text().splitlines()[:n]]
    c = ceiling.ceilings(lines, block=512, chunk=8192, specs={"paper-7b": paper_spec})
    prefill, kv_saved, hybrid_saved = c["flops"]["paper-7b"]
    res = simulate(read_trace(mooncake_path).head(n), paper_spec, 10 ** 13,
                   parse_policies("sglang,marconi+:materialise=sglang"), progress=False)
    for name, r in res["policies"].items():
        assert r["prefill_flops"] == pytest.approx(prefill, rel=1e-9)
        assert 0 < r["flops_saved"] <= kv_saved, name
    stock = res["policies"]["sglang"]["flops_saved"]
    assert hybrid_saved <= stock * 1.001 and stock <= kv_saved
    assert stock / prefill == pytest.approx(hybrid_saved / prefill, abs=0.01)
