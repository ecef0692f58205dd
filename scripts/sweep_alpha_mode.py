"""Sweep: the SGLang cache's FLOPs saved per alpha mode (fixed, auto, online) against stock,
over state-pool sizes and traces, and the default the evidence picks (issue 13).

Logic: ``scripts/lib/marconi_reports/alpha_sweep.py``. Each cell is one CPU A/B replay; cells
run in a process pool (``--workers``, 2 by default). ``--limit`` replays the first N
requests of each trace (label the result with it).

Usage: python scripts/sweep_alpha_mode.py [--slots 60,200,600,1800] [--limit N]
       [--traces PATH,gen:chat] [--modes stock,fixed-1,auto,online] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

from marconi_reports import alpha_sweep  # noqa: E402
from marconi_reports.sweeps import MOONCAKE_TRACE  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=f"{MOONCAKE_TRACE},gen:chat,gen:agent")
    ap.add_argument("--slots", default=",".join(map(str, alpha_sweep.SLOTS)))
    ap.add_argument("--modes", default=",".join(alpha_sweep.MODES))
    ap.add_argument("--kv-tokens", type=int, default=1_500_000)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", help="write the markdown here (and FILE.json)")
    args = ap.parse_args(argv)
    cells = [alpha_sweep.Cell(t, int(s), m, args.kv_tokens, args.limit)
             for t in args.traces.split(",") for s in args.slots.split(",")
             for m in args.modes.split(",")]
    rows = alpha_sweep.run(cells, args.workers)
    command = "python " + " ".join(["scripts/sweep_alpha_mode.py", *(argv or sys.argv[1:])])
    text = alpha_sweep.markdown(rows, command)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
