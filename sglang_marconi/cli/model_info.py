"""``model-info``: a hybrid model's bytes per KV token and SSM checkpoint, and prefill FLOPs."""
from __future__ import annotations

from sglang_marconi.cli.common import (add_model_arguments, human_bytes, human_flops,
                                            model_from_args, print_json)
from sglang_marconi.errors import UserError
from sglang_marconi.model import PRESETS


def add_arguments(parser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--tokens", type=int, default=1024, metavar="L",
                        help="sequence length for the FLOP figures (default 1024)")
    parser.add_argument("--list", action="store_true", help="list the presets and exit")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    if args.list:
        names = list(PRESETS)
        print_json({"presets": names}) if args.json else print("\n".join(names))
        return 0
    if not args.preset and not args.config:
        raise UserError("give --model PRESET or --config PATH (see --list)")
    if args.tokens <= 0:
        raise UserError(f"--tokens must be positive, got {args.tokens}")
    spec = model_from_args(args)
    info = spec.summary(args.tokens)
    if args.json:
        print_json(info)
        return 0
    L = args.tokens
    print(f"model {info['name']} ({info['architecture']}, {info['dtype']}): "
          f"{info['num_attention_layers']} attention, {info['num_ssm_layers']} SSM, "
          f"{info['num_mlp_layers']} MLP/MoE layers")
    rank = f" on each of {spec.tp_size} TP ranks" if spec.tp_size > 1 else ""
    if spec.cache_dtypes is not None:
        print(f"  SGLang's pools{rank}: {spec.cache_dtypes.describe()}")
    print(f"  KV per token (all attention layers): {info['kv_bytes_per_token']:,} B "
          f"({human_bytes(info['kv_bytes_per_token'])})")
    print(f"  SSM state per checkpoint (all SSM layers): {info['ssm_state_bytes']:,} B "
          f"({human_bytes(info['ssm_state_bytes'])})")
    print(f"  one checkpoint = KV of {info['ssm_state_bytes'] / max(1, info['kv_bytes_per_token']):,.0f}"
          " tokens" if info["kv_bytes_per_token"] else "  (no attention layers: no KV)")
    print(f"  prefill FLOPs at L={L}: {human_flops(info['prefill_flops'])}")
    print(f"\n  {'kind':<10}{'layers':>7}{'FLOPs @L':>16}{'KV B/token':>13}{'state bytes':>16}")
    for kind, row in info["breakdown"].items():
        print(f"  {kind:<10}{row['layers']:>7}{human_flops(row['prefill_flops']):>16}"
              f"{row['kv_bytes_per_token']:>13,}{row['state_bytes']:>16,}")
    return 0
