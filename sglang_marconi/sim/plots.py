"""Plots of simulator results (matplotlib, written to PNG)."""
from __future__ import annotations


def plot_runs(runs: list[dict], path: str) -> None:
    """Hit rate and FLOPs saved per policy (one run) or against capacity (a sweep)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    title = f"{runs[0]['trace']} on {runs[0]['model']}"
    if len(runs) == 1:
        pols = runs[0]["policies"]
        names = list(pols)
        for ax, key, label in ((axes[0], "token_hit_rate", "token hit rate"),
                               (axes[1], "flops_saved_fraction", "prefill FLOPs saved")):
            ax.bar(names, [pols[n][key] for n in names], color="tab:blue")
            ax.set_ylabel(label)
            ax.tick_params(axis="x", rotation=20)
        cap = runs[0]["capacity_bytes"]
        title += f", capacity {cap / 1e9:.0f} GB" if cap else ""
    else:
        caps = [r["capacity_bytes"] / 1e9 for r in runs]
        for name in runs[0]["policies"]:
            for ax, key in ((axes[0], "token_hit_rate"), (axes[1], "flops_saved_fraction")):
                ax.plot(caps, [r["policies"][name][key] for r in runs], marker="o", label=name)
        axes[0].set_ylabel("token hit rate")
        axes[1].set_ylabel("prefill FLOPs saved")
        for ax in axes:
            ax.set_xlabel("cache capacity (GB)")
            ax.set_xscale("log")
        axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
