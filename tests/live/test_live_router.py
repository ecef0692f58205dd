"""End to end on real parts: the real sglang-router 0.3.2 binary (``smg``, cache_aware)
in front of two live CPU SGLang servers (tiny Nemotron-H, SGLang's default extra_buffer
with the overlap loop, tight pools), ``sglang.bench_serving`` (generated-shared-prefix)
through the router, and each worker's own counters read back from its ``/metrics``: stock
workers, then marconi+ workers (one pair of servers at a time).

What it asserts: every request is served, both workers got traffic, the workers'
``num_requests_total`` add up to the benchmark's requests, and the prompt tokens each
worker reports cached are read back (> 0 with shared prefixes). The cached fractions are
printed (``pytest -s``), not asserted against each other: with the forward pass replaced,
timings (and so the router's in-flight counts) are this machine's. ``make test`` runs the
marconi+ pair (its time budget); ``MARCONI_LIVE_ROUTER=full`` runs the stock pair too (the
comparison docs/scale-out.md quotes).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from live_configs import server_args
from router_stubs import RouterProcess, smg_path
from server import LiveServer, live_env
from streams import KV_TOKENS, MAMBA_SLOTS, MAX_RUNNING
from tiny_models import write_tiny_model

pytestmark = pytest.mark.skipif(smg_path() is None,
                                reason="sglang-router 0.3.2 (smg) is not installed")

MODEL = "nemotron_h"
N_PROMPTS = 32
ROUTER_FLAGS = ["--cache-threshold", "0.3", "--balance-abs-threshold", "64",
                "--balance-rel-threshold", "1.5", "--eviction-interval-secs", "60",
                "--max-tree-size", str(1 << 26), "--request-timeout-secs", "120"]


def _counters(server: LiveServer) -> dict:
    return {"requests": server.metric("sglang:num_requests_total", default=0.0),
            "prompt": server.metric("sglang:prompt_tokens_total", default=0.0),
            "cached": server.metric("sglang:cached_tokens_total", default=0.0)}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("router-model") / MODEL, MODEL)


@pytest.mark.parametrize("policy", ["stock", "marconi+"])
def test_bench_serving_through_the_real_router(model_path, tmp_path, policy):
    if policy == "stock" and os.environ.get("MARCONI_LIVE_ROUTER") != "full":
        pytest.skip("stock workers behind the router run with MARCONI_LIVE_ROUTER=full")
    args = server_args(MODEL, "extra_buffer", policy)
    servers = [LiveServer(model_path, args, max_total_tokens=KV_TOKENS,
                          mamba_slots=MAMBA_SLOTS, max_running=MAX_RUNNING)
               for _ in range(2)]
    router = None
    t_start = time.monotonic()
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(LiveServer.start, servers))
        router = RouterProcess([s.url for s in servers], "cache_aware", ROUTER_FLAGS,
                               log_path=tmp_path / "smg.log")
        router.wait_ready(2, timeout=60)
        before = [_counters(s) for s in servers]
        out = tmp_path / "bench.jsonl"
        cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang",
               "--base-url", router.url, "--tokenizer", str(model_path),
               "--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "4",
               "--gsp-prompts-per-group", str(N_PROMPTS // 4),
               "--gsp-system-prompt-len", "400", "--gsp-question-len", "40",
               "--gsp-output-len", "8", "--num-prompts", str(N_PROMPTS),
               "--request-rate", "inf", "--max-concurrency", "8", "--disable-tqdm",
               "--warmup-requests", "0", "--output-file", str(out), "--seed", "1"]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, env=live_env(), capture_output=True, text=True,
                              timeout=300)
        t_bench = time.monotonic() - t0
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        result = json.loads(out.read_text().splitlines()[-1])
        assert result["completed"] == N_PROMPTS
        for s in servers:
            assert s.wait_idle()
        after = [_counters(s) for s in servers]
    finally:
        if router is not None:
            router.stop()
        for s in servers:
            s.stop()
    delta = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before)]
    assert sum(d["requests"] for d in delta) == N_PROMPTS
    assert all(d["requests"] > 0 for d in delta), delta
    prompt = sum(d["prompt"] for d in delta)
    cached = sum(d["cached"] for d in delta)
    assert prompt > 0 and cached > 0
    print(f"\n{policy}: servers and router up in {t0 - t_start:.0f} s, {N_PROMPTS} prompts "
          f"in {t_bench:.0f} s; per worker "
          f"(requests, prompt tokens, cached): "
          f"{[(int(d['requests']), int(d['prompt']), int(d['cached'])) for d in delta]}; "
          f"cached {cached / prompt:.1%} of prompt tokens")
