"""The paper's simulator figures (docs/results.md): the sweep ``scripts/reproduce.py`` runs
and its analysis.

Sweep: workloads (chat-like and agent-like generators at several session arrival rates, the
shared Mooncake trace) x capacities (per workload, chosen so that eviction matters: see
``sweeps.calibrate``) x policies (vllm+, paper-sglang+, marconi, infinite), on ``paper-7b`` and on
one real architecture preset (``qwen3_next`` by default); plus the sensitivity to the
SSM:attention layer ratio and to the state dimension (hand-built variants of paper-7b).

- ``make_config``: the sweep of a mode (``tiny``, ``quick``, ``full``);
- ``run_sweep``: calibration and every replay, in worker processes;
- ``analyze``: the per-configuration rows, per-family aggregates (Figs. 7-10), the
  sensitivity rows (Fig. 12) that ``reproduce_markdown`` and ``plots`` render.
"""
from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field

from marconi_reports import sweeps
from sglang_marconi.sim.runner import LONG_REQUEST
from marconi_reports.sweeps import Task, generator, model_spec, variant_name

POLICIES = ("vllm+", "paper-sglang+", "marconi")
PAPER = {  # the paper's Figs. 7-8: marconi / vllm+ token hit rate, gain over paper-sglang+ (P95)
    "LMSys": (4.5, 0.456), "ShareGPT": (7.3, 0.190), "SWE-bench": (34.4, 2.197),
}
PAPER_FOR_FAMILY = {"chat": ("LMSys", "ShareGPT"), "agent": ("SWE-bench",), "mooncake": ()}
FAMILY_ORDER = ("chat", "agent", "mooncake")
EFF_LENGTHS = (64, 256, 1024, 4096, 16384, 65536)
EFF_REF = 16384


# ---- configuration ---------------------------------------------------------------------------
@dataclass
class SweepConfig:
    mode: str
    models: list
    workloads: list                       # sweeps.WorkloadRef
    targets: tuple                        # calibration targets (see sweeps.calibrate)
    sens_workloads: list = field(default_factory=list)
    sens_target_index: tuple = ()         # which of the base model's capacities to use
    sens_ratios: tuple = ()               # SSM layers per attention layer
    sens_state_dims: tuple = ()


def make_config(mode: str, arch: str = "qwen3_next", mooncake: str | None = None) -> SweepConfig:
    def chat(rate, sessions=200):
        return generator("chat", rate_key="session_rate", session_rate=rate, sessions=sessions)

    def agent(rate, sessions=40):
        return generator("agent", rate_key="session_rate", session_rate=rate, sessions=sessions)

    if mode == "tiny":
        tiny_agent = generator("agent", rate_key="session_rate", session_rate=0.2, sessions=5,
                               min_turns=6, max_turns=10)
        return SweepConfig("tiny", ["paper-7b"], [chat(1.0, 30), tiny_agent], (0.3, 0.7),
                           [chat(1.0, 30)], (0,), (8,), (32,))
    moon = sweeps.mooncake(mooncake)
    if mode == "quick":
        return SweepConfig("quick", ["paper-7b", arch],
                           [chat(0.5), chat(2.0), agent(0.05), agent(0.2), moon],
                           (0.2, 0.4, 0.6, 0.8), [chat(0.5), agent(0.05)], (1, 2),
                           (2, 4, 8), (16, 32, 64, 256))
    if mode == "full":
        return SweepConfig("full", ["paper-7b", arch],
                           [chat(0.25), chat(0.5), chat(1.0), chat(2.0), agent(0.05),
                            agent(0.1), agent(0.2), moon],
                           (0.1, 0.3, 0.5, 0.7, 0.9), [chat(0.5), agent(0.1)],
                           (1, 2, 3), (2, 4, 8), (16, 32, 64, 256))
    raise ValueError(mode)


def sens_models(cfg: SweepConfig) -> list:
    out = ["paper-7b"]
    out += [variant_name(r) for r in cfg.sens_ratios if r != 6]
    out += [variant_name(None, n) for n in cfg.sens_state_dims if n != 128]
    return out


# ---- the sweep -------------------------------------------------------------------------------
def run_sweep(cfg: SweepConfig, jobs: int = 2, progress: bool = True) -> dict:
    t0 = time.perf_counter()
    cal_items = [("calibrate", (m, w, cfg.targets)) for m in cfg.models for w in cfg.workloads]
    cal = {}
    for kind, (m, w, _), res, secs in sweeps.run_tasks(cal_items, jobs, progress,
                                                        "calibrating capacities"):
        res["seconds"] = secs
        cal[(m, w.label)] = res
    tasks: dict = {}
    for m in cfg.models:
        for w in cfg.workloads:
            for cap in sorted(set(cal[(m, w.label)]["capacities"])):
                for p in POLICIES:
                    t = Task(m, w, cap, p)
                    tasks[t.key] = t
    sens = []
    for w in cfg.sens_workloads:
        caps = cal[("paper-7b", w.label)]["capacities"]
        for i in cfg.sens_target_index:
            for m in sens_models(cfg):
                for p in POLICIES:
                    t = Task(m, w, caps[i], p)
                    tasks.setdefault(t.key, t)
                    sens.append(t.key)
    records = []
    for kind, task, res, secs in sweeps.run_tasks([("run", t) for t in tasks.values()], jobs,
                                                   progress, "replaying configurations"):
        records.append(res)
    for c in cal.values():
        records.append(c["infinite"])
    wall = time.perf_counter() - t0
    return {"config": cfg, "calibration": cal, "records": records, "sens_keys": sens,
            "wall_s": wall, "jobs": jobs}


# ---- analysis ----------------------------------------------------------------------------
def _mean(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else None


def _rel(a, b):
    if a is None or b is None:
        return None
    return a / b - 1 if b else (math.inf if a > 0 else 0.0)


def analyze(sweep: dict) -> dict:
    cfg, records, cal = sweep["config"], sweep["records"], sweep["calibration"]
    by = {}
    for r in records:
        by[(r["model"], r["workload"], r["capacity"], r["policy"])] = r
    inf = {(c["model"], c["workload"]): c["infinite"] for c in cal.values()}
    target_of = {}
    for c in cal.values():
        for t, cap in zip(c["targets"], c["capacities"]):
            target_of.setdefault((c["model"], c["workload"], cap), t)
    out = {"rows": {}, "families": {}, "sens": [], "sens_summary": {}}
    for m in cfg.models:
        rows = []
        for w in cfg.workloads:
            c = cal[(m, w.label)]
            ceiling = inf[(m, w.label)]
            for cap in sorted(set(c["capacities"])):
                row = {"model": m, "workload": w.label, "family": w.family, "rate": w.rate,
                       "capacity": cap, "target": target_of[(m, w.label, cap)],
                       "peak_fraction": cap / ceiling["peak_bytes"]}
                for p in POLICIES:
                    r = by[(m, w.label, cap, p)]
                    row[p] = r
                    row[f"{p}_of_inf"] = (r["hit_tokens"] / ceiling["hit_tokens"]
                                          if ceiling["hit_tokens"] else None)
                row["infinite"] = ceiling
                row["ratio"] = sweeps._ratio(row["marconi"]["token_hit_rate"],
                                             row["vllm+"]["token_hit_rate"])
                row["gain"] = sweeps._ratio(row["marconi"]["token_hit_rate"],
                                            row["paper-sglang+"]["token_hit_rate"]) - 1
                row["flops_gain"] = sweeps._ratio(row["marconi"]["flops_saved"],
                                                  row["paper-sglang+"]["flops_saved"]) - 1
                rows.append(row)
        out["rows"][m] = rows
        for fam in FAMILY_ORDER:
            frows = [r for r in rows if r["family"] == fam]
            if not frows:
                continue
            cmp = sweeps.compare(records, m, fam)
            alphas = Counter(f"{r['marconi']['alpha']:g}" for r in frows)
            tuned = sum(1 for r in frows if r["marconi"].get("alpha_tuned"))
            v = [r["vllm+"] for r in frows]
            fam_out = {
                "n": len(frows),
                "ratio_mean": cmp.ratio_mean, "ratio_inf": cmp.ratio_infinite_count,
                "ratio_min": min(cmp.ratio_vs_vllm), "ratio_max": max(cmp.ratio_vs_vllm),
                "gain_p95": cmp.gain_p95, "gain_mean": cmp.gain_mean,
                "gain_min": min(cmp.gain_vs_sglang), "flops_gain_p95": cmp.flops_gain_p95,
                "alphas": dict(sorted(alphas.items(), key=lambda kv: float(kv[0]))),
                "tuned": tuned,
                "identical_to_lru": sum(1 for r in frows
                                        if r["marconi"]["hit_tokens"] == r["paper-sglang+"]["hit_tokens"]),
                "of_inf": {p: _mean([r[f"{p}_of_inf"] for r in frows]) for p in POLICIES},
                "vllm_admitted": _mean([x["states_admitted"] for x in v]),
                "vllm_evicted": _mean([x["states_evicted"] for x in v]),
                "vllm_zero": sum(1 for x in v if x["states_admitted"] == 0),
                "vllm_rejected": _mean([x["admissions_rejected"] / x["requests"] for x in v]),
                "vllm_state_share": _mean([x["state_bytes_held"] / x["bytes_held"]
                                           for x in v if x["bytes_held"]]),
                "marconi_admitted": _mean([r["marconi"]["states_admitted"] for r in frows]),
                "f0": _mean([cal[(m, w.label)]["floor_fraction"] for w in cfg.workloads
                             if w.family == fam]),
                "lru_evicted": _mean([r["paper-sglang+"]["states_evicted"] for r in frows]),
                "ttft": {p: (_mean([r[p]["ttft_p50_s"] for r in frows]),
                             _mean([r[p]["ttft_p95_s"] for r in frows])) for p in POLICIES},
                "ttft_inf": (frows[0]["infinite"]["ttft_p50_s"],
                             frows[0]["infinite"]["ttft_p95_s"]),
            }
            red = []
            for r in frows:
                m95 = r["marconi"]["ttft_p95_s"]
                for base in ("vllm+", "paper-sglang+"):
                    b95 = r[base]["ttft_p95_s"]
                    red.append((1 - m95 / b95, b95 - m95, base, r["workload"], r["capacity"],
                                m95 / b95 - 1))
            best = max(red, key=lambda x: x[0])
            fam_out["ttft_best_reduction"] = best
            fam_out["ttft_worst_vs_lru"] = min((x for x in red if x[2] == "paper-sglang+"),
                                               key=lambda x: x[0])
            fam_out["length"] = {p: (_mean([r[p]["short_token_hit_rate"] for r in frows]),
                                     _mean([r[p]["long_token_hit_rate"] for r in frows]))
                                 for p in POLICIES}
            shorts = [_rel(r["marconi"]["short_token_hit_rate"], r["paper-sglang+"]["short_token_hit_rate"])
                      for r in frows]
            longs = [_rel(r["marconi"]["long_token_hit_rate"], r["paper-sglang+"]["long_token_hit_rate"])
                     for r in frows]
            shorts = [x for x in shorts if x is not None and math.isfinite(x)]
            longs = [x for x in longs if x is not None and math.isfinite(x)]
            fam_out["short_worst"] = min(shorts) if shorts else None
            fam_out["long_best"] = max(longs) if longs else None
            out["families"][(m, fam)] = fam_out
    # FLOPs saved per byte of a cached sequence of L tokens with its one state
    out["efficiency"] = {}
    for m in cfg.models:
        spec = model_spec(m)

        def eff(n, spec=spec):
            return spec.flops_saved(n, 0) / (n * spec.kv_bytes_per_token + spec.ssm_state_bytes)
        out["efficiency"][m] = [(n, eff(n) / eff(EFF_REF)) for n in EFF_LENGTHS]
    # request length mix of each workload
    out["length_mix"] = {}
    for w in cfg.workloads:
        lens = [r.input_len for r in w.build().requests]
        out["length_mix"][w.label] = (sum(1 for n in lens if n < LONG_REQUEST), len(lens))
    # sensitivity
    for key in dict.fromkeys(sweep["sens_keys"]):
        m, wl, cap, p, _ = key
        if p != "marconi":
            continue
        mr, v, s = (by[(m, wl, cap, q)] for q in ("marconi", "vllm+", "paper-sglang+"))
        out["sens"].append({"model": m, "workload": wl, "capacity": cap,
                            "vllm+": v["token_hit_rate"], "paper-sglang+": s["token_hit_rate"],
                            "marconi": mr["token_hit_rate"], "alpha": mr["alpha"],
                            "ratio": sweeps._ratio(mr["token_hit_rate"], v["token_hit_rate"]),
                            "gain": sweeps._ratio(mr["token_hit_rate"], s["token_hit_rate"]) - 1,
                            "flops_gain": sweeps._ratio(mr["flops_saved"], s["flops_saved"]) - 1,
                            "vllm_admitted": v["states_admitted"]})
    for m in dict.fromkeys(x["model"] for x in out["sens"]):
        xs = [x for x in out["sens"] if x["model"] == m]
        finite = [x["ratio"] for x in xs if math.isfinite(x["ratio"])]
        out["sens_summary"][m] = {
            "ratio_mean": _mean(finite), "ratio_inf": len(xs) - len(finite),
            "gain_mean": _mean([x["gain"] for x in xs]),
            "flops_gain_mean": _mean([x["flops_gain"] for x in xs]), "n": len(xs)}
    return out


def families(cfg, an):
    """(model, family, its analysis) for every family a model was run on, in report order."""
    for m in cfg.models:
        for fam in FAMILY_ORDER:
            f = an["families"].get((m, fam))
            if f is not None:
                yield m, fam, f
