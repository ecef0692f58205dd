"""Serving evidence (issue 12): ``serve-sim`` on the shared Mooncake trace for each model,
stock vs marconi vs marconi+ at several offered loads; writes one JSON and one plot per
model and a markdown block (table + PASS/MISS of the targets) for docs/serving.md.

The runs are the CLI's (``python -m sglang_marconi serve-sim``, one process per model);
the analysis is ``sglang_marconi/reports/serving_report.py``. A benchmark, not a test:
exits 0 either way.

Usage: .venv/bin/python scripts/bench_serving.py [--models paper-7b,qwen3_next]
       [--loads 0.5,0.8,0.95] [--cache-gb 100] [--limit N] [--out docs/serving_results.md]
       [--reuse]  (render from the JSON files an earlier run left beside --out)
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_marconi.reports import serving_report  # noqa: E402
from sglang_marconi.sim.sweeps import MOONCAKE_TRACE  # noqa: E402


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(MOONCAKE_TRACE))
    ap.add_argument("--models", default="paper-7b,qwen3_next")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--cache-gb", default="100")
    ap.add_argument("--memory", default="static")
    ap.add_argument("--loads", default="0.5,0.8,0.95")
    ap.add_argument("--caches", default="stock,marconi,marconi+")
    ap.add_argument("--limit", default=None)
    ap.add_argument("--out", default=str(ROOT / "docs" / "serving_results.md"))
    ap.add_argument("--reuse", action="store_true",
                    help="read a model's JSON from an earlier run where it exists")
    args = ap.parse_args(argv)
    out = Path(args.out)
    img = out.parent / "img"
    img.mkdir(parents=True, exist_ok=True)
    results = {}
    for model in args.models.split(","):
        tag = f"serving_{model.replace('-', '_')}_{args.gpu}_{args.cache_gb}gb_{args.memory}"
        cmd = [sys.executable, "-m", "sglang_marconi", "serve-sim", "--trace", args.trace,
               "--model", model, "--gpu", args.gpu, "--cache-gb", args.cache_gb,
               "--memory", args.memory, "--load", args.loads, "--caches", args.caches,
               "--json", "--plot", str(img / f"{tag}.png")]
        if args.limit:
            cmd += ["--limit", args.limit]
        saved = out.parent / f"{tag}.json"
        if args.reuse and saved.is_file():
            results[model] = json.loads(saved.read_text())
            continue
        print("$", shlex.join(cmd[1:]), flush=True)
        done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        if done.returncode:
            print(f"{model}: serve-sim failed ({done.returncode})", file=sys.stderr)
            continue
        saved.write_text(done.stdout)
        results[model] = json.loads(done.stdout)
    command = "python scripts/bench_serving.py " + shlex.join(argv)
    text = serving_report.markdown(results, command.strip())
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
