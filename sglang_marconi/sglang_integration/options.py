"""The ``--cache-policy`` / ``--marconi-*`` server flags and the settings they carry.

``add_cli_args`` adds the flags to SGLang's server parser. ``apply_to_namespace`` runs on
the parsed namespace before ``ServerArgs`` is built: it validates the flags, points
``--radix-cache-backend`` at the ``marconi`` backend and exports the settings as
``SGLANG_MARCONI_*`` environment variables, which SGLang's spawned scheduler processes
inherit (``ServerArgs`` itself only keeps its own fields). The backend reads them back
with ``MarconiSettings.from_env``.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Optional, Union

BACKEND_NAME = "marconi"
POLICIES = ("lru", "marconi")
ENV_ALPHA = "SGLANG_MARCONI_ALPHA"
ENV_BOOTSTRAP = "SGLANG_MARCONI_BOOTSTRAP_MULTIPLIER"
ENV_MAX_STATES = "SGLANG_MARCONI_MAX_STATES_PER_REQUEST"

# flags that the Marconi cache cannot honour (dest -> reason)
_CONFLICTS = {
    "disable_radix_cache": "--disable-radix-cache turns the prefix cache off",
    "enable_hierarchical_cache": "--enable-hierarchical-cache (host offload) is not supported",
    "enable_lmcache": "--enable-lmcache replaces the radix cache",
    "enable_session_radix_cache": "--enable-session-radix-cache is not supported",
    "enable_unified_cache_external_linker": "--enable-unified-cache-external-linker is not "
                                            "supported",
    "enable_int8_mamba_checkpoint": "--enable-int8-mamba-checkpoint is not supported",
}


@dataclass(frozen=True)
class MarconiSettings:
    """What the Marconi cache needs beyond SGLang's own arguments."""

    alpha: Union[float, str] = "auto"  # a number >= 0, or "auto" (bootstrap tuning)
    bootstrap_multiplier: float = 5.0  # k: tune after k x (requests until first eviction)
    max_states_per_request: int = -1   # states one request may leave in the tree; -1: no cap

    def __post_init__(self):
        parse_alpha(self.alpha)
        if not self.bootstrap_multiplier > 0:
            raise ValueError("--marconi-bootstrap-multiplier must be > 0, "
                             f"got {self.bootstrap_multiplier}")
        if self.max_states_per_request == 0 or self.max_states_per_request < -1:
            raise ValueError("--marconi-max-states-per-request must be a positive integer "
                             f"or -1 (no cap), got {self.max_states_per_request}")

    @property
    def auto_alpha(self) -> bool:
        return self.alpha == "auto"

    def to_env(self) -> dict:
        return {ENV_ALPHA: str(self.alpha),
                ENV_BOOTSTRAP: repr(float(self.bootstrap_multiplier)),
                ENV_MAX_STATES: str(int(self.max_states_per_request))}

    @classmethod
    def from_env(cls, environ=None) -> "MarconiSettings":
        env = os.environ if environ is None else environ
        default = cls()
        try:
            return cls(
                alpha=parse_alpha(env.get(ENV_ALPHA, default.alpha)),
                bootstrap_multiplier=float(env.get(ENV_BOOTSTRAP,
                                                   default.bootstrap_multiplier)),
                max_states_per_request=int(env.get(ENV_MAX_STATES,
                                                   default.max_states_per_request)),
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad SGLANG_MARCONI_* setting: {exc}") from None


def parse_alpha(text) -> Union[float, str]:
    """``auto`` or a number >= 0 (argparse ``type``; raises ValueError otherwise)."""
    if isinstance(text, str) and text.strip().lower() == "auto":
        return "auto"
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"--marconi-alpha must be a number >= 0 or 'auto', got {text!r}") \
            from None
    if not value >= 0:
        raise ValueError(f"--marconi-alpha must be >= 0, got {text!r}")
    return value


def _alpha_arg(text):
    try:
        return parse_alpha(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Add the Marconi flags (defaults None, so 'given' can be told from 'default')."""
    if any("--cache-policy" in a.option_strings for a in parser._actions):
        return  # already added (the hook may run twice on one parser)
    group = parser.add_argument_group("Marconi prefix caching (sglang-marconi)")
    group.add_argument("--cache-policy", dest="cache_policy", choices=POLICIES, default=None,
                       help="Prefix-cache eviction/admission policy for hybrid attention+SSM "
                            "models: lru = stock SGLang (default), marconi = FLOP-aware "
                            "Marconi (MLSys 2025).")
    group.add_argument("--marconi-alpha", dest="marconi_alpha", type=_alpha_arg, default=None,
                       help="Weight of FLOP efficiency against recency (0 = LRU), or 'auto' "
                            "to tune it from the first requests (default: auto).")
    group.add_argument("--marconi-bootstrap-multiplier", dest="marconi_bootstrap_multiplier",
                       type=float, default=None,
                       help="With --marconi-alpha auto: tune once k x (requests before the "
                            "first eviction) requests were seen (default 5).")
    group.add_argument("--marconi-max-states-per-request", dest="marconi_max_states",
                       type=int, default=None,
                       help="SSM states one request may leave in the tree: the branch point "
                            "and the final state first, then chunk-boundary states (2 = the "
                            "paper's admission; default -1 = no cap: SGLang's own states, "
                            "with FLOP-aware eviction deciding which to keep).")


def settings_from_namespace(args) -> Optional[MarconiSettings]:
    """The settings a parsed namespace asks for (None when the policy is not marconi).

    Raises ValueError for flags that conflict with ``--cache-policy marconi`` or that only
    make sense with it.
    """
    policy = getattr(args, "cache_policy", None) or "lru"
    given = {name: getattr(args, dest, None) for name, dest in (
        ("--marconi-alpha", "marconi_alpha"),
        ("--marconi-bootstrap-multiplier", "marconi_bootstrap_multiplier"),
        ("--marconi-max-states-per-request", "marconi_max_states"))}
    backend = getattr(args, "radix_cache_backend", None)
    if policy != "marconi":
        stray = [name for name, value in given.items() if value is not None]
        if stray and backend != BACKEND_NAME:
            raise ValueError(f"{', '.join(stray)}: only apply with --cache-policy marconi")
        if backend != BACKEND_NAME:
            return None
    if backend not in (None, BACKEND_NAME):
        raise ValueError(f"--cache-policy marconi conflicts with --radix-cache-backend "
                         f"{backend}")
    for dest, reason in _CONFLICTS.items():
        if getattr(args, dest, False):
            raise ValueError(f"--cache-policy marconi: {reason}")
    eviction = getattr(args, "radix_eviction_policy", "lru")
    if eviction not in (None, "lru"):
        raise ValueError("--cache-policy marconi replaces the eviction order; drop "
                         f"--radix-eviction-policy {eviction}")
    default = MarconiSettings()
    return MarconiSettings(
        alpha=default.alpha if given["--marconi-alpha"] is None else given["--marconi-alpha"],
        bootstrap_multiplier=(default.bootstrap_multiplier
                              if given["--marconi-bootstrap-multiplier"] is None
                              else given["--marconi-bootstrap-multiplier"]),
        max_states_per_request=(default.max_states_per_request
                                if given["--marconi-max-states-per-request"] is None
                                else given["--marconi-max-states-per-request"]),
    )


def apply_to_namespace(args, environ=None) -> Optional[MarconiSettings]:
    """Validate, select the ``marconi`` backend and export the settings for subprocesses."""
    settings = settings_from_namespace(args)
    if settings is None:
        return None
    args.radix_cache_backend = BACKEND_NAME
    env = os.environ if environ is None else environ
    env.update(settings.to_env())
    return settings
