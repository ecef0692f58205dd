"""The host-tier flags of ``ab`` under SGLang's names (any implies HiCache); the host pools get
SGLang's split of ``--hicache-size`` in real bytes as a host/device slot ratio."""
from __future__ import annotations

from sglang_marconi.cli.pool_flags import _positive_float
from sglang_marconi.errors import UserError

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
DEFAULT_HICACHE_RATIO = 2.0  # SGLang's --hicache-ratio default in the host-cache mode
HICACHE_GB = 1e9  # --hicache-size is in 10**9 bytes (pool_host/mamba.py, mha.py)


def add_host_arguments(parser) -> None:
    group = parser.add_argument_group(
        "host tier (SGLang's HiCache; any of these turns it on for every cache)")
    group.add_argument("--hicache-size", type=_positive_float, default=None, metavar="GB",
                       help="host memory in GB (10**9 bytes), split between KV and states "
                            "as SGLang splits it; overrides --hicache-ratio")
    group.add_argument("--hicache-ratio", type=_positive_float, default=None,
                       help=f"host pools = R x the device pools (default {DEFAULT_HICACHE_RATIO:g})")
    group.add_argument("--hicache-write-policy", choices=WRITE_POLICIES, default=None,
                       help="when a node is backed up to host (default write_through)")
    group.add_argument("--hicache-storage-backend", choices=("file",), default=None,
                       help="an L3 store behind the host tier: SGLang's file backend, in a "
                            "temporary directory per cache")


def host_enabled(args) -> bool:
    return any(getattr(args, name) is not None for name in
               ("hicache_size", "hicache_ratio", "hicache_write_policy",
                "hicache_storage_backend"))


def host_ratio(args, spec, kv_tokens: int, mamba_slots: int) -> float:
    """Host slots per device slot: from ``--hicache-size``, else ``--hicache-ratio``."""
    if args.hicache_size is None:
        return args.hicache_ratio or DEFAULT_HICACHE_RATIO
    return ratio_for_size(args.hicache_size, spec, kv_tokens, mamba_slots)


def ratio_for_size(size_gb: float, spec, kv_tokens: int, mamba_slots: int) -> float:
    """Host slots per device slot for ``--hicache-size size_gb``."""
    device_bytes = kv_tokens * spec.kv_bytes_per_token + mamba_slots * spec.ssm_state_bytes
    return size_gb * HICACHE_GB / device_bytes


def resolve_host(args, spec, kv_tokens: int, mamba_slots: int, unified) -> dict:
    """``PoolConfig`` fields of the host tier ({} when no host flag is given)."""
    if not host_enabled(args):
        return {}
    if unified is not None:
        raise UserError("--hicache-*: the host tier is not built over --memory unified "
                        "(--cache-policy marconi refuses it in a server too)")
    return {"hicache_write_policy": args.hicache_write_policy or "write_through",
            "hicache_ratio": host_ratio(args, spec, kv_tokens, mamba_slots)}


def host_summary(args, spec, pools) -> dict:
    """The host tier in ``ab --json``'s config: the host pools as SGLang builds them."""
    if pools.hicache_write_policy is None:
        return {}
    ratio, page = pools.hicache_ratio, pools.page_size  # SGLang's: x ratio, + a page / slot
    kv_host = (int(pools.kv_tokens * ratio) // page + 1) * page
    states_host = int(pools.mamba_slots * ratio) + 1
    return {"host": {
        "hicache_size_gb": args.hicache_size, "hicache_ratio": pools.hicache_ratio,
        "write_policy": pools.hicache_write_policy,
        "storage_backend": args.hicache_storage_backend,
        "kv_tokens": kv_host, "state_slots": states_host,
        "bytes": kv_host * spec.kv_bytes_per_token + states_host * spec.ssm_state_bytes}}
