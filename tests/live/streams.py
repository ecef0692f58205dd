"""The scripted request stream the live tests send, one client at a time.

Token ids only (``/generate`` with ``input_ids``), seeded, sized for the capped pools of
the live servers (4,096 KV tokens, 32 state slots, chunked prefill 256, track interval
128, checkpoint grid 64): a shared system prompt of 350 tokens seen three times (branch state at 320, then a
hit), multi-turn continuations whose outputs cross a decode-track boundary, a long prompt
that spans several prefill chunks and a request that resumes inside it, forks of one
parent, and enough unique long prompts to make both pools evict before the shared prompt
comes back. Each step's input may depend on the server's earlier outputs (a continuation
carries the previous turn's output), so the stream is run against a server and recorded;
the record is what ``ab`` replays (``write_session_trace``).
"""
from __future__ import annotations

import contextlib
import io
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

# the serving settings the stream is sized for (the live servers use exactly these)
CHUNKED_PREFILL = 256
TRACK_INTERVAL = 128
KV_TOKENS = 4096
MAMBA_SLOTS = 32
MAX_RUNNING = 4


@dataclass
class Step:
    name: str
    input_ids: list
    output_ids: list
    cached_tokens: int


@dataclass
class Record:
    steps: list = field(default_factory=list)

    def by_name(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    def hits(self) -> list:
        return [s.cached_tokens for s in self.steps]


def _tokens(rng: random.Random, n: int) -> list:
    # ids 1..250: byte tokens (0 is the health check's input; 256+ are special tokens)
    return [rng.randint(1, 250) for _ in range(n)]


def run_stream(generate, seed: int = 0) -> Record:
    """Send the stream through ``generate(input_ids, max_new_tokens) -> response``."""
    rng = random.Random(seed)
    rec = Record()

    def send(name, ids, out_len=8):
        r = generate(ids, out_len)
        step = Step(name, list(ids), list(r["output_ids"]), int(r["meta_info"]["cached_tokens"]))
        rec.steps.append(step)
        return step

    system = _tokens(rng, 350)
    send("shared-1", system + _tokens(rng, 40))
    send("shared-2", system + _tokens(rng, 40))   # branch point at 300 detected here
    s3 = send("shared-3", system + _tokens(rng, 40))  # hits the branch state
    # multi-turn: the next turn carries the whole previous turn, outputs cross 128
    t1 = send("turn-1", s3.input_ids + s3.output_ids + _tokens(rng, 30), out_len=150)
    t2 = send("turn-2", t1.input_ids + t1.output_ids + _tokens(rng, 20), out_len=20)
    send("turn-3", t2.input_ids + t2.output_ids + _tokens(rng, 20))
    # a long prompt in several prefill chunks, then a request resuming inside it
    doc = _tokens(rng, 700)
    send("doc-1", doc)
    send("doc-prefix", doc[:600] + _tokens(rng, 30))
    # forks of one parent
    parent = _tokens(rng, 200)
    for k in range(3):
        send(f"fork-{k}", parent + _tokens(rng, 60 + 10 * k))
    # pressure: unique long prompts fill the KV pool and the state slots
    for k in range(10):
        send(f"filler-{k}", _tokens(rng, 560), out_len=4)
    send("shared-after-pressure", system + _tokens(rng, 40))
    send("turn-after-pressure", t2.input_ids + t2.output_ids + _tokens(rng, 10))
    return rec


def write_session_trace(record: Record, path: Path) -> Path:
    """The recorded stream as a session JSONL trace (``input_tokens``/``output_tokens``)."""
    with open(path, "w", encoding="utf-8") as f:
        for i, s in enumerate(record.steps):
            f.write(json.dumps({"session_id": s.name, "turn_id": 0, "ts": i,
                                "input_tokens": s.input_ids,
                                "output_tokens": s.output_ids}) + "\n")
    return Path(path)


def replay_hits(server, record: Record, tmp_path: Path, cache: str, cache_flags=()) -> list:
    """``sglang_marconi ab`` (the CLI's code, in this process) on the recorded stream with
    the server's own pool sizes and settings (``/server_info``) and its loop; the hits
    per request of ``cache`` (an ``ab`` column: stock or marconi, with ``cache_flags``)."""
    from sglang_marconi.cli.main import main as sglang_marconi_cli

    info = server.server_info()
    trace = write_session_trace(record, Path(tmp_path) / "stream.jsonl")
    argv = ["ab", "--trace", str(trace), "--config", str(server.model_path / "config.json"),
            "--kv-tokens", str(info["max_total_num_tokens"]),
            "--mamba-slots", str(info["max_mamba_cache_size"]),
            "--page-size", str(info["page_size"]),
            "--chunked-prefill-size", str(info["chunked_prefill_size"]),
            "--mamba-track-interval", str(info["mamba_track_interval"]),
            "--mamba-radix-cache-strategy", info["mamba_radix_cache_strategy"],
            "--caches", cache, *cache_flags, "--json", "--per-request", "--no-progress",
            # the server's loop: the replay follows it (order, tracking slots)
            *(["--disable-overlap-schedule"] if info["disable_overlap_schedule"] else [])]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert sglang_marconi_cli(argv) == 0
    return json.loads(out.getvalue())["caches"][cache]["hit_tokens_per_request"]


def disconnect_mid_stream(server, first_token: int, clients: int, max_new_tokens: int) -> str:
    """``clients`` streaming requests that hang up after three lines, then an idle round
    (the scheduler's self-check, SGLang's leak check of KV, state and request slots);
    returns the server's log written meanwhile, lower-cased."""
    before = len(server.log_text())
    for k in range(clients):
        body = {"input_ids": [first_token + k] * 300, "stream": True,
                "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True}}
        with requests.post(server.url + "/generate", json=body, stream=True,
                           timeout=30) as r:
            for n, _ in enumerate(r.iter_lines()):
                if n >= 3:
                    break  # closing the response disconnects the client
    assert server.wait_idle(), "requests of disconnected clients still running after 30 s"
    time.sleep(1.0)  # an idle round: the scheduler's self-check
    assert server.generate([5] * 50, 4)["meta_info"]["cached_tokens"] >= 0
    return server.log_text()[before:].lower()
