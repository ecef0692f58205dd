"""Fixtures of the live-server tests: tiny checkpoints and one server per configuration.

A configuration is (model, cache policy, buffer strategy). ``ServerFarm`` starts each
server once, for every test that needs it, and starts the next configuration's server in
the background while the tests of the current one run (start-up is about 15 s of
imports; two cores). A server is stopped (by PID, every process checked gone) when the
tests move on to the next configuration; ``stops`` records what each stop had to kill.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from live_configs import CONFIGS, MODELS, config_id, server_args  # noqa: E402
from server import LiveServer  # noqa: E402
from streams import KV_TOKENS, MAMBA_SLOTS, MAX_RUNNING  # noqa: E402
from tiny_models import write_tiny_model  # noqa: E402

pytest.importorskip("sglang")
pytest.importorskip("uvicorn", reason="the live server needs requirements/cpu.txt's server "
                                      "packages")

class ServerFarm:
    def __init__(self, root: Path):
        self.root = root
        self.models = {m: write_tiny_model(root / m, m) for m in MODELS}
        self.pool = ThreadPoolExecutor(max_workers=2)
        self.starting: dict = {}   # cfg -> Future[LiveServer]
        self.current = None        # (cfg, LiveServer)
        self.stops: list = []      # (cfg, PIDs killed after the grace period, PIDs left)
        self.records: dict = {}    # cfg -> the scripted stream's record
        self.lock = threading.Lock()

    def _start(self, cfg) -> LiveServer:
        model, buffer, policy = cfg
        return LiveServer(self.models[model], server_args(model, buffer, policy),
                          max_total_tokens=KV_TOKENS, mamba_slots=MAMBA_SLOTS,
                          max_running=MAX_RUNNING).start()

    def _future(self, cfg) -> Future:
        with self.lock:
            if cfg not in self.starting:
                self.starting[cfg] = self.pool.submit(self._start, cfg)
            return self.starting[cfg]

    def _stop(self, cfg, server: LiveServer) -> None:
        """Stop ``server`` (SIGTERM, then by PID) and record what was left."""
        pids = server.pids()
        killed = server.stop()
        left = [p for p in pids if _alive(p)]
        self.stops.append((cfg, killed, left))

    def get(self, cfg) -> LiveServer:
        if self.current is not None and self.current[0] == cfg:
            return self.current[1]
        if self.current is not None:
            old = self.current
            self.current = None
            with self.lock:
                self.starting.pop(old[0], None)  # a later get() starts it again
            self.pool.submit(self._stop, *old)
        server = self._future(cfg).result()
        self.current = (cfg, server)
        i = CONFIGS.index(cfg) if cfg in CONFIGS else -1
        if 0 <= i < len(CONFIGS) - 1:
            self._future(CONFIGS[i + 1])  # prefetch the next configuration
        return server

    def close(self) -> None:
        if self.current is not None:
            self._stop(*self.current)
            self.current = None
        for cfg, fut in list(self.starting.items()):  # prefetched, maybe still starting
            try:
                server = fut.result(timeout=300)
            except Exception:  # a start that failed stopped its own processes
                continue
            if server.proc is not None:
                self._stop(cfg, server)
        self.starting.clear()
        self.pool.shutdown(wait=True)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="session")
def farm():
    root = Path(tempfile.mkdtemp(prefix="sglang-live-models-"))
    f = ServerFarm(root)
    yield f
    f.close()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module", params=CONFIGS, ids=config_id)
def live(request, farm):
    """(cfg, server) for each configuration, in ``CONFIGS`` order."""
    cfg = request.param
    return cfg, farm.get(cfg)
