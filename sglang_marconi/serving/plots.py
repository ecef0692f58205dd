"""Serving plots (matplotlib, PNG): the TTFT CDF per cache, one panel per load, and P95
TTFT against load, one line per cache."""
from __future__ import annotations


def plot_serving(result: dict, path: str, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    loads = sorted({r["load"] for r in runs if r["load"] is not None}) or [None]
    caches = list(dict.fromkeys(r["cache"] for r in runs))
    fig, axes = plt.subplots(1, len(loads) + 1, figsize=(4.2 * (len(loads) + 1), 3.8),
                             squeeze=False)
    for ax, load in zip(axes[0], loads):
        for run in (r for r in runs if r["load"] == load):
            label = f"{run['cache']}@{load}" if load is not None else next(
                k for k in result["ttft"] if k.startswith(run["cache"] + "@"))
            xs = result["ttft"][label]
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=run["cache"])
        ax.set_xscale("log")
        ax.set_xlabel("TTFT (s, virtual clock)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"load {load}" if load is not None else "rate-scaled")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[0][-1]
    for name in caches:
        pts = sorted((r["load"], r["ttft_p95_s"]) for r in runs
                     if r["cache"] == name and r["load"] is not None)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=name)
    ax.set_xlabel("offered load (prefill FLOPs / capacity)")
    ax.set_ylabel("P95 TTFT (s)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
