"""Seeded synthetic workloads (``gen-trace`` writes them, ``sim --workload`` replays them):
deterministic per seed, sequences sharing tokens only where the workload makes them share;
parameters documented in each dataclass."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

from sglang_marconi.errors import UserError
from sglang_marconi.sim.traces import Request, Trace


class _Tokens:
    def __init__(self, start: int = 1):
        self.next = start

    def fresh(self, n: int) -> np.ndarray:
        out = np.arange(self.next, self.next + n, dtype=np.int64)
        self.next += n
        return out


def _lognormal(rng, median, sigma, lo, hi) -> int:
    return int(np.clip(round(rng.lognormal(np.log(median), sigma)), lo, hi))


@dataclass
class ChatParams:
    sessions: int = 200
    session_rate: float = 0.5       # sessions started per second (Poisson)
    mean_turns: float = 4.0         # geometric turns per session (ShareGPT ~3.5, LMSys ~2)
    max_turns: int = 30
    user_median: int = 60           # tokens per user message (lognormal)
    user_sigma: float = 1.0
    output_median: int = 220        # tokens per response (lognormal)
    output_sigma: float = 0.8
    max_len: int = 2048
    system_prompt: int = 0          # tokens of a system prompt shared by all sessions
    typing_tok_s: float = 2.0       # think time = user message / typing speed
    decode_tok_s: float = 50.0


@dataclass
class AgentParams:
    sessions: int = 40
    session_rate: float = 0.1
    system_prompt: int = 3000       # shared by every session (tool docs, instructions)
    task_median: int = 800          # the issue text, unique per session
    min_turns: int = 10
    max_turns: int = 50
    action_median: int = 150        # model output per turn
    observation_median: int = 600   # tool output per turn
    observation_sigma: float = 1.0
    max_observation: int = 8000
    keep_last: int = 5              # observations older than this are replaced
    placeholder: int = 12           # tokens of "Old environment output omitted"
    tool_time_s: float = 2.0
    decode_tok_s: float = 50.0


@dataclass
class SharedPromptParams:
    requests: int = 2000
    rate: float = 5.0               # requests per second (Poisson)
    prompts: int = 4
    prompt_min: int = 2000
    prompt_max: int = 8000
    zipf: float = 1.1
    question_median: int = 200
    output_median: int = 100


@dataclass
class ForkJoinParams:
    programs: int = 300
    rate: float = 1.0               # programs started per second
    templates: int = 3              # distinct few-shot prefixes
    prefix_len: int = 1500
    question_median: int = 120
    forks: int = 4
    fork_prompt: int = 24           # the fork's own instruction ("approach i")
    fork_output_median: int = 200
    join_prompt: int = 30
    join_output: int = 16
    decode_tok_s: float = 50.0


@dataclass
class DriftParams:
    chat_sessions: int = 150
    agent_sessions: int = 30
    session_rate: float = 0.5
    agent_rate: float = 0.1


def _starts(rng, n, rate) -> np.ndarray:
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


def gen_chat(p: ChatParams, seed: int = 0, tok: _Tokens | None = None, t0: float = 0.0,
             prefix: str = "chat") -> Trace:
    rng = np.random.default_rng(seed)
    tok = tok or _Tokens()
    system = tok.fresh(p.system_prompt)
    reqs = []
    for s, start in enumerate(_starts(rng, p.sessions, p.session_rate) + t0):
        turns = min(p.max_turns, int(rng.geometric(1.0 / p.mean_turns)))
        history, t = system, start
        for _ in range(turns):
            user = tok.fresh(_lognormal(rng, p.user_median, p.user_sigma, 4, p.max_len))
            inp = np.concatenate([history, user])
            out = tok.fresh(_lognormal(rng, p.output_median, p.output_sigma, 4, p.max_len))
            reqs.append(Request(inp, out, float(t), f"{prefix}-{s}"))
            history = np.concatenate([inp, out])
            t += len(out) / p.decode_tok_s + len(user) / p.typing_tok_s
    return Trace("chat", sorted(reqs, key=lambda r: r.timestamp))


def gen_agent(p: AgentParams, seed: int = 0, tok: _Tokens | None = None, t0: float = 0.0,
              prefix: str = "agent") -> Trace:
    rng = np.random.default_rng(seed)
    tok = tok or _Tokens()
    system = tok.fresh(p.system_prompt)
    placeholder = tok.fresh(p.placeholder)
    reqs = []
    for s, start in enumerate(_starts(rng, p.sessions, p.session_rate) + t0):
        task = tok.fresh(_lognormal(rng, p.task_median, 0.5, 50, 4000))
        turns = int(rng.integers(p.min_turns, p.max_turns + 1))
        steps: list[tuple[np.ndarray, np.ndarray]] = []  # (action, observation)
        t = start
        for i in range(turns):
            parts = [system, task]
            for j, (action, obs) in enumerate(steps):
                parts += [action, obs if j >= len(steps) - p.keep_last else placeholder]
            inp = np.concatenate(parts)
            action = tok.fresh(_lognormal(rng, p.action_median, 0.6, 8, 2000))
            reqs.append(Request(inp, action, float(t), f"{prefix}-{s}"))
            obs = tok.fresh(_lognormal(rng, p.observation_median, p.observation_sigma, 8,
                                       p.max_observation))
            steps.append((action, obs))
            t += len(action) / p.decode_tok_s + p.tool_time_s
    return Trace("agent", sorted(reqs, key=lambda r: r.timestamp))


def gen_shared_prompt(p: SharedPromptParams, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    tok = _Tokens()
    prompts = [tok.fresh(int(n)) for n in rng.integers(p.prompt_min, p.prompt_max + 1, p.prompts)]
    weights = 1.0 / np.arange(1, p.prompts + 1) ** p.zipf
    weights /= weights.sum()
    reqs = []
    for i, t in enumerate(_starts(rng, p.requests, p.rate)):
        k = int(rng.choice(p.prompts, p=weights))
        q = tok.fresh(_lognormal(rng, p.question_median, 0.8, 8, 4000))
        out = tok.fresh(_lognormal(rng, p.output_median, 0.8, 4, 2000))
        reqs.append(Request(np.concatenate([prompts[k], q]), out, float(t), f"req-{i}"))
    return Trace("shared-prompt", reqs)


def gen_fork_join(p: ForkJoinParams, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    tok = _Tokens()
    templates = [tok.fresh(p.prefix_len) for _ in range(p.templates)]
    fork_prompts = [tok.fresh(p.fork_prompt) for _ in range(p.forks)]
    join_prompt = tok.fresh(p.join_prompt)
    reqs = []
    for g, start in enumerate(_starts(rng, p.programs, p.rate)):
        base = np.concatenate([templates[int(rng.integers(p.templates))],
                               tok.fresh(_lognormal(rng, p.question_median, 0.6, 8, 2000))])
        outs, done = [], start
        for i in range(p.forks):
            out = tok.fresh(_lognormal(rng, p.fork_output_median, 0.5, 8, 2000))
            reqs.append(Request(np.concatenate([base, fork_prompts[i]]), out,
                                float(start + 1e-3 * i), f"prog-{g}"))
            outs.append(out)
            done = max(done, start + len(out) / p.decode_tok_s)
        join = np.concatenate([base, *outs, join_prompt])
        reqs.append(Request(join, tok.fresh(p.join_output), float(done), f"prog-{g}"))
    return Trace("fork-join", sorted(reqs, key=lambda r: r.timestamp))


def gen_drift(p: DriftParams, seed: int = 0) -> Trace:
    """Chat, then agent sessions, then chat again (session ids chat1-, agent-, chat2-)."""
    tok = _Tokens()
    a = gen_chat(ChatParams(sessions=p.chat_sessions, session_rate=p.session_rate), seed, tok,
                 0.0, "chat1")
    t1 = a.requests[-1].timestamp + 1
    b = gen_agent(AgentParams(sessions=p.agent_sessions, session_rate=p.agent_rate), seed + 1,
                  tok, t1, "agent")
    t2 = b.requests[-1].timestamp + 1
    c = gen_chat(ChatParams(sessions=p.chat_sessions, session_rate=p.session_rate), seed + 2,
                 tok, t2, "chat2")
    return Trace("drift", a.requests + b.requests + c.requests)


@dataclass
class AlphaShiftParams:
    """``alpha-shift``: scan, steady, scan (``requests_per_phase`` each), every request a prompt
    plus ``question`` fresh tokens. Scan phases (LRU wins): hot prompts (``hot_share``) between
    one-off long documents read ``doc_reads`` times. Steady phase (FLOP-aware wins): a fixed
    set of ``steady_docs`` long documents (``doc_share``) between one-off short prompts."""
    requests_per_phase: int = 600
    long_len: int = 4000         # tokens of a long document (both phases)
    hot_prompts: int = 8         # scan: the pool of short prompts that keeps being reused
    hot_len: int = 200           # scan: tokens of a hot prompt
    hot_share: float = 0.67      # scan: share of requests on the hot pool (the rest: documents)
    doc_reads: int = 1           # scan: consecutive reads of each one-off document
    steady_docs: int = 12        # steady: long documents reused for the whole phase
    doc_share: float = 0.5       # steady: share of requests on them (the rest: short prompts)
    short_len: int = 1000        # steady: tokens of a short prompt
    short_prompts: int = 10000   # steady: the pool short prompts are drawn from
    question: int = 40           # fresh tokens after the prompt, per request
    output: int = 8              # output tokens per request
    rate: float = 5.0            # requests per second (Poisson)


def gen_alpha_shift(p: AlphaShiftParams, seed: int = 0) -> Trace:
    """Scan, steady, scan; each session id starts with its phase."""
    for name in ("hot_share", "doc_share"):
        if not 0 < getattr(p, name) <= 1:
            raise UserError(f"workload parameter {name!r} must be in (0, 1], "
                            f"got {getattr(p, name)!r}")
    rng = np.random.default_rng(seed)
    tok = _Tokens()
    hot = [tok.fresh(p.hot_len) for _ in range(p.hot_prompts)]
    shorts: dict = {}
    reqs, t = [], 0.0

    def add(prefix, phase):
        nonlocal t
        t += rng.exponential(1.0 / p.rate)
        inp = np.concatenate([prefix, tok.fresh(p.question)])
        reqs.append(Request(inp, tok.fresh(p.output), t, f"{phase}-{len(reqs)}"))

    def scan():
        doc, reads_left = None, 0
        for _ in range(p.requests_per_phase):
            if rng.random() < p.hot_share:
                add(hot[int(rng.integers(p.hot_prompts))], "scan")
                continue
            if reads_left == 0:
                doc, reads_left = tok.fresh(p.long_len), p.doc_reads
            add(doc, "scan")
            reads_left -= 1

    def steady():
        docs = [tok.fresh(p.long_len) for _ in range(p.steady_docs)]
        for _ in range(p.requests_per_phase):
            if rng.random() < p.doc_share:
                add(docs[int(rng.integers(p.steady_docs))], "steady")
                continue
            k = int(rng.integers(p.short_prompts))
            if k not in shorts:
                shorts[k] = tok.fresh(p.short_len)
            add(shorts[k], "steady")

    scan()
    steady()
    scan()
    return Trace("alpha-shift", reqs)


WORKLOADS = {
    "chat": (ChatParams, gen_chat),
    "agent": (AgentParams, gen_agent),
    "shared-prompt": (SharedPromptParams, gen_shared_prompt),
    "fork-join": (ForkJoinParams, gen_fork_join),
    "drift": (DriftParams, gen_drift),
    "alpha-shift": (AlphaShiftParams, gen_alpha_shift),
}


def parse_params(cls, overrides: dict):
    known = {f.name: f for f in fields(cls)}
    kwargs = {}
    for key, value in overrides.items():
        name = key.replace("-", "_")
        if name not in known:
            raise UserError(f"unknown workload parameter {key!r}; known: {', '.join(known)}")
        typ = type(getattr(cls(), name))
        try:
            kwargs[name] = typ(value)
        except ValueError:
            raise UserError(f"workload parameter {key!r} must be a {typ.__name__}, "
                            f"got {value!r}") from None
        if kwargs[name] <= 0 and name != "system_prompt":
            raise UserError(f"workload parameter {key!r} must be positive, got {value!r}")
    return cls(**kwargs)


def generate(name: str, seed: int = 0, **overrides) -> Trace:
    """A workload by name with parameter overrides (``sessions=100``, ...)."""
    if name not in WORKLOADS:
        raise UserError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    cls, fn = WORKLOADS[name]
    return fn(parse_params(cls, overrides), seed=seed)


def workload_params(name: str) -> dict:
    return asdict(WORKLOADS[name][0]())
