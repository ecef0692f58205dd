"""The ``marconi`` radix-cache backend: SGLang's registry calls ``marconi_cache_factory``
in each scheduler process to build the tree cache."""
from __future__ import annotations

import functools
import logging

from sglang_marconi.model.dtypes import KV_CACHE_DTYPES
from sglang_marconi.sglang_integration.options import MarconiSettings, check_host_tier

logger = logging.getLogger("sglang_marconi.cache")


def model_spec(model_config, server_args=None):
    """The served model's cost model, from its HF config and the server's flags."""
    from sglang_marconi.model import spec_from_hf_config

    hf = getattr(model_config, "hf_text_config", None) or model_config.hf_config
    # the dtype the server resolved (``--dtype``; ``auto`` serves a float32 config in float16)
    flags = {"dtype": str(model_config.dtype)} if getattr(model_config, "dtype", None) else {}
    if server_args is not None:
        kv = getattr(server_args, "kv_cache_dtype", None) or "auto"
        flags.update(kv_cache_dtype=kv if kv in KV_CACHE_DTYPES else "auto",
                     tp_size=int(getattr(server_args, "tp_size", 1) or 1))
    try:
        return spec_from_hf_config(hf, **flags)
    except Exception as exc:
        arch = getattr(hf, "architectures", None) or [type(hf).__name__]
        raise ValueError(f"--cache-policy marconi: no cost model for {arch[0]}: {exc}") from None


def marconi_cache_factory(ctx, settings: MarconiSettings | None = None):
    """``MarconiUnifiedRadixCache``, built the way SGLang builds its hybrid cache."""
    from sglang.srt.mem_cache.registry import (create_unified_radix_cache,
                                               default_radix_cache_factory)
    from sglang.srt.runtime_context import get_memory, get_server_args

    from sglang_marconi.sglang_integration.cache import MarconiUnifiedRadixCache

    if not ctx.is_hybrid_ssm:
        arch = getattr(ctx.model_config.hf_config, "architectures", None) or ["this model"]
        raise ValueError(f"--cache-policy marconi needs a hybrid attention+SSM model; {arch[0]} "
                         "has no SSM/linear-attention layers (use --cache-policy lru)")
    if ctx.is_hybrid_swa:
        raise ValueError("--cache-policy marconi does not support sliding-window hybrids")
    if ctx.disable_radix_cache:
        # A PD decode server: SGLang turns the radix cache off after flag validation; no
        # prefix cache, no policy: stock behaviour.
        logger.info("--cache-policy marconi: the radix cache is disabled here (e.g. a "
                    "PD decode server); using SGLang's default cache")
        return default_radix_cache_factory(ctx)
    if ctx.enable_hierarchical_cache:
        check_host_tier(get_memory())
    eviction = get_memory().radix_eviction_policy
    if eviction not in (None, "lru"):
        raise ValueError("--cache-policy marconi replaces the eviction order; drop "
                         f"--radix-eviction-policy {eviction}")
    settings = settings or MarconiSettings.from_env()
    spec = model_spec(ctx.model_config, get_server_args())
    cache_class = functools.partial(MarconiUnifiedRadixCache, settings=settings, spec=spec,
                                    spec_from_pools=True)
    return create_unified_radix_cache(ctx, cache_class=cache_class)


def native_cache_factory(ctx, memory):
    """Entry point for SGLang patched with ``patches/sglang-0.5.23-cache-policy.patch``."""
    from sglang_marconi.sglang_integration.options import DEPRECATED_POLICIES, flag_fields

    policy = getattr(memory, "cache_policy", "marconi")
    if policy in DEPRECATED_POLICIES:
        logger.warning("--cache-policy %s is deprecated: it is now --cache-policy %s",
                       policy, DEPRECATED_POLICIES[policy])
    given = {f.name: getattr(memory, f"marconi_{f.name}", None) for f in flag_fields()}
    settings = MarconiSettings(**{k: v for k, v in given.items() if v is not None})
    return marconi_cache_factory(ctx, settings)
