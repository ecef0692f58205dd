#!/usr/bin/env python3
"""The serving A/B on a CPU-only machine: live SGLang servers with the forward replaced.

``scripts/ab_serve.sh --cpu`` runs this. For each policy it starts SGLang's real server
(``python -m sglang_marconi.launch_server``) on 127.0.0.1 with the live test harness's
settings (tests/live: tiny checkpoint written here, capped pools, the test plugin that
replaces only the model forward; docs/live_server.md), runs ``sglang.bench_serving``
(generated-shared-prefix, sized for the capped pools) against it, stops it, and prints a
table from each server's own counters (``/metrics``: prompt and cached tokens, Marconi's
FLOPs saved). Outputs and timings are not a model's (the forward is replaced): the table
compares what each cache reuses, not speed.

    scripts/ab_serve.sh --cpu [--model qwen3_next|nemotron_h] [--policies stock,marconi,marconi-alpha]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "live"))

from live_configs import server_args  # noqa: E402
from server import BUFFERS, POLICIES, LiveServer, live_env  # noqa: E402
from streams import KV_TOKENS, MAMBA_SLOTS, MAX_RUNNING  # noqa: E402
from tiny_models import CONFIGS, write_tiny_model  # noqa: E402

BENCH = ["--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "6",
         "--gsp-prompts-per-group", "6", "--gsp-system-prompt-len", "600",
         "--gsp-question-len", "60", "--gsp-output-len", "16", "--num-prompts", "36",
         "--request-rate", "inf", "--max-concurrency", "4", "--seed", "1", "--disable-tqdm"]


def counters(server: LiveServer) -> dict:
    out = {"prompt_tokens": server.metric("sglang:prompt_tokens_total"),
           "cached_tokens": server.metric("sglang:cached_tokens_total")}
    try:
        out["marconi_flops_saved"] = server.metric("sglang:marconi_flops_saved_total")
    except KeyError:
        pass
    return out


def run_policy(model: str, model_dir: Path, policy: str, buffer: str, out_dir: Path) -> dict:
    server = LiveServer(model_dir, server_args(model, buffer, policy),
                        max_total_tokens=KV_TOKENS, mamba_slots=MAMBA_SLOTS,
                        max_running=MAX_RUNNING)
    print(f"[{policy}] starting a live CPU server ({buffer}) ...", flush=True)
    server.start()
    try:
        result_file = out_dir / f"{policy}.jsonl"
        cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang",
               "--base-url", server.url, "--tokenizer", str(model_dir), *BENCH,
               "--output-file", str(result_file)]
        proc = subprocess.run(cmd, env=live_env(), capture_output=True, text=True,
                              timeout=600)
        (out_dir / f"bench_{policy}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise SystemExit(f"error: sglang.bench_serving failed against {policy}; "
                             f"see {out_dir / f'bench_{policy}.log'}")
        bench = json.loads(result_file.read_text().splitlines()[-1])
        return {"completed": bench["completed"], **counters(server)}
    finally:
        (out_dir / f"server_{policy}.log").write_text(server.log_text())
        server.stop()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(CONFIGS), default="qwen3_next")
    parser.add_argument("--buffer", choices=sorted(BUFFERS), default="extra_buffer",
                        help="extra_buffer (SGLang's default for hybrids, overlap loop) or "
                             "no_buffer (normal loop)")
    parser.add_argument("--policies", default="stock,marconi")
    parser.add_argument("--out", default=None, help="folder for logs and raw results")
    args = parser.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies:
        parser.error(f"--policies: unknown {', '.join(bad) or 'empty list'}; "
                     f"known: {', '.join(POLICIES)}")
    out_dir = Path(args.out or tempfile.mkdtemp(prefix="ab_serve_cpu-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    model_dir = write_tiny_model(out_dir / "model" / args.model, args.model)
    rows = {p: run_policy(args.model, model_dir, p, args.buffer, out_dir) for p in policies}
    print(f"\nlive CPU servers ({args.model}, {args.buffer}, {KV_TOKENS} KV tokens, "
          f"{MAMBA_SLOTS} state slots; forward replaced), sglang.bench_serving "
          "generated-shared-prefix; from each server's /metrics:")
    print(f"  {'policy':<10}{'requests':>10}{'prompt tok':>12}{'cached tok':>12}"
          f"{'hit rate':>10}{'FLOPs saved':>14}")
    for p, r in rows.items():
        hit = r["cached_tokens"] / r["prompt_tokens"] if r["prompt_tokens"] else 0.0
        flops = f"{r['marconi_flops_saved']:.3g}" if "marconi_flops_saved" in r else "-"
        print(f"  {p:<10}{r['completed']:>10}{r['prompt_tokens']:>12.0f}"
              f"{r['cached_tokens']:>12.0f}{hit:>10.1%}{flops:>14}")
    print(f"logs and raw results: {out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
