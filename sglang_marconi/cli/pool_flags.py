"""The pool flags of ``ab``, ``demo`` and ``sim``: a byte budget sized the way SGLang sizes a server
(``--cache-gb N --memory static|unified --mamba-full-memory-ratio R``, ``driver/sizing.py``)
or the explicit pool sizes (``--kv-tokens K --mamba-slots S``); one form, not both. And
SGLang's int8 checkpoint pool (``--enable-int8-mamba-checkpoint``, for every cache alike)."""
from __future__ import annotations

import argparse

from sglang_marconi.driver.sizing import size_pools
from sglang_marconi.errors import UserError


def _positive(convert, what: str):
    """An argparse type: ``convert(text)`` when it is > 0, else a one-line error."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not value > 0:
            raise argparse.ArgumentTypeError(f"expected a positive {what}, got {text!r}")
        return value
    return parse


_positive_float = _positive(float, "number")
positive_int = _positive(int, "integer")


def add_pool_arguments(parser) -> None:
    group = parser.add_argument_group("pools (either --cache-gb or --kv-tokens/--mamba-slots)")
    group.add_argument("--cache-gb", type=_positive_float, default=None,
                       help="cache memory in GB (2**30 bytes, SGLang's rest_memory): pools "
                            "sized the way SGLang 0.5.23 sizes them")
    group.add_argument("--memory", choices=("static", "unified"), default=None,
                       help="with --cache-gb: static (two pools, SGLang's default) or unified "
                            "(--enable-unified-memory: one byte buffer); default static")
    group.add_argument("--mamba-full-memory-ratio", type=_positive_float, default=None,
                       help="with --cache-gb: state bytes / KV bytes of the split (SGLang's "
                            "default 0.9); in unified mode it fixes max_mamba_cache_size (the running-request cap), while the allocator's slot ids fill the buffer")
    group.add_argument("--kv-tokens", type=positive_int, default=None,
                       help="explicit form: KV token slots (SGLang max_total_num_tokens)")
    group.add_argument("--mamba-slots", type=positive_int, default=None,
                       help="explicit form: SSM state slots (a running request holds 3)")


def resolve_pools(args, spec):
    """(kv_tokens, mamba_slots, PoolSizes or None, UnifiedConfig or None) from the flags."""
    from sglang_marconi.driver.unified_pools import UnifiedConfig  # torch, sglang

    kv_tokens, mamba_slots, sizes = pool_sizes(args, spec)
    unified = UnifiedConfig.from_sizes(sizes) if sizes and sizes.mode == "unified" else None
    return kv_tokens, mamba_slots, sizes, unified


def pool_sizes(args, spec):
    """(kv_tokens, mamba_slots, PoolSizes or None) from the flags (no torch, no SGLang)."""
    explicit = args.kv_tokens is not None or args.mamba_slots is not None
    if args.cache_gb is not None and explicit:
        raise UserError("--cache-gb and --kv-tokens/--mamba-slots are two forms of the pool "
                        "sizes: give one")
    if args.cache_gb is None:
        if args.memory is not None or args.mamba_full_memory_ratio is not None:
            raise UserError("--memory and --mamba-full-memory-ratio need --cache-gb")
        if args.kv_tokens is None or args.mamba_slots is None:
            raise UserError("give --cache-gb N, or both --kv-tokens and --mamba-slots")
        return args.kv_tokens, args.mamba_slots, None
    sizes = size_pools(spec, args.cache_gb, args.memory or "static",
                       mamba_full_memory_ratio=args.mamba_full_memory_ratio or 0.9,
                       page_size=args.page_size)
    return sizes.kv_tokens, sizes.mamba_slots, sizes


def check_pools_fit(args, kv_tokens: int, mamba_slots: int, longest: int, page: int) -> int:
    """The KV tokens the longest request needs (and 4 state slots), else a one-line error."""
    need = longest + 2 * page
    if kv_tokens < need:
        given = ("--kv-tokens" if args.cache_gb is None
                 else f"--cache-gb {args.cache_gb:g} ({args.memory or 'static'}): KV tokens")
        raise UserError(f"{given} {kv_tokens} cannot hold the longest request of "
                        f"the trace ({longest} tokens); use at least {need}")
    if mamba_slots < 4:
        raise UserError("--mamba-slots must be at least 4 (a running request holds 3)")
    return need


def pool_summary(sizes, kv_tokens: int, mamba_slots: int) -> dict:
    """The pool sizes a run used, for ``--json`` (``mode`` "explicit" without --cache-gb)."""
    if sizes is None:
        return {"mode": "explicit", "kv_tokens": kv_tokens, "mamba_slots": mamba_slots}
    return sizes.as_dict()


def describe_pools(sizes, kv_tokens: int, mamba_slots: int) -> str:
    if sizes is None:
        return f"{kv_tokens:,} KV token slots, {mamba_slots} state slots (explicit)"
    return sizes.describe()


def add_int8_arguments(parser) -> None:
    parser.add_argument("--enable-int8-mamba-checkpoint", action="store_true",
                        help="SGLang's flag, for every cache: cached states live in a separate "
                             "int8 checkpoint pool (about 0.27x a float32 state's bytes), "
                             "outside the --cache-gb budget as in SGLang")
    parser.add_argument("--int8-mamba-ckpt-size", type=positive_int, default=None,
                        help="with --enable-int8-mamba-checkpoint: checkpoint slots (SGLang's "
                             "default: 2 x the state slots)")


# what SGLang does with --enable-int8-mamba-checkpoint beside these, as in a server
INT8_REFUSED = {
    "hicache": "--enable-int8-mamba-checkpoint is not supported together with the host tier "
               "(--hicache-*): SGLang refuses it, the host-offload path is not int8-aware "
               "(mamba_hook.py handle_int8_mamba_checkpoint)",
    "unified": "--enable-int8-mamba-checkpoint does nothing with --memory unified: SGLang's "
               "unified pool builds no checkpoint pool (unified_memory_pool.py 1469)",
}


def int8_summary(spec, pools) -> dict:
    """The int8 checkpoint pool in ``ab --json``'s config ({} when off), sized as SGLang's."""
    if not pools.int8_checkpoint:
        return {}
    slots = pools.int8_checkpoint_slots or 2 * pools.mamba_slots
    per_slot = spec.int8_checkpoint_bytes
    return {"int8_checkpoints": {"slots": slots, "bytes_per_slot": per_slot,
                                 "bytes": (slots + 1) * per_slot,
                                 "full_state_bytes": spec.full_state_bytes}}


def describe_int8(summary: dict) -> str:
    return (f"int8 checkpoint pool: {summary['slots']:,} slots of "
            f"{summary['bytes_per_slot']:,} B ({summary['bytes'] / 2**30:.2f} GB, outside "
            f"the budget as in SGLang; a full state is {summary['full_state_bytes']:,} B)")


def check_int8(args, unified: bool, host: bool) -> None:
    if args.int8_mamba_ckpt_size is not None and not args.enable_int8_mamba_checkpoint:
        raise UserError("--int8-mamba-ckpt-size needs --enable-int8-mamba-checkpoint")
    if args.enable_int8_mamba_checkpoint and (unified or host):
        raise UserError(INT8_REFUSED["unified" if unified else "hicache"])


def int8_pool_fields(args) -> dict:
    """``PoolConfig`` fields of the int8 checkpoint pool."""
    return {"int8_checkpoint": args.enable_int8_mamba_checkpoint,
            "int8_checkpoint_slots": args.int8_mamba_ckpt_size}
