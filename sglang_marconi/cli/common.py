"""Helpers shared by CLI commands: model selection flags, byte sizes, JSON output."""
from __future__ import annotations

import json
import re
import sys
import warnings

from sglang_marconi.errors import UserError
from sglang_marconi.model import resolve_model
from sglang_marconi.model.dtypes import KV_CACHE_DTYPES, STATE_DTYPES
from sglang_marconi.sglang_version import check_sglang_version

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(text: str, what: str = "capacity") -> int:
    """'40GB', '1.5GiB', '123456' -> bytes (decimal GB as in the paper)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise UserError(f"{what}: cannot read {text!r} as a size (e.g. 40GB, 512MiB)")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value <= 0:
        raise UserError(f"{what}: must be positive, got {text!r}")
    return int(value)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1000
    return str(n)


def human_flops(f: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if abs(f) >= scale:
            return f"{f / scale:,.2f} {unit}"
    return f"{f:,.0f} FLOP"


def add_model_arguments(parser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument("--model", "--preset", dest="preset", metavar="PRESET",
                   help="a named preset (see `model-info --list`), e.g. paper-7b")
    g.add_argument("--config", metavar="PATH", help="a Hugging Face config.json (or its folder)")
    g.add_argument("--dtype", help="the model's dtype, as SGLang's flag (default: the config's)")
    add_cache_dtype_arguments(g)


def add_trace_model_arguments(parser) -> None:
    """``ab``'s and ``serve-sim``'s trace and cost-model flags."""
    parser.add_argument("--trace", required=True, help="Mooncake or session JSONL trace")
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", metavar="PRESET", help="model preset (cost model)")
    model.add_argument("--config", metavar="PATH", help="HF config.json (cost model)")
    add_cache_dtype_arguments(parser.add_argument_group("bytes per KV token and per state"))


def add_cache_dtype_arguments(group) -> None:
    """SGLang's flags that decide what a KV token and a state weigh in its pools."""
    group.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default=None,
                       help="SGLang's flag: KV cache dtype (default auto: the model's)")
    group.add_argument("--mamba-ssm-dtype", choices=STATE_DTYPES, default=None,
                       help="SGLang's flag: the temporal SSM state's dtype (default: "
                            "SGLANG_MAMBA_SSM_DTYPE, else the config's mamba_ssm_dtype, else "
                            "float32, as SGLang)")
    group.add_argument("--tp-size", type=int, default=1,
                       help="SGLang's flag: tensor-parallel ranks; bytes are one rank's "
                            "(default 1)")


def server_model_kwargs(args) -> dict:
    """The cache-dtype flags as ``resolve_model`` keywords (paper-7b takes none)."""
    return {"kv_cache_dtype": args.kv_cache_dtype, "mamba_ssm_dtype": args.mamba_ssm_dtype,
            "tp_size": args.tp_size}


def model_from_args(args, default_preset: str | None = None):
    preset = args.preset or (None if args.config else default_preset)
    return resolve_model(preset=preset, config=args.config, dtype=args.dtype,
                         **server_model_kwargs(args))


def describe_model(spec) -> str:
    """One line: the model and what SGLang's pools hold of it per rank."""
    dtypes = f"; {spec.cache_dtypes.describe()}" if spec.cache_dtypes is not None else ""
    tp = f", TP {spec.tp_size} (per rank)" if spec.tp_size > 1 else ""
    return (f"model {spec.name}: {spec.kv_bytes_per_token:,} B per KV token, "
            f"{spec.ssm_state_bytes:,} B per state{tp}{dtypes}")


def parse_params(items) -> dict:
    """``--param KEY=VALUE`` items -> {KEY: VALUE}."""
    overrides = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"--param {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        overrides[k] = v
    return overrides


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=2, default=float)
    sys.stdout.write("\n")


def run_with_sglang(fn, args) -> int:
    """``fn(args)`` after the SGLang pin check, sglang's CUDA-only UserWarnings silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module=r"sglang\.")
        try:
            check_sglang_version()
        except ImportError as exc:
            raise UserError(str(exc)) from None
        return fn(args)
