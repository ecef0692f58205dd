"""``ab`` with SGLang's host tier: the --hicache-* flags, the ``host`` section of --json
(hits loaded back, bytes in the model's sizes, evictions per tier), the L3 file store,
and the one-line errors."""
import json

import pytest

pytest.importorskip("sglang")

from sglang_marconi.cli import ab as ab_cli  # noqa: E402
from sglang_marconi.cli.host_flags import host_ratio  # noqa: E402
from sglang_marconi.cli.host_flags import HICACHE_GB as GB  # noqa: E402
from sglang_marconi.errors import UserError  # noqa: E402
from sglang_marconi.model import preset_spec  # noqa: E402

POOLS = ("--kv-tokens", "4000", "--mamba-slots", "16", "--page-size", "16",
         "--chunked-prefill-size", "1024", "--mamba-track-interval", "256")


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """Four prefix families (2 shared blocks of 512 tokens + 1 own block) taken in turn,
    five rounds: the device pool (4,000 tokens) holds about two, so a family comes back
    from host."""
    path = tmp_path_factory.mktemp("trace") / "families.jsonl"
    lines, fresh = [], 1000
    for _ in range(5):
        for family in range(4):
            lines.append(json.dumps({"timestamp": 0, "input_length": 1536, "output_length": 8,
                                     "hash_ids": [10 * family, 10 * family + 1, fresh]}))
            fresh += 1
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(trace, *extra):
    from cli_helper import run_cli

    return run_cli(ab_cli, "--trace", str(trace), "--model", "qwen3_next", *POOLS,
                   "--no-progress", *extra)


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_ab_host_section(families, policy):
    out = json.loads(_run(families, "--caches", "stock-python,marconi+",
                          "--hicache-ratio", "3", "--hicache-write-policy", policy,
                          "--json"))
    spec = preset_spec("qwen3_next")
    host_cfg = out["config"]["host"]
    # SGLang's host pool: int(4,000 x 3) floored to its 16-token page, plus one page
    assert host_cfg["write_policy"] == policy and host_cfg["kv_tokens"] == 12016
    for name, col in out["caches"].items():
        host = col["host"]
        assert host["hit_tokens"] > 0, name  # prefixes came back from host
        assert host["bytes_loaded"] == (host["kv_tokens_loaded"] * spec.kv_bytes_per_token
                                        + host["states_loaded"] * spec.ssm_state_bytes)
        assert col["hit_tokens"] >= host["hit_tokens"]  # device + host hits
        assert 0 < host["flops_saved"] <= col["flops_saved"]
        assert host["bytes_backed_up"] > 0


def test_ab_l3_file_store_and_table(families):
    text = _run(families, "--caches", "marconi", "--hicache-ratio", "1",
                "--hicache-storage-backend", "file")
    assert "host: hit tokens (loaded back)" in text and "host: L3 tokens fetched" in text


def test_hicache_size_splits_like_sglang():
    """--hicache-size: each host pool gets size / device bytes times its device slots."""
    import argparse

    spec = preset_spec("paper-7b")
    args = argparse.Namespace(hicache_size=400.0, hicache_ratio=3.0)
    ratio = host_ratio(args, spec, 862_592, 1_897)
    device = 862_592 * spec.kv_bytes_per_token + 1_897 * spec.ssm_state_bytes
    assert ratio == pytest.approx(400 * GB / device)  # the size overrides the ratio


def test_host_tier_over_unified_memory_is_refused(families):
    with pytest.raises(UserError, match="--memory unified"):
        from cli_helper import run_cli

        run_cli(ab_cli, "--trace", str(families), "--model", "qwen3_next",
                "--cache-gb", "10", "--memory", "unified", "--limit", "5",
                "--hicache-ratio", "2", "--no-progress")
