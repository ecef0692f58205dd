"""Beyond the paper (issue 7): marconi+ and online alpha against LRU, Marconi and the
references, on the shared Mooncake trace and the generators. Writes results/beyond.md (and
results/img/beyond_mooncake.png; docs/beyond.md summarises a run) and prints PASS/MISS for the two targets:

- Mooncake, paper-7b, 100 GB: marconi+ saves >= 1.5x the prefill FLOPs of LRU (paper-sglang+);
- generators (chat, agent, shared-prompt, fork-join, 3 capacities each): marconi+ never
  more than 2% below LRU in FLOPs saved.

The runs and their analysis: ``scripts/lib/marconi_reports/beyond.py``; the markdown:
``marconi_reports/beyond_markdown.py``; the plot: ``marconi_reports/plots.py``.
A benchmark, not a test: exits 0 either way (1 with ``--strict`` on a MISS).

Usage: .venv/bin/python scripts/bench_beyond.py [--jobs 2] [--out results/beyond.md]
       [--quick] [--mooncake PATH]
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

from marconi_reports import beyond, beyond_markdown, plots  # noqa: E402
from marconi_reports.formatting import gb, pct, relpath, times  # noqa: E402


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "results" / "beyond.md"))
    ap.add_argument("--img", default=None, help="PNG folder (default: img/ beside --out)")
    ap.add_argument("--mooncake", default=None)
    ap.add_argument("--quick", action="store_true", help="time the shadows once, not 3 times")
    ap.add_argument("--strict", action="store_true", help="exit 1 on a MISS")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    img = Path(args.img) if args.img else out.parent / "img"
    command = " ".join(["python", "scripts/bench_beyond.py", *map(shlex.quote, argv)])
    b = beyond.run(args.jobs, args.mooncake, args.quick, not args.no_progress)
    an = beyond.analyze(b)
    plots.write_beyond_plot(an, img / "beyond_mooncake.png")
    beyond_markdown.write_markdown(b, an, out, relpath(img, out.parent), command)
    print(f"wrote {out} ({b['wall_s']:.0f} s)")
    for x in an["mooncake"]:
        if x["policy"] in ("marconi+", "sglang", "paper-sglang+", "offline"):
            print(f"  mooncake {gb(x['capacity']):>7} {x['policy']:>13}: FLOPs saved "
                  f"{pct(x['flops_fraction'])}, {times(x['vs_stock'])} stock sglang, "
                  f"{times(x['vs_lru'])} LRU, {pct(x['of_offline_flops'])} of offline")
    print(f"target: marconi+ >= {beyond.TARGET_RATIO}x LRU FLOPs saved at 100 GB: "
          f"{times(an['target_ratio'])} {'PASS' if an['target_pass'] else 'MISS'}")
    for x in an["gens"]:
        print(f"  {x['workload']:>13} t={x['target']:g} {gb(x['capacity']):>8}: marconi+/sglang "
              f"{times(x['stock_ratio'])}, marconi+/LRU {times(x['ratio'])} "
              f"{'PASS' if x['pass'] else 'MISS'}")
    for x in an["inside"]:
        print(f"  inside SGLang {gb(x['capacity']):>7} {x['policy']:>28}: FLOPs saved "
              f"{pct(x['flops_fraction'])}, {times(x['vs_stock'])} stock, "
              f"{pct(x['of_offline_flops'])} of the offline reference's")
    print(f"target: marconi+ inside SGLang >= {beyond.OFFLINE_TARGET:g} of the offline "
          f"reference at 100 GB: {pct(an['inside_offline'])} "
          f"{'PASS' if an['inside_pass'] else 'MISS'}")
    print(f"target: marconi+ never more than 2% below stock sglang nor LRU: "
          f"{'PASS' if an['gens_pass'] else 'MISS'}")
    for x in an["cpu"]:
        print(f"  online alpha CPU on {x['workload']}: {times(x['online_ratio'])} of alpha=0 "
              f"(sample=0.25: {times(x['sampled_ratio'])})")
    ok = an["target_pass"] and an["gens_pass"]
    return 1 if args.strict and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
