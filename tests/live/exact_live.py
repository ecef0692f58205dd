"""Exact outputs through SGLang's own model code: cached vs uncached, on live CPU servers.

A tiny Qwen3-Next and a tiny Nemotron-H with seeded random fp32 weights
(``tiny_models.write_tiny_weights``) are served with the real forward
(``MARCONI_CPU_TESTKIT_FORWARD=real``: SGLang's model, GDN / Mamba2 backend, torch_native
attention, pools and COW copies; torch versions of the ``sgl_kernel`` ops and of the
Mamba2 Triton kernels). For each model, a scripted stream (``build_stream``) runs first
on a server with ``--disable-radix-cache``; its inputs (continuations carry that server's
outputs) are then sent, in the same order, to stock, marconi and marconi-alpha servers under
no_buffer (overlap off) and extra_buffer (overlap on). The order makes them resume from branch,
chunk, decode-track and end-of-request states, forks, and after evictions under tight
pools. ``compare`` checks greedy tokens and logprobs position by position.

With ``--enable-int8-mamba-checkpoint`` (``INT8_CONFIGS``) a resumed state is the int8
round trip of the full-precision one: the test kit's audit checks each load bitwise, and
the outputs are held to ``INT8_REL_TOL``.

Used by ``test_live_exact.py`` and ``python -m sglang_marconi verify-exact --live``.
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import requests

from farm import ServerFarm
from live_configs import page_size
from server import BUFFERS, INT8_POLICIES, LEARNED_ADMISSION, POLICIES, LiveServer
from tiny_models import write_tiny_weights

MODELS = ("qwen3_next", "nemotron_h")
CHUNKED_PREFILL = 256
TRACK_INTERVAL = 128
GRID = 64                 # checkpoint grid (the GDN chunk; Nemotron-H's mamba chunk_size)
KV_TOKENS = 2048          # tight: the fillers make both pools evict
MAMBA_SLOTS = 16
MAX_RUNNING = 2
REL_TOL = 1e-4            # |logprob - reference| / |reference|
CLEAR_MARGIN = 1e-3       # a top-1 lead (in logprob) below this may flip either way
PERTURB = 1.0             # the negative control doubles every copied SSM state
# fp32 end to end: SGLang keeps conv states in bf16 unless told otherwise
# (SGLANG_MAMBA_CONV_DTYPE, configs/mamba_utils.py); the KV cache follows --dtype
EXACT_ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
REFERENCE = ("reference", "no-radix")
# the live farm's two ways (no_buffer in the normal loop, extra_buffer in the overlap loop)
# and extra_buffer in the normal loop (--disable-overlap-schedule): the decode-track
# snapshots without the overlap loop's lookahead
EXACT_BUFFERS = {**BUFFERS, "extra_buffer_normal_loop": [*BUFFERS["extra_buffer"],
                                                         "--disable-overlap-schedule"]}
# speculative decoding: NGRAM draft chains (breadth 1) verified by the real forward, its
# accepted steps' states committed and tracked (SGLang runs it in the normal loop on CPU)
SPEC = "extra_buffer_ngram"
EXACT_BUFFERS[SPEC] = [*BUFFERS["extra_buffer"], "--speculative-algorithm", "NGRAM",
                       "--speculative-num-draft-tokens", "4",
                       "--speculative-ngram-max-bfs-breadth", "1"]
CONFIGS = [(buffer, policy) for buffer in EXACT_BUFFERS if buffer != SPEC
           for policy in POLICIES if policy not in INT8_POLICIES] + [(SPEC, "marconi")]
# ``make test`` runs these (every buffer and loop, each policy once, for Qwen3-Next; both buffers and
# both Marconi policies for Nemotron-H; with the references and the negative controls, its
# time budget); MARCONI_LIVE_EXACT=full runs all nine per model (verify-exact --live always
# does)
QUICK_CONFIGS = {"qwen3_next": [("no_buffer", "marconi"), ("extra_buffer", "stock"),
                                ("extra_buffer_normal_loop", "marconi-alpha")],
                 "nemotron_h": [("no_buffer", "marconi-alpha"), ("extra_buffer", "marconi")]}
FULL_ENV = "MARCONI_LIVE_EXACT"
NEGATIVE = ("no_buffer", "stock-perturbed")
NEGATIVE_STEPS = 5        # shared-1 .. turn-2: chunk, branch and end-state hits
# int8 checkpoints (--enable-int8-mamba-checkpoint, SGLang's defaults otherwise): every hit
# loads a state the test kit's int8 audit finds bitwise equal to Int8CheckpointStore's
# round trip of the full-precision state stored for it; the outputs then differ from the
# uncached ones by that rounding only (measured worst 3.1e-4 on Qwen3-Next: INT8_REL_TOL
# leaves 3x). Its negative control scales every loaded state by 1 + PERTURB.
INT8_CONFIGS = [("extra_buffer", "marconi-int8")]
INT8_NEGATIVE = ("no_buffer", "marconi-int8-perturbed")
INT8_REL_TOL = 1e-3
AUDIT_EQUAL = "bitwise equal to the round trip"
AUDIT_FAILED = ("int8 audit: MISMATCH", "int8 audit: ORPHAN")


@dataclass
class Step:
    name: str
    input_ids: list
    max_new_tokens: int
    output_ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)     # chosen token's logprob per position
    top: list = field(default_factory=list)          # [(logprob, id), ...] per position
    cached_tokens: int = 0
    verify_ct: int = 0   # speculative verify forwards (meta_info.spec_verify_ct), else 0


def config_id(cfg) -> str:
    return "-".join(cfg)


def checked_configs(model: str) -> list:
    """The configurations the pytest run checks for ``model`` (``QUICK_CONFIGS`` unless
    ``MARCONI_LIVE_EXACT=full``)."""
    mode = os.environ.get(FULL_ENV, "")
    if mode not in ("", "full"):
        raise ValueError(f"{FULL_ENV}={mode!r}: expected 'full' or unset")
    return CONFIGS if mode == "full" else QUICK_CONFIGS.get(model, CONFIGS)


def server_for(model_path: Path, cfg, model: str = "qwen3_next") -> LiveServer:
    """An unstarted server of ``model`` for ``cfg`` (``REFERENCE``, ``NEGATIVE`` or a
    CONFIGS entry); pages as in the live farm (``live_configs.page_size``: 16 for
    Nemotron-H's extra_buffer, else 1)."""
    buffer, policy = cfg
    env = dict(EXACT_ENV)
    if cfg == REFERENCE:
        flags = ["--disable-radix-cache", *BUFFERS["no_buffer"]]
    elif cfg == NEGATIVE:
        flags = [*BUFFERS["no_buffer"]]
        env["MARCONI_CPU_TESTKIT_PERTURB_STATE"] = str(PERTURB)
    elif cfg == INT8_NEGATIVE:
        flags = [*POLICIES["marconi-int8"], *BUFFERS["no_buffer"]]
        env["MARCONI_CPU_TESTKIT_PERTURB_STATE"] = str(PERTURB)
    else:
        flags = [*POLICIES[policy], *EXACT_BUFFERS[buffer]]
    pages = page_size(model, "no_buffer" if buffer == "no_buffer" else "extra_buffer")
    flags += ["--chunked-prefill-size", str(CHUNKED_PREFILL), "--mamba-track-interval",
              str(TRACK_INTERVAL), "--page-size", str(pages),
              "--dtype", "float32"]
    return LiveServer(model_path, flags, max_total_tokens=KV_TOKENS, mamba_slots=MAMBA_SLOTS,
                      max_running=MAX_RUNNING, forward="real", load_format="safetensors",
                      extra_env=env)


def write_model(root: Path, model: str = "qwen3_next", seed: int = 0) -> Path:
    return write_tiny_weights(Path(root) / model, model, seed=seed)


def send(server: LiveServer, step: Step) -> Step:
    try:
        r = server.generate(step.input_ids, step.max_new_tokens, return_logprob=True,
                            top_logprobs_num=2)
    except requests.RequestException as e:
        raise RuntimeError(f"{step.name}: {e}\n{server.log_tail(40)}") from e
    meta = r["meta_info"]
    return Step(step.name, list(step.input_ids), step.max_new_tokens, list(r["output_ids"]),
                [lp for lp, _tok, *_ in meta["output_token_logprobs"]],
                [[(lp, tok) for lp, tok, *_ in pos] for pos in meta["output_top_logprobs"]],
                int(meta["cached_tokens"]), int(meta.get("spec_verify_ct") or 0))


def build_stream(server: LiveServer, seed: int = 0) -> list:
    """Run the scripted stream on ``server`` (the uncached reference), each continuation
    carrying this server's outputs; returns the recorded steps."""
    rng = random.Random(seed)
    tokens = lambda n: [rng.randint(1, 250) for _ in range(n)]  # noqa: E731 (byte ids)
    steps: list = []

    def run(name, ids, out_len=8):
        steps.append(send(server, Step(name, ids, out_len)))
        return steps[-1]

    system = tokens(350)
    run("shared-1", system + tokens(40))
    run("shared-2", system + tokens(40))        # chunk state at 256; branch found
    s3 = run("shared-3", system + tokens(40))   # extra_buffer: the branch state 320
    t1 = run("turn-1", s3.input_ids + s3.output_ids + tokens(30), 140)  # decode past 512
    t2 = run("turn-2", t1.input_ids + t1.output_ids + tokens(20), 12)   # track / end
    doc = tokens(600)
    run("doc-1", doc, 4)                        # chunk states at 256, 512
    run("doc-prefix", doc[:560] + tokens(30))   # resumes at the chunk state 512
    parent = tokens(200)
    for k in range(3):                          # forks: branch state at 192
        run(f"fork-{k}", parent + tokens(50 + 10 * k))
    for k in range(5):                          # pressure: both pools evict
        run(f"filler-{k}", tokens(300), 4)
    run("shared-after-pressure", system + tokens(40))
    run("turn-after-pressure", t2.input_ids + t2.output_ids + tokens(10))
    # turn-1 again: NGRAM's corpus holds its output, so a speculative server's drafts are
    # accepted several at a time (the random weights' outputs repeat no n-grams otherwise)
    run("turn-1-again", t1.input_ids, 140)
    return steps


def replay(server: LiveServer, reference: list) -> list:
    """The reference's inputs, in order, through ``server``."""
    return [send(server, Step(s.name, s.input_ids, s.max_new_tokens)) for s in reference]


@dataclass
class Comparison:
    name: str
    cached_tokens: int
    positions: int          # output positions compared (same prefix)
    max_rel: float          # max |logprob diff| / |reference logprob| over them
    diverged_at: int | None  # first position with a different token, if any
    margin_at_divergence: float | None  # the reference's top-1 lead there
    length: int = 0          # the reference's output tokens

    @property
    def clear_divergence(self) -> bool:
        """A different token where the reference's top-1 lead was clear: not exact."""
        return self.diverged_at is not None and self.margin_at_divergence >= CLEAR_MARGIN


def _margin(top: list) -> float:
    return top[0][0] - top[1][0] if len(top) > 1 else float("inf")


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def compare(ref: Step, got: Step) -> Comparison:
    """Position by position while the output prefixes agree: the chosen token's logprob,
    and at a differing token the top logprobs the two share (same context there)."""
    max_rel, n, diverged, margin = 0.0, 0, None, None
    for j, (r_tok, g_tok) in enumerate(zip(ref.output_ids, got.output_ids)):
        n += 1
        if r_tok == g_tok:
            max_rel = max(max_rel, _rel(got.logprobs[j], ref.logprobs[j]))
            continue
        shared = {tok: lp for lp, tok in ref.top[j]}
        for lp, tok in got.top[j]:
            if tok in shared:
                max_rel = max(max_rel, _rel(lp, shared[tok]))
        diverged, margin = j, _margin(ref.top[j])
        break
    return Comparison(got.name, got.cached_tokens, n, max_rel, diverged, margin,
                      len(ref.output_ids))


def compare_all(reference: list, got: list) -> list:
    return [compare(r, g) for r, g in zip(reference, got)]


def expected_hits(buffer: str, policy: str, by_name: dict) -> dict:
    """The resume point each scenario must hit (``cached_tokens``) on this server."""
    t1 = by_name["turn-1"]
    end = len(t1.input_ids) + len(t1.output_ids) - 1
    want = {"shared-2": CHUNKED_PREFILL,                  # chunk state
            "doc-prefix": 2 * CHUNKED_PREFILL}            # chunk state inside a long prompt
    if buffer.startswith("extra_buffer"):                # either loop
        want["shared-3"] = 350 // GRID * GRID             # branch state
        if policy not in LEARNED_ADMISSION:
            want["turn-2"] = end // TRACK_INTERVAL * TRACK_INTERVAL   # decode-track state
    else:
        want["shared-3"] = CHUNKED_PREFILL
        want["turn-2"] = end                              # end-of-request state
    return want


def summary(comparisons: list) -> tuple:
    """(max relative logprob diff over all requests, over requests that hit the cache)."""
    every = max((c.max_rel for c in comparisons), default=0.0)
    hits = max((c.max_rel for c in comparisons if c.cached_tokens > 0), default=0.0)
    return every, hits


# request groups, for the per-scenario report
# (branch states exist under extra_buffer only; no_buffer resumes those at chunk states)
SCENARIOS = {
    "shared prompt (chunk, branch)": ("shared-2", "shared-3"),
    "multi-turn (end, decode track)": ("turn-1", "turn-2"),
    "inside a long prompt (chunk)": ("doc-prefix",),
    "forks (branch)": ("fork-1", "fork-2"),
    "after evictions": ("shared-after-pressure", "turn-after-pressure"),
    "no hit": ("shared-1", "doc-1", "fork-0", *(f"filler-{k}" for k in range(5))),
}


def problems(cfg, reference: list, got: list) -> list:
    """Why ``got`` (``cfg``'s replay of ``reference``) is not exact, or [] if it is."""
    buffer, policy = cfg
    by_name = {s.name: s for s in got}
    want = expected_hits(buffer, policy, by_name)
    out = [f"{name}: cached_tokens {by_name[name].cached_tokens}, expected {hit}"
           for name, hit in want.items() if by_name[name].cached_tokens != hit]
    comparisons = compare_all(reference, got)
    out += [f"{c.name}: max rel logprob diff {c.max_rel:.2e}" for c in comparisons
            if c.max_rel > REL_TOL]
    out += [f"{c.name}: token {c.diverged_at} differs where the reference leads by "
            f"{c.margin_at_divergence:.2e}" for c in comparisons if c.clear_divergence]
    again = by_name["turn-1-again"]
    if buffer == SPEC and not 0 < again.verify_ct <= len(again.output_ids) // 2:
        out.append(f"turn-1-again: {again.verify_ct} verify forwards for "
                   f"{len(again.output_ids)} tokens (drafts not accepted)")
    return out


def int8_audit(log_text: str) -> dict:
    """The int8 audit's lines in a server's log: loads found equal, loads that failed."""
    return {"equal": log_text.count(AUDIT_EQUAL),
            "failed": sum(log_text.count(f) for f in AUDIT_FAILED)}


def int8_problems(cfg, reference: list, got: list, audit: dict) -> list:
    """Why an int8 configuration's replay is wrong, or []: the scripted hits, one audited
    bitwise round trip per hit and none failed, outputs within ``INT8_REL_TOL`` with the
    same greedy tokens where the reference's lead is clear."""
    buffer, policy = cfg
    by_name = {s.name: s for s in got}
    out = [f"{name}: cached_tokens {by_name[name].cached_tokens}, expected {hit}"
           for name, hit in expected_hits(buffer, policy, by_name).items()
           if by_name[name].cached_tokens != hit]
    hits = sum(s.cached_tokens > 0 for s in got)
    if audit["failed"] or audit["equal"] != hits:
        out.append(f"int8 audit: {audit['equal']} loads bitwise equal to the round trip, "
                   f"{audit['failed']} failed, for {hits} hits")
    comparisons = compare_all(reference, got)
    out += [f"{c.name}: max rel logprob diff {c.max_rel:.2e}" for c in comparisons
            if c.max_rel > INT8_REL_TOL]
    out += [f"{c.name}: token {c.diverged_at} differs where the reference leads by "
            f"{c.margin_at_divergence:.2e}" for c in comparisons if c.clear_divergence]
    return out


def run_int8(farm, reference: list, model: str, log=print) -> dict:
    """The int8 configurations and their negative control on ``farm``'s servers."""
    out = {"configs": {}}
    for cfg in INT8_CONFIGS:
        server = farm.get(cfg)
        got = replay(server, reference)
        audit = int8_audit(server.log_text())
        comparisons = compare_all(reference, got)
        out["configs"][config_id(cfg)] = {
            "requests": [vars(c) for c in comparisons], "audit": audit,
            "problems": int8_problems(cfg, reference, got, audit),
            "max_rel": summary(comparisons)[0], "max_rel_resumed": summary(comparisons)[1]}
        log(f"{model} {config_id(cfg)}: max rel logprob diff {summary(comparisons)[0]:.2e}, "
            f"{audit['equal']} loads bitwise equal to the int8 round trip")
    server = farm.get(INT8_NEGATIVE)
    steps = reference[:NEGATIVE_STEPS]
    comparisons = compare_all(steps, replay(server, steps))
    audit = int8_audit(server.log_text())
    worst = summary(comparisons)[1]
    out["negative_control"] = {"perturb": PERTURB, "max_rel_resumed": worst, "audit": audit,
                               "breaks_tolerance": (worst > 10 * INT8_REL_TOL
                                                    and audit["failed"] > 0
                                                    and audit["equal"] == 0)}
    out["passed"] = out["negative_control"]["breaks_tolerance"] and not any(
        r["problems"] for r in out["configs"].values())
    return out


def run_model(root: Path, model: str, seed: int = 0, log=print) -> dict:
    """Every configuration and the negative control of ``model`` against its reference,
    one server at a time (the next one starting in the background); a JSON-able result."""
    path = write_model(root, model, seed)
    order = [REFERENCE, *CONFIGS, NEGATIVE, *INT8_CONFIGS, INT8_NEGATIVE]
    farm = ServerFarm(order, lambda cfg: server_for(path, cfg, model).start())
    result = {"model": model, "configs": {}}
    try:
        reference = build_stream(farm.get(REFERENCE), seed)
        log(f"{model} reference ({config_id(REFERENCE)}): {len(reference)} requests, "
            f"{sum(len(s.output_ids) for s in reference)} greedy tokens")
        for cfg in [*CONFIGS, NEGATIVE]:
            steps = reference[:NEGATIVE_STEPS] if cfg == NEGATIVE else reference
            got = replay(farm.get(cfg), steps)
            comparisons = compare_all(steps, got)
            result["configs"][config_id(cfg)] = {
                "requests": [vars(c) for c in comparisons],
                "problems": [] if cfg == NEGATIVE else problems(cfg, steps, got),
                "max_rel": summary(comparisons)[0],
                "max_rel_resumed": summary(comparisons)[1]}
            log(f"{model} {config_id(cfg)}: max rel logprob diff "
                f"{summary(comparisons)[0]:.2e}")
        result["int8"] = run_int8(farm, reference, model, log)
    finally:
        farm.close()
    neg = result["configs"][config_id(NEGATIVE)]["max_rel_resumed"]
    result["negative_control"] = {"perturb": PERTURB, "max_rel_resumed": neg,
                                  "breaks_tolerance": neg > 100 * REL_TOL}
    result["passed"] = (result["negative_control"]["breaks_tolerance"]
                        and result["int8"]["passed"] and not any(
                            r["problems"] for r in result["configs"].values()))
    return result


def run_all(root: Path, seed: int = 0, log=print, models=MODELS) -> dict:
    """``run_model`` for each of ``models``, one model after the other."""
    result = {"seed": seed, "rel_tol": REL_TOL, "int8_rel_tol": INT8_REL_TOL,
              "models": {m: run_model(root, m, seed, log) for m in models}}
    result["passed"] = all(r["passed"] for r in result["models"].values())
    return result


def scenario_table(result: dict) -> list:
    """Lines: per scenario (rows) and configuration (columns), the max relative logprob
    difference against the reference and the hits (cached_tokens) of its requests
    (``result``: one model's, from ``run_model``)."""
    cfgs = [config_id(c) for c in CONFIGS]
    lines = [f"{'scenario':31s} " + " ".join(f"{c:>22s}" for c in cfgs)]
    for label, names in SCENARIOS.items():
        cells = []
        for c in cfgs:
            reqs = [r for r in result["configs"][c]["requests"] if r["name"] in names]
            worst = max(r["max_rel"] for r in reqs)
            hit = "/".join(str(r["cached_tokens"]) for r in reqs if r["cached_tokens"])
            cells.append(f"{worst:.1e} hit {hit or '-'}")
        lines.append(f"{label:31s} " + " ".join(f"{x:>22s}" for x in cells))
    same = [identical_tokens(result["configs"][c]["requests"]) for c in cfgs]
    lines.append(f"{'identical greedy tokens':31s} " + " ".join(
        f"{f'{n} of {total}':>22s}" for n, total in same))
    return lines


def identical_tokens(requests: list) -> tuple:
    """(output tokens equal to the reference's before any divergence, the reference's
    output tokens)."""
    same = sum(r["positions"] - (r["diverged_at"] is not None) for r in requests)
    return same, sum(r["length"] for r in requests)
