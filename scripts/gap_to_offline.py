"""Where stock SGLang, marconi+ and the future-knowing reference lose FLOPs against a cache
that never evicts, by reuse order and reuse distance (analysis: scripts/lib/marconi_reports/
reuse_gap.py).

Every policy runs in the simulator on one byte budget (`--capacity`, decimal units, as
`sim`; the default policies are docs/beyond.md's: `materialise=sglang` is the plugin's
model in SGLang's buffer with one tracking slot, so 22.15% for marconi+ at 100GB where `ab
--cache-gb 100 --memory unified` in its default overlap loop gives 23.15%: add `:overlap=1`
and `--capacity 107318034432` for that); the ceiling is `sglang` with room for everything. Prints, per policy,
a table: rows = the reused prefix's reuse order (its 2nd, 3rd, 4th, 5th or later use),
columns = new tokens since its previous use; each cell "ceiling / missed (of which on
requests that hit nothing)", in % of all prefill FLOPs.

Usage: python scripts/gap_to_offline.py [--model paper-7b] [--capacity 100GB]
       [--policies sglang,marconi+:materialise=sglang,offline:materialise=sglang]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

from sglang_marconi.cli.common import parse_bytes  # noqa: E402
from sglang_marconi.model import resolve_model  # noqa: E402
from marconi_reports import reuse_gap  # noqa: E402
from marconi_reports.formatting import table  # noqa: E402
from marconi_reports.sweeps import MOONCAKE_TRACE  # noqa: E402
from sglang_marconi.sim.traces import read_trace  # noqa: E402

UNBOUNDED = 10 ** 14  # bytes: more than the bundled trace ever holds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(MOONCAKE_TRACE), help="a Mooncake trace")
    ap.add_argument("--model", default="paper-7b")
    ap.add_argument("--capacity", default="100GB")
    ap.add_argument("--policies",
                    default="sglang,marconi+:materialise=sglang,offline:materialise=sglang")
    args = ap.parse_args(argv)
    spec = resolve_model(args.model, None)
    capacity = parse_bytes(args.capacity)
    raw = [json.loads(x) for x in Path(args.trace).read_text().splitlines() if x.strip()]
    trace = read_trace(args.trace)
    kinds = reuse_gap.classify(raw)
    ceiling = reuse_gap.per_request_flops("sglang", trace, spec, UNBOUNDED)
    prefill = sum(spec.prefill_flops(r.input_len) for r in trace.requests)
    saved = {p: reuse_gap.per_request_flops(p, trace, spec, capacity)
             for p in args.policies.split(",")}
    tables = reuse_gap.losses(kinds, ceiling, saved, prefill)
    edges = reuse_gap.DISTANCE_EDGES
    heads = ([f"< {edges[0] // 1000}K new tokens"]
             + [f"{a // 1000}K-{b // 1000}K" for a, b in zip(edges, edges[1:])]
             + [f">= {edges[-1] // 1000}K"])
    print(f"# Gap to a cache that never evicts: {Path(args.trace).name}, {args.model}, "
          f"{args.capacity}\n")
    print(f"never evicting (`sglang` unbounded): {ceiling.sum() / prefill:.2%} of prefill "
          "FLOPs saved\n")
    for name, cells in tables.items():
        total = sum(saved[name]) / prefill
        print(f"## {name}: {total:.2%} saved\n")
        rows = []
        for k in range(1, reuse_gap.MAX_ORDER + 1):
            label = f"use {k + 1}" if k < reuse_gap.MAX_ORDER else f"use {k + 1}+"
            row = [label]
            for b in range(len(heads)):
                ceil, miss, zero = cells.get((k, b), (0.0, 0.0, 0.0))
                row.append(f"{ceil:.2%} / {miss:.2%} ({zero:.2%})")
            ceil_k, miss_k, zero_k = reuse_gap.totals(cells).get(k, (0.0, 0.0, 0.0))
            row.append(f"{ceil_k:.2%} / {miss_k:.2%} ({zero_k:.2%})")
            rows.append(row)
        print(table(["reused prefix", *heads, "all"], rows))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
