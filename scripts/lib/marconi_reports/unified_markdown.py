"""Issue 11's benchmark tables (markdown) and plot, from ``unified_bench.analyze``."""
from __future__ import annotations

from pathlib import Path

from marconi_reports.formatting import pct, table
from marconi_reports.unified_bench import ADMISSION, ALPHA, BUDGETS

LABELS = {"stock": "stock", "marconi": f"marconi (alpha {ALPHA:g})", "marconi+": "marconi+",
          ADMISSION: f"marconi, paper admission (<= 2 states/request, alpha {ALPHA:g})"}


def _pools(p: dict) -> str:
    if p["mode"] == "unified":
        # SGLang's allocator: a buffer full of state ids (older JSON lacks the field)
        ids = p.get("mamba_slot_ids", p["mamba_slots"])
        return f"{p['unified_bytes'] / 2**30:.1f} GiB buffer, {ids:,} ids"
    return f"{p['kv_tokens']:,} KV tok, {p['mamba_slots']:,} states"


def markdown(an: dict, command: str, limit=None) -> str:
    scope = f"first {limit} requests" if limit else "all requests"
    lines = [f"Command: `{command}` ({scope} of the trace; FLOPs saved = prefill FLOPs of "
             "the hits / all prefill FLOPs)", ""]
    header = ["model", "GB", "mode", "pools", "running cap", *(LABELS[c] for c in LABELS),
              "marconi+ / stock", "ms/req stock", "ms/req marconi+"]
    rows = []
    for r in an["rows"]:
        cols = r["cols"]
        rows.append([r["model"], f"{r['gb']:g}", r["mode"], _pools(r["pools"]),
                     f"{r['pools']['max_running_requests']:,}",
                     *(pct(r[c]) if c in r else "-" for c in LABELS),
                     f"{r['marconi+/stock']:.2f}x" if "marconi+/stock" in r else "-",
                     f"{cols['stock']['bookkeeping_ms_per_request']:.1f}" if "stock" in cols
                     else "-",
                     f"{cols['marconi+']['bookkeeping_ms_per_request']:.1f}"
                     if "marconi+" in cols else "-"])
    lines.append(table(header, rows))
    lines += ["", "| target | measured | result |", "| --- | --- | --- |"]
    lines += [f"| {t} | {m} | {res} |" for t, m, res in an["targets"]]
    return "\n".join(lines)


def write_plot(an: dict, path: Path, note: str = "") -> Path:
    """FLOPs saved vs budget, one panel per model, a line per (mode, cache)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in an["rows"]})
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.2), squeeze=False)
    styles = {"stock": ":", "marconi": "--", "marconi+": "-", ADMISSION: "-."}
    for ax, model in zip(axes[0], models):
        modes = sorted({r["mode"] for r in an["rows"] if r["model"] == model})
        for mi, mode in enumerate(modes):
            for cache, style in styles.items():
                pts = sorted((r["gb"], 100 * r[cache]) for r in an["rows"]
                             if r["model"] == model and r["mode"] == mode and cache in r)
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", color=f"C{mi}",
                            label=f"{mode}: {cache}")
        ax.set_xticks(list(BUDGETS))
        ax.set_xlabel("cache memory (GB)")
        ax.set_ylabel("prefill FLOPs saved (%)")
        ax.set_title(f"Mooncake trace, {model}{note}")
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
