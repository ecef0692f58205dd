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
import math
import os
from dataclasses import dataclass
from typing import Optional, Union

from sglang_marconi.policy import defaults

BACKEND_NAME = "marconi"
POLICIES = ("lru", "marconi", "marconi+")
ENV_ALPHA = "SGLANG_MARCONI_ALPHA"
ENV_BOOTSTRAP = "SGLANG_MARCONI_BOOTSTRAP_MULTIPLIER"
ENV_MAX_STATES = "SGLANG_MARCONI_MAX_STATES_PER_REQUEST"
ENV_ONLINE_ALPHAS = "SGLANG_MARCONI_ONLINE_ALPHAS"
ENV_ONLINE_WINDOW = "SGLANG_MARCONI_ONLINE_WINDOW"
ENV_ONLINE_SAMPLE = "SGLANG_MARCONI_ONLINE_SAMPLE"
ENV_RENORMALISE = "SGLANG_MARCONI_RENORMALISE_LIMIT"
ENV_PLUS = "SGLANG_MARCONI_PLUS"
ENV_GHOST_FACTOR = "SGLANG_MARCONI_GHOST_FACTOR"
ENV_END_THRESHOLD = "SGLANG_MARCONI_END_THRESHOLD"
ENV_HOST_RULE = "SGLANG_MARCONI_HOST_RULE"
HOST_RULES = ("ranked", "lru")
ALPHA_MODES = ("auto", "online")

# flags that the Marconi cache cannot honour (dest -> reason)
_CONFLICTS = {
    "disable_radix_cache": "--disable-radix-cache turns the prefix cache off",
    "enable_lmcache": "--enable-lmcache replaces the radix cache",
    "enable_session_radix_cache": "--enable-session-radix-cache is not supported",
    "enable_unified_cache_external_linker": "--enable-unified-cache-external-linker is not "
                                            "supported",
    "enable_int8_mamba_checkpoint": "--enable-int8-mamba-checkpoint is not supported",
}


def check_host_tier(args) -> None:
    """``--enable-hierarchical-cache`` works with the Marconi cache in SGLang's host-cache
    mode, every write policy (tests/test_sglang_hicache.py); two combinations are not
    built: the unified buffer's joint walk has no host tier, and buffer_only host memory
    stages through the storage backend without a host cache."""
    if getattr(args, "enable_unified_memory", False):
        raise ValueError("--cache-policy marconi: --enable-hierarchical-cache with "
                         "--enable-unified-memory is not supported (drop one of them)")
    mode = getattr(args, "hicache_host_memory_mode", "cache")
    if mode not in (None, "cache"):
        raise ValueError(f"--cache-policy marconi: --hicache-host-memory-mode {mode} is not "
                         "supported (only the host-cache mode, the default)")


@dataclass(frozen=True)
class MarconiSettings:
    """What the Marconi cache needs beyond SGLang's own arguments."""

    alpha: Union[float, str] = defaults.SERVER_ALPHA_MODE  # a number >= 0, "auto" (bootstrap) or "online"
    bootstrap_multiplier: float = defaults.BOOTSTRAP_MULTIPLIER  # k: tune after k x (requests until first eviction)
    max_states_per_request: int = defaults.SERVER_MAX_STATES_PER_REQUEST  # states one request may leave in the tree; -1: no cap
    # alpha = online: the shadow caches' alphas, the sliding window (requests) and the
    # fraction of prefix families (by first token) the shadows see
    online_alphas: tuple = defaults.ONLINE_ALPHAS
    online_window: int = defaults.ONLINE_WINDOW
    online_sample: float = defaults.ONLINE_SAMPLE
    # refresh the min-max bounds of the utility over all candidates at every eviction walk
    # (the paper's rule, O(candidates) per walk) while a queue holds at most this many
    # candidates; above it, the amortised refresh (O(log n) per eviction). -1: always.
    renormalise_limit: int = defaults.RENORMALISE_LIMIT
    # marconi+ (docs/beyond.md): victims ranked by reuse-weighted FLOPs saved per byte with
    # GDSF aging (no alpha), a ghost index of ``ghost_factor`` x the KV pool's tokens for
    # branch points past evictions, end-of-request states admitted while their measured
    # reuse rate is >= ``end_threshold``
    plus: bool = False
    ghost_factor: float = defaults.GHOST_FACTOR
    end_threshold: float = defaults.END_THRESHOLD
    # HiCache's host tier: "ranked" ranks host victims by the two-tier rule
    # (policy/host_tier.py), "lru" leaves them to SGLang's host LRU
    host_rule: str = defaults.HOST_RULE

    def __post_init__(self):
        parse_alpha(self.alpha)
        if not (isinstance(self.renormalise_limit, int) and self.renormalise_limit >= -1):
            raise ValueError("--marconi-renormalise-limit must be an integer >= -1, "
                             f"got {self.renormalise_limit!r}")
        if not (math.isfinite(self.ghost_factor) and self.ghost_factor >= 0):
            raise ValueError("--marconi-ghost-factor must be a finite number >= 0, "
                             f"got {self.ghost_factor}")
        if self.plus and self.alpha != 0.0:
            object.__setattr__(self, "alpha", 0.0)  # marconi+ ranks without an alpha
        if self.host_rule not in HOST_RULES:
            raise ValueError(f"--marconi-host-rule must be one of {', '.join(HOST_RULES)}, "
                             f"got {self.host_rule!r}")
        if not 0 <= self.end_threshold <= 1:
            raise ValueError("--marconi-end-threshold must be in [0, 1], "
                             f"got {self.end_threshold}")
        if not self.bootstrap_multiplier > 0:
            raise ValueError("--marconi-bootstrap-multiplier must be > 0, "
                             f"got {self.bootstrap_multiplier}")
        if self.max_states_per_request == 0 or self.max_states_per_request < -1:
            raise ValueError("--marconi-max-states-per-request must be a positive integer "
                             f"or -1 (no cap), got {self.max_states_per_request}")
        object.__setattr__(self, "online_alphas", parse_alphas(self.online_alphas))
        if not (isinstance(self.online_window, int) and self.online_window > 0):
            raise ValueError("--marconi-online-window must be a positive integer, "
                             f"got {self.online_window!r}")
        if not 0 < self.online_sample <= 1:
            raise ValueError("--marconi-online-sample must be in (0, 1], "
                             f"got {self.online_sample}")

    @property
    def auto_alpha(self) -> bool:
        return self.alpha == "auto"

    @property
    def online_alpha(self) -> bool:
        return self.alpha == "online"

    @property
    def online_period(self) -> int:
        """Requests between two comparisons of the shadows: a quarter of the window."""
        return max(1, self.online_window // 4)

    def to_env(self) -> dict:
        return {ENV_ALPHA: str(self.alpha),
                ENV_BOOTSTRAP: repr(float(self.bootstrap_multiplier)),
                ENV_MAX_STATES: str(int(self.max_states_per_request)),
                ENV_ONLINE_ALPHAS: ",".join(repr(a) for a in self.online_alphas),
                ENV_ONLINE_WINDOW: str(int(self.online_window)),
                ENV_ONLINE_SAMPLE: repr(float(self.online_sample)),
                ENV_RENORMALISE: str(int(self.renormalise_limit)),
                ENV_PLUS: "1" if self.plus else "0",
                ENV_GHOST_FACTOR: repr(float(self.ghost_factor)),
                ENV_END_THRESHOLD: repr(float(self.end_threshold)),
                ENV_HOST_RULE: self.host_rule}

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
                online_alphas=parse_alphas(env.get(ENV_ONLINE_ALPHAS,
                                                   default.online_alphas)),
                online_window=int(env.get(ENV_ONLINE_WINDOW, default.online_window)),
                online_sample=float(env.get(ENV_ONLINE_SAMPLE, default.online_sample)),
                renormalise_limit=int(env.get(ENV_RENORMALISE, default.renormalise_limit)),
                plus=_parse_bool(env.get(ENV_PLUS, "0"), ENV_PLUS),
                ghost_factor=float(env.get(ENV_GHOST_FACTOR, default.ghost_factor)),
                end_threshold=float(env.get(ENV_END_THRESHOLD, default.end_threshold)),
                host_rule=env.get(ENV_HOST_RULE, default.host_rule),
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad SGLANG_MARCONI_* setting: {exc}") from None


def _parse_bool(text, name: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{name} must be 0 or 1, got {text!r}")


def parse_alpha(text) -> Union[float, str]:
    """``auto``, ``online`` or a number >= 0 (argparse ``type``; raises ValueError
    otherwise)."""
    if isinstance(text, str) and text.strip().lower() in ALPHA_MODES:
        return text.strip().lower()
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError("--marconi-alpha must be a number >= 0, 'auto' or 'online', "
                         f"got {text!r}") from None
    if not value >= 0:
        raise ValueError(f"--marconi-alpha must be >= 0, got {text!r}")
    return value


def parse_alphas(text) -> tuple:
    """``--marconi-online-alphas``: distinct numbers >= 0, comma-separated (or a sequence)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    try:
        values = tuple(float(x) for x in items if str(x).strip())
    except (TypeError, ValueError):
        raise ValueError("--marconi-online-alphas must be comma-separated numbers >= 0, "
                         f"got {text!r}") from None
    if not values or any(not v >= 0 for v in values) or len(set(values)) != len(values):
        raise ValueError("--marconi-online-alphas must be distinct numbers >= 0, "
                         f"got {text!r}")
    return values


def _alpha_arg(text):
    try:
        return parse_alpha(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _alphas_arg(text):
    try:
        return parse_alphas(text)
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
                            "Marconi (MLSys 2025), marconi+ = Marconi with reuse "
                            "likelihood, a ghost index and learned end-state admission "
                            "(no alpha; docs/beyond.md).")
    group.add_argument("--marconi-alpha", dest="marconi_alpha", type=_alpha_arg, default=None,
                       help="Weight of FLOP efficiency against recency (0 = LRU), 'auto' "
                            "to tune it once from the first requests, or 'online' to follow "
                            "the traffic with metadata-only shadow caches (default: "
                            f"{defaults.SERVER_ALPHA_MODE}).")
    group.add_argument("--marconi-bootstrap-multiplier", dest="marconi_bootstrap_multiplier",
                       type=float, default=None,
                       help="With --marconi-alpha auto: tune once k x (requests before the "
                            f"first eviction) requests were seen (default {defaults.BOOTSTRAP_MULTIPLIER:g}).")
    group.add_argument("--marconi-max-states-per-request", dest="marconi_max_states",
                       type=int, default=None,
                       help="SSM states one request may leave in the tree: the branch point "
                            "and the final state first, then chunk-boundary states (2 = the "
                            "paper's admission; default -1 = no cap: SGLang's own states, "
                            "with FLOP-aware eviction deciding which to keep).")
    group.add_argument("--marconi-renormalise-limit", dest="marconi_renormalise_limit",
                       type=int, default=None,
                       help="Refresh the min-max normalisation of the utility over all "
                            "candidates at every eviction walk, as the paper does, while a "
                            "pool has at most this many eviction candidates; above it the "
                            "refresh is amortised (O(log n) per eviction). -1: always per "
                            f"walk; 0: always amortised (default {defaults.RENORMALISE_LIMIT}).")
    group.add_argument("--marconi-ghost-factor", dest="marconi_ghost_factor", type=float,
                       default=None,
                       help="With --cache-policy marconi+: the ghost index remembers the "
                            "token ids of this many times the KV pool's token slots (host "
                            "memory, 8 bytes an id; 0 turns it and learned end-state "
                            f"admission off; default {defaults.GHOST_FACTOR:g}).")
    group.add_argument("--marconi-end-threshold", dest="marconi_end_threshold", type=float,
                       default=None,
                       help="With --cache-policy marconi+: end-of-request states are kept "
                            "while the measured rate at which later requests reach them is "
                            f"at least this (0 keeps them all; default {defaults.END_THRESHOLD:g}).")
    group.add_argument("--marconi-host-rule", dest="marconi_host_rule", choices=HOST_RULES,
                       default=None,
                       help="With --enable-hierarchical-cache: ranked = the host tier's "
                            "victims go by the FLOPs a host hit saves net of its PCIe load "
                            "per host byte (reuse-weighted and aged with marconi+, by the "
                            "alpha utility with marconi), and under "
                            "write_through_selective marconi+ keeps the end states it would "
                            "refuse (their insert counts toward the backup); lru = SGLang's "
                            f"host LRU, none of the rule (default {defaults.HOST_RULE}).")
    group.add_argument("--marconi-online-alphas", dest="marconi_online_alphas",
                       type=_alphas_arg, default=None,
                       help="With --marconi-alpha online: the alphas of the shadow caches, "
                            "comma-separated (default "
                            + ",".join(f"{a:g}" for a in defaults.ONLINE_ALPHAS) + ").")
    group.add_argument("--marconi-online-window", dest="marconi_online_window", type=int,
                       default=None,
                       help="With --marconi-alpha online: the sliding window, in finished "
                            "requests, over which the shadows' FLOPs saved are compared "
                            f"(every quarter window; default {defaults.ONLINE_WINDOW}).")
    group.add_argument("--marconi-online-sample", dest="marconi_online_sample", type=float,
                       default=None,
                       help="With --marconi-alpha online: the fraction of prefix families "
                            "(by first token) the shadows see, their capacity scaled alike "
                            f"(default {defaults.ONLINE_SAMPLE:g}).")


def settings_from_namespace(args) -> Optional[MarconiSettings]:
    """The settings a parsed namespace asks for (None when the policy is not marconi).

    Raises ValueError for flags that conflict with ``--cache-policy marconi`` or that only
    make sense with it.
    """
    policy = getattr(args, "cache_policy", None) or "lru"
    plus = policy == "marconi+"
    if plus:
        policy = "marconi"
    given = {name: getattr(args, dest, None) for name, dest in (
        ("--marconi-alpha", "marconi_alpha"),
        ("--marconi-bootstrap-multiplier", "marconi_bootstrap_multiplier"),
        ("--marconi-max-states-per-request", "marconi_max_states"),
        ("--marconi-renormalise-limit", "marconi_renormalise_limit"),
        ("--marconi-host-rule", "marconi_host_rule"),
        *_PLUS_FLAGS, *_ONLINE_FLAGS)}
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
    if getattr(args, "enable_hierarchical_cache", False):
        check_host_tier(args)
    speculative = getattr(args, "speculative_algorithm", None)
    if speculative:
        raise ValueError(f"--cache-policy marconi: --speculative-algorithm {speculative} is "
                         "not supported yet (no test shows its draft-token state tracking "
                         "correct with the Marconi cache); drop it or use --cache-policy lru")
    eviction = getattr(args, "radix_eviction_policy", "lru")
    if eviction not in (None, "lru"):
        raise ValueError("--cache-policy marconi replaces the eviction order; drop "
                         f"--radix-eviction-policy {eviction}")
    default = MarconiSettings()
    alpha = default.alpha if given["--marconi-alpha"] is None else given["--marconi-alpha"]
    if plus:
        stray = [name for name in ("--marconi-alpha", "--marconi-bootstrap-multiplier",
                                   "--marconi-renormalise-limit",
                                   *(n for n, _ in _ONLINE_FLAGS))
                 if given[name] is not None]
        if stray:
            raise ValueError(f"{', '.join(stray)}: marconi+ has no alpha (it ranks by "
                             "reuse-weighted FLOPs per byte); use --cache-policy marconi")
        alpha = 0.0
    plus_only = [name for name, _ in _PLUS_FLAGS if given[name] is not None]
    if plus_only and not plus:
        raise ValueError(f"{', '.join(plus_only)}: only apply with --cache-policy marconi+")
    online = [name for name, _ in _ONLINE_FLAGS if given[name] is not None]
    if online and alpha != "online":
        raise ValueError(f"{', '.join(online)}: only apply with --marconi-alpha online")

    def pick(name, field):
        return getattr(default, field) if given[name] is None else given[name]

    return MarconiSettings(
        alpha=alpha,
        bootstrap_multiplier=pick("--marconi-bootstrap-multiplier", "bootstrap_multiplier"),
        max_states_per_request=pick("--marconi-max-states-per-request",
                                    "max_states_per_request"),
        online_alphas=pick("--marconi-online-alphas", "online_alphas"),
        online_window=pick("--marconi-online-window", "online_window"),
        online_sample=pick("--marconi-online-sample", "online_sample"),
        renormalise_limit=pick("--marconi-renormalise-limit", "renormalise_limit"),
        plus=plus,
        ghost_factor=pick("--marconi-ghost-factor", "ghost_factor"),
        end_threshold=pick("--marconi-end-threshold", "end_threshold"),
        host_rule=pick("--marconi-host-rule", "host_rule"),
    )


_PLUS_FLAGS = (("--marconi-ghost-factor", "marconi_ghost_factor"),
               ("--marconi-end-threshold", "marconi_end_threshold"))
_ONLINE_FLAGS = (("--marconi-online-alphas", "marconi_online_alphas"),
                 ("--marconi-online-window", "marconi_online_window"),
                 ("--marconi-online-sample", "marconi_online_sample"))


def apply_to_namespace(args, environ=None) -> Optional[MarconiSettings]:
    """Validate, select the ``marconi`` backend and export the settings for subprocesses."""
    settings = settings_from_namespace(args)
    if settings is None:
        return None
    args.radix_cache_backend = BACKEND_NAME
    env = os.environ if environ is None else environ
    env.update(settings.to_env())
    return settings


def validate_server_args(server_args) -> Optional[MarconiSettings]:
    """A resolved ``ServerArgs`` from any entry point (``sglang.Engine(...)`` builds it
    without the command line): with ``radix_cache_backend="marconi"``, the flags' checks
    and messages on its fields and the ``SGLANG_MARCONI_*`` settings the backend reads.
    A PD decode server, whose radix cache SGLang turned off, passes (the backend steps
    aside). Raises ValueError."""
    if getattr(server_args, "radix_cache_backend", None) != BACKEND_NAME:
        return None
    if (getattr(server_args, "disaggregation_mode", None) == "decode"
            and getattr(server_args, "disable_radix_cache", False)):
        return None
    settings_from_namespace(server_args)
    return MarconiSettings.from_env()
