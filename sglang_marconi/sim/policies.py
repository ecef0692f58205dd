"""Policy names of the paper's planning simulator (``sim --paper``) and the cache each builds:
``NAME[:key=value...]`` for ``vllm+``, ``paper-sglang+``, ``marconi``, ``infinite``,
``marconi+`` and ``offline``; every policy takes ``max_states`` (default 2)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from sglang_marconi.errors import UserError
from sglang_marconi.policy import defaults
from sglang_marconi.policy.cache import PrefixCache
from sglang_marconi.policy.likelihood import ReuseWeight
from sglang_marconi.policy.offline import offline_cache

# names the planning simulator does not run: an error that says what to write instead
NOT_HERE = {
    "sglang+": "policy 'sglang+' was renamed: write paper-sglang+ for the paper's LRU "
               "baseline (Marconi admission, LRU); stock SGLang as a server runs it is "
               "`sim` without --paper",
    "sglang": "policy 'sglang' is gone from `sim --paper`: `sim` without --paper runs "
              "SGLang's own cache objects (stock and marconi, --caches)",
}


@dataclass(frozen=True)
class PolicySpec:
    label: str
    name: str
    options: tuple  # ((key, value), ...)

    def option(self, key, default=None):
        return dict(self.options).get(key, default)


def parse_policy(text: str) -> PolicySpec:
    parts = [p for p in text.strip().split(":")]
    name = parts[0]
    if name in NOT_HERE:
        raise UserError(NOT_HERE[name])
    if name not in POLICY_BUILDERS:
        raise UserError(f"unknown policy {name!r}; known: {', '.join(POLICY_BUILDERS)}")
    options = []
    for part in parts[1:]:
        if "=" not in part:
            raise UserError(f"policy {text!r}: option {part!r} must be key=value")
        key, value = part.split("=", 1)
        if key not in POLICY_OPTIONS[name]:
            raise UserError(f"policy {text!r}: unknown option {key!r}; "
                            f"{name} takes: {', '.join(POLICY_OPTIONS[name]) or 'none'}")
        options.append((key, value))
    return PolicySpec(text.strip(), name, tuple(options))


def parse_policies(text: str) -> list[PolicySpec]:
    specs = [parse_policy(p) for p in text.split(",") if p.strip()]
    if not specs:
        raise UserError("--policies is empty")
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise UserError(f"--policies names a policy twice: {text}")
    return specs


def _number(policy: PolicySpec, key: str, cast, default, minimum=None):
    raw = policy.option(key)
    if raw is None:
        return default
    try:
        value = cast(raw)
    except ValueError:
        raise UserError(f"policy {policy.label!r}: option {key}={raw!r} is not a "
                        f"{cast.__name__}") from None
    if minimum is not None and value < minimum:
        raise UserError(f"policy {policy.label!r}: option {key} must be >= {minimum}")
    return value


def _alpha(policy: PolicySpec, default="auto"):
    raw = policy.option("alpha", default)
    if raw in ("auto", "online"):
        return raw
    return _number(policy, "alpha", float, 0.0, 0.0)


def build_cache(policy: PolicySpec, spec, capacity, grid: int = 1, trace=None) -> PrefixCache:
    if policy.name == "offline":
        if trace is None:
            raise UserError("the offline policy needs the whole trace")
        return _offline(policy, spec, capacity, grid, trace)
    return POLICY_BUILDERS[policy.name](policy, spec, capacity, grid)


def _offline(p, spec, cap, grid, trace):
    ghost = _number(p, "ghost", float, defaults.GHOST_FACTOR, 0.0)
    return offline_cache(spec, cap, trace.requests, grid,
                         _number(p, "max_states", int, defaults.PAPER_MAX_STATES_PER_REQUEST,
                                 0), ghost_budget(ghost, spec, cap))


def _common(policy):
    return dict(max_states_per_request=_number(policy, "max_states", int,
                                                 defaults.PAPER_MAX_STATES_PER_REQUEST, 0))


def _online(p: PolicySpec) -> dict:
    out = {}
    if p.option("alphas"):
        try:
            out["alphas"] = tuple(float(x) for x in p.option("alphas").split("/"))
        except ValueError:
            raise UserError(f"policy {p.label!r}: alphas must be numbers separated by '/'") from None
    for key, cast in (("window", int), ("period", int), ("hysteresis", float), ("sample", float)):
        if p.option(key) is not None:
            out[key] = _number(p, key, cast, None, 0)
    return out


def ghost_budget(ghost: float, spec, cap) -> int | None:
    """Tokens the ghost index remembers: ``ghost`` x the KV tokens the capacity holds."""
    if not cap or not ghost:
        return None
    per_token = spec.kv_bytes_per_token or spec.ssm_state_bytes / 4096
    return max(1, int(ghost * (cap / per_token)))


def _marconi(p, spec, cap, grid):
    return PrefixCache(spec, cap, alpha=_alpha(p), grid=grid,
                       bootstrap_multiplier=_number(p, "k", float,
                                                    defaults.BOOTSTRAP_MULTIPLIER, 0.1),
                       online=_online(p), **_common(p))


def _marconi_plus(p, spec, cap, grid):
    weight = ReuseWeight(branch_bonus=_number(p, "bonus", float, defaults.BRANCH_BONUS, 0.0),
                         half_life=_number(p, "half_life", float, math.inf, 1.0),
                         chain_weight=_number(p, "chain", float, defaults.CHAIN_WEIGHT, 0.0))
    ghost = _number(p, "ghost", float, defaults.GHOST_FACTOR, 0.0)
    ghost_tokens = ghost_budget(ghost, spec, cap)
    threshold = _number(p, "end_threshold", float, defaults.END_THRESHOLD, 0.0) if ghost_tokens else None
    return PrefixCache(spec, cap, grid=grid, reuse_weight=weight, ghost_tokens=ghost_tokens,
                       end_threshold=threshold, **_common(p))


POLICY_BUILDERS = {
    "vllm+": lambda p, spec, cap, grid: PrefixCache(
        spec, cap, alpha=0.0, admission="block", block=_number(p, "block", int, 32, 1), grid=grid,
        **_common(p)),
    "paper-sglang+": lambda p, spec, cap, grid: PrefixCache(spec, cap, alpha=0.0, grid=grid,
                                                      **_common(p)),
    "marconi": _marconi,
    "infinite": lambda p, spec, cap, grid: PrefixCache(spec, None, alpha=0.0, grid=grid,
                                                       **_common(p)),
    "marconi+": _marconi_plus,
    "offline": None,  # built by build_cache: it needs the trace
}
POLICY_OPTIONS = {
    "vllm+": ("block", "max_states"),
    "paper-sglang+": ("max_states",),
    "marconi": ("alpha", "k", "max_states", "alphas", "window", "period", "hysteresis",
                "sample"),
    "infinite": ("max_states",),
    "marconi+": ("bonus", "half_life", "chain", "ghost", "end_threshold", "max_states"),
    "offline": ("ghost", "max_states"),
}
