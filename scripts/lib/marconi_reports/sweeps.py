"""Sweep machinery for ``scripts/reproduce.py`` (the paper's planning simulator).

- ``WorkloadRef``: a replayable workload by value (a generator with parameters, or a trace
  file), so sweep tasks can be sent to worker processes and traces built once per process.
- ``model_spec``: a model by name: a preset (``paper-7b``, ``qwen3_next``, ...) or a
  hand-built variant of ``paper-7b`` (``paper-7b/ssm:attn=4``, ``paper-7b/N=64``, see
  ``paper_variant``) for the paper's sensitivity study (Fig. 12).
- ``run_config``: one (model, workload, capacity, policy) replay; the runner's metrics plus
  a few extra measurements (states held at the end, the alpha tuner's window, per-phase
  FLOPs).
- ``calibrate``: per (model, workload), the ``infinite`` ceiling and capacities at which the
  LRU baseline (``paper-sglang+``) keeps given fractions of the ceiling's hit tokens, so every
  capacity of a sweep is one where eviction matters.
- ``run_tasks``: many replays in parallel processes (fork) with a tqdm bar over
  configurations.
- aggregations the paper uses: the token hit rate ratio marconi / vllm+ averaged over
  configurations, the gain over paper-sglang+ at the 95th percentile over configurations.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
from tqdm import tqdm

from sglang_marconi.model.layers import AttentionLayer, MLPLayer, SSMLayer
from sglang_marconi.model.presets import PAPER_D, PAPER_N, preset_spec
from sglang_marconi.model.spec import HybridModelSpec, dtype_bytes
from sglang_marconi.sim.generators import generate
from sglang_marconi.sim.latency import LatencyModel
from sglang_marconi.sim.policies import build_cache, parse_policy
from sglang_marconi.sim.runner import summarize
from sglang_marconi.sim.traces import read_trace

REPO_ROOT = Path(__file__).resolve().parents[3]  # scripts/lib/marconi_reports/sweeps.py
MOONCAKE_TRACE = REPO_ROOT.parent / "shared" / "traces" / "mooncake" / "synthetic_trace.jsonl"
PAPER_BLOCKS = 28  # paper-7b: 28 blocks of (mixer, MLP); 4 attention + 24 Mamba mixers


# ---- models --------------------------------------------------------------------------------
def paper_variant(ssm_per_attention: float | None = None, state_dim: int = PAPER_N,
                  blocks: int = PAPER_BLOCKS, name: str | None = None,
                  dtype: str = "float16") -> HybridModelSpec:
    """``paper-7b`` with another SSM:attention ratio (same number of blocks) and/or another
    state dimension N, with the paper's formulas (attention 8LD^2 + 4L^2D, MLP 16LD^2, Mamba
    12LD^2 + 16LDN + 10LD; state D*N + (2D + 2N)*4 elements). ``ssm_per_attention=None``
    keeps the paper's 4 attention mixers (1:6); otherwise round(blocks / (1 + r)) attention
    mixers, spread evenly."""
    D, N = PAPER_D, int(state_dim)
    b = dtype_bytes(dtype)
    attn = AttentionLayer(hidden=D, num_heads=32, num_kv_heads=32, head_dim=D // 32,
                          kv_dtype_bytes=b)
    mamba = SSMLayer("mamba", temporal_elems=D * N, conv_elems=(2 * D + 2 * N) * 4,
                     state_dtype_bytes=b, conv_dtype_bytes=b,
                     proj_flops_per_token=12 * D * D + 10 * D, scan_flops_per_token=16 * D * N)
    mlp = MLPLayer(hidden=D, dense_size=4 * D, gated=False)
    n_attn = 4 if ssm_per_attention is None else max(1, round(blocks / (1 + ssm_per_attention)))
    layers = []
    for i in range(blocks):
        is_attn = (i + 1) * n_attn // blocks > i * n_attn // blocks
        layers += [attn if is_attn else mamba, mlp]
    return HybridModelSpec(name or variant_name(ssm_per_attention, state_dim), tuple(layers),
                           dtype=dtype, architecture="paper-7b-variant", num_hidden_layers=blocks)


def variant_name(ssm_per_attention=None, state_dim=PAPER_N) -> str:
    parts = []
    if ssm_per_attention is not None:
        parts.append(f"ssm:attn={ssm_per_attention:g}")
    if state_dim != PAPER_N:
        parts.append(f"N={state_dim}")
    return "paper-7b/" + ",".join(parts) if parts else "paper-7b"


@lru_cache(maxsize=None)
def model_spec(name: str) -> HybridModelSpec:
    """A preset name, or ``paper-7b/ssm:attn=R,N=K`` (a ``paper_variant``)."""
    if name.startswith("paper-7b/"):
        ratio, n = None, PAPER_N
        for part in name.split("/", 1)[1].split(","):
            key, value = part.split("=", 1)
            if key == "ssm:attn":
                ratio = float(value)
            elif key == "N":
                n = int(value)
            else:
                raise ValueError(f"unknown paper-7b variant field {key!r} in {name!r}")
        return paper_variant(ratio, n, name=name)
    return preset_spec(name)


def describe_model(spec: HybridModelSpec) -> str:
    return (f"{spec.num_attention_layers} attention : {spec.num_ssm_layers} SSM layers, "
            f"{spec.kv_bytes_per_token:,} B KV/token, "
            f"{spec.ssm_state_bytes / 1e6:,.2f} MB/state")


# ---- workloads -----------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkloadRef:
    """A workload by value. ``kind`` "generator" (``name`` is a generator, ``params`` its
    overrides) or "trace" (``name`` is a trace file). ``family`` groups rows for the paper's
    per-workload averages; ``rate`` is the arrival rate shown in tables."""

    label: str
    kind: str
    name: str
    params: tuple = ()
    seed: int = 0
    family: str = ""
    rate: float | None = None
    limit: int | None = None

    def build(self):
        return _build_trace(self)


_TRACES: dict = {}


def _build_trace(ref: WorkloadRef):
    if ref not in _TRACES:
        if ref.kind == "trace":
            trace = read_trace(ref.name)
        else:
            trace = generate(ref.name, seed=ref.seed, **dict(ref.params))
        _TRACES[ref] = trace.head(ref.limit)
    return _TRACES[ref]


def generator(name: str, family: str | None = None, rate_key: str | None = None, seed: int = 0,
              label: str | None = None, **params) -> WorkloadRef:
    rate = params.get(rate_key) if rate_key else None
    if label is None:
        label = name if rate is None else f"{name}@{rate:g}/s"
    return WorkloadRef(label, "generator", name, tuple(sorted(params.items())), seed,
                       family or name, rate)


def mooncake(path=None, limit: int | None = None, label: str = "mooncake") -> WorkloadRef:
    return WorkloadRef(label, "trace", str(path or MOONCAKE_TRACE), (), 0, "mooncake", None,
                       limit)


def phase_labels(trace) -> list:
    """Each request's phase: its session id's prefix (before the first '-'); a phase that
    comes back after another one is numbered (``scan#1``, ``steady``, ``scan#2``)."""
    raw = [r.session_id.split("-", 1)[0] for r in trace.requests]
    runs: list = []
    for p in raw:
        if not runs or runs[-1] != p:
            runs.append(p)
    repeated = {p for p in runs if runs.count(p) > 1}
    out, seen, prev = [], {}, None
    for p in raw:
        if p != prev:
            seen[p] = seen.get(p, 0) + 1
            prev = p
        out.append(f"{p}#{seen[p]}" if p in repeated else p)
    return out


# ---- one replay -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Task:
    model: str
    workload: WorkloadRef
    capacity: int | None
    policy: str
    phases: bool = False   # also report FLOPs saved per phase (session id prefix)
    tag: str = ""          # free-form: what the caller wants to find the result by

    @property
    def key(self) -> tuple:
        return (self.model, self.workload.label, self.capacity, self.policy, self.tag)


def run_config(task: Task, latency: LatencyModel | None = None) -> dict:
    """Replay one configuration: the runner's ``summarize`` metrics plus extras."""
    latency = latency or LatencyModel()
    spec = model_spec(task.model)
    trace = task.workload.build()
    policy = parse_policy(task.policy)
    cache = build_cache(policy, spec, task.capacity, 1, trace)
    requests = trace.requests
    hits = np.zeros(len(requests), dtype=np.int64)
    start = time.perf_counter()
    for i, r in enumerate(requests):
        hits[i] = cache.process(r.input_tokens, r.full_tokens)
    wall = time.perf_counter() - start
    out = summarize(cache, trace, hits, spec, latency, wall)
    tree = cache.tree
    states, kv_tokens, held = tree.num_states, tree.num_kv_tokens, tree.bytes_used
    out.update(
        model=task.model, workload=task.workload.label, family=task.workload.family,
        rate=task.workload.rate, capacity=task.capacity, policy=task.policy, tag=task.tag,
        states_held=states, kv_tokens_held=kv_tokens, bytes_held=held,
        state_bytes_held=states * spec.ssm_state_bytes,
        requests=len(requests),
    )
    out.pop("alpha_scores", None)
    tuner = getattr(cache, "tuner", None)
    if tuner is not None:
        out["alpha_first_eviction_at"] = tuner.first_eviction_at
    online = getattr(cache, "online", None)
    if online is not None:
        out["alpha_switches"] = list(online.history)
    ghost = getattr(cache, "ghost", None)
    if ghost is not None:
        out["ghost_tokens_max"] = ghost.max_tokens
        out["ghost_tokens_held"] = ghost.tree.num_kv_tokens
    if task.phases:
        labels = phase_labels(trace)
        phases: dict = {}
        for r, h, p in zip(requests, hits, labels):
            row = phases.setdefault(p, {"requests": 0, "flops_saved": 0.0,
                                        "prefill_flops": 0.0, "hit_tokens": 0,
                                        "input_tokens": 0})
            row["requests"] += 1
            row["flops_saved"] += spec.flops_saved(int(h), 0)
            row["prefill_flops"] += spec.prefill_flops(r.input_len)
            row["hit_tokens"] += int(h)
            row["input_tokens"] += r.input_len
        out["phases"] = phases
    return out


# ---- calibration -------------------------------------------------------------------------------
def calibrate(model: str, workload: WorkloadRef, targets, lru_policy: str = "paper-sglang+") -> dict:
    """The ``infinite`` ceiling of (model, workload) and one capacity per target t.

    The smallest useful cache holds the longest request (its KV plus two states): call the
    share of the ceiling's hit tokens the LRU baseline (``lru_policy``) keeps there ``f0``
    (on the agent workload the shared system prompt alone keeps ~half). Target t asks for
    the capacity at which the LRU baseline keeps ``f0 + t * (1 - f0)`` of the ceiling: t of
    the way from the smallest useful cache to an unlimited one. Probes capacities
    peak * 2^(-k/2) (peak: the ceiling's peak bytes) down to the smallest useful cache,
    interpolates log-linearly between the probes around each target, rounds to 3
    significant figures."""
    spec = model_spec(model)
    trace = workload.build()
    inf = run_config(Task(model, workload, None, "infinite"))
    peak, ceiling = inf["peak_bytes"], inf["hit_tokens"]
    longest = max(r.input_len + r.output_len for r in trace.requests)
    floor_cap = min(peak, longest * spec.kv_bytes_per_token + 2 * spec.ssm_state_bytes)

    def frac(cap):
        res = run_config(Task(model, workload, int(cap), lru_policy))
        return res["hit_tokens"] / ceiling if ceiling else 0.0

    probes = [(float(peak), 1.0)]
    k = 1
    while peak * 2.0 ** (-k / 2) > floor_cap:
        cap = int(peak * 2.0 ** (-k / 2))
        probes.append((float(cap), frac(cap)))
        k += 1
    f0 = frac(floor_cap) if floor_cap < peak else 1.0
    probes.append((float(floor_cap), f0))
    caps, wanted = [], []
    for t in targets:
        want = f0 + t * (1.0 - f0)
        wanted.append(want)
        cap = None
        for (c_hi, f_hi), (c_lo, f_lo) in zip(probes, probes[1:]):
            if f_lo <= want <= f_hi:
                w = (want - f_lo) / (f_hi - f_lo) if f_hi > f_lo else 0.0
                cap = math.exp(math.log(c_lo) + w * (math.log(c_hi) - math.log(c_lo)))
                break
        caps.append(_round_sig(cap if cap is not None else floor_cap, 3))
    return {"model": model, "workload": workload.label, "infinite": inf, "targets": list(targets),
            "lru_fraction_wanted": wanted, "floor_capacity": int(floor_cap), "floor_fraction": f0,
            "capacities": caps, "probes": probes}


def _round_sig(x: float, sig: int) -> int:
    if x <= 0:
        return 0
    digits = sig - int(math.floor(math.log10(x))) - 1
    return int(round(x, digits))


# ---- parallel execution --------------------------------------------------------------------
_POLICY_COST = {"vllm+": 40.0, "offline": 6.0, "marconi": 3.0, "marconi+": 2.0}


def task_cost(task) -> float:
    if isinstance(task, Task):
        trace = task.workload.build()
        base = task.policy.split(":", 1)[0]
        cost = _POLICY_COST.get(base, 1.0)
        if "alpha=online" in task.policy:
            cost *= 5
        return cost * trace.input_tokens
    return 30.0 * task[1].build().input_tokens  # a calibration


def _work_indexed(arg):
    index, item = arg
    return index, _work(item)


def _work(item):
    kind, payload = item
    t0 = time.perf_counter()
    if kind == "run":
        res = run_config(payload)
    else:
        model, workload, targets = payload
        res = calibrate(model, workload, targets)
    return kind, payload, res, time.perf_counter() - t0, os.getpid()


def run_tasks(items, jobs: int = 2, progress: bool = True, desc: str = "configurations"):
    """Run ``items`` (``("run", Task)`` or ``("calibrate", (model, workload, targets))``) in
    ``jobs`` forked processes, costliest first; returns [(kind, payload, result, seconds)] in
    the order given. Traces are built in this process first, so the workers inherit them."""
    items = list(items)
    for kind, payload in items:
        (payload.workload if kind == "run" else payload[1]).build()
    order = sorted(range(len(items)), key=lambda i: -task_cost(
        items[i][1] if items[i][0] == "run" else ("cal", items[i][1][1])))
    results: list = [None] * len(items)
    bar = None
    if progress:
        bar = tqdm(total=len(items), desc=desc, unit="cfg", mininterval=1.0)
    try:
        if jobs > 1 and len(items) > 1:
            with mp.get_context("fork").Pool(min(jobs, len(items))) as pool:
                ordered = [(i, items[i]) for i in order]
                for j, out in pool.imap_unordered(_work_indexed, ordered):
                    results[j] = out[:4]
                    if bar is not None:
                        bar.update(1)
        else:
            for j in order:
                results[j] = _work(items[j])[:4]
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return results


# ---- aggregation ---------------------------------------------------------------------------
@dataclass
class Comparison:
    """Per-configuration comparisons of one policy against two baselines."""

    configs: list = field(default_factory=list)  # (workload, capacity)
    ratio_vs_vllm: list = field(default_factory=list)     # marconi / vllm+ token hit rate
    gain_vs_sglang: list = field(default_factory=list)    # marconi / paper-sglang+ - 1
    flops_gain_vs_sglang: list = field(default_factory=list)

    @property
    def ratio_mean(self) -> float | None:
        finite = [r for r in self.ratio_vs_vllm if math.isfinite(r)]
        return float(np.mean(finite)) if finite else None

    @property
    def ratio_infinite_count(self) -> int:
        return sum(1 for r in self.ratio_vs_vllm if not math.isfinite(r))

    @property
    def gain_p95(self) -> float | None:
        return _p95(self.gain_vs_sglang)

    @property
    def gain_mean(self) -> float | None:
        return float(np.mean(self.gain_vs_sglang)) if self.gain_vs_sglang else None

    @property
    def flops_gain_p95(self) -> float | None:
        return _p95(self.flops_gain_vs_sglang)


def _p95(xs) -> float | None:
    xs = [x for x in xs if math.isfinite(x)]
    return float(np.percentile(xs, 95)) if xs else None


def _ratio(a: float, b: float) -> float:
    if b == 0:
        return math.inf if a > 0 else 1.0
    return a / b


def compare(records: list, model: str, family: str, policy: str = "marconi",
            vllm: str = "vllm+", lru: str = "paper-sglang+") -> Comparison:
    """The paper's comparisons over every (workload, capacity) of ``family`` on ``model``:
    token hit rate ratio ``policy`` / ``vllm`` and relative gain over ``lru``."""
    table: dict = {}
    for r in records:
        if r["model"] == model and r["family"] == family and r["capacity"] is not None:
            table.setdefault((r["workload"], r["capacity"]), {})[r["policy"]] = r
    cmp = Comparison()
    for key in sorted(table, key=lambda k: (k[0], k[1])):
        row = table[key]
        if not all(p in row for p in (policy, vllm, lru)):
            continue
        m, v, s = row[policy], row[vllm], row[lru]
        cmp.configs.append(key)
        cmp.ratio_vs_vllm.append(_ratio(m["token_hit_rate"], v["token_hit_rate"]))
        cmp.gain_vs_sglang.append(_ratio(m["token_hit_rate"], s["token_hit_rate"]) - 1)
        cmp.flops_gain_vs_sglang.append(_ratio(m["flops_saved"], s["flops_saved"]) - 1)
    return cmp


def find(records: list, **where) -> list:
    return [r for r in records if all(r.get(k) == v for k, v in where.items())]


def one(records: list, **where) -> dict:
    rows = find(records, **where)
    if len(rows) != 1:
        raise KeyError(f"{len(rows)} records match {where}")
    return rows[0]
