"""End to end on real parts: the real sglang-router 0.3.2 binary (``smg``, cache_aware)
in front of two live CPU SGLang servers (tiny Nemotron-H, SGLang's default extra_buffer
with the overlap loop, tight pools), ``sglang.bench_serving`` (generated-shared-prefix)
through the router, and each worker's own counters read back from its ``/metrics``: stock
workers, then marconi workers (one pair of servers at a time).

What it asserts: every request is served, both workers got traffic, the workers'
``num_requests_total`` add up to the benchmark's requests, and the prompt tokens each
worker reports cached are read back (> 0 with shared prefixes). The cached fractions are
printed (``pytest -s``), not asserted against each other: with the forward pass replaced,
timings (and so the router's in-flight counts) are this machine's. ``make test`` runs the
marconi pair (its time budget); ``MARCONI_LIVE_ROUTER=full`` runs the stock pair too (the
comparison docs/scale-out.md quotes).

Also SGLang's own data parallelism: one live server with ``--dp-size 2 --cache-policy
marconi``, whose DP controller's round-robin spreads a shared prefix over two caches.
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


@pytest.mark.parametrize("policy", ["stock", "marconi"])
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


DP_PREFIX, DP_SUFFIX, DP_REQUESTS = 400, 40, 6


def test_dp_size_two_ranks_round_robin_with_marconi(model_path):
    """SGLang's in-server data parallelism on CPU: one live server with ``--dp-size 2``
    and ``--cache-policy marconi`` (its DP controller starts two scheduler processes, each
    with the plugin's cache), six requests one at a time sharing a 400-token prefix. The
    controller's round-robin sends requests 0, 2, 4 to rank 0 and 1, 3, 5 to rank 1, each
    rank its own cache: the first request on each rank (0 and 1) finds nothing, every later
    one reuses the same resume point inside the prefix. One cache would already reuse it at
    request 1, as request 2 does on rank 0."""
    import random

    rng = random.Random(7)
    prefix = [rng.randrange(3, 250) for _ in range(DP_PREFIX)]
    args = server_args(MODEL, "extra_buffer", "marconi") + ["--dp-size", "2"]
    # SGLang's CPU path binds each rank's threads to a NUMA node and refuses more ranks
    # than nodes unless told which cores each rank takes (srt/utils/numa_utils.py 463)
    server = LiveServer(model_path, args, max_total_tokens=KV_TOKENS,
                        mamba_slots=MAMBA_SLOTS, max_running=MAX_RUNNING,
                        extra_env={"SGLANG_CPU_OMP_THREADS_BIND": "0|1"})
    t0 = time.monotonic()
    try:
        server.start()
        t_up = time.monotonic() - t0
        cached = [int(server.generate(prefix + [rng.randrange(3, 250) for _ in range(DP_SUFFIX)],
                                      max_new_tokens=4)["meta_info"]["cached_tokens"])
                  for _ in range(DP_REQUESTS)]
        requests_total = server.metric("sglang:num_requests_total", default=0.0)
    finally:
        server.stop()
    print(f"\n--dp-size 2, marconi: server up in {t_up:.0f} s; cached tokens per request "
          f"{cached}; num_requests_total {requests_total:.0f}")
    assert cached[:2] == [0, 0], cached
    assert len(set(cached[2:])) == 1 and 0 < cached[2] <= DP_PREFIX, cached
