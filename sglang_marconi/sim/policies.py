"""Policy names the simulator understands, and the cache each one builds.

``NAME[:key=value[:key=value...]]``, e.g. ``marconi:alpha=0.5``, ``vllm+:block=64``.

- ``sglang``: stock SGLang 0.5.23 as a server runs it (``extra_buffer``, one byte budget:
  the unified buffer), see ``policy.stock``: a state at every chunked-prefill boundary
  (``chunk``, --chunked-prefill-size, 8192; -1: off), SGLang's branch rule on the checkpoint grid
  lcm(64, ``page``) (--page-size, 64), the last prefill chunk's state, the last
  decode-track snapshot (``track``, --mamba-track-interval, 256), LRU over the tree's
  leaves; ``overlap=1``: the running request holds the second tracking slot of SGLang's
  overlap scheduler (default 0; ``ab``'s default overlap loop matches ``overlap=1``). ``kv_tokens=K:state_slots=S`` (both):
  SGLang's default static two pools instead of the byte budget (a KV pool of K token
  slots, a state pool of S slots, what ``ab --memory static`` builds; the capacity is then
  ignored; a state shortage runs SGLang's MAMBA walk). Takes no ``max_states`` and ignores
  the simulator's ``--grid``.
- ``vllm+``: a state at every ``block``-token boundary (32), LRU eviction.
- ``paper-sglang+``: Marconi admission, LRU eviction (alpha 0).
- ``marconi``: Marconi admission, FLOP-aware eviction, alpha tuned by bootstrap (``alpha=auto``,
  ``k`` = bootstrap multiplier), fixed (``alpha=0.7``) or online (``alpha=online``, shadow
  caches for ``alphas=0/0.5/1/2`` over a ``window``, re-decided every ``period`` requests,
  ``hysteresis``, miniature shadows with ``sample``=rate).
- ``infinite``: Marconi admission, unlimited capacity: the ceiling on the trace.
- ``marconi+``: Marconi admission plus reuse likelihood (see ``policy.likelihood``): victims
  ranked by expected FLOPs saved per byte with GDSF aging (``bonus`` for nodes that were
  branch points, hit counts with ``half_life`` in requests), a ghost index of ``ghost`` x the
  capacity's KV tokens for branch detection past evictions, and end-of-request states
  admitted only while their measured reuse rate is >= ``end_threshold``.
- ``offline``: knows the future (see ``policy.offline``): Belady-style eviction weighted by
  FLOPs saved per byte, end states kept only if reused later, the ghost index. A heuristic
  reference, not an optimum. ``materialise=sglang``: the same on the snapshots SGLang takes
  (below), no per-request cap: the mark for marconi+ inside SGLang.
Options every policy but ``sglang`` takes: ``max_states`` (per request, default 2).
``marconi`` and ``marconi+`` also take ``materialise=sglang``: keep only the states SGLang's
extra buffer snapshots, decided as the ``--cache-policy marconi`` plugin decides (chunk
boundaries at ``chunk`` (8192), the branch point inside its chunk, the last prefill chunk and
the last decode-track snapshot on ``track`` (256), grid lcm(64, ``page``)), with SGLang's
branch rule and the plugin's default of no per-request cap; with a fixed alpha or for
marconi+ inside the model of SGLang's unified buffer (``policy.in_sglang``: the plugin's
allocation-time joint walk; ``overlap=1``: 2 tracking slots, ``ab``'s default loop) or,
with ``kv_tokens=K:state_slots=S``, of its static pools (the plugin's FULL and MAMBA
walks), equal to ``ab``'s cache request for request (``scripts/bench_baseline_agreement.py
--caches marconi+ --memory unified|static``); ``alpha=auto|online`` keep the simulator's eviction (``materialise=plan``, the
default, keeps the states Marconi plans wherever they are, as the paper's simulator).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from sglang_marconi.errors import UserError
from sglang_marconi.policy import defaults
from sglang_marconi.policy.defaults import NO_CAP
from sglang_marconi.policy.admission import SGLangGrids, sglang_grid, sglang_track_grid
from sglang_marconi.policy.cache import PrefixCache
from sglang_marconi.policy.in_sglang import MarconiSGLangCache
from sglang_marconi.policy.likelihood import ReuseWeight
from sglang_marconi.policy.offline import offline_cache
from sglang_marconi.policy.stock import StockSGLangCache

BASE_POLICIES = ("vllm+", "paper-sglang+", "marconi", "infinite")
# names that meant something else before: an error that says what to write now
RENAMED = {"sglang+": "write paper-sglang+ for the paper's LRU baseline (Marconi admission, "
                      "LRU), or sglang for stock SGLang as a server runs it"}


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
    if name in RENAMED:
        raise UserError(f"policy {name!r} was renamed: {RENAMED[name]}")
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
    ghost_tokens = ghost_budget(ghost, spec, cap)
    grids = _materialise(p)
    default_cap = defaults.PAPER_MAX_STATES_PER_REQUEST if grids is None else NO_CAP
    return offline_cache(spec, cap, trace.requests, grid,
                         _number(p, "max_states", int, default_cap, 0), ghost_tokens, grids)


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


def ghost_budget(ghost: float, spec, cap, page: int | None = None) -> int | None:
    """Tokens the ghost index remembers: ``ghost`` times the KV tokens the capacity holds
    (for a model without attention layers, whose KV is free: ``ghost`` x the states it holds
    x 4096 tokens). ``page``: in whole pages, as the SGLang plugin counts its buffer's KV
    tokens (the allocator's size: ``materialise=sglang``)."""
    if not cap or not ghost:
        return None
    per_token = spec.kv_bytes_per_token or spec.ssm_state_bytes / 4096
    tokens = cap / per_token if page is None else cap // (page * per_token) * page
    return max(1, int(ghost * tokens))


def _marconi(p, spec, cap, grid):
    knobs = dict(bootstrap_multiplier=_number(p, "k", float, defaults.BOOTSTRAP_MULTIPLIER, 0.1),
                 online=_online(p))
    if _materialise(p) is not None:
        return _in_sglang(p, spec, cap, alpha=_alpha(p), knobs=knobs)
    return PrefixCache(spec, cap, alpha=_alpha(p), grid=grid, **knobs, **_common(p))


def _marconi_plus(p, spec, cap, grid):
    weight = ReuseWeight(branch_bonus=_number(p, "bonus", float, defaults.BRANCH_BONUS, 0.0),
                         half_life=_number(p, "half_life", float, math.inf, 1.0),
                         chain_weight=_number(p, "chain", float, defaults.CHAIN_WEIGHT, 0.0))
    ghost = _number(p, "ghost", float, defaults.GHOST_FACTOR, 0.0)
    grids = _materialise(p)
    pools = _static_pools(p, grids.page) if grids else None
    if pools is not None:  # the plugin's budget: factor x the KV allocator's size
        ghost_tokens = int(ghost * pools[0]) or None
    else:
        ghost_tokens = ghost_budget(ghost, spec, cap, grids.page if grids else None)
    threshold = _number(p, "end_threshold", float, defaults.END_THRESHOLD, 0.0) if ghost_tokens else None
    plus = dict(reuse_weight=weight, ghost_tokens=ghost_tokens, end_threshold=threshold)
    if _materialise(p) is not None:
        return _in_sglang(p, spec, cap, alpha=0.0, **plus)
    return PrefixCache(spec, cap, grid=grid, **plus, **_common(p))


def _materialise(p: PolicySpec):
    """``materialise=sglang``: keep only what SGLang snapshots (``admission.SGLangGrids``:
    ``chunk``, ``page``, ``track`` as the server's flags); ``plan`` (default): the states
    Marconi plans, wherever they are."""
    how = p.option("materialise", "plan")
    if how not in ("plan", "sglang"):
        raise UserError(f"policy {p.label!r}: materialise must be plan or sglang, got {how!r}")
    if how == "plan":
        for key in ("chunk", "page", "track", "overlap", "kv_tokens", "state_slots"):
            if p.option(key) is not None:
                raise UserError(f"policy {p.label!r}: option {key} needs materialise=sglang")
        return None
    page = _number(p, "page", int, 64, 1)
    grid = sglang_grid(page)
    return SGLangGrids(chunk=_number(p, "chunk", int, 8192), page=page, grid=grid,
                       track_grid=sglang_track_grid(grid, _number(p, "track", int, 256, 1)))


def _in_sglang(p: PolicySpec, spec, cap, alpha, knobs=None, **plus):
    """Marconi as the SGLang plugin runs it: SGLang's snapshot grids and branch rule and the
    plugin's default of no per-request cap (``max_states`` sets one). A fixed alpha or
    marconi+ runs inside the model of SGLang's unified buffer or static pools
    (``policy.in_sglang``: its walks, ``overlap=1``: the overlap loop's 2 tracking slots),
    ``alpha=auto|online`` keep the simulator's eviction (room
    made when a request's states are inserted, docs/usage.md)."""
    grids = _materialise(p)
    max_states = _number(p, "max_states", int, NO_CAP, 0)
    pools = _static_pools(p, grids.page)
    if alpha in ("auto", "online"):
        if pools is not None:
            raise UserError(f"policy {p.label!r}: static pools (kv_tokens, state_slots) "
                            "need a fixed alpha or marconi+")
        return PrefixCache(spec, cap, alpha=alpha, grid=grids.grid, branch_rule="kv",
                           max_states_per_request=max_states, materialise=grids,
                           **(knobs or {}), **plus)
    kv_tokens, state_slots = pools or (None, None)
    common = dict(grids=grids, max_states_per_request=max_states,
                  tracking_slots=2 if _number(p, "overlap", int, 0, 0) else 1,
                  kv_tokens=kv_tokens, state_slots=state_slots, **plus)
    return MarconiSGLangCache(spec, cap, alpha=alpha, **common)


def _static_pools(p: PolicySpec, page: int):
    """``kv_tokens=K:state_slots=S``: SGLang's default static pools, (K, S), or None for
    the byte budget (the unified buffer)."""
    kv_tokens = _number(p, "kv_tokens", int, None, 1)
    state_slots = _number(p, "state_slots", int, None, 1)
    if (kv_tokens is None) != (state_slots is None):
        raise UserError(f"policy {p.label!r}: static pools need both kv_tokens and "
                        "state_slots")
    if kv_tokens is not None and kv_tokens < page:
        raise UserError(f"policy {p.label!r}: kv_tokens must be >= the page ({page})")
    return None if kv_tokens is None else (kv_tokens, state_slots)


def _sglang(p, spec, cap, grid):
    page = _number(p, "page", int, 64, 1)
    kv_tokens, state_slots = _static_pools(p, page) or (None, None)
    knobs = dict(chunk=_number(p, "chunk", int, 8192), track=_number(p, "track", int, 256, 1),
                 page=page, tracking_slots=2 if _number(p, "overlap", int, 0, 0) else 1)
    return StockSGLangCache(spec, cap, kv_tokens=kv_tokens, state_slots=state_slots, **knobs)


POLICY_BUILDERS = {
    "sglang": _sglang,
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
    "sglang": ("chunk", "track", "page", "overlap", "kv_tokens", "state_slots"),
    "vllm+": ("block", "max_states"),
    "paper-sglang+": ("max_states",),
    "marconi": ("alpha", "k", "max_states", "alphas", "window", "period", "hysteresis",
                "sample", "materialise", "chunk", "page", "track", "overlap", "kv_tokens",
                "state_slots"),
    "infinite": ("max_states",),
    "marconi+": ("bonus", "half_life", "chain", "ghost", "end_threshold", "max_states",
                 "materialise", "chunk", "page", "track", "overlap", "kv_tokens",
                 "state_slots"),
    "offline": ("ghost", "max_states", "materialise", "chunk", "page", "track"),
}
