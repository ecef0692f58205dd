"""Start, talk to and stop SGLang's real HTTP server on CPU (the live test harness).

``LiveServer`` runs ``python -m sglang_marconi.launch_server`` (the command a user runs)
with the test plugin of ``cpu_shims/`` on ``PYTHONPATH``: the model forward is replaced,
everything else is SGLang's (docs/live_server.md). Servers bind 127.0.0.1 on a free port,
with capped pools; start-up and every request are bounded in time; ``stop`` ends the
whole process group by PID and checks that nothing is left.
"""
from __future__ import annotations

import os
import pkgutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests

HERE = Path(__file__).resolve().parent
SHIMS = HERE / "cpu_shims"
START_TIMEOUT_S = 180
REQUEST_TIMEOUT_S = 60

# Capped pools: otherwise SGLang sizes them from host RAM (16 GB, 20 s).
POOL_CAPS = ("--max-total-tokens", "--max-mamba-cache-size", "--max-running-requests")
# The two ways the plugin runs: SGLang's normal loop with a state at the end only, and
# SGLang's default for hybrid models (extra_buffer with the overlap scheduler).
BUFFERS = {
    "no_buffer": ["--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule"],
    "extra_buffer": ["--mamba-radix-cache-strategy", "extra_buffer"],
}
# marconi-alpha: the paper's ranking at a fixed alpha (every state SGLang takes admitted);
# marconi-int8: cached states in SGLang's int8 checkpoint pool
INT8 = ["--enable-int8-mamba-checkpoint"]
POLICIES = {"stock": [], "marconi": ["--cache-policy", "marconi"],
            "marconi-alpha": ["--cache-policy", "marconi", "--marconi-alpha", "1"],
            "marconi-int8": ["--cache-policy", "marconi", *INT8]}
# what ab replays each server with: its column and flags
AB_CACHES = {"stock": ("stock", []), "marconi": ("marconi", []),
             "marconi-alpha": ("marconi", ["--marconi-alpha", "1"]),
             "marconi-int8": ("marconi", INT8)}
# may decline end / track states (learned end admission)
LEARNED_ADMISSION = {"marconi", "marconi-int8"}
INT8_POLICIES = {"marconi-int8"}  # resumed states pass through int8: not bitwise exact


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# the model modules the live servers load; SGLang's registry imports every other one at
# start-up unless SGLANG_DISABLED_MODEL_ARCHS names it (about a third of start-up)
SERVED_MODEL_MODULES = ("qwen3_next", "nemotron_h")


def _other_model_modules() -> str:
    import sglang.srt.models as models  # heavy: only where a server is started

    return ",".join(m.name for m in pkgutil.iter_modules(models.__path__)
                    if not m.ispkg and m.name not in SERVED_MODEL_MODULES)


def live_env(base: dict | None = None, forward: str = "replaced") -> dict:
    """The environment of a live CPU server: SGLang's CPU engine and the test plugin
    (``forward``: ``replaced``, or ``real`` with torch versions of the GDN kernels)."""
    env = dict(os.environ if base is None else base)
    env["MARCONI_CPU_TESTKIT_FORWARD"] = forward
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SHIMS)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(MARCONI_CPU_TESTKIT="1", SGLANG_USE_CPU_ENGINE="1",
               # plugins: ours (installed entry point) and the test kit, nothing else
               SGLANG_PLUGINS="marconi,marconi_cpu_testkit",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               SGLANG_DISABLED_MODEL_ARCHS=_other_model_modules())
    return env


@dataclass
class LiveServer:
    model_path: Path
    args: list[str]
    max_total_tokens: int = 4096
    mamba_slots: int = 32
    max_running: int = 4
    forward: str = "replaced"   # "real": the model's own forward (needs real weights)
    load_format: str = "dummy"  # "safetensors" for written weights
    extra_env: dict = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    start_s: float = 0.0
    _log: object = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "sglang_marconi.launch_server",
                "--model-path", str(self.model_path), "--device", "cpu",
                "--load-format", self.load_format, "--host", "127.0.0.1", "--port", str(self.port),
                "--max-total-tokens", str(self.max_total_tokens),
                "--max-mamba-cache-size", str(self.mamba_slots),
                "--max-running-requests", str(self.max_running),
                "--enable-metrics", "--enable-cache-report", "--random-seed", "0",
                "--log-level", "info", "--skip-server-warmup",
                # the scheduler otherwise polls at full speed when idle: a whole core of
                # two, for each server alive
                "--sleep-on-idle", *self.args]

    def start(self) -> "LiveServer":
        self.port = self.port or free_port()
        fd, name = tempfile.mkstemp(prefix="sglang-live-", suffix=".log")
        self.log_path = Path(name)
        self._log = os.fdopen(fd, "w")
        t0 = time.monotonic()
        env = {**live_env(forward=self.forward), **self.extra_env}
        self.proc = subprocess.Popen(self.command(), env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        try:
            self._wait_ready(t0)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - t0
        return self

    def _wait_ready(self, t0: float) -> None:
        while time.monotonic() - t0 < START_TIMEOUT_S:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} during start-up:"
                                   f"\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/model_info", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server not ready after {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def pids(self) -> list[int]:
        """The launcher and every process under it."""
        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [root.pid] + [c.pid for c in root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = 10.0) -> list[int]:
        """Signal the launcher, wait, then kill every process left by PID.
        Returns the PIDs that had to be killed after the grace period."""
        if self.proc is None:
            return []
        pids = self.pids()
        try:
            os.kill(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(psutil.pid_exists(p) and
                                                   psutil.Process(p).status() != "zombie"
                                                   for p in pids):
            self.proc.poll()
            time.sleep(0.2)
        killed = []
        for pid in pids:
            try:
                p = psutil.Process(pid)
                if p.status() != "zombie":
                    p.kill()
                    killed.append(pid)
            except psutil.NoSuchProcess:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(timeout=10)
        self.proc = None
        if self._log:
            self._log.close()
            self._log = None
        return killed

    # --- requests -------------------------------------------------------------------
    def generate(self, input_ids: list[int], max_new_tokens: int = 8, **extra) -> dict:
        """One ``/generate`` with token ids; returns the response (``meta_info`` etc.)."""
        body = {"input_ids": list(input_ids),
                "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True,
                                    "temperature": 0.0}, **extra}
        r = requests.post(self.url + "/generate", json=body, timeout=REQUEST_TIMEOUT_S)
        r.raise_for_status()
        return r.json()

    def post(self, path: str, body: dict | None = None) -> requests.Response:
        return requests.post(self.url + path, json=body or {}, timeout=REQUEST_TIMEOUT_S)

    def get(self, path: str) -> requests.Response:
        return requests.get(self.url + path, timeout=REQUEST_TIMEOUT_S)

    def server_info(self) -> dict:
        r = self.get("/server_info")
        r.raise_for_status()
        return r.json()

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Until the scheduler reports no running and no queued request (``/metrics``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (self.metric("sglang:num_running_reqs") == 0
                    and self.metric("sglang:num_queue_reqs") == 0):
                return True
            time.sleep(0.2)
        return False

    def flush_cache(self, timeout_s: float = 10.0) -> bool:
        """``POST /flush_cache``; SGLang refuses (400) while a request is still in the
        scheduler, e.g. just after the last response was sent: retry, bounded."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.post("/flush_cache").status_code == 200:
                return True
            time.sleep(0.2)
        return False

    def metric(self, name: str, default: float | None = None) -> float:
        """Sum of a Prometheus series over its label sets (``/metrics``); ``default`` when
        the series is absent (a labelled counter appears at its first observation)."""
        total, found = 0.0, False
        for line in self.get("/metrics").text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
                found = True
        if not found:
            if default is not None:
                return default
            raise KeyError(f"{name} not in /metrics")
        return total
