"""The one settings schema of the Marconi cache (``MarconiSettings``: each field's flag, help
and check), the launcher flags built from it and the hand-over to the scheduler processes as
JSON in ``SGLANG_MARCONI_SETTINGS``."""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Optional

from sglang_marconi.policy import defaults

logger = logging.getLogger("sglang_marconi.options")

BACKEND_NAME = "marconi"
POLICIES = ("lru", "marconi", "marconi+")
DEPRECATED_POLICIES = {"marconi+": "marconi"}
ENV_SETTINGS = "SGLANG_MARCONI_SETTINGS"
HOST_RULES = ("ranked", "lru")
GHOST_BRANCHES = ("beyond", "fill", "off")

# flags that the Marconi cache cannot honour (dest -> reason)
_CONFLICTS = {
    "disable_radix_cache": "--disable-radix-cache turns the prefix cache off",
    "enable_lmcache": "--enable-lmcache replaces the radix cache",
    "enable_session_radix_cache": "--enable-session-radix-cache is not supported",
    "enable_unified_cache_external_linker": "--enable-unified-cache-external-linker is not "
                                            "supported",
}
# SGLang's unified pool builds no int8 checkpoint pool (unified_memory_pool.py 1469): the
# flag would do nothing there
INT8_UNIFIED = ("--enable-int8-mamba-checkpoint does nothing with --enable-unified-memory "
                "(SGLang's unified pool builds no checkpoint pool, unified_memory_pool.py "
                "1469); drop one of them")


def _alpha(value):
    try:
        alpha = None if value is None else float(value)
    except (TypeError, ValueError):
        alpha = math.nan
    if alpha is not None and not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"a number >= 0, got {value!r}")
    return alpha


def _states(value):
    value = int(value)
    if value == 0 or value < -1:
        raise ValueError(f"a positive integer or -1 (no cap), got {value}")
    return value


def _one_of(choices):
    def check(value):
        if value not in choices:
            raise ValueError(f"one of {', '.join(choices)}, got {value!r}")
        return value
    return check


def _limit(value):
    value = int(value)
    if value < -1:
        raise ValueError(f"an integer >= -1, got {value}")
    return value


def _non_negative(value):
    value = float(value)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"a finite number >= 0, got {value}")
    return value


def _fraction(value):
    value = float(value)
    if not 0 <= value <= 1:
        raise ValueError(f"a number in [0, 1], got {value}")
    return value


def _setting(default, check, help, flag=None, metavar=None, choices=None):
    return field(default=default, metadata={"check": check, "help": help, "flag": flag,
                                            "metavar": metavar, "choices": choices})


@dataclass(frozen=True)
class MarconiSettings:
    """What the Marconi cache needs beyond SGLang's arguments, one field a setting."""

    alpha: Optional[float] = _setting(
        None, _alpha, flag="--marconi-alpha", metavar="A",
        help="Rank victims by the paper's rule instead: recency plus A times FLOP "
             "efficiency, min-max normalised (A >= 0; 0 is LRU). Default: unset, the "
             "reuse-weighted ranking with learned end-state admission.")
    max_states_per_request: int = _setting(
        defaults.SERVER_MAX_STATES_PER_REQUEST, _states,
        flag="--marconi-max-states-per-request", metavar="N",
        help="SSM states one request may leave in the tree: the branch point and the final "
             "state first, then chunk-boundary states (2 is the paper's admission; -1, the "
             "default, admits every state SGLang takes and lets eviction choose).")
    host_rule: str = _setting(
        defaults.HOST_RULE, _one_of(HOST_RULES), flag="--marconi-host-rule", choices=HOST_RULES,
        help="With --enable-hierarchical-cache: ranked (default) ranks host victims by the "
             "FLOPs a host hit saves net of its PCIe load per host byte; lru leaves them to "
             "SGLang's host LRU.")
    renormalise_limit: int = _setting(
        defaults.RENORMALISE_LIMIT, _limit,
        help="With an alpha: refresh the min-max bounds over every candidate at each eviction "
             "walk while a queue holds at most this many (-1: always); above it, amortised.")
    ghost_factor: float = _setting(
        defaults.GHOST_FACTOR, _non_negative,
        help="Without an alpha: the ghost index remembers this many times the KV pool's "
             "token slots (8 bytes an id; 0 turns it and end-state admission off).")
    branch_bonus: float = _setting(
        defaults.BRANCH_BONUS, _non_negative,
        help="Without an alpha: the reuse weight a node gains once it was a branch point.")
    chain_weight: Optional[float] = _setting(
        defaults.CHAIN_WEIGHT, _alpha,
        help="Without an alpha: the reuse weight of a chain state (one child, never a "
             "branch point); unset: learned on the ghost index.")
    ghost_branch: str = _setting(
        "fill", _one_of(GHOST_BRANCHES),
        help="Without an alpha, under extra_buffer: where the ghost index's branch point is "
             "snapshotted in the prefill: fill (only where SGLang's match found none), "
             "beyond (also in place of SGLang's own branch when deeper) or off.")
    decay: bool = _setting(
        False, bool,
        help="Without an alpha: discount the reuse-weighted ranking by exp(-age / tau), tau "
             "the mean reuse distance learned on the hits, instead of GDSF aging.")
    end_threshold: float = _setting(
        defaults.END_THRESHOLD, _fraction,
        help="Without an alpha: end-of-request states are admitted while the measured rate "
             "at which later requests reach them is at least this (0 admits all).")

    def __post_init__(self):
        for f in dataclasses.fields(self):
            try:
                object.__setattr__(self, f.name, f.metadata["check"](getattr(self, f.name)))
            except (TypeError, ValueError) as exc:
                name = f.metadata["flag"] or f"MarconiSettings.{f.name}"
                raise ValueError(f"{name}: expected {exc}") from None

    @property
    def plus(self) -> bool:
        """The reuse-weighted ranking (no alpha), the product's default."""
        return self.alpha is None

    @property
    def policy_name(self) -> str:
        return "marconi" if self.plus else f"marconi (paper's ranking, alpha {self.alpha:g})"

    def to_env(self) -> dict:
        return {ENV_SETTINGS: json.dumps(dataclasses.asdict(self), sort_keys=True)}

    @classmethod
    def from_env(cls, environ=None) -> "MarconiSettings":
        env = os.environ if environ is None else environ
        text = env.get(ENV_SETTINGS)
        if not text:
            return cls()
        try:
            values = json.loads(text)
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(values) - known)
            if unknown:
                raise ValueError(f"unknown field(s) {', '.join(unknown)}")
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad {ENV_SETTINGS}: {exc}") from None


def flag_fields():
    """The settings fields the launcher has a flag for, in order."""
    return [f for f in dataclasses.fields(MarconiSettings) if f.metadata["flag"]]


def check_host_tier(args) -> None:
    """HiCache works with every write policy, but not unified or buffer_only."""
    if getattr(args, "enable_unified_memory", False):
        raise ValueError("--cache-policy marconi: --enable-hierarchical-cache with "
                         "--enable-unified-memory is not supported (drop one of them)")
    mode = getattr(args, "hicache_host_memory_mode", "cache")
    if mode not in (None, "cache"):
        raise ValueError(f"--cache-policy marconi: --hicache-host-memory-mode {mode} is not "
                         "supported (only the host-cache mode, the default)")


def _arg_type(f):
    def parse(text):
        try:
            return f.metadata["check"](text)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(f"expected {exc}") from None
    parse.__name__ = f.name
    return parse


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--cache-policy`` and the settings' flags (defaults None: 'given' is told)."""
    if any("--cache-policy" in a.option_strings for a in parser._actions):
        return  # already added (the hook may run twice on one parser)
    group = parser.add_argument_group("Marconi prefix caching (sglang-marconi)")
    group.add_argument("--cache-policy", dest="cache_policy", choices=POLICIES, default=None,
                       help="Prefix-cache policy for hybrid attention+SSM models: lru = "
                            "stock SGLang (default); marconi = FLOP-aware eviction and "
                            "admission (marconi+ is a deprecated alias).")
    add_settings_arguments(group)


def add_settings_arguments(group) -> None:
    """One argument per settings field with a flag (the launcher's, ``ab``'s)."""
    for f in flag_fields():
        default = f.default
        group.add_argument(f.metadata["flag"], dest="marconi_" + f.name, type=_arg_type(f),
                           default=None, metavar=f.metadata["metavar"],
                           choices=f.metadata["choices"],
                           help=f"{f.metadata['help']} (default: "
                                f"{'unset' if default is None else default})")


def settings_given(args) -> dict:
    """The settings fields whose flags a parsed namespace sets."""
    given = {f.name: getattr(args, "marconi_" + f.name, None) for f in flag_fields()}
    return {k: v for k, v in given.items() if v is not None}


def settings_from_namespace(args) -> Optional[MarconiSettings]:
    """The settings a namespace asks for (None: not marconi); ValueError on conflicts."""
    policy = getattr(args, "cache_policy", None) or "lru"
    if policy in DEPRECATED_POLICIES:
        logger.warning("--cache-policy %s is deprecated: it is now --cache-policy %s",
                       policy, DEPRECATED_POLICIES[policy])
        policy = DEPRECATED_POLICIES[policy]
    given = settings_given(args)
    backend = getattr(args, "radix_cache_backend", None)
    if policy != "marconi":
        if given and backend != BACKEND_NAME:
            names = [f.metadata["flag"] for f in flag_fields() if f.name in given]
            raise ValueError(f"{', '.join(names)}: only apply with --cache-policy marconi")
        if backend != BACKEND_NAME:
            return None
    if backend not in (None, BACKEND_NAME):
        raise ValueError(f"--cache-policy marconi conflicts with --radix-cache-backend {backend}")
    for dest, reason in _CONFLICTS.items():
        if getattr(args, dest, False):
            raise ValueError(f"--cache-policy marconi: {reason}")
    if getattr(args, "enable_hierarchical_cache", False):
        check_host_tier(args)
    if (getattr(args, "enable_int8_mamba_checkpoint", False)
            and getattr(args, "enable_unified_memory", False)):
        raise ValueError(f"--cache-policy marconi: {INT8_UNIFIED}")
    speculative = getattr(args, "speculative_algorithm", None) or "NGRAM"
    if speculative.upper() != "NGRAM":  # NGRAM: tests/live/test_live_spec.py
        raise ValueError(f"--cache-policy marconi: --speculative-algorithm {speculative} is "
                         "not supported yet (its draft-model worker has not run with the "
                         "Marconi cache; NGRAM, which drafts without a model, has); use NGRAM, "
                         "drop it or use --cache-policy lru")
    if getattr(args, "mamba_radix_cache_strategy", None) == "extra_buffer_lazy":
        raise ValueError("--cache-policy marconi: --mamba-radix-cache-strategy extra_buffer_lazy "
                         "is not supported yet (its lazily allocated track slots have not run "
                         "under the Marconi cache's admission); use extra_buffer")
    eviction = getattr(args, "radix_eviction_policy", "lru")
    if eviction not in (None, "lru"):
        raise ValueError("--cache-policy marconi replaces the eviction order; drop "
                         f"--radix-eviction-policy {eviction}")
    if backend == BACKEND_NAME and not given:  # the Python API: the handed-over settings
        return MarconiSettings.from_env()
    return MarconiSettings(**given)


def apply_to_namespace(args, environ=None) -> Optional[MarconiSettings]:
    """Validate, select the ``marconi`` backend and hand the settings to subprocesses."""
    settings = settings_from_namespace(args)
    if settings is None:
        return None
    args.radix_cache_backend = BACKEND_NAME
    env = os.environ if environ is None else environ
    env.update(settings.to_env())
    return settings


def validate_server_args(server_args) -> Optional[MarconiSettings]:
    """A resolved ``ServerArgs`` from any entry point with ``radix_cache_backend="marconi"``: the
    flags' checks and the settings hand-over; a PD decode server passes. Raises ValueError."""
    if getattr(server_args, "radix_cache_backend", None) != BACKEND_NAME:
        return None
    if (getattr(server_args, "disaggregation_mode", None) == "decode"
            and getattr(server_args, "disable_radix_cache", False)):
        return None
    settings_from_namespace(server_args)
    return MarconiSettings.from_env()
