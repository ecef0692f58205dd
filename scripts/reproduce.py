"""Reproduce the Marconi paper's simulator results (Figs. 7-10, 12) with this project's
simulator, and write docs/results.md plus PNG plots in docs/img/.

Sweep: workloads (chat-like and agent-like generators at several session arrival rates, the
shared Mooncake trace) x capacities (per workload, chosen so that eviction matters: see
``sweeps.calibrate``) x policies (vllm+, sglang+, marconi, infinite), on ``paper-7b`` and on
one real architecture preset (``qwen3_next`` by default); plus the sensitivity to the
SSM:attention layer ratio and to the state dimension (hand-built variants of paper-7b).

Every number in the markdown is computed by this run; every table names the command.

Usage: .venv/bin/python scripts/reproduce.py [--quick | --tiny] [--jobs 2]
       [--out docs/results.md] [--img docs/img] [--arch qwen3_next] [--mooncake PATH]
"""
from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_marconi.sim import sweeps  # noqa: E402
from sglang_marconi.sim.runner import LONG_REQUEST  # noqa: E402
from sglang_marconi.sim.sweeps import Task, generator, model_spec, variant_name  # noqa: E402

POLICIES = ("vllm+", "sglang+", "marconi")
PAPER = {  # the paper's Figs. 7-8: marconi / vllm+ token hit rate, gain over sglang+ (P95)
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
                                            row["sglang+"]["token_hit_rate"]) - 1
                row["flops_gain"] = sweeps._ratio(row["marconi"]["flops_saved"],
                                                  row["sglang+"]["flops_saved"]) - 1
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
                                        if r["marconi"]["hit_tokens"] == r["sglang+"]["hit_tokens"]),
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
                "lru_evicted": _mean([r["sglang+"]["states_evicted"] for r in frows]),
                "ttft": {p: (_mean([r[p]["ttft_p50_s"] for r in frows]),
                             _mean([r[p]["ttft_p95_s"] for r in frows])) for p in POLICIES},
                "ttft_inf": (frows[0]["infinite"]["ttft_p50_s"],
                             frows[0]["infinite"]["ttft_p95_s"]),
            }
            red = []
            for r in frows:
                m95 = r["marconi"]["ttft_p95_s"]
                for base in ("vllm+", "sglang+"):
                    b95 = r[base]["ttft_p95_s"]
                    red.append((1 - m95 / b95, b95 - m95, base, r["workload"], r["capacity"],
                                m95 / b95 - 1))
            best = max(red, key=lambda x: x[0])
            fam_out["ttft_best_reduction"] = best
            fam_out["ttft_worst_vs_lru"] = min((x for x in red if x[2] == "sglang+"),
                                               key=lambda x: x[0])
            fam_out["length"] = {p: (_mean([r[p]["short_token_hit_rate"] for r in frows]),
                                     _mean([r[p]["long_token_hit_rate"] for r in frows]))
                                 for p in POLICIES}
            shorts = [_rel(r["marconi"]["short_token_hit_rate"], r["sglang+"]["short_token_hit_rate"])
                      for r in frows]
            longs = [_rel(r["marconi"]["long_token_hit_rate"], r["sglang+"]["long_token_hit_rate"])
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
        mr, v, s = (by[(m, wl, cap, q)] for q in ("marconi", "vllm+", "sglang+"))
        out["sens"].append({"model": m, "workload": wl, "capacity": cap,
                            "vllm+": v["token_hit_rate"], "sglang+": s["token_hit_rate"],
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


# ---- formatting ------------------------------------------------------------------------------
def pct(x, sign=False):
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf"
    return f"{100 * x:+.1f}%" if sign else f"{100 * x:.1f}%"


def times(x):
    if x is None:
        return "-"
    return "inf" if not math.isfinite(x) else f"{x:.2f}x"


def gb(n):
    return "unlimited" if n is None else f"{n / 1e9:.3g} GB"


def ms(s):
    return "-" if s is None else f"{s * 1e3:.0f} ms"


def rate_of(r):
    return pct(r["token_hit_rate"])


def _families(cfg, an):
    """(model, family, its analysis) for every family a model was run on, in report order."""
    for m in cfg.models:
        for fam in FAMILY_ORDER:
            f = an["families"].get((m, fam))
            if f is not None:
                yield m, fam, f


def _table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


# ---- markdown --------------------------------------------------------------------------------
def write_markdown(sweep: dict, an: dict, path: Path, img_rel: str, command: str) -> str:
    cfg = sweep["config"]
    cmd = f"Command: `{command}`"
    L = []
    add = L.append
    add("# Results: reproducing Marconi's simulator figures\n")
    add(f"Generated by `{command}` (mode `{cfg.mode}`, {sweep['jobs']} worker processes, "
        f"{sweep['wall_s'] / 60:.1f} min wall). Every number below was computed by that run; "
        "nothing is copied from elsewhere except the paper's own figures, which are marked as "
        "such. The simulator replays requests one at a time in arrival order (the paper's "
        "setup); the TTFT model is the simulator's (A100 at 50% MFU plus 20 ms, no "
        "queueing). The Mooncake trace is the synthetic trace published with Mooncake "
        "(kvcache-ai/Mooncake, FAST25-release/traces, Apache License 2.0), replayed "
        "unmodified.\n")
    # setup
    add("## Setup\n")
    add("Models:\n")
    for m in cfg.models + [x for x in sens_models(cfg) if x not in cfg.models]:
        add(f"- `{m}`: {sweeps.describe_model(model_spec(m))}")
    add("")
    add("Workloads (generator parameters not listed are the generators' defaults; requests "
        f"shorter than {LONG_REQUEST:,} tokens are 'short'):\n")
    rows = []
    for w in cfg.workloads:
        tr = w.build()
        short, n = an["length_mix"][w.label]
        params = ", ".join(f"{k}={v}" for k, v in w.params) or _display_path(w.name)
        rows.append((w.label, w.family, params, f"{len(tr):,}", f"{tr.input_tokens:,}",
                     f"{short:,} / {n - short:,}"))
    add(cmd + "\n")
    add(_table(("workload", "family", "source / parameters", "requests", "input tokens",
                "short / long requests"), rows))
    add("")
    add("Capacities are chosen per (model, workload) so that eviction matters: the smallest "
        "useful cache holds the longest request (its KV and two states); call f0 the share of "
        "the `infinite` policy's hit tokens that the LRU baseline (`sglang+`) keeps there. "
        "Target t is the capacity at which `sglang+` keeps f0 + t(1 - f0) of them (t of the way "
        "from the smallest useful cache to an unlimited one), found by probing capacities and "
        "interpolating. The capacity is also shown as a fraction of the `infinite` policy's "
        "peak bytes.\n")
    rows = []
    for (m, wl), c in sweep["calibration"].items():
        rows.append((m, wl, gb(c["infinite"]["peak_bytes"]), pct(c["infinite"]["token_hit_rate"]),
                     f"{gb(c['floor_capacity'])} ({pct(c['floor_fraction'])})",
                     ", ".join(f"{t:g}: {gb(cap)}" for t, cap in zip(c["targets"], c["capacities"]))))
    add(cmd + "\n")
    add(_table(("model", "workload", "infinite peak", "infinite token hit rate",
                "smallest useful cache (f0)", "target: capacity"), rows))
    add("")
    # per-configuration results
    add("## Every configuration\n")
    add("Token hit rate per policy; `x inf` = share of the `infinite` policy's hit tokens; "
        "ratio = marconi / vllm+ token hit rate; gain = marconi / sglang+ token hit rate - 1 "
        "(FLOPs: the same on prefill FLOPs saved); alpha = marconi's alpha at the end "
        "(bootstrap-tuned; `(untuned)` when the bootstrap window never completed).\n")
    for m in cfg.models:
        add(f"### {m}\n")
        add(cmd + "\n")
        rows = []
        for r in an["rows"][m]:
            mar = r["marconi"]
            rows.append((r["workload"], f"{gb(r['capacity'])} ({pct(r['peak_fraction'])})",
                         f"{r['target']:g}",
                         f"{rate_of(r['vllm+'])} ({pct(r['vllm+_of_inf'])})",
                         f"{rate_of(r['sglang+'])} ({pct(r['sglang+_of_inf'])})",
                         f"{rate_of(mar)} ({pct(r['marconi_of_inf'])})",
                         rate_of(r["infinite"]),
                         f"{mar['alpha']:g}" + ("" if mar.get("alpha_tuned") else " (untuned)"),
                         times(r["ratio"]), pct(r["gain"], True), pct(r["flops_gain"], True)))
        add(_table(("workload", "capacity (of inf peak)", "target", "vllm+ (x inf)",
                    "sglang+ (x inf)", "marconi (x inf)", "infinite", "alpha", "ratio",
                    "gain", "FLOPs gain"), rows))
        add("")
    # Figs 7-8
    add("## Figs. 7-8: token hit rate vs vllm+ and sglang+\n")
    add("As in the paper: the ratio marconi / vllm+ is averaged over every capacity and arrival "
        "rate of a workload family (configurations where vllm+ hits nothing give an infinite "
        "ratio: they are counted, not averaged); the gain over sglang+ is the 95th percentile "
        "over the same configurations (numpy's linear interpolation). The paper's figures "
        "are quoted beside ours (paper: LMSys / ShareGPT chat, SWE-bench agent traces; the "
        "Mooncake trace is not in the paper).\n")
    add(f"![ratio and gain]({img_rel}/fig7_8_ratio_gain.png)\n")
    add(cmd + "\n")
    rows = []
    for m, fam, f in _families(cfg, an):
        paper = "; ".join(f"{name}: {PAPER[name][0]}x / {pct(PAPER[name][1], True)}"
                          for name in PAPER_FOR_FAMILY[fam]) or "-"
        rows.append((m, fam, f["n"], times(f["ratio_mean"]),
                     f"{times(f['ratio_min'])} .. {times(f['ratio_max'])}", f["ratio_inf"],
                     pct(f["gain_p95"], True), pct(f["gain_mean"], True),
                     pct(f["flops_gain_p95"], True), paper))
    add(_table(("model", "family", "configs", "ratio vs vllm+ (mean)", "ratio range",
                "configs with vllm+ = 0", "gain vs sglang+ (P95)", "gain (mean)",
                "FLOPs gain (P95)", "paper (ratio / gain)"), rows))
    add("")
    # why
    add("### Why ours differ: measurements\n")
    add(cmd + "\n")
    rows = []
    for m, fam, f in _families(cfg, an):
        alphas = ", ".join(f"{a}: {n}" for a, n in f["alphas"].items())
        rows.append((m, fam, f"{f['tuned']}/{f['n']}", alphas,
                     f"{f['identical_to_lru']}/{f['n']}",
                     pct(f["of_inf"]["vllm+"]), pct(f["of_inf"]["sglang+"]),
                     pct(f["of_inf"]["marconi"]),
                     f"{f['vllm_admitted']:,.0f} / {f['vllm_evicted']:,.0f}",
                     f"{f['vllm_zero']}/{f['n']}", pct(f["vllm_rejected"]),
                     pct(f["vllm_state_share"]),
                     f"{f['marconi_admitted']:,.0f}"))
    add(_table(("model", "family", "alpha tuned", "final alpha: configs",
                "marconi hits = sglang+ hits", "vllm+ x inf", "sglang+ x inf", "marconi x inf",
                "vllm+ states admitted / evicted (mean)", "vllm+ admitted nothing",
                "vllm+ requests not admitted", "vllm+ cache bytes in states",
                "marconi states admitted (mean)"), rows))
    add("")
    add(explain(sweep, an))
    add("How much FLOP-aware eviction can tell nodes apart: FLOPs a hit saves per byte held, "
        "for a cached sequence of L tokens with its one state (the cost model's numbers, "
        f"relative to L = {EFF_REF:,}). Where most cached nodes are long enough that this "
        "is nearly flat, weighting by it (alpha > 0) reorders little against LRU; the states "
        "dominate the bytes only of short nodes.\n")
    add(cmd + "\n")
    add(_table(("model", *[f"L = {n:,}" for n in EFF_LENGTHS]),
               [(m, *[f"{v:.3f}" for _, v in rows]) for m, rows in an["efficiency"].items()]))
    add("")
    # Fig 9
    add("## Fig. 9: estimated TTFT\n")
    add("P50 / P95 of the TTFT model per policy, averaged over a family's configurations; the "
        "best P95 reduction of marconi against either baseline in any configuration (the "
        "paper: up to 71.1% / 617 ms lower P95 TTFT than the baselines).\n")
    add(f"![TTFT]({img_rel}/fig9_ttft.png)\n")
    add(cmd + "\n")
    rows = []
    for m, fam, f in _families(cfg, an):
        cells = [f"{ms(f['ttft'][p][0])} / {ms(f['ttft'][p][1])}" for p in POLICIES]
        b = f["ttft_best_reduction"]
        w = f["ttft_worst_vs_lru"]
        rows.append((m, fam, *cells, f"{ms(f['ttft_inf'][0])} / {ms(f['ttft_inf'][1])}",
                     f"{pct(b[0])} ({ms(b[1])}) vs {b[2]} on {b[3]} at {gb(b[4])}",
                     f"{pct(w[5], True)} ({w[3]} at {gb(w[4])})"))
    add(_table(("model", "family", "vllm+ P50 / P95", "sglang+ P50 / P95", "marconi P50 / P95",
                "infinite P50 / P95", "best marconi P95 reduction",
                "worst marconi P95 change vs sglang+"), rows))
    add("")
    # Fig 10
    add(f"## Fig. 10: hit rate by request length (short < {LONG_REQUEST:,} tokens)\n")
    add("Token hit rate of short and long requests per policy (mean over a family's "
        "configurations), and marconi's relative change against sglang+: the worst for short "
        "requests and the best for long ones over the configurations (the paper: short "
        "requests lose up to 3%, long ones gain up to 25.5%). '-' where a workload has no "
        "request in the bucket.\n")
    add(f"![length buckets]({img_rel}/fig10_length.png)\n")
    add(cmd + "\n")
    rows = []
    for m, fam, f in _families(cfg, an):
        cells = [f"{pct(f['length'][p][0])} / {pct(f['length'][p][1])}" for p in POLICIES]
        rows.append((m, fam, *cells, pct(f["short_worst"], True), pct(f["long_best"], True)))
    add(_table(("model", "family", "vllm+ short / long", "sglang+ short / long",
                "marconi short / long", "short: worst marconi vs sglang+",
                "long: best marconi vs sglang+"), rows))
    add("")
    # Fig 12
    if an["sens"]:
        add("## Fig. 12: sensitivity to the SSM:attention ratio and the state dimension\n")
        add("Hand-built variants of paper-7b (same 28 blocks, the paper's formulas; "
            "`sweeps.paper_variant`): SSM layers per attention layer 1:2, 1:4, 1:8 (9, 6, 3 "
            "attention mixers; paper-7b itself is 4:24 = 1:6) and state dimension N. Each "
            "variant is replayed at paper-7b's calibrated capacities for the workload (same "
            "cache size in bytes, as in the paper: a bigger state or more SSM layers weigh "
            "more per checkpoint). The paper: the gains grow with the ratio (1:2 to 1:8) and "
            "with N.\n")
        add(f"![sensitivity]({img_rel}/fig12_sensitivity.png)\n")
        add(cmd + "\n")
        rows = []
        for m, s in an["sens_summary"].items():
            rows.append((m, sweeps.describe_model(model_spec(m)), s["n"], times(s["ratio_mean"]),
                         s["ratio_inf"], pct(s["gain_mean"], True), pct(s["flops_gain_mean"], True)))
        add(_table(("model", "layers and sizes", "configs", "ratio vs vllm+ (mean)",
                    "configs with vllm+ = 0", "gain vs sglang+ (mean)",
                    "FLOPs gain vs sglang+ (mean)"), rows))
        add("")
        add(cmd + "\n")
        rows = [(x["model"], x["workload"], gb(x["capacity"]), pct(x["vllm+"]), pct(x["sglang+"]),
                 pct(x["marconi"]), f"{x['alpha']:g}", f"{x['vllm_admitted']:,}",
                 times(x["ratio"]), pct(x["gain"], True), pct(x["flops_gain"], True))
                for x in an["sens"]]
        add(_table(("model", "workload", "capacity", "vllm+", "sglang+", "marconi", "alpha",
                    "vllm+ states admitted", "ratio", "gain", "FLOPs gain"), rows))
        add("")
    add("## Plots\n")
    for m in cfg.models:
        add(f"![capacity sweep {m}]({img_rel}/capacity_{_slug(m)}.png)\n")
    text = "\n".join(L)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return text


def explain(sweep: dict, an: dict) -> str:
    """Measured statements about where and why ours differ from the paper."""
    cfg = sweep["config"]
    out = []
    for m, fam, f in _families(cfg, an):
        bits = []
        paper = PAPER_FOR_FAMILY[fam]
        if paper:
            quoted = " and ".join(f"{n} {PAPER[n][0]}x / {pct(PAPER[n][1], True)}"
                                  for n in paper)
            bits.append(f"ours: ratio {times(f['ratio_mean'])} over the configurations "
                        f"where vllm+ hits anything, gain {pct(f['gain_p95'], True)} "
                        f"(P95); the paper: {quoted}")
        a0 = f["alphas"].get("0", 0)
        bits.append(f"marconi ended with alpha = 0 (plain LRU eviction) in {a0} of {f['n']} "
                    f"configurations, and its hit tokens equal sglang+'s in "
                    f"{f['identical_to_lru']} of {f['n']}")
        bits.append(f"sglang+ already keeps {pct(f['of_inf']['sglang+'])} of the "
                    f"`infinite` policy's hit tokens on average (marconi "
                    f"{pct(f['of_inf']['marconi'])}), so the room for a better eviction "
                    f"order is at most {pct(1 - f['of_inf']['sglang+'])} of the ceiling")
        bits.append(f"vllm+ admits {f['vllm_admitted']:,.0f} states and evicts "
                    f"{f['vllm_evicted']:,.0f} per configuration on average (marconi admits "
                    f"{f['marconi_admitted']:,.0f}); states hold "
                    f"{pct(f['vllm_state_share'])} of its cache bytes at the end")
        bits.append(f"vllm+ keeps {pct(f['of_inf']['vllm+'])} of the ceiling's hit tokens, "
                    f"against {pct(f['f0'])} that LRU keeps in the smallest useful cache "
                    "(f0 above: the reuse any cache holding the longest request gets, e.g. "
                    "a shared system prompt)")
        if f["vllm_zero"]:
            bits.append(f"in {f['vllm_zero']} configurations vllm+ admitted nothing at all: "
                        "the block-32 states of every request together exceed the capacity, "
                        "and the simulator's vllm+ admits a request's states all or nothing "
                        "(no truncation), so its ratio is infinite there")
        out.append(f"- **{m}, {fam}**: " + "; ".join(bits) + ".")
    return "\n".join(out) + "\n"


def _display_path(path: str) -> str:
    import os

    try:
        rel = os.path.relpath(Path(path).resolve(), ROOT.resolve())
    except ValueError:
        return path
    return path if rel.startswith("../..") else rel


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


# ---- plots -----------------------------------------------------------------------------------
def write_plots(sweep: dict, an: dict, img: Path) -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401
    import numpy as np

    cfg = sweep["config"]
    img.mkdir(parents=True, exist_ok=True)
    written = []
    colors = {"vllm+": "tab:gray", "sglang+": "tab:blue", "marconi": "tab:red",
              "infinite": "tab:green"}

    # Figs 7-8
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    labels, ratios, gains, kinds = [], [], [], []
    for m, fam, f in _families(cfg, an):
        labels.append(f"{fam} / {m}")
        ratios.append(f["ratio_mean"] if f["ratio_mean"] is not None else float("nan"))
        gains.append(100 * (f["gain_p95"] or 0.0))
        kinds.append("ours")
    for name, (r, g) in PAPER.items():
        labels.append(f"{name} (paper)")
        ratios.append(r)
        gains.append(100 * g)
        kinds.append("paper")
    col = ["tab:red" if k == "ours" else "tab:olive" for k in kinds]
    x = np.arange(len(labels))
    axes[0].bar(x, ratios, color=col)
    axes[0].set_yscale("log")
    axes[0].set_ylim(bottom=1.0)
    axes[0].yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    axes[0].set_ylabel("token hit rate marconi / vllm+ (mean)")
    axes[1].bar(x, gains, color=col)
    axes[1].set_ylabel("gain over sglang+ (P95, %)")
    axes[1].axhline(0, color="black", lw=0.8)
    for ax, vals, fmt in ((axes[0], ratios, "{:.1f}x"), (axes[1], gains, "{:+.1f}%")):
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7, rotation=35, ha="right")
        for xi, v in zip(x, vals):
            if math.isnan(v):
                ax.annotate("vllm+ = 0", (xi, 1.0), ha="center", va="bottom", fontsize=7)
            else:
                ax.annotate(fmt.format(v), (xi, v), ha="center", va="bottom", fontsize=7)
    fig.suptitle("Figs. 7-8: ours (red) vs the paper's (olive)")
    fig.tight_layout()
    written.append(_save(fig, img / "fig7_8_ratio_gain.png", plt))

    fam_cols = [fam for fam in FAMILY_ORDER if any((m, fam) in an["families"] for m in cfg.models)]

    def family_grid():
        fig, axes = plt.subplots(len(cfg.models), len(fam_cols),
                                 figsize=(3.6 * len(fam_cols), 3.3 * len(cfg.models)),
                                 squeeze=False)
        pairs = []
        for i, m in enumerate(cfg.models):
            for j, fam in enumerate(fam_cols):
                if (m, fam) in an["families"]:
                    pairs.append((axes[i][j], (m, fam)))
                else:
                    axes[i][j].axis("off")
        return fig, axes, pairs

    # Fig 9
    fig, axes, pairs = family_grid()
    for ax, (m, fam) in pairs:
        f = an["families"][(m, fam)]
        pols = list(POLICIES) + ["infinite"]
        p50 = [f["ttft"][p][0] * 1e3 for p in POLICIES] + [f["ttft_inf"][0] * 1e3]
        p95 = [f["ttft"][p][1] * 1e3 for p in POLICIES] + [f["ttft_inf"][1] * 1e3]
        xs = np.arange(len(pols))
        ax.bar(xs - 0.2, p50, 0.4, label="P50", color=[colors[p] for p in pols], alpha=0.5)
        ax.bar(xs + 0.2, p95, 0.4, label="P95", color=[colors[p] for p in pols])
        ax.set_xticks(xs)
        ax.set_xticklabels(pols, rotation=30, fontsize=8)
        ax.set_title(f"{fam} / {m}", fontsize=9)
        ax.set_ylabel("TTFT (ms): P50 light, P95 dark", fontsize=8)
    fig.suptitle("Fig. 9: estimated TTFT (mean over configurations)")
    fig.tight_layout()
    written.append(_save(fig, img / "fig9_ttft.png", plt))

    # Fig 10
    fig, axes, pairs = family_grid()
    for ax, (m, fam) in pairs:
        f = an["families"][(m, fam)]
        xs = np.arange(2)
        for i, p in enumerate(POLICIES):
            vals = [100 * (v or 0.0) for v in f["length"][p]]
            ax.bar(xs + (i - 1) * 0.27, vals, 0.27, color=colors[p], label=p)
        ax.set_xticks(xs)
        ax.set_xticklabels([f"short\n< {LONG_REQUEST // 1000}K", "long"])
        ax.set_title(f"{fam} / {m}", fontsize=9)
        ax.set_ylabel("token hit rate (%)", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Fig. 10: token hit rate by request length (mean over configurations)")
    fig.tight_layout()
    written.append(_save(fig, img / "fig10_length.png", plt))

    # Fig 12
    if an["sens"]:
        fig, axes = plt.subplots(2, 2, figsize=(11, 7))
        wls = list(dict.fromkeys(x["workload"] for x in an["sens"]))

        def series(models, xvals, row):
            for wl in wls:
                for cap in sorted({x["capacity"] for x in an["sens"] if x["workload"] == wl}):
                    pts = []
                    for mm, xv in zip(models, xvals):
                        hit = [x for x in an["sens"] if x["model"] == mm and x["workload"] == wl
                               and x["capacity"] == cap]
                        if hit:
                            pts.append((xv, hit[0]))
                    if not pts:
                        continue
                    lab = f"{wl} @ {gb(cap)}"
                    rv = [p[1]["ratio"] if math.isfinite(p[1]["ratio"]) else np.nan for p in pts]
                    axes[row][0].plot([p[0] for p in pts], rv, marker="o", label=lab)
                    axes[row][1].plot([p[0] for p in pts], [100 * p[1]["gain"] for p in pts],
                                      marker="o", label=lab)

        ratios_ = sorted(set(cfg.sens_ratios) | {6})
        series([variant_name(r) if r != 6 else "paper-7b" for r in ratios_], ratios_, 0)
        dims = sorted(set(cfg.sens_state_dims) | {128})
        series([variant_name(None, n) if n != 128 else "paper-7b" for n in dims], dims, 1)
        for row, xl in ((0, "SSM layers per attention layer (paper-7b: 6)"),
                        (1, "state dimension N (paper-7b: 128)")):
            axes[row][0].set_ylabel("marconi / vllm+ token hit rate")
            axes[row][0].set_yscale("log")
            axes[row][1].set_ylabel("marconi vs sglang+ token hit rate (%)")
            for ax in axes[row]:
                ax.set_xlabel(xl)
                if row == 1:
                    ax.set_xscale("log", base=2)
        axes[0][0].legend(fontsize=7)
        fig.suptitle("Fig. 12: sensitivity (missing points: vllm+ hit nothing)")
        fig.tight_layout()
        written.append(_save(fig, img / "fig12_sensitivity.png", plt))

    # capacity sweeps
    for m in cfg.models:
        wls = [w for w in cfg.workloads]
        cols = min(4, len(wls))
        nrows = math.ceil(len(wls) / cols)
        fig, axes = plt.subplots(nrows, cols, figsize=(3.6 * cols, 3.2 * nrows), squeeze=False)
        for ax, w in zip(axes.flat, wls):
            rows = [r for r in an["rows"][m] if r["workload"] == w.label]
            caps = [r["capacity"] / 1e9 for r in rows]
            for p in POLICIES:
                ax.plot(caps, [100 * r[p]["token_hit_rate"] for r in rows], marker="o",
                        color=colors[p], label=p)
            ax.axhline(100 * rows[0]["infinite"]["token_hit_rate"], color=colors["infinite"],
                       ls="--", label="infinite")
            ax.set_xscale("log")
            ax.minorticks_off()
            ax.set_xticks(caps)
            ax.set_xticklabels([f"{c:.3g}" for c in caps], fontsize=7)
            ax.set_title(w.label, fontsize=9)
            ax.set_xlabel("capacity (GB)", fontsize=8)
            ax.set_ylabel("token hit rate (%)", fontsize=8)
        for ax in list(axes.flat)[len(wls):]:
            ax.axis("off")
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"Token hit rate vs capacity, {m}")
        fig.tight_layout()
        written.append(_save(fig, img / f"capacity_{_slug(m)}.png", plt))
    return written


def _save(fig, path, plt):
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- main ------------------------------------------------------------------------------------
def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="a smaller sweep (< 10 min on 2 cores)")
    mode.add_argument("--tiny", action="store_true", help="a seconds-long sweep (tests)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results.md"))
    ap.add_argument("--img", default=None, help="PNG folder (default: img/ beside --out)")
    ap.add_argument("--arch", default="qwen3_next", help="the real architecture preset")
    ap.add_argument("--mooncake", default=None, help="the Mooncake trace (default: shared)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    mode_name = "tiny" if args.tiny else "quick" if args.quick else "full"
    cfg = make_config(mode_name, args.arch, args.mooncake)
    out = Path(args.out)
    img = Path(args.img) if args.img else out.parent / "img"
    command = " ".join(["python", "scripts/reproduce.py", *map(shlex.quote, argv)])
    sweep = run_sweep(cfg, args.jobs, not args.no_progress)
    an = analyze(sweep)
    try:
        img_rel = str(Path(_relpath(img, out.parent)))
    except ValueError:
        img_rel = str(img)
    write_plots(sweep, an, img)
    write_markdown(sweep, an, out, img_rel, command)
    print(f"wrote {out} and plots in {img} ({sweep['wall_s']:.0f} s, "
          f"{len(sweep['records'])} replays)")
    for (m, fam), f in an["families"].items():
        print(f"  {m:>12} {fam:>9}: ratio vs vllm+ {times(f['ratio_mean'])} "
              f"({f['ratio_inf']} inf), gain vs sglang+ P95 {pct(f['gain_p95'], True)}")
    return 0


def _relpath(target: Path, start: Path) -> str:
    import os

    return os.path.relpath(target.resolve(), start.resolve())


if __name__ == "__main__":
    sys.exit(main())
