"""One live server per configuration, started ahead of need and stopped by PID.

``ServerFarm(configs, start)`` starts each configuration's server once (``start(cfg)``
returns a started ``LiveServer``), for every test that needs it, and starts the next
configuration's server in the background while the tests of the current one run
(start-up is about 15 s of imports; two cores). A server is stopped (by PID, every
process checked gone) when the tests move on to the next configuration; ``stops``
records what each stop had to kill.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import psutil

from server import LiveServer


class ServerFarm:
    def __init__(self, configs: list, start, models: dict | None = None):
        self.configs = list(configs)
        self.start = start         # cfg -> a started LiveServer
        self.models = models or {}
        self.pool = ThreadPoolExecutor(max_workers=2)
        self.starting: dict = {}   # cfg -> Future[LiveServer]
        self.current = None        # (cfg, LiveServer)
        self.stops: list = []      # (cfg, PIDs killed after the grace period, PIDs left)
        self.records: dict = {}    # cfg -> the scripted stream's record
        self.lock = threading.Lock()

    def _future(self, cfg) -> Future:
        with self.lock:
            if cfg not in self.starting:
                self.starting[cfg] = self.pool.submit(self.start, cfg)
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
        i = self.configs.index(cfg) if cfg in self.configs else -1
        if 0 <= i < len(self.configs) - 1:
            self._future(self.configs[i + 1])  # prefetch the next configuration
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
