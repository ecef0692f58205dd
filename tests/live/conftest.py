"""Fixtures of the live-server tests: tiny checkpoints and one server per configuration.

A configuration is (model, cache policy, buffer strategy); ``farm.ServerFarm`` starts
each configuration's server once, prefetches the next one and stops each by PID.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from functools import partial
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from farm import ServerFarm  # noqa: E402
from live_configs import CONFIGS, MODELS, config_id, server_args  # noqa: E402
from server import LiveServer  # noqa: E402
from streams import KV_TOKENS, MAMBA_SLOTS, MAX_RUNNING  # noqa: E402
from tiny_models import write_tiny_model  # noqa: E402

pytest.importorskip("sglang")
pytest.importorskip("uvicorn", reason="the live server needs requirements/cpu.txt's server "
                                      "packages")


def _start(models: dict, cfg) -> LiveServer:
    model, buffer, policy = cfg
    return LiveServer(models[model], server_args(model, buffer, policy),
                      max_total_tokens=KV_TOKENS, mamba_slots=MAMBA_SLOTS,
                      max_running=MAX_RUNNING).start()


@pytest.fixture(scope="session")
def farm():
    root = Path(tempfile.mkdtemp(prefix="sglang-live-models-"))
    models = {m: write_tiny_model(root / m, m) for m in MODELS}
    f = ServerFarm(CONFIGS, partial(_start, models), models)
    yield f
    f.close()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module", params=CONFIGS, ids=config_id)
def live(request, farm):
    """(cfg, server) for each configuration, in ``CONFIGS`` order."""
    cfg = request.param
    return cfg, farm.get(cfg)
