"""SGLang's real server on CPU (forward replaced) with ``--enable-hierarchical-cache
--cache-policy marconi``: a prefix pushed off the device by other requests comes back from
the host tier (KV and its Mamba state loaded back), and the server goes idle without a
leak. One server (write_back, the policy with the most Marconi-side code); the other
write policies are checked on the CPU stack (tests/test_sglang_hicache.py)."""
from __future__ import annotations

import time

# conftest.py puts this folder on sys.path and skips without sglang / the server packages
from live_configs import server_args
from server import LiveServer
from tiny_models import write_tiny_model

SHARED = [10 + (i % 50) for i in range(600)]  # the prefix that goes to host and back


def other(i: int) -> list:
    return [100 + 7 * i + (j % 13) for j in range(700)]


def test_marconi_serves_host_hits(tmp_path):
    model = write_tiny_model(tmp_path / "qwen3_next", "qwen3_next")
    args = server_args("qwen3_next", "extra_buffer", "marconi") + [
        "--enable-hierarchical-cache", "--hicache-ratio", "4",
        "--hicache-write-policy", "write_back"]
    # 1024 device KV tokens: two 700-token requests push the shared prefix to host
    server = LiveServer(model, args, max_total_tokens=1024, mamba_slots=16, max_running=2)
    server.start()
    try:
        before = len(server.log_text())  # start-up noise (health polls) not included
        cached = []
        for i in range(7):
            ids = SHARED if i % 3 == 0 else other(i)
            cached.append(server.generate(ids, max_new_tokens=4)["meta_info"]["cached_tokens"])
        assert cached[3] > 0 and cached[6] > 0, cached  # the shared prefix, from host
        assert server.metric("sglang:load_back_tokens_total") > 0
        # a Mamba state came back with the KV (the series is labelled by pool)
        lines = [line for line in server.get("/metrics").text.splitlines()
                 if line.startswith("sglang:load_back_tokens_total{") and 'pool="mamba"' in line]
        assert lines and float(lines[0].rsplit(" ", 1)[1]) > 0
        assert server.wait_idle()
        time.sleep(1.0)  # an idle round: SGLang's leak check (KV, states, request slots)
        assert server.generate([5] * 50, 4)["meta_info"]["cached_tokens"] >= 0
        log = server.log_text()[before:].lower()
        assert "leak" not in log and "traceback" not in log, log[-3000:]
    finally:
        server.stop()
