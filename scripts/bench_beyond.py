"""Beyond the paper (issue 7): marconi+ and online alpha against LRU, Marconi and the
references, on the shared Mooncake trace and the generators. Writes docs/beyond.md (and
docs/img/beyond_mooncake.png) and prints PASS/MISS for the two targets:

- Mooncake, paper-7b, 100 GB: marconi+ saves >= 1.5x the prefill FLOPs of LRU (sglang+);
- generators (chat, agent, shared-prompt, fork-join, 3 capacities each): marconi+ never
  more than 2% below LRU in FLOPs saved.

Also: marconi+ ablations on Mooncake 100 GB; per-phase FLOPs saved of bootstrap, online and
fixed alphas on the ``drift`` and ``alpha-shift`` workloads (alpha-shift at 2 GB, the
capacity ``tests/test_beyond.py`` uses: how clearly the best fixed alpha differs between its
phases, and when online alpha moves); the online shadows' CPU cost.
A benchmark, not a test: exits 0 either way (1 with ``--strict`` on a MISS).

Usage: .venv/bin/python scripts/bench_beyond.py [--jobs 2] [--out docs/beyond.md]
       [--quick] [--mooncake PATH]
"""
from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_marconi.policy.online import DEFAULT_ALPHAS  # noqa: E402
from sglang_marconi.sim import sweeps  # noqa: E402
from sglang_marconi.sim.sweeps import Task, generator, model_spec, run_config  # noqa: E402

MODEL = "paper-7b"
MOONCAKE_CAPS = (50e9, 100e9, 200e9)
MAIN_POLICIES = ("marconi+", "sglang+", "marconi", "infinite", "offline")
ABLATIONS = ("marconi+", "marconi+:ghost=0", "marconi+:end_threshold=0", "marconi+:chain=1",
             "marconi+:bonus=0", "marconi+:half_life=500")
GENERATORS = ("chat", "agent", "shared-prompt", "fork-join")
GEN_TARGETS = (0.25, 0.5, 0.75)
FIXED_ALPHAS = (0.0, 0.5, 1.0, 2.0, 4.0)
ALPHA_SHIFT_CAP = 2e9   # as tests/test_beyond.py::test_online_alpha_on_a_drifting_trace
ONLINE_BOUND = 200 + 50  # OnlineAlpha's default window + period
CLEAR = 1.10  # a phase's "clearly better" alphas: >= 10% more FLOPs saved (as the test)
# online alpha with its default shadows, and with shadows for every fixed alpha shown (as the
# test): (key, policy, the alphas it can choose)
ONLINE_VARIANTS = (("online", "marconi:alpha=online", DEFAULT_ALPHAS),
                   ("online5", "marconi:alpha=online:alphas="
                    + "/".join(f"{a:g}" for a in FIXED_ALPHAS), FIXED_ALPHAS))
TARGET_RATIO = 1.5
TARGET_FLOOR = 0.98


def pct(x, sign=False):
    if x is None:
        return "-"
    return f"{100 * x:+.1f}%" if sign else f"{100 * x:.1f}%"


def pp(x):
    return f"{100 * x:+.1f} pp"


def times(x):
    return "-" if x is None else ("inf" if not math.isfinite(x) else f"{x:.2f}x")


def gb(n):
    return "unlimited" if n is None else f"{n / 1e9:.3g} GB"


def pflop(f):
    return f"{f / 1e15:,.1f}"


def _table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def _ratio(a, b):
    return a / b if b else (math.inf if a > 0 else 1.0)


def run(jobs: int, mooncake_path=None, quick: bool = False, progress: bool = True) -> dict:
    t0 = time.perf_counter()
    moon = sweeps.mooncake(mooncake_path)
    gens = [generator(g) for g in GENERATORS]
    drift, shift = generator("drift"), generator("alpha-shift")
    cal_items = [("calibrate", (MODEL, w, GEN_TARGETS)) for w in gens + [drift]]
    cal = {p[1].label: res for _, p, res, _ in sweeps.run_tasks(cal_items, jobs, progress,
                                                                 "calibrating capacities")}
    tasks: dict = {}

    def add(task):
        tasks.setdefault(task.key, task)
        return task.key

    moon_keys = {(cap, p): add(Task(MODEL, moon, None if p == "infinite" else int(cap), p))
                 for cap in MOONCAKE_CAPS for p in MAIN_POLICIES}
    abl_keys = {p: add(Task(MODEL, moon, int(100e9), p)) for p in ABLATIONS + ("sglang+",)}
    gen_keys = {}
    for w in gens:
        for t, cap in zip(GEN_TARGETS, cal[w.label]["capacities"]):
            for p in ("sglang+", "marconi", "marconi+"):
                gen_keys[(w.label, t, p)] = add(Task(MODEL, w, cap, p))
    chain_keys = {p: add(Task(MODEL, gens[0], int(4e9), p))
                  for p in ("sglang+", "marconi+", "marconi+:chain=1")}
    drift_cap = cal[drift.label]["capacities"][1]
    online_pols = (["marconi"] + [p for _, p, _ in ONLINE_VARIANTS]
                   + [f"marconi:alpha={a:g}" for a in FIXED_ALPHAS])
    phase_keys = {}
    for w, cap in ((drift, drift_cap), (shift, int(ALPHA_SHIFT_CAP))):
        for p in online_pols:
            phase_keys[(w.label, p)] = add(Task(MODEL, w, cap, p, phases=True))
    out = sweeps.run_tasks([("run", t) for t in tasks.values()], jobs, progress,
                           "replaying configurations")
    res = {task.key: r for _, task, r, _ in out}
    # CPU cost of the online shadows: one process, best of ``repeats`` runs
    timing = {}
    repeats = 1 if quick else 3
    for w, cap in ((drift, drift_cap), (shift, int(ALPHA_SHIFT_CAP))):
        for p in ("marconi:alpha=0", "marconi:alpha=online",
                  "marconi:alpha=online:sample=0.25"):
            walls = [run_config(Task(MODEL, w, cap, p))["wall_s"] for _ in range(repeats)]
            timing[(w.label, p)] = min(walls)
    return {"cal": cal, "res": res, "moon_keys": moon_keys, "abl_keys": abl_keys,
            "gen_keys": gen_keys, "chain_keys": chain_keys, "phase_keys": phase_keys,
            "timing": timing, "repeats": repeats, "drift_cap": drift_cap,
            "workloads": {"mooncake": moon, "gens": gens, "drift": drift, "shift": shift},
            "online_pols": online_pols, "wall_s": time.perf_counter() - t0, "jobs": jobs}


def _clearly_better(fixed: dict, choices) -> set | None:
    """The alphas among ``choices`` that are clearly better in a phase, as the test has it:
    {0} where alpha 0 saves >= CLEAR x every fixed alpha > 0 (LRU's phase); the alphas > 0
    saving >= CLEAR x alpha 0 where there are such (FLOP-aware eviction's phase); None
    where neither holds (no clear best)."""
    pos = [a for a in FIXED_ALPHAS if a]
    if all(fixed[0.0] >= CLEAR * fixed[a] for a in pos) and fixed[0.0] > 0:
        return {0.0}
    if any(fixed[a] >= CLEAR * fixed[0.0] for a in pos) and fixed[0.0] > 0:
        return {a for a in choices if a and fixed[a] >= CLEAR * fixed[0.0]}
    return None


def analyze(b: dict) -> dict:
    res = b["res"]
    an = {"mooncake": [], "gens": [], "ablation": [], "chain": [], "phases": {}, "cpu": []}
    for cap in MOONCAKE_CAPS:
        off = res[b["moon_keys"][(cap, "offline")]]
        lru = res[b["moon_keys"][(cap, "sglang+")]]
        for p in MAIN_POLICIES:
            r = res[b["moon_keys"][(cap, p)]]
            an["mooncake"].append({
                "capacity": cap, "policy": p, "flops_saved": r["flops_saved"],
                "flops_fraction": r["flops_saved_fraction"], "token_hit_rate": r["token_hit_rate"],
                "of_offline_flops": _ratio(r["flops_saved"], off["flops_saved"]),
                "of_offline_tokens": _ratio(r["hit_tokens"], off["hit_tokens"]),
                "vs_lru": _ratio(r["flops_saved"], lru["flops_saved"]),
                "states_admitted": r["states_admitted"], "wall_s": r["wall_s"],
                "ghost_max": r.get("ghost_tokens_max"), "ghost_held": r.get("ghost_tokens_held"),
                "end_skipped": None})
    at100 = [x for x in an["mooncake"] if x["capacity"] == 100e9 and x["policy"] == "marconi+"][0]
    an["target_ratio"] = at100["vs_lru"]
    an["target_pass"] = at100["vs_lru"] >= TARGET_RATIO
    for (wl, t, p), key in b["gen_keys"].items():
        if p != "marconi+":
            continue
        r, lru = res[key], res[b["gen_keys"][(wl, t, "sglang+")]]
        mar = res[b["gen_keys"][(wl, t, "marconi")]]
        ratio = _ratio(r["flops_saved"], lru["flops_saved"])
        an["gens"].append({"workload": wl, "target": t, "capacity": r["capacity"],
                           "lru": lru["flops_saved_fraction"], "marconi": mar["flops_saved_fraction"],
                           "plus": r["flops_saved_fraction"], "ratio": ratio,
                           "token_ratio": _ratio(r["hit_tokens"], lru["hit_tokens"]),
                           "marconi_ratio": _ratio(mar["flops_saved"], lru["flops_saved"]),
                           "pass": ratio >= TARGET_FLOOR})
    an["gens_pass"] = all(x["pass"] for x in an["gens"])
    full = res[b["abl_keys"]["marconi+"]]
    lru = res[b["abl_keys"]["sglang+"]]
    for p in ("sglang+",) + ABLATIONS:
        r = res[b["abl_keys"][p]]
        an["ablation"].append({"policy": p, "flops_fraction": r["flops_saved_fraction"],
                               "token_hit_rate": r["token_hit_rate"],
                               "vs_lru": _ratio(r["flops_saved"], lru["flops_saved"]),
                               "vs_full": _ratio(r["flops_saved"], full["flops_saved"]),
                               "states_admitted": r["states_admitted"]})
    clru = res[b["chain_keys"]["sglang+"]]
    for p, key in b["chain_keys"].items():
        r = res[key]
        an["chain"].append({"policy": p, "flops_fraction": r["flops_saved_fraction"],
                            "vs_lru": _ratio(r["flops_saved"], clru["flops_saved"])})
    for w in (b["workloads"]["drift"], b["workloads"]["shift"]):
        rows = {p: res[b["phase_keys"][(w.label, p)]] for p in b["online_pols"]}
        phases = list(rows["marconi"]["phases"])
        table = []
        for ph in phases + ["all"]:
            def frac(p, ph=ph):
                r = rows[p]
                if ph == "all":
                    return r["flops_saved_fraction"]
                x = r["phases"][ph]
                return x["flops_saved"] / x["prefill_flops"] if x["prefill_flops"] else 0.0
            fixed = {a: frac(f"marconi:alpha={a:g}") for a in FIXED_ALPHAS}
            best_a = max(FIXED_ALPHAS, key=lambda a: (fixed[a], -a))
            best_pos = max(fixed[a] for a in FIXED_ALPHAS if a)
            table.append({"phase": ph, "requests": (rows["marconi"]["requests"] if ph == "all"
                                                    else rows["marconi"]["phases"][ph]["requests"]),
                          "auto": frac("marconi"),
                          **{key: frac(p) for key, p, _ in ONLINE_VARIANTS},
                          "fixed": fixed, "best_alpha": best_a, "best": fixed[best_a],
                          "lru_vs_best_pos": _ratio(fixed[0.0], best_pos)})
        starts, at = [], 0
        for ph in phases:
            starts.append((ph, at))
            at += rows["marconi"]["phases"][ph]["requests"]
        switches, moves = {}, {}
        for key, p, choices in ONLINE_VARIANTS:
            sw = switches[key] = rows[p].get("alpha_switches", [])
            moves[key] = []  # per phase: when its alpha enters the phase's clearly better set
            for (ph, start), row in zip(starts, table):
                end = next((s for _, s in starts if s > start), at)
                target = _clearly_better(row["fixed"], choices)
                if target is None:
                    moves[key].append({"phase": ph, "target": None})
                    continue
                held = [a for i, a in sw if i <= start][-1]
                inside = [i for i, a in sw if start < i < end]
                entered = (start if held in target else
                           next((i for i, a in sw if start < i < end and a in target), None))
                stays = entered is not None and all(
                    a in target for i, a in sw if entered < i < end)
                moves[key].append({"phase": ph, "start": start, "target": sorted(target),
                                   "entered": entered, "stays": stays, "switches": len(inside),
                                   "after": None if entered is None else entered - start})
        an["phases"][w.label] = {
            "rows": table, "auto_alpha": rows["marconi"]["alpha"],
            "auto_tuned": rows["marconi"].get("alpha_tuned"),
            "switches": switches, "moves": moves,
            "capacity": rows["marconi"]["capacity"]}
        t0 = b["timing"][(w.label, "marconi:alpha=0")]
        t1 = b["timing"][(w.label, "marconi:alpha=online")]
        t2 = b["timing"][(w.label, "marconi:alpha=online:sample=0.25")]
        an["cpu"].append({"workload": w.label, "alpha0": t0, "online": t1, "sampled": t2,
                          "online_ratio": t1 / t0, "sampled_ratio": t2 / t0,
                          "shadow_cost": (t1 - t0) / t0, "sampled_shadow_cost": (t2 - t0) / t0})
    return an


def write_markdown(b: dict, an: dict, path: Path, img_rel: str, command: str) -> str:
    cmd = f"Command: `{command}`"
    spec = model_spec(MODEL)
    L = []
    add = L.append
    add("# Beyond the paper: marconi+ and online alpha\n")
    add(f"Generated by `{command}` ({b['jobs']} worker processes, {b['wall_s'] / 60:.1f} min "
        "wall). Every number below was computed by that run. Model `paper-7b` throughout "
        f"({sweeps.describe_model(spec)}); FLOPs saved are prefill FLOPs of the cost model. "
        "The Mooncake trace is the synthetic trace published with Mooncake "
        "(kvcache-ai/Mooncake, FAST25-release/traces, Apache License 2.0), replayed "
        "unmodified.\n")
    add("## What marconi+ does, and what it costs\n")
    add("`marconi+` keeps Marconi's admission (a state at the branch point found by "
        "speculative insertion, one at the end of the request) and changes three things:\n")
    add("1. **Eviction by expected FLOPs saved per byte** (`policy.likelihood.ReuseWeight`, "
        "`policy.scoring` mode `gdsf`). A node's FLOP efficiency (FLOPs a hit on it saves over "
        "its nearest checkpointed ancestor, per byte its eviction frees) is multiplied by a "
        "reuse weight: 1 + its hit count (decayed with `half_life` requests; default: no "
        "decay) + `bonus` (2) if it ever was a branch point; a *chain* state (one child, never "
        "a branch point: a turn the next turn already extended) weighs `chain` (0). Victims "
        "are ordered by Greedy-Dual-Size-Frequency aging (key = inflation clock at the last "
        "touch + weighted efficiency) instead of min-max normalised recency, so no alpha is "
        "tuned and no rescan is needed.\n")
    add("2. **A ghost index** (`policy.ghost.GhostIndex`): token ids (no KV, no states) of the "
        "last `ghost` x capacity-in-KV-tokens tokens of sequences, LRU. Speculative insertion "
        "also looks there, so a branch point is found even after LRU evicted the earlier "
        "request that shares the prefix (on Mooncake, the previous request sharing a prefix "
        "is typically hundreds of requests back). It costs host memory, not cache bytes: 8 "
        "bytes per token id kept (the measured figures are in the first table).\n")
    add("3. **Learned end-of-request admission** (`policy.likelihood.EndStateUsefulness`): "
        "the end-of-request state (and the KV of the request's unique tail) is admitted only "
        "while the measured rate at which such positions are reached again (measured on the "
        "ghost index, Beta(1,1)-smoothed) is at least `end_threshold` (0.05). On Mooncake "
        "outputs are never part of a later input, the rate falls to ~0 and those bytes go to "
        "prefixes that are shared.\n")
    add("`offline` (`policy.offline`) knows the future: Belady-style eviction weighted by FLOPs "
        "per byte, end states kept only if a later request reaches them, the ghost index. It "
        "is a heuristic reference, not an optimum. `marconi:alpha=online` "
        "(`policy.online.OnlineAlpha`) runs shadow caches with fixed alphas (0/0.5/1/2) on "
        "the same requests and moves the real cache to the alpha whose shadow saved the most "
        "FLOPs over the last 200 requests (checked every 50, 2% hysteresis); `sample=0.25` "
        "feeds the shadows only the requests whose first token hashes into a 25% sample, "
        "with 25% of the capacity.\n")
    add("Both run inside SGLang too: `--cache-policy marconi+` and `--marconi-alpha online` "
        "use the same objects in `MarconiUnifiedRadixCache`; docs/sglang.md (\"marconi+ in "
        "SGLang\") has what changes there and the Mooncake A/B against stock SGLang.\n")
    # Mooncake
    add("## Mooncake trace: marconi+ vs LRU, Marconi, the ceiling and the future-knowing "
        "reference\n")
    v = "PASS" if an["target_pass"] else "MISS"
    add(f"Target: marconi+ saves >= {TARGET_RATIO}x the FLOPs of LRU (sglang+) at 100 GB: "
        f"**{times(an['target_ratio'])}, {v}**.\n")
    add(f"![Mooncake]({img_rel}/beyond_mooncake.png)\n")
    add(cmd + "\n")
    rows = []
    for x in an["mooncake"]:
        ghost = (f"{x['ghost_max'] * 8 / 1e6:,.0f} MB max, {x['ghost_held'] * 8 / 1e6:,.0f} MB "
                 "at end" if x["ghost_max"] else "-")
        cap = "unlimited" if x["policy"] == "infinite" else gb(x["capacity"])
        rows.append((gb(x["capacity"]), x["policy"], cap, pflop(x["flops_saved"]),
                     pct(x["flops_fraction"]), pct(x["token_hit_rate"]),
                     pct(x["of_offline_flops"]), pct(x["of_offline_tokens"]),
                     times(x["vs_lru"]), f"{x['states_admitted']:,}", ghost,
                     f"{x['wall_s']:.1f} s"))
    add(_table(("sweep capacity", "policy", "its capacity", "FLOPs saved (PFLOP)",
                "of prefill FLOPs", "token hit rate", "FLOPs of offline's", "tokens of offline's",
                "FLOPs vs sglang+", "states admitted", "ghost index host memory (8 B/token)",
                "replay wall"), rows))
    add("")
    # generators
    add("## Generators: marconi+ vs LRU\n")
    v = "PASS" if an["gens_pass"] else "MISS"
    add(f"Target: marconi+ never more than 2% below LRU in FLOPs saved (ratio >= "
        f"{TARGET_FLOOR}) on any row: **{v}**. Default generator parameters; capacities "
        "calibrated as in docs/results.md (`sweeps.calibrate`: target t = the capacity at which "
        "LRU keeps f0 + t(1 - f0) of the unlimited cache's hit tokens, f0 being what it keeps "
        "in the smallest cache that holds the longest request).\n")
    add(cmd + "\n")
    rows = [(x["workload"], f"{x['target']:g}", gb(x["capacity"]), pct(x["lru"]),
             pct(x["marconi"]), pct(x["plus"]), times(x["ratio"]), times(x["token_ratio"]),
             times(x["marconi_ratio"]), "PASS" if x["pass"] else "MISS") for x in an["gens"]]
    add(_table(("workload", "target", "capacity", "sglang+ FLOPs saved", "marconi",
                "marconi+", "marconi+ / sglang+ (FLOPs)", "(tokens)", "marconi / sglang+",
                "row"), rows))
    add("")
    # ablation
    add("## Ablation: which part of marconi+ earns the gain (Mooncake, 100 GB)\n")
    add("`ghost=0` removes the ghost index and with it the learned end-state admission (it is "
        "measured on the ghost index); `end_threshold=0` keeps every end state; `chain=1` "
        "weighs chain states like other nodes; `bonus=0` drops the branch-point bonus; "
        "`half_life=500` decays hit counts with a 500-request half-life.\n")
    add(cmd + "\n")
    rows = [(x["policy"], pct(x["flops_fraction"]), pct(x["token_hit_rate"]), times(x["vs_lru"]),
             times(x["vs_full"]), f"{x['states_admitted']:,}") for x in an["ablation"]]
    add(_table(("policy", "FLOPs saved", "token hit rate", "vs sglang+", "vs full marconi+",
                "states admitted"), rows))
    add("")
    add("Chain states on multi-turn chat (chat generator, 4 GB): counting hits on them "
        "against weighting them 0.\n")
    add(cmd + "\n")
    rows = [(x["policy"], pct(x["flops_fraction"]), times(x["vs_lru"])) for x in an["chain"]]
    add(_table(("policy", "FLOPs saved", "vs sglang+"), rows))
    add("")
    # online alpha
    add(summary(an))
    add("## Online alpha: per-phase FLOPs saved\n")
    add("Share of each phase's prefill FLOPs saved. `auto` = the paper's bootstrap (fitted "
        "once); `online` = shadow caches; the fixed alphas show the best fixed alpha in "
        "hindsight per phase; `alpha 0 / best alpha > 0` = alpha 0's FLOPs saved over "
        "those of the best fixed alpha > 0 (above 1: LRU's phase, below: FLOP-aware "
        "eviction's). `online`: default shadows (alphas 0/0.5/1/2, window 200, period 50), "
        "so it cannot pick alpha 4; `online 0-4`: shadows for all five alphas shown (as "
        "`tests/test_beyond.py` runs it on alpha-shift). `drift` phases: chat1, agent, chat2; "
        "`alpha-shift` phases: scan, steady, scan (numbered): in a scan phase one-off long "
        "documents (each read once) pass between requests on 8 short hot prompts, in the "
        "steady phase 12 long documents are reused between one-off prompts (see "
        "`sim.generators`).\n")
    for wl, ph in an["phases"].items():
        sw = {k: ", ".join(f"request {i}: {a:g}" for i, a in v) or "none"
              for k, v in ph["switches"].items()}
        add(f"### {wl} at {gb(ph['capacity'])}\n")
        add(f"Bootstrap alpha: {ph['auto_alpha']:g} "
            f"({'tuned' if ph['auto_tuned'] else 'never tuned: the window did not complete'}); "
            f"online alpha switches: {sw['online']}; online 0-4: {sw['online5']}.\n")
        add(cmd + "\n")
        rows = []
        for x in ph["rows"]:
            rows.append((x["phase"], f"{x['requests']:,}", pct(x["auto"]), pct(x["online"]),
                         pct(x["online5"]), *[pct(x["fixed"][a]) for a in FIXED_ALPHAS],
                         f"{x['best_alpha']:g} ({pct(x['best'])})",
                         times(x["lru_vs_best_pos"]), pp(x["online"] - x["best"]),
                         pp(x["online5"] - x["best"])))
        add(_table(("phase", "requests", "marconi (auto)", "online", "online 0-4",
                    *[f"alpha={a:g}" for a in FIXED_ALPHAS], "best fixed (hindsight)",
                    "alpha 0 / best alpha > 0", "online - best fixed",
                    "online 0-4 - best fixed"), rows))
        add("")
    add("### CPU cost of the online shadows\n")
    add(f"Replay wall time of the whole workload in one process (best of {b['repeats']}), "
        "online against the same cache with a fixed alpha = 0; shadow cost = (online - "
        "fixed) / fixed. The machine is shared, so these times are noisy.\n")
    add(cmd + "\n")
    rows = [(x["workload"], f"{x['alpha0']:.2f} s", f"{x['online']:.2f} s",
             f"{x['sampled']:.2f} s", times(x["online_ratio"]), pct(x["shadow_cost"]),
             times(x["sampled_ratio"]), pct(x["sampled_shadow_cost"])) for x in an["cpu"]]
    add(_table(("workload", "alpha=0", "online", "online, sample=0.25", "online / alpha=0",
                "shadow cost", "sampled / alpha=0", "sampled shadow cost"), rows))
    add("")
    text = "\n".join(L)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return text


def _move_text(m: dict) -> str:
    if m["target"] is None:
        return f"{m['phase']}: no alpha clearly better"
    head = f"{m['phase']} (from request {m['start']}, clearly better: " + \
        "/".join(f"{a:g}" for a in m["target"]) + ")"
    if m["entered"] is None:
        return f"{head}: never"
    where = "within" if m["after"] <= ONLINE_BOUND else "beyond"
    stays = "and stays" if m["stays"] else "but leaves it again"
    return (f"{head}: from request {m['entered']} ({m['after']} in, {where} the bound) "
            f"{stays}")


def summary(an: dict) -> str:
    """What the tables say, in numbers this run computed."""
    abl = {x["policy"]: x for x in an["ablation"]}
    full = abl["marconi+"]
    moon100 = {x["policy"]: x for x in an["mooncake"] if x["capacity"] == 100e9}
    small = [p for p in ("marconi+:chain=1", "marconi+:bonus=0", "marconi+:half_life=500")]
    spread = max(abs(abl[p]["vs_full"] - 1) for p in small)
    chain = {x["policy"]: x for x in an["chain"]}
    worst = min(an["gens"], key=lambda x: x["ratio"])
    lines = [
        "### Reading the tables\n",
        f"- On Mooncake at 100 GB marconi+ saves {times(full['vs_lru'])} the FLOPs of LRU and "
        f"{pct(moon100['marconi+']['of_offline_flops'])} of what the future-knowing reference "
        f"saves (LRU: {pct(moon100['sglang+']['of_offline_flops'])}, Marconi: "
        f"{pct(moon100['marconi']['of_offline_flops'])}).",
        f"- What earns it: without the ghost index (and so without learned end-state "
        f"admission) marconi+ keeps {times(abl['marconi+:ghost=0']['vs_full'])} of its "
        f"savings; keeping every end state (`end_threshold=0`) keeps "
        f"{times(abl['marconi+:end_threshold=0']['vs_full'])}. The reuse weights' knobs (chain "
        f"weight, branch bonus, hit-count half-life) move it by at most {pct(spread)} on this "
        "trace" + (": here the gain comes from admission (finding shared prefixes past "
                   "evictions, not spending bytes on end states that are never reused) rather "
                   "than from the eviction order." if spread < 0.02 else "."),
        f"- On multi-turn chat at 4 GB, weighting chain states 0 gives "
        f"{times(chain['marconi+']['vs_lru'])} LRU's FLOPs saved, counting their hits "
        f"(`chain=1`) {times(chain['marconi+:chain=1']['vs_lru'])}.",
        f"- On the generators the lowest marconi+ / LRU ratio is {times(worst['ratio'])} "
        f"({worst['workload']}, {gb(worst['capacity'])}).",
        "- Costs: the ghost index holds token ids in host memory (the table's column: 8 bytes "
        "per id, at most `ghost` = 10 x the capacity's KV tokens; Python node overhead comes "
        "on top in this simulator); marconi+ needs no alpha tuning replays. `offline` is a "
        "reference only: it needs the whole future and rescans candidates per eviction.",
    ]
    for x in an["cpu"]:
        lines.append(f"- Online alpha on {x['workload']}: the four shadow caches cost "
                     f"{pct(x['shadow_cost'])} of the real cache's replay time "
                     f"({pct(x['sampled_shadow_cost'])} with sample=0.25).")
    for wl, ph in an["phases"].items():
        rows = [r for r in ph["rows"] if r["phase"] != "all"]
        allrow = [r for r in ph["rows"] if r["phase"] == "all"][0]
        gap = min(r["online"] - r["best"] for r in rows)
        lines.append(f"- {wl}: over the whole trace online saved {pct(allrow['online'])} of "
                     f"prefill FLOPs (online 0-4: {pct(allrow['online5'])}), bootstrap "
                     f"{pct(allrow['auto'])}, the best single fixed "
                     f"alpha {pct(allrow['best'])} (alpha={allrow['best_alpha']:g}); per phase "
                     f"online trails the hindsight-best fixed alpha by at most "
                     f"{max(0.0, -100 * gap):.1f} percentage points.")
        per_phase = "; ".join(
            f"{r['phase']}: best fixed alpha {r['best_alpha']:g}, alpha 0 saves "
            f"{times(r['lru_vs_best_pos'])} the best alpha > 0" for r in rows)
        moved = {key: "; ".join(_move_text(m) for m in ms) for key, ms in ph["moves"].items()}
        lines.append(f"- {wl} per phase: {per_phase}.")
        lines.append(f"- {wl}, when online alpha holds one of the phase's clearly better alphas "
                     f"(>= {CLEAR:g}x the FLOPs saved: alpha 0 against every alpha > 0, or an "
                     f"alpha > 0 against alpha 0; bound: window + period = {ONLINE_BOUND} "
                     f"requests into the phase). online: {moved['online']}. online 0-4: "
                     f"{moved['online5']}.")
    return "\n".join(lines) + "\n"


def write_plot(an: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 4))
    caps = list(MOONCAKE_CAPS)
    x = np.arange(len(caps))
    width = 0.8 / len(MAIN_POLICIES)
    for i, p in enumerate(MAIN_POLICIES):
        vals = [100 * next(r["flops_fraction"] for r in an["mooncake"]
                           if r["capacity"] == c and r["policy"] == p) for c in caps]
        ax.bar(x + (i - (len(MAIN_POLICIES) - 1) / 2) * width, vals, width, label=p)
    ax.set_xticks(x)
    ax.set_xticklabels([gb(c) for c in caps])
    ax.set_ylabel("prefill FLOPs saved (%)")
    ax.set_title("Mooncake trace, paper-7b (infinite: unlimited capacity)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "docs" / "beyond.md"))
    ap.add_argument("--img", default=None, help="PNG folder (default: img/ beside --out)")
    ap.add_argument("--mooncake", default=None)
    ap.add_argument("--quick", action="store_true", help="time the shadows once, not 3 times")
    ap.add_argument("--strict", action="store_true", help="exit 1 on a MISS")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    img = Path(args.img) if args.img else out.parent / "img"
    command = " ".join(["python", "scripts/bench_beyond.py", *map(shlex.quote, argv)])
    b = run(args.jobs, args.mooncake, args.quick, not args.no_progress)
    an = analyze(b)
    import os

    write_plot(an, img / "beyond_mooncake.png")
    write_markdown(b, an, out, os.path.relpath(img.resolve(), out.parent.resolve()), command)
    print(f"wrote {out} ({b['wall_s']:.0f} s)")
    for x in an["mooncake"]:
        if x["policy"] in ("marconi+", "sglang+", "offline"):
            print(f"  mooncake {gb(x['capacity']):>7} {x['policy']:>9}: FLOPs saved "
                  f"{pct(x['flops_fraction'])}, {times(x['vs_lru'])} LRU, "
                  f"{pct(x['of_offline_flops'])} of offline")
    print(f"target: marconi+ >= {TARGET_RATIO}x LRU FLOPs saved at 100 GB: "
          f"{times(an['target_ratio'])} {'PASS' if an['target_pass'] else 'MISS'}")
    for x in an["gens"]:
        print(f"  {x['workload']:>13} t={x['target']:g} {gb(x['capacity']):>8}: marconi+/LRU "
              f"{times(x['ratio'])} {'PASS' if x['pass'] else 'MISS'}")
    print(f"target: marconi+ never more than 2% below LRU: "
          f"{'PASS' if an['gens_pass'] else 'MISS'}")
    for x in an["cpu"]:
        print(f"  online alpha CPU on {x['workload']}: {times(x['online_ratio'])} of alpha=0 "
              f"(sample=0.25: {times(x['sampled_ratio'])})")
    ok = an["target_pass"] and an["gens_pass"]
    return 1 if args.strict and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
