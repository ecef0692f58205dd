"""Reproduce the Marconi paper's simulator results (Figs. 7-10, 12) with this project's
simulator, and write results/results.md plus PNG plots in results/img/ (under the
repository root; docs/results.md summarises a run).

The sweep and its analysis: ``scripts/lib/marconi_reports/reproduce.py``; the markdown:
``marconi_reports/reproduce_markdown.py``; the plots: ``marconi_reports/plots.py``. Every
number in the markdown is computed by this run; every table names the command.

Usage: .venv/bin/python scripts/reproduce.py [--quick | --tiny] [--jobs 2]
       [--out results/results.md] [--img results/img] [--arch qwen3_next] [--mooncake PATH]
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

from marconi_reports import plots, reproduce_markdown  # noqa: E402
from marconi_reports.formatting import pct, relpath, times  # noqa: E402
from marconi_reports.reproduce import analyze, make_config, run_sweep  # noqa: E402


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="a smaller sweep (< 10 min on 2 cores)")
    mode.add_argument("--tiny", action="store_true", help="a seconds-long sweep (tests)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--out", default=str(ROOT / "results" / "results.md"))
    ap.add_argument("--img", default=None, help="PNG folder (default: img/ beside --out)")
    ap.add_argument("--arch", default="qwen3_next", help="the real architecture preset")
    ap.add_argument("--mooncake", default=None, help="the Mooncake trace (default: shared)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    mode_name = "tiny" if args.tiny else "quick" if args.quick else "full"
    cfg = make_config(mode_name, args.arch, args.mooncake)
    out = Path(args.out)
    img = Path(args.img) if args.img else out.parent / "img"
    command = " ".join(["python", "scripts/reproduce.py", *map(shlex.quote, argv)])
    sweep = run_sweep(cfg, args.jobs, not args.no_progress)
    an = analyze(sweep)
    try:
        img_rel = str(Path(relpath(img, out.parent)))
    except ValueError:
        img_rel = str(img)
    plots.write_plots(sweep, an, img)
    reproduce_markdown.write_markdown(sweep, an, out, img_rel, command)
    print(f"wrote {out} and plots in {img} ({sweep['wall_s']:.0f} s, "
          f"{len(sweep['records'])} replays)")
    for (m, fam), f in an["families"].items():
        print(f"  {m:>12} {fam:>9}: ratio vs vllm+ {times(f['ratio_mean'])} "
              f"({f['ratio_inf']} inf), gain vs paper-sglang+ P95 {pct(f['gain_p95'], True)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
