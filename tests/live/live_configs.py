"""The live servers' configurations: (model, buffer strategy, cache policy) and the
flags each one runs with (shared by conftest.py, the tests and scripts/ab_serve_cpu.py)."""
from __future__ import annotations

from server import BUFFERS, POLICIES
from streams import CHUNKED_PREFILL, TRACK_INTERVAL

MODELS = ("nemotron_h", "qwen3_next")
# extra_buffer runs with pages of 16 on Nemotron-H (page > 1; no_buffer needs page 1)
PAGE = {("nemotron_h", "extra_buffer"): 16}
# the last configuration, Qwen3-Next with SGLang's defaults and --cache-policy marconi,
# stays up for test_live_tools.py
# the paper's ranking (marconi-alpha) under extra_buffer here; under no_buffer in
# test_live_exact.py (Nemotron-H; both models with MARCONI_LIVE_EXACT=full)
CONFIGS = [(m, b, p) for m in MODELS for b in BUFFERS for p in ("stock", "marconi-alpha", "marconi")
           if p != "marconi-alpha" or b == "extra_buffer"]
LAST = CONFIGS[-1]
# int8 checkpoints (--enable-int8-mamba-checkpoint) with SGLang's defaults, before the last
CONFIGS.insert(-1, ("qwen3_next", "extra_buffer", "marconi-int8"))


def config_id(cfg) -> str:
    return "-".join(cfg)


def page_size(model: str, buffer: str) -> int:
    return PAGE.get((model, buffer), 1)


def server_args(model: str, buffer: str, policy: str) -> list:
    return [*POLICIES[policy], *BUFFERS[buffer],
            "--chunked-prefill-size", str(CHUNKED_PREFILL),
            "--mamba-track-interval", str(TRACK_INTERVAL),
            "--page-size", str(page_size(model, buffer))]
