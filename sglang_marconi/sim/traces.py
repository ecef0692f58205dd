"""Traces: what the simulator replays, and the readers for Mooncake JSONL (512-token
``hash_ids`` blocks; outputs get fresh tokens) and session JSONL (token-id lists); bad lines
raise ``UserError`` with the file and line."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sglang_marconi.errors import UserError

MOONCAKE_BLOCK = 512
FRESH_TOKEN_BASE = 1 << 40  # output tokens of Mooncake requests: never an input token


@dataclass
class Request:
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    timestamp: float = 0.0  # seconds
    session_id: str = ""

    @property
    def input_len(self) -> int:
        return len(self.input_tokens)

    @property
    def output_len(self) -> int:
        return len(self.output_tokens)

    @property
    def full_tokens(self) -> np.ndarray:
        """Tokens whose KV exists when the request finishes (the last sampled token has none)."""
        if self.output_len <= 1:
            return self.input_tokens
        return np.concatenate([self.input_tokens, self.output_tokens[:-1]])


@dataclass
class Trace:
    name: str
    requests: list = field(repr=False)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def input_tokens(self) -> int:
        return sum(r.input_len for r in self.requests)

    def head(self, n: int | None) -> "Trace":
        return self if n is None else Trace(self.name, self.requests[:n])


def _int_field(obj, key, path, lineno, minimum=0):
    if key not in obj:
        raise UserError(f"{path}:{lineno}: missing field {key!r}")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise UserError(f"{path}:{lineno}: field {key!r} must be an integer >= {minimum}, got {v!r}")
    return v


def _token_list(obj, key, path, lineno):
    if key not in obj:
        raise UserError(f"{path}:{lineno}: missing field {key!r}")
    v = obj[key]
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        raise UserError(f"{path}:{lineno}: field {key!r} must be a list of integer token ids")
    return np.asarray(v, dtype=np.int64)


def _iter_json_lines(path: Path):
    try:
        fh = open(path, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot read trace {path}: {exc.strerror}") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{lineno}: invalid JSON: {exc.msg}") from None
            if not isinstance(obj, dict):
                raise UserError(f"{path}:{lineno}: expected a JSON object")
            yield lineno, obj


def mooncake_request(obj, path, lineno, fresh_start: int) -> Request:
    n_in = _int_field(obj, "input_length", path, lineno, 1)
    n_out = _int_field(obj, "output_length", path, lineno, 0)
    ts = obj.get("timestamp", 0)
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise UserError(f"{path}:{lineno}: field 'timestamp' must be a number, got {ts!r}")
    ids = obj.get("hash_ids")
    if not isinstance(ids, list) or not all(isinstance(h, int) and h >= 0 for h in ids):
        raise UserError(f"{path}:{lineno}: field 'hash_ids' must be a list of non-negative "
                        "integers")
    if not (len(ids) - 1) * MOONCAKE_BLOCK < n_in <= len(ids) * MOONCAKE_BLOCK:
        raise UserError(f"{path}:{lineno}: input_length {n_in} does not fit {len(ids)} blocks "
                        f"of {MOONCAKE_BLOCK} tokens")
    blocks = np.asarray(ids, dtype=np.int64)[:, None] * MOONCAKE_BLOCK
    tokens = (blocks + np.arange(MOONCAKE_BLOCK, dtype=np.int64)).ravel()[:n_in]
    out = np.arange(fresh_start, fresh_start + n_out, dtype=np.int64)
    return Request(tokens, out, float(ts) / 1000.0, "")


def read_mooncake(path) -> Trace:
    path = Path(path)
    requests = []
    fresh = FRESH_TOKEN_BASE
    for lineno, obj in _iter_json_lines(path):
        req = mooncake_request(obj, path, lineno, fresh)
        fresh += req.output_len
        requests.append(req)
    if not requests:
        raise UserError(f"{path}: the trace is empty")
    return Trace(path.stem, requests)


def read_sessions(path) -> Trace:
    path = Path(path)
    requests = []
    for lineno, obj in _iter_json_lines(path):
        sid = obj.get("session_id")
        if sid is None:
            raise UserError(f"{path}:{lineno}: missing field 'session_id'")
        _int_field(obj, "turn_id", path, lineno, 0)
        ts = obj.get("ts", 0)
        if isinstance(ts, bool) or not isinstance(ts, (int, float)):
            raise UserError(f"{path}:{lineno}: field 'ts' must be a number, got {ts!r}")
        inp = _token_list(obj, "input_tokens", path, lineno)
        if len(inp) == 0:
            raise UserError(f"{path}:{lineno}: field 'input_tokens' is empty")
        out = _token_list(obj, "output_tokens", path, lineno)
        requests.append(Request(inp, out, float(ts), str(sid)))
    if not requests:
        raise UserError(f"{path}: the trace is empty")
    requests.sort(key=lambda r: r.timestamp)  # stable: file order within a timestamp
    return Trace(path.stem, requests)


def detect_format(path) -> str:
    path = Path(path)
    for lineno, obj in _iter_json_lines(path):
        if "hash_ids" in obj:
            return "mooncake"
        if "input_tokens" in obj:
            return "sessions"
        raise UserError(f"{path}:{lineno}: neither a Mooncake line (hash_ids) nor a session "
                        "line (input_tokens)")
    raise UserError(f"{path}: the trace is empty")


def read_trace(path, fmt: str = "auto") -> Trace:
    """Read a trace file; ``fmt`` is "auto", "mooncake" or "sessions"."""
    if not Path(path).is_file():
        raise UserError(f"trace not found: {path}")
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "mooncake":
        return read_mooncake(path)
    if fmt == "sessions":
        return read_sessions(path)
    raise UserError(f"unknown trace format {fmt!r} (mooncake, sessions)")


def write_sessions(trace: Trace, path) -> None:
    """Write a trace in the session JSONL format (what ``gen-trace`` emits)."""
    turns: dict[str, int] = {}
    with open(path, "w", encoding="utf-8") as fh:
        for r in trace.requests:
            turn = turns.get(r.session_id, 0)
            turns[r.session_id] = turn + 1
            fh.write(json.dumps({"session_id": r.session_id, "turn_id": turn,
                                 "ts": round(r.timestamp, 6),
                                 "input_tokens": r.input_tokens.tolist(),
                                 "output_tokens": r.output_tokens.tolist()}) + "\n")
