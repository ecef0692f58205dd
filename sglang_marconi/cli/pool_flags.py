"""The pool flags of ``ab``, ``demo`` and ``sim``: a byte budget sized the way SGLang sizes a server
(``--cache-gb N --memory static|unified --mamba-full-memory-ratio R``, ``driver/sizing.py``)
or the explicit pool sizes (``--kv-tokens K --mamba-slots S``); one form, not both."""
from __future__ import annotations

import argparse

from sglang_marconi.driver.sizing import size_pools
from sglang_marconi.errors import UserError


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


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
    """(kv_tokens, mamba_slots, PoolSizes or None) from the flags (no torch, no SGLang):
    the explicit form, or the pools SGLang sizes from ``--cache-gb``."""
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
    """The pools must hold the longest request (its tokens and 2 pages, as SGLang checks
    ``max_context_len``) and a running request's 3 state slots and one more; returns the
    KV tokens needed. One-line errors that name the flag."""
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
