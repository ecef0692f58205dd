"""Stub SGLang workers and a launcher for the real sglang-router binary, for the tests.

A stub worker is a stdlib ``ThreadingHTTPServer`` on 127.0.0.1 answering what the router
asks at registration (``/health``, ``/server_info``, ``/model_info`` and the ``/get_``
names) and ``POST /generate``: it records the request (rid, text or input_ids) and holds
the response until the test releases that rid (or a hold timeout passes), so the router's
in-flight counts are whatever the test's script says they are.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOLD_TIMEOUT_S = 30.0     # a held /generate answers anyway after this long (never hangs)
# no model_path / tokenizer_path: with one the router would try to fetch a tokenizer from
# the Hugging Face hub (src/core/steps/worker/local/register_tokenizer.rs 40-48)
MODEL_INFO = {"is_generation": True, "model_type": "stub",
              "architectures": ["StubForCausalLM"]}
SERVER_INFO = {"tp_size": 1, "dp_size": 1, "version": "stub",
               "max_total_tokens": 1 << 20, "max_running_requests": 1024}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StubWorker:
    """One worker: ``received`` lists the /generate bodies in arrival order."""

    def __init__(self):
        self.received: list = []
        self.cond = threading.Condition()
        self.release_events: dict = {}
        worker = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _json(self, obj, status=200):
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                path = self.path.split("?")[0]
                if path in ("/health", "/health_generate"):
                    self._json({"status": "ok"})
                elif path in ("/server_info", "/get_server_info"):
                    self._json(SERVER_INFO)
                elif path in ("/model_info", "/get_model_info"):
                    self._json(MODEL_INFO)
                else:
                    self._json({"error": "not found"}, 404)

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path.split("?")[0] != "/generate":
                    self._json({"error": "not found"}, 404)
                    return
                event = worker.event_for(body.get("rid"))
                with worker.cond:
                    worker.received.append(body)
                    worker.cond.notify_all()
                event.wait(HOLD_TIMEOUT_S)
                self._json({"text": "", "output_ids": [], "meta_info": {
                    "id": body.get("rid"), "prompt_tokens": 0, "completion_tokens": 0,
                    "cached_tokens": 0, "finish_reason": {"type": "length"}}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def event_for(self, rid) -> threading.Event:
        with self.cond:
            return self.release_events.setdefault(rid, threading.Event())

    def release(self, rid) -> None:
        self.event_for(rid).set()

    def rids(self) -> list:
        with self.cond:
            return [body.get("rid") for body in self.received]

    def stop(self) -> None:
        with self.cond:
            for event in self.release_events.values():
                event.set()
        self.server.shutdown()
        self.server.server_close()


def smg_path():
    """The ``smg`` launcher installed by ``sglang-router`` (None when not installed)."""
    here = os.path.join(os.path.dirname(sys.executable), "smg")
    return here if os.path.exists(here) else shutil.which("smg")


def http_json(url: str, body=None, timeout: float = 10.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


class RouterProcess:
    """``smg launch`` on 127.0.0.1 in front of ``worker_urls``; every flag is explicit."""

    def __init__(self, worker_urls, policy: str, extra_args=(), log_path=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [smg_path(), "launch", "--host", "127.0.0.1", "--port", str(self.port),
                "--worker-urls", *worker_urls, "--policy", policy,
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                "--worker-startup-check-interval", "1", "--log-level", "warn",
                *extra_args]
        self.log = open(log_path, "wb") if log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait_ready(self, n_workers: int, timeout: float = 30.0) -> list:
        """The workers' URLs in the router's own order (``GET /workers``) once all are
        registered and healthy."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"smg exited with status {self.proc.returncode}")
            try:
                listing = http_json(self.url + "/workers", timeout=2.0)
                workers = listing.get("workers", [])
                last = listing
                if len(workers) == n_workers and all(w.get("is_healthy") for w in workers):
                    return [w["url"] for w in workers]
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"router not ready after {timeout} s (last /workers: {last})")

    def loads(self) -> dict:
        return {w["url"]: w["load"] for w in http_json(self.url + "/workers")["workers"]}

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=5)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=5)
        if self.log is not subprocess.DEVNULL:
            self.log.close()
