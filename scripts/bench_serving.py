"""The serving grid (issue 19): ``serve-sim`` for stock vs marconi vs marconi+ on both
models, both memory modes, the overlap loop (the normal loop as a reference), loads
0.5 / 0.8 / 0.95 of the honest load, on the bundled Mooncake trace and on a long-turn chat
workload (``CHAT_LONG``, generated once with ``gen-trace``), each cell with seeded Poisson
arrivals (``--arrivals poisson --seed S``: the seed varies the arrival process only; the
requests and their order are the trace's); the median over seeds per row. Writes each
cell's JSON under ``--json-dir``, the markdown (table + PASS/MISS of the targets) to
``--out`` and the plot to ``--plot`` (by default all under results/ at the repository
root).

Each cell is one serve-sim process (all loads and caches of one model, workload, memory
mode, loop and seed). The defaults run a slice that fits a shared 2-core machine (see
``--help``); ``--full`` runs the issue's whole grid (no --limit, 3 seeds, both memory
modes, the normal loop reference). A benchmark, not a test: exits 0 when every cell ran.

Usage: .venv/bin/python scripts/bench_serving.py [--full] [--models paper-7b,qwen3_next]
       [--workloads bundled,chat-long] [--memory unified,static] [--loops overlap,normal]
       [--loads 0.5,0.8,0.95] [--seeds 0,1,2] [--limit N] [--reuse] [--dry-run]
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

from marconi_reports import serving_grid  # noqa: E402
from marconi_reports.sweeps import MOONCAKE_TRACE  # noqa: E402

# the long-turn chat workload: 120 sessions of 8 turns on average (up to 30), a 2,000-token
# system prompt, user turns of ~400 tokens, answers of ~300, contexts up to 32K tokens
CHAT_LONG = ("--workload", "chat", "--seed", "0", "--param", "sessions=120",
             "--param", "mean_turns=8", "--param", "max_turns=30",
             "--param", "system_prompt=2000", "--param", "user_median=400",
             "--param", "output_median=300", "--param", "max_len=32768")
FULL = dict(models="paper-7b,qwen3_next", workloads="bundled,chat-long",
            memory="unified,static", loops="overlap,normal", loads="0.5,0.8,0.95",
            seeds="0,1,2", limit=None)


def workload_trace(name: str, build_dir: Path) -> Path:
    if name == "bundled":
        return Path(MOONCAKE_TRACE)
    if name != "chat-long":
        raise SystemExit(f"--workloads: unknown workload {name!r} (bundled, chat-long)")
    path = build_dir / "chat_long.jsonl"  # build/: git-ignored, regenerated when absent
    if not path.is_file():
        build_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "sglang_marconi", "gen-trace", *CHAT_LONG, "-o", str(path)]
        print("$", shlex.join(cmd[1:]), flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return path


def cells(args):
    """(model, workload, memory, loop, seed) of every cell: the overlap loop everywhere,
    the normal loop as a reference in the first memory mode only."""
    memories = args.memory.split(",")
    for model in args.models.split(","):
        for workload in args.workloads.split(","):
            for memory in memories:
                for loop in args.loops.split(","):
                    if loop == "normal" and memory != memories[0]:
                        continue
                    for seed in args.seeds.split(","):
                        yield model, workload, memory, loop, int(seed)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true",
                    help="the whole grid: " + ", ".join(f"{k}={v}" for k, v in FULL.items()))
    ap.add_argument("--models", default="paper-7b,qwen3_next")
    ap.add_argument("--workloads", default="bundled,chat-long")
    ap.add_argument("--memory", default="unified", help="modes, comma-separated")
    ap.add_argument("--loops", default="overlap", help="overlap[,normal] (normal: reference)")
    ap.add_argument("--loads", default="0.5,0.8,0.95")
    ap.add_argument("--caches", default="stock,marconi")
    ap.add_argument("--seeds", default="0,1,2", help="seeds of the Poisson arrivals")
    ap.add_argument("--limit", default="600", help="first N requests of each trace")
    ap.add_argument("--bookkeeping", default="cpu", choices=("measured", "cpu", "off"),
                    help="serve-sim's --bookkeeping (cpu: the cache's thread CPU time, "
                         "robust to a shared machine)")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--cache-gb", default="100")
    ap.add_argument("--json-dir", default=str(ROOT / "results" / "serving_grid"))
    ap.add_argument("--out", default=str(ROOT / "results" / "serving_grid.md"))
    ap.add_argument("--plot", default=str(ROOT / "results" / "serving_grid.png"))
    ap.add_argument("--reuse", action="store_true", help="keep the cells already in --json-dir")
    ap.add_argument("--dry-run", action="store_true", help="list the cells' commands only")
    args = ap.parse_args(argv)
    if args.full:
        for k, v in FULL.items():
            setattr(args, k, v)
    json_dir = Path(args.json_dir)
    json_dir.mkdir(parents=True, exist_ok=True)
    results, failed = [], 0
    for model, workload, memory, loop, seed in cells(args):
        tag = f"{model.replace('-', '_')}_{workload}_{memory}_{loop}_seed{seed}"
        saved = json_dir / f"{tag}.json"
        trace = workload_trace(workload, ROOT / "build" / "traces")
        cmd = [sys.executable, "-m", "sglang_marconi", "serve-sim", "--trace", str(trace),
               "--model", model, "--gpu", args.gpu, "--cache-gb", args.cache_gb,
               "--memory", memory, "--load", args.loads, "--caches", args.caches,
               "--arrivals", "poisson", "--seed", str(seed), "--bookkeeping", args.bookkeeping,
               "--json", "--no-progress"]
        if loop == "normal":
            cmd.append("--disable-overlap-schedule")
        if args.limit:
            cmd += ["--limit", str(args.limit)]
        if args.dry_run:
            print("$", shlex.join(cmd[1:]))
            continue
        if not (args.reuse and saved.is_file()):
            print("$", shlex.join(cmd[1:]), flush=True)
            t0 = time.perf_counter()
            done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
            if done.returncode:
                print(f"{tag}: serve-sim failed ({done.returncode})", file=sys.stderr)
                failed += 1
                continue
            saved.write_text(done.stdout)
            print(f"  {tag}: {time.perf_counter() - t0:.0f} s", flush=True)
        runs = json.loads(saved.read_text())["runs"]
        results.append({"model": model, "workload": workload, "memory": memory,
                        "loop": loop, "seed": seed, "runs": runs})
    if args.dry_run or not results:
        return 0 if not failed else 1
    grid_rows = serving_grid.rows(results)
    command = "python scripts/bench_serving.py " + shlex.join(argv)
    text = serving_grid.markdown(grid_rows, command.strip())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    serving_grid.plot(grid_rows, args.plot)
    print(text)
    return 0 if not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
