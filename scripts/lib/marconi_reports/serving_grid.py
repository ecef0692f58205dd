"""The serving grid of issue 19 (``scripts/bench_serving.py``): serve-sim runs per model,
workload, memory mode, loop and seed of the arrival process, reduced to one row per
(model, workload, memory, loop, load, cache) with the median over seeds; the targets'
PASS/MISS; the markdown table and the plot.

Targets (issue 19; overlap loop, unified memory, P95 ratios to stock taken within one seed,
then the median over seeds):
- marconi and marconi+: P95 TTFT never above 1.02x stock's at any load, both models, both
  workloads;
- paper-7b, bundled trace, load 0.8: marconi+ P95 <= 0.8x stock; qwen3_next: <= 0.5x.
"""
from __future__ import annotations

import statistics
from collections import defaultdict

from marconi_reports.formatting import pct, table, times

WORST_RATIO = 1.02
TARGET_LOAD = 0.8
TARGET_RATIOS = {"paper-7b": 0.8, "qwen3_next": 0.5}
TARGET_WORKLOAD, TARGET_MEMORY, TARGET_LOOP = "bundled", "unified", "overlap"

KEYS = ("ttft_p50_s", "ttft_p95_s", "flops_saved_fraction", "busy_fraction",
        "cpu_critical_fraction", "gc_pause_s_max", "bookkeeping_ms_per_step_max",
        "bookkeeping_s_total")


def rows(cells: list) -> list:
    """``cells``: ``{"model", "workload", "memory", "loop", "seed", "runs": [serve-sim
    run, ...]}``. One row per (model, workload, memory, loop, load, cache): the median of
    each of ``KEYS`` over the seeds whose server did not crash (None if every one did),
    ``p95_vs_stock`` (the median over seeds of the ratio to stock's P95 in the same seed,
    over the seeds where neither crashed), ``overloaded`` and ``crashed`` as "k/n" seeds,
    ``seeds``."""
    groups = defaultdict(list)   # row key -> [(seed, run)]
    stock = {}                   # (model, workload, memory, loop, seed, load) -> P95
    for cell in cells:
        for run in cell["runs"]:
            key = (cell["model"], cell["workload"], cell["memory"], cell["loop"],
                   run["load"], run["cache"])
            groups[key].append((cell["seed"], run))
            if run["cache"] == "stock" and not run.get("crashed"):
                stock[key[:4] + (cell["seed"], run["load"])] = run["ttft_p95_s"]
    out = []
    for key, seeded in groups.items():
        model, workload, memory, loop, load, cache = key
        row = dict(zip(("model", "workload", "memory", "loop", "load", "cache"), key))
        ran = [(seed, r) for seed, r in seeded if not r.get("crashed")]
        for k in KEYS:
            row[k] = statistics.median(r[k] for _, r in ran) if ran else None
        ratios = [r["ttft_p95_s"] / stock[key[:4] + (seed, load)] for seed, r in ran
                  if stock.get(key[:4] + (seed, load))]
        row["p95_vs_stock"] = statistics.median(ratios) if ratios else None
        row["overloaded"] = f"{sum(bool(r['overloaded']) for _, r in ran)}/{len(ran)}"
        row["crashed"] = f"{len(seeded) - len(ran)}/{len(seeded)}"
        row["seeds"] = len(seeded)
        out.append(row)
    order = {"stock": 0, "stock-python": 1, "marconi": 2, "marconi+": 3}
    out.sort(key=lambda r: (r["model"], r["workload"], r["memory"], r["loop"] != "overlap",
                            r["load"], order.get(r["cache"], 9)))
    return out


def verdicts(grid_rows: list) -> list:
    """``[(target, "PASS"|"MISS", detail)]`` over the rows the targets name (overlap,
    unified); a target with no rows is left out."""
    out = []
    main = [r for r in grid_rows if r["memory"] == TARGET_MEMORY and r["loop"] == TARGET_LOOP]
    died = [r for r in main if r["cache"] in ("marconi", "marconi+")
            and not r["crashed"].startswith("0/")]
    if died:
        out.append(("marconi and marconi+ never crash the server", "MISS",
                    ", ".join(f"{r['cache']} {r['model']} {r['workload']} load {r['load']:g}: "
                              f"{r['crashed']} seeds" for r in died)))
    for model in sorted({r["model"] for r in main}):
        for workload in sorted({r["workload"] for r in main if r["model"] == model}):
            mine = [r for r in main if r["model"] == model and r["workload"] == workload
                    and r["cache"] in ("marconi", "marconi+") and r["p95_vs_stock"]]
            if not mine:
                continue
            worst = max(mine, key=lambda r: r["p95_vs_stock"])
            out.append((f"{model}, {workload}: marconi and marconi+ P95 <= {WORST_RATIO}x "
                        "stock at every load",
                        "PASS" if worst["p95_vs_stock"] <= WORST_RATIO else "MISS",
                        f"worst {worst['cache']} at load {worst['load']}: "
                        f"{times(worst['p95_vs_stock'])}"))
    for model, target in TARGET_RATIOS.items():
        hit = [r for r in main if r["model"] == model and r["workload"] == TARGET_WORKLOAD
               and r["load"] == TARGET_LOAD and r["cache"] == "marconi+" and r["p95_vs_stock"]]
        if hit:
            ratio = hit[0]["p95_vs_stock"]
            out.append((f"{model}, {TARGET_WORKLOAD} trace, load {TARGET_LOAD}: marconi+ P95 "
                        f"<= {target}x stock", "PASS" if ratio <= target else "MISS",
                        f"{times(ratio)}"))
    return out


def markdown(grid_rows: list, command: str, note: str = "") -> str:
    header = ["model", "workload", "memory", "loop", "load", "cache", "TTFT p50 s", "p95 s",
              "p95 / stock", "FLOPs saved", "busy", "overloaded", "crashed", "cpu crit",
              "gc max s", "bk ms max", "bk s total"]

    def num(x, fmt):
        return "-" if x is None else fmt(x)

    body = [[r["model"], r["workload"], r["memory"], r["loop"], f"{r['load']:g}", r["cache"],
             num(r["ttft_p50_s"], "{:.3f}".format), num(r["ttft_p95_s"], "{:.3f}".format),
             num(r["p95_vs_stock"], times),
             num(r["flops_saved_fraction"], pct), num(r["busy_fraction"], pct),
             r["overloaded"], r["crashed"], num(r["cpu_critical_fraction"], pct),
             num(r["gc_pause_s_max"], "{:.3f}".format),
             num(r["bookkeeping_ms_per_step_max"], "{:.1f}".format),
             num(r["bookkeeping_s_total"], "{:.2f}".format)]
            for r in grid_rows]
    lines = [f"Command: `{command}`", ""]
    if note:
        lines += [note, ""]
    lines += [table(header, body), ""]
    for target, verdict, detail in verdicts(grid_rows):
        lines.append(f"- **{verdict}** {target}: {detail}")
    return "\n".join(lines) + "\n"


def plot(grid_rows: list, path: str) -> None:
    """P95 TTFT over stock's against load, one panel per (model, workload) of the overlap
    loop in unified memory (static dashed), one line per cache."""
    import matplotlib  # heavy: only the plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["model"], r["workload"]) for r in grid_rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.6), squeeze=False)
    for ax, (model, workload) in zip(axes[0], panels):
        for memory, style in (("unified", "-"), ("static", "--")):
            for cache in ("marconi", "marconi+"):
                pts = sorted((r["load"], r["p95_vs_stock"]) for r in grid_rows
                             if (r["model"], r["workload"], r["memory"], r["cache"])
                             == (model, workload, memory, cache)
                             and r["loop"] == "overlap" and r["p95_vs_stock"])
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", label=f"{cache} ({memory})")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.axhline(WORST_RATIO, color="grey", lw=0.8, ls=":")
        ax.set_title(f"{model}, {workload}")
        ax.set_xlabel("offered load")
        ax.set_ylabel("P95 TTFT / stock's (median of seeds)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
