"""The earlier serve-sim evidence report: the serve-sim grid's rows, the targets' PASS/MISS, and what
changed against the serial replay (state slots held by running requests vs the tree).

Targets (issue 12): at load 0.8 marconi+'s P95 TTFT <= 0.6x stock's; at no load is a
Marconi cache's P95 TTFT worse than stock's by more than 2%.
"""
from __future__ import annotations

from marconi_reports.formatting import pct, table, times

TARGET_LOAD, TARGET_RATIO, WORST_RATIO = 0.8, 0.6, 1.02


def _p95(runs, cache, load):
    for r in runs:
        if r["cache"] == cache and r["load"] == load:
            return r["ttft_p95_s"]
    return None


def verdicts(model: str, runs: list) -> list:
    """``[(target text, "PASS"|"MISS"|"n/a", detail)]`` for one model's runs."""
    out = []
    stock, plus = _p95(runs, "stock", TARGET_LOAD), _p95(runs, "marconi+", TARGET_LOAD)
    if stock and plus is not None:
        ratio = plus / stock
        out.append((f"{model}: marconi+ P95 TTFT at load {TARGET_LOAD} <= "
                    f"{TARGET_RATIO}x stock", "PASS" if ratio <= TARGET_RATIO else "MISS",
                    f"{plus:.3f} s vs {stock:.3f} s = {times(ratio)}"))
    worst = None
    for r in runs:
        base = _p95(runs, "stock", r["load"])
        if r["cache"] != "stock" and base:
            ratio = r["ttft_p95_s"] / base
            if worst is None or ratio > worst[0]:
                worst = (ratio, r["cache"], r["load"])
    if worst is not None:
        out.append((f"{model}: no Marconi cache's P95 TTFT > {WORST_RATIO}x stock at any load",
                    "PASS" if worst[0] <= WORST_RATIO else "MISS",
                    f"worst {worst[1]} at load {worst[2]}: {times(worst[0])}"))
    return out


HEADER = ("model", "cache", "load", "TTFT p50 s", "p95 s", "p99 s", "queue p95 s",
          "req/s", "FLOPs saved", "hit rate", "GPU busy", "running", "slots: running",
          "slots: tree", "retractions", "bookkeeping ms p99", "wall s")


def rows(model: str, runs: list) -> list:
    return [(model, r["cache"], r["load"], f"{r['ttft_p50_s']:.3f}", f"{r['ttft_p95_s']:.3f}",
             f"{r['ttft_p99_s']:.3f}", f"{r['queue_p95_s']:.3f}",
             f"{r['throughput_req_s']:.2f}", pct(r["flops_saved_fraction"]),
             pct(r["token_hit_rate"]), pct(r["gpu_busy_fraction"]),
             f"{r['mean_running']:.1f}", f"{r['state_slots_by_running_mean']:.0f}",
             f"{r['state_slots_by_tree_mean']:.0f}", r["retractions"],
             f"{r['bookkeeping_ms_per_step_p99']:.2f}", f"{r['wall_s']:.0f}")
            for r in runs]


def markdown(results: dict, command: str) -> str:
    """``results``: model -> serve-sim's JSON (``{"runs": [...], "config": {...}}``)."""
    lines = [f"Command: `{command}`", ""]
    body, checks = [], []
    for model, res in results.items():
        body += rows(model, res["runs"])
        checks += verdicts(model, res["runs"])
        pools = res["config"]["pools"]
        lines.append(f"- {model}: {pools['mode']} pools, {pools['kv_tokens']:,} KV tokens, "
                     f"{pools['mamba_slots']:,} state slots, max running requests "
                     f"{pools['max_running_requests']:,}; {res['config']['requests']:,} "
                     "requests")
    lines += ["", table(HEADER, body), ""]
    lines += [f"- **{v}** {text}: {detail}" for text, v, detail in checks]
    return "\n".join(lines) + "\n"
