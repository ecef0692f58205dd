"""The PNG plots of the results report (matplotlib, Agg): ``write_plots``, the paper's
Figs. 7-10 and 12 side by side with ours and a capacity sweep per model."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from marconi_reports.formatting import gb, slug
from marconi_reports.reproduce import FAMILY_ORDER, PAPER, POLICIES, families
from sglang_marconi.sim.runner import LONG_REQUEST
from marconi_reports.sweeps import variant_name


def write_plots(sweep: dict, an: dict, img: Path) -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401

    cfg = sweep["config"]
    img.mkdir(parents=True, exist_ok=True)
    written = []
    colors = {"vllm+": "tab:gray", "paper-sglang+": "tab:blue", "marconi": "tab:red",
              "infinite": "tab:green"}

    # Figs 7-8
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    labels, ratios, gains, kinds = [], [], [], []
    for m, fam, f in families(cfg, an):
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
    axes[1].set_ylabel("gain over paper-sglang+ (P95, %)")
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
            axes[row][1].set_ylabel("marconi vs paper-sglang+ token hit rate (%)")
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
        written.append(_save(fig, img / f"capacity_{slug(m)}.png", plt))
    return written


def _save(fig, path, plt):
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
