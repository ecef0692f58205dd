"""SGLang's own clients against the live CPU server, refusals at start-up, and shutdown.

Runs after ``test_live_server.py`` (file order) on servers the farm already holds where it
can: an ``sglang.function`` fork/gen program and ``sglang.bench_serving``
(generated-shared-prefix) against Marconi servers, speculative decoding refused with one
line, and every server stopped by SIGTERM with no process left behind.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import sglang as sgl

from live_configs import LAST, server_args
from server import LiveServer, live_env
from streams import KV_TOKENS, MAMBA_SLOTS, MAX_RUNNING, run_stream

# the server the last configuration left up: Qwen3-Next, extra_buffer + overlap, marconi
FORK_CFG = BENCH_CFG = LAST


def test_bench_serving_generated_shared_prefix(farm, tmp_path):
    """``python -m sglang.bench_serving --dataset-name generated-shared-prefix`` completes
    against a marconi server and the server reports cache hits in its counters."""
    server = farm.get(BENCH_CFG)
    hits0 = server.metric("sglang:marconi_hit_tokens_total", default=0.0)
    out = tmp_path / "bench.jsonl"
    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang",
           "--base-url", server.url, "--tokenizer", str(server.model_path),
           "--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "2",
           "--gsp-prompts-per-group", "4", "--gsp-system-prompt-len", "400",
           "--gsp-question-len", "40", "--gsp-output-len", "8", "--num-prompts", "8",
           "--request-rate", "inf", "--max-concurrency", "2", "--disable-tqdm",
           "--output-file", str(out), "--seed", "1"]
    proc = subprocess.run(cmd, env=live_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text().splitlines()[-1])
    assert result["completed"] == 8
    assert server.metric("sglang:marconi_hit_tokens_total") > hits0


def test_sglang_function_fork_program(farm):
    """The frontend language: a shared prefix, a fork into branches, gen in each; the
    branches' calls after the first find the shared prefix cached."""
    server = farm.get(FORK_CFG)

    @sgl.function
    def branches(s, question):
        s += "Answer each question in several ways. " * 12 + question
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f" Way {i + 1}: "
            f += sgl.gen("way", max_tokens=12, temperature=0)
        s += " Best: " + sgl.gen("best", max_tokens=6, temperature=0)

    backend = sgl.RuntimeEndpoint(server.url)
    before = server.metric("sglang:num_requests_total", default=0.0)
    states = branches.run_batch([{"question": f" Question {k}?"} for k in range(3)],
                                backend=backend, num_threads=1)
    for st in states:
        assert st["best"], st.text()[-200:]
        assert st.get_meta_info("best")["prompt_tokens"] > 450
    # the forked gens and the final gen of each program reached the server (the
    # interpreter may batch the forks: 10 requests for these 3 programs with 0.5.23)
    assert server.metric("sglang:num_requests_total") - before >= 3 * 2
    cached = [st.get_meta_info("best")["cached_tokens"] for st in states]
    assert all(c > 0 for c in cached[1:]), cached


def test_unified_memory_serves(farm):
    """``--enable-unified-memory`` (one byte buffer for KV and states; SGLang needs the
    triton attention backend for its page-major KV layout) with marconi: the Marconi
    cache ranks KV and states together, the scripted stream hits where states are, and
    SGLang's idle leak check stays silent. (Not compared with ``ab``: ab sizes a unified
    buffer from --cache-gb, not from a server's token caps.)"""
    args = [*server_args("qwen3_next", "extra_buffer", "marconi"),
            "--enable-unified-memory", "--attention-backend", "triton"]
    server = LiveServer(farm.models["qwen3_next"], args, max_total_tokens=KV_TOKENS,
                        mamba_slots=MAMBA_SLOTS, max_running=MAX_RUNNING).start()
    try:
        assert server.server_info()["enable_unified_memory"] is True
        assert "memory=unified" in server.log_text()
        # the cost model's bytes are the ones the unified buffer's pools hold
        assert "Marconi cache: SGLang's pools hold" in server.log_text()
        assert "differ from the cost model" not in server.log_text()
        before = len(server.log_text())
        rec = run_stream(server.generate)
        assert rec.by_name("shared-2").cached_tokens == 256      # the chunk state
        assert rec.by_name("shared-3").cached_tokens == 320      # the branch state
        assert rec.by_name("doc-prefix").cached_tokens == 512
        assert server.metric("sglang:marconi_hit_tokens_total") == sum(rec.hits())
        assert server.wait_idle()
        time.sleep(1.0)  # an idle round: SGLang's leak check
        log = server.log_text()[before:].lower()
        assert "leak" not in log and "traceback" not in log, log[-3000:]
    finally:
        farm._stop(("qwen3_next", "extra_buffer", "marconi", "unified"), server)


@pytest.mark.parametrize("algorithm", ["NEXTN", "EAGLE"])
def test_speculative_decoding_is_refused_at_start_up(farm, algorithm):
    server = LiveServer(farm.models["qwen3_next"],
                        ["--cache-policy", "marconi", "--speculative-algorithm", algorithm])
    with pytest.raises(RuntimeError) as err:
        server.start()
    lines = [ln for ln in str(err.value).splitlines() if "--speculative-algorithm" in ln]
    assert lines and "not supported yet" in lines[-1], str(err.value)[-2000:]
    assert not server.pids()


def test_every_server_stopped_by_sigterm_leaves_no_process(farm):
    farm.close()
    assert farm.stops, "no server was stopped"
    for cfg, killed, left in farm.stops:
        assert not left, f"{'/'.join(cfg)}: processes left after stop: {left}"
