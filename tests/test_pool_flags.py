"""``ab`` / ``demo`` pool flags: ``--cache-gb N --memory static|unified`` sized like SGLang,
or the explicit ``--kv-tokens/--mamba-slots``; one form; ``--json`` carries the pools."""
import argparse
import io
import json
from contextlib import redirect_stdout

import pytest

from sglang_marconi.errors import UserError
from sglang_marconi.model import preset_spec


def _args(*argv):
    from sglang_marconi.cli import ab as ab_cli

    parser = argparse.ArgumentParser()
    ab_cli.add_arguments(parser)
    return parser.parse_args(["--trace", "t.jsonl", "--model", "paper-7b", *argv])


@pytest.mark.parametrize("argv, field", [
    (("--cache-gb", "50", "--kv-tokens", "100000"), "--cache-gb"),
    (("--memory", "unified", "--kv-tokens", "100000", "--mamba-slots", "8"), "--memory"),
    (("--kv-tokens", "100000"), "--mamba-slots"),
    ((), "--cache-gb"),
    (("--cache-gb", "0.01"), "--cache-gb"),
])
def test_one_form_one_line_errors(argv, field):
    from sglang_marconi.cli.pool_flags import resolve_pools

    with pytest.raises(UserError) as err:
        resolve_pools(_args(*argv), preset_spec("paper-7b"))
    assert field in str(err.value) and "\n" not in str(err.value)


def test_budget_sizes_pools_and_unified_gets_a_buffer():
    from sglang_marconi.cli.pool_flags import resolve_pools
    from sglang_marconi.driver.sizing import size_pools

    spec = preset_spec("paper-7b")
    kv, slots, sizes, unified = resolve_pools(_args("--cache-gb", "50"), spec)
    assert (kv, slots) == (sizes.kv_tokens, sizes.mamba_slots) and unified is None
    assert sizes == size_pools(spec, 50)
    kv, slots, sizes, unified = resolve_pools(
        _args("--cache-gb", "50", "--memory", "unified", "--mamba-full-memory-ratio", "2"), spec)
    assert sizes.mode == "unified" and unified.unified_bytes == sizes.unified_bytes
    assert unified.mamba_slots == slots == size_pools(spec, 50, mamba_full_memory_ratio=2).mamba_slots
    assert resolve_pools(_args("--kv-tokens", "9000", "--mamba-slots", "9"), spec)[:3] == (
        9000, 9, None)


def test_ab_json_in_unified_mode(mooncake_path):  # conftest: skips without the shared trace
    pytest.importorskip("sglang")
    from sglang_marconi.cli import ab as ab_cli

    args = _args("--cache-gb", "20", "--memory", "unified", "--limit", "12", "--json",
                 "--no-progress", "--caches", "stock,marconi+")
    args.trace = str(mooncake_path)
    out = io.StringIO()
    with redirect_stdout(out):
        assert ab_cli.run(args) == 0
    result = json.loads(out.getvalue())
    assert set(result["caches"]) == {"stock", "marconi+"}
    assert {"flops_saved_fraction", "token_hit_rate"} <= set(result["caches"]["stock"])
    pools = result["config"]["pools"]
    assert pools["mode"] == "unified" and pools["unified_bytes"] > 0
    assert result["config"]["kv_tokens"] == pools["kv_tokens"]
    assert pools["max_running_requests"] == pools["mamba_slots"] // pools["slots_per_request"]


def test_demo_takes_a_budget_instead_of_its_explicit_pools(monkeypatch, tmp_path):
    from sglang_marconi.cli import ab as ab_cli
    from sglang_marconi.cli import demo

    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    trace = tmp_path / "t.jsonl"
    trace.write_text("")
    seen = {}
    monkeypatch.setattr(ab_cli, "run", lambda args: seen.update(vars(args)) or 0)
    assert demo.run(parser.parse_args(["--trace", str(trace), "--cache-gb", "50",
                                       "--memory", "unified", "--json"])) == 0
    assert seen["kv_tokens"] is None and seen["mamba_slots"] is None
    assert seen["cache_gb"] == 50 and seen["memory"] == "unified"
    demo.run(parser.parse_args(["--trace", str(trace), "--json"]))
    assert (seen["kv_tokens"], seen["mamba_slots"]) == (1_500_000, 200)
