"""The CPU A/B (``sglang-marconi ab``) on the shared Mooncake trace: it runs, both caches
report, and the numbers are consistent with each other (not that Marconi wins)."""
import json

import pytest

pytest.importorskip("sglang")

from sglang_marconi.errors import UserError  # noqa: E402
from sglang_marconi.model import preset_spec  # noqa: E402

LIMIT = 80
KV_TOKENS, SLOTS = 400_000, 24


def _run_cli(*argv):
    from cli_helper import run_cli
    from sglang_marconi.cli import ab as ab_cli

    return run_cli(ab_cli, *argv)


@pytest.fixture(scope="module")
def ab_result(mooncake_path):  # conftest: ../shared/traces/mooncake (skips if absent)
    text = _run_cli("--trace", str(mooncake_path), "--model", "qwen3_next",
                    "--kv-tokens", str(KV_TOKENS), "--mamba-slots", str(SLOTS),
                    "--limit", str(LIMIT), "--json", "--no-progress", "--marconi-alpha", "1.0")
    return json.loads(text)


def test_ab_reports_every_cache(ab_result):
    caches = ab_result["caches"]
    assert set(caches) == {"stock", "stock-python", "marconi"}
    for c in caches.values():
        assert 0.0 <= c["token_hit_rate"] <= 1.0
        assert c["flops_saved"] >= 0.0
        assert c["requests"] == LIMIT


def test_ab_numbers_are_consistent(ab_result):
    spec = preset_spec("qwen3_next")
    caches = ab_result["caches"]
    inputs = {c["input_tokens"] for c in caches.values()}
    assert len(inputs) == 1  # the same requests went to every cache
    for c in caches.values():
        assert c["hit_tokens"] == pytest.approx(c["token_hit_rate"] * c["input_tokens"])
        # FLOPs saved are the cost model's prefill FLOPs of the hits: bounded by a single
        # hit of all hit tokens and by prefilling everything
        assert c["flops_saved"] <= spec.prefill_flops(c["hit_tokens"]) * (1 + 1e-9)
        assert 0 <= c["flops_saved_fraction"] <= 1
        assert 0 <= c["states_in_tree"] <= SLOTS
        assert c["states_admitted"] >= c["states_evicted"]
        assert c["peak_kv_slots_used"] <= KV_TOKENS
        assert c["peak_state_slots_used"] <= SLOTS
    # the compiled and the python tree cores are the same policy
    for key in ("hit_tokens", "flops_saved", "states_admitted", "states_evicted"):
        assert caches["stock"][key] == caches["stock-python"][key]
    m = caches["marconi"]["marconi"]  # the cache's own counters agree with the A/B's
    assert m["hit_tokens"] == caches["marconi"]["hit_tokens"]
    assert m["flops_saved"] == pytest.approx(caches["marconi"]["flops_saved"])
    assert sum(m["states_admitted"].values()) == caches["marconi"]["states_admitted"]
    assert m["alpha"] == 1.0


def test_ab_table_and_bad_input(mooncake_path):
    trace = str(mooncake_path)
    text = _run_cli("--trace", trace, "--model", "qwen3_next", "--kv-tokens", "300000",
                    "--mamba-slots", "16", "--limit", "10", "--caches", "stock,marconi,marconi+",
                    "--no-progress")
    assert "token hit rate" in text and "FLOPs saved" in text and "marconi" in text
    assert "marconi+: reuse-weighted" in text and "end states skipped" in text
    with pytest.raises(UserError, match="longest request"):
        _run_cli("--trace", trace, "--model", "qwen3_next", "--kv-tokens", "1000",
                 "--mamba-slots", "16", "--limit", "3")
    with pytest.raises(UserError, match="unknown"):
        _run_cli("--trace", trace, "--model", "qwen3_next", "--kv-tokens", "300000",
                 "--mamba-slots", "16", "--limit", "3", "--caches", "stock,vllm")


def test_ab_end_threshold_from_the_python_api(mooncake_path):
    """The marconi column follows ``MarconiSettings.end_threshold`` (an internal default,
    set from the Python API): 0 keeps every end state."""
    from sglang_marconi.driver.pools import PoolConfig
    from sglang_marconi.harness.ab import ABConfig, run_ab, to_replay_requests
    from sglang_marconi.sglang_integration.options import MarconiSettings
    from sglang_marconi.sim.traces import read_trace

    requests = to_replay_requests(read_trace(str(mooncake_path)), 60)
    longest = max(len(r.input_ids) + len(r.output_ids) for r in requests)

    def run(threshold):
        cfg = ABConfig(pools=PoolConfig(kv_tokens=300000, mamba_slots=16,
                                        max_context_len=longest + 128),
                       spec=preset_spec("qwen3_next"), caches=("marconi",),
                       settings=MarconiSettings(end_threshold=threshold))
        return run_ab(requests, cfg, show_progress=False)["caches"]["marconi"]["marconi"]

    learned, keep_all = run(0.05), run(0.0)
    assert learned["end_states_skipped"] > 0
    assert keep_all["end_states_skipped"] == 0
    assert keep_all["states_admitted"]["final"] > learned["states_admitted"]["final"]

def test_ab_turns_sglangs_out_of_memory_into_one_line(mooncake_path, monkeypatch):
    """SGLang's allocator running out mid-trace (pools that fit the longest request but not
    what the states and running requests hold with it) is a one-line error, not a
    traceback; any other RuntimeError still propagates."""
    from sglang_marconi.driver.replay import Replayer

    def oom(self, rr):
        raise RuntimeError("Decode out of memory. Try to lower your batch size.\n"
                           "Try to allocate 1 tokens.\nAvailable full tokens: 0\nmore")

    monkeypatch.setattr(Replayer, "run", oom)
    argv = ("--trace", str(mooncake_path), "--model", "qwen3_next", "--kv-tokens", "300000",
            "--mamba-slots", "16", "--limit", "3", "--caches", "stock", "--no-progress")
    with pytest.raises(UserError) as err:
        _run_cli(*argv)
    assert str(err.value).startswith("stock: SGLang raised 'Decode out of memory.")
    assert "Try to allocate 1 tokens.; Available full tokens: 0)" in str(err.value)
    assert "at request 1:" in str(err.value) and "\n" not in str(err.value)
    monkeypatch.setattr(Replayer, "run", lambda self, rr: (_ for _ in ()).throw(
        RuntimeError("something else")))
    with pytest.raises(RuntimeError, match="something else"):
        _run_cli(*argv)
