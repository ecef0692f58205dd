"""SGLang plugin (entry-point group ``sglang.srt.plugins``, name ``marconi``): ``register``
adds the ``marconi`` radix-cache backend and the ``ServerArgs`` hooks (flags, validation,
backend selection, the int8 checkpoint check) in every process SGLang starts."""
from __future__ import annotations

import logging

logger = logging.getLogger("sglang_marconi.plugin")

ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"
CHECK_SERVER_ARGS = "sglang.srt.server_args.ServerArgs.check_server_args"
INT8_CHECK = "handle_int8_mamba_checkpoint"  # a resolution step (arg_groups/mamba_hook.py)
_registered = False


def _after_add_cli_args(result, parser, *args, **kwargs):
    from sglang_marconi.sglang_integration.options import add_cli_args

    add_cli_args(parser)
    return result


def _has_native_flags(cls) -> bool:
    """SGLang patched with ``patches/`` declares the flags itself and routes the cache."""
    from sglang.srt.arg_groups.arg_utils import record_fields

    return any(f.name == "cache_policy" for f in record_fields(cls))


def _around_from_cli_args(original, cls, args, *rest, **kwargs):
    from sglang_marconi.sglang_integration.options import apply_to_namespace

    if _has_native_flags(cls):
        return original(cls, args, *rest, **kwargs)
    try:
        apply_to_namespace(args)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    return original(cls, args, *rest, **kwargs)


def _before_check_server_args(server_args, *args, **kwargs):
    """``ServerArgs`` from any entry point, resolved: the flags' checks."""
    from sglang_marconi.sglang_integration.options import validate_server_args

    if not _has_native_flags(type(server_args)):
        validate_server_args(server_args)


class _BuiltInCacheView:
    """``server_args`` with the ``marconi`` backend seen as the built-in cache."""

    def __init__(self, server_args):
        self._server_args = server_args

    @property
    def _resolved_overrides(self):
        own = getattr(self._server_args, "_resolved_overrides", None) or ()
        return [*own, ("sglang_marconi", {"radix_cache_backend": None})]

    def __getattr__(self, name):
        return getattr(self._server_args, name)


def _around_int8_check(server_args, previous):
    """SGLang refuses ``--enable-int8-mamba-checkpoint`` with any ``--radix-cache-backend``
    ("not int8-aware"); for ``marconi`` its other refusals (HiCache, LMCache) stand."""
    from sglang_marconi.sglang_integration.options import BACKEND_NAME

    if getattr(server_args, "radix_cache_backend", None) == BACKEND_NAME:
        server_args = _BuiltInCacheView(server_args)
    previous(server_args)


def register() -> None:
    """Register the backend and the flag hooks (idempotent)."""
    global _registered
    if _registered:
        return
    from sglang_marconi.sglang_version import check_sglang_version

    check_sglang_version()
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_marconi.sglang_integration.backend import marconi_cache_factory
    from sglang_marconi.sglang_integration.options import BACKEND_NAME

    if get_radix_cache_factory(BACKEND_NAME) is None:
        register_radix_cache_backend(BACKEND_NAME, marconi_cache_factory)
    HookRegistry.register(ADD_CLI_ARGS, _after_add_cli_args, HookType.AFTER)
    HookRegistry.register(FROM_CLI_ARGS, _around_from_cli_args, HookType.AROUND)
    HookRegistry.register(CHECK_SERVER_ARGS, _before_check_server_args, HookType.BEFORE)
    register_resolution_hook(INT8_CHECK)(_around_int8_check)
    _registered = True
    logger.debug("sglang-marconi plugin registered")
