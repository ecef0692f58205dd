"""The harness of ``test_parity``: the simulator and the SGLang cache side by side.

``SGLangSide`` is ``MarconiUnifiedRadixCache`` on real SGLang pools (CPU), driven through
the scheduler's own calls (``driver.replay``), with probes for the branch position each
request is admitted with and the states evicted; ``SimSide`` is a ``PrefixCache`` built by
``sim_mirror.sglang_image`` (``Regime.sim``: the only place the tests build the
simulator as SGLang's image). ``assert_same_decisions`` replays one request stream through
both and fails at the first request where they differ (hit, branch, evicted states, the
states each tree holds); ``both``/``both_plus`` build the pair for a regime (marconi /
marconi+), ``same_plus_state`` compares marconi+'s extra state after every request. The
traces are hand-built (each shows one behaviour) or generated (``sim.generators``).

Where the models coincide (docs/sglang.md, "Where the simulator and SGLang differ", says why
it is only there):

- ``extra_buffer``: SGLang's extra-buffer strategy (checkpoint grid 1, 16 or SGLang's
  default 64; page 1 or 16) with one prefill chunk per request
  (chunked_prefill_size above every input) and no decode snapshot (mamba_track_interval
  above every sequence). SGLang then publishes one state per request, the last one the
  prefill took: the branch point when the match reported one, else the grid-floored end of
  the input; the tree keeps the sequence only up to it. The simulator mirrors it with
  ``max_states_per_request=1`` (the branch first, else the end), ``cache_output=False``,
  ``grid`` = SGLang's checkpoint grid and ``branch_rule="kv"`` (SGLang's branch: where the
  KV match of input[:-1] ends beyond the hit).
- ``no_buffer``: SGLang without the extra buffer (page 1): one state at the end of input +
  output minus the last token, no branch states. The simulator: ``branch_rule="none"``,
  ``cache_output=True``, grid 1.

Unified memory (``test_parity_unified``): SGLang's unified buffer against the simulator's
single byte budget with the full cost model (KV and states). With a buffer the trace does not
fill, admission and hits are the same; the joint walk's inputs (recency, FLOP efficiency per
byte freed in the shared buffer) equal the simulator's for every candidate, and its order is
the order they give. Evictions are not compared: SGLang evicts while a request allocates, its
own KV pages and 3 state slots in the same buffer, so the bytes left to the tree change
within a request; the simulator evicts once, before it, to a fixed capacity.

Eviction: only the state pool binds (a KV pool larger than the trace), which the simulator
models with a byte budget of state slots and KV bytes of 0 (``StatePoolCost``), sized as the
pool minus the slots a running request holds (3 with the extra buffer, 1 without), with
SGLang's timing (``evict_at="begin"``), per-eviction normalisation (``renormalise``) and
SGLang's recency stamps (``insert_clock_offset=0.5``). The candidates coincide on trees
whose states have at most one child: chat sessions, and everything under ``no_buffer``
(which keeps no branch states). Elsewhere (branch states under the extra buffer) the tests
check the scoring instead: the efficiency, the recency and the ranking of every state.

The call sequence. This harness drives SGLang without the publish of the last prefill
chunk (``publish_last_chunk=False``), the sequence its simulator image (``sglang_image``, a
``PrefixCache``; also the online-alpha shadows of ``policy_state``) models: with SGLang's
real sequence 30 of ``test_parity``'s cases differ (the publish takes a fresh state slot
during the request, so the state-pool image evicts a request late; marconi+'s end marks;
under no_buffer a second state at the prompt's end). SGLang's real sequence is held by
``test_parity_pressure``: the plugin in SGLang's unified buffer against
``policy.in_sglang.MarconiSGLangCache``, multi-chunk, decode snapshots, evicting.

marconi+ (``MarconiSettings()``, no alpha; the simulator's ``reuse_weight=ReuseWeight()``,
``ghost_tokens`` and ``end_threshold``, each side's ghost index of the same size) is compared
the same way, in the same configurations, and after every request also on the ghost index,
the end-state reuse counts and skipped end states; where eviction runs, on the GDSF victim
queue itself (the states, their keys, their order and the aging clock). Where branch states
are in the tree the tests check each state's reuse weight and weighted efficiency.
"""
from __future__ import annotations

import functools
import random
from array import array
from dataclasses import dataclass

import numpy as np
import pytest

pytest.importorskip("sglang")

from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402

from sglang_marconi.driver.pools import PoolConfig, build_cache  # noqa: E402
from sglang_marconi.driver.replay import Replayer, ReplayRequest  # noqa: E402
from sglang_marconi.driver.unified_pools import build_unified_cache  # noqa: E402
from marconi_checks.invariants import check_idle, walk  # noqa: E402
from sglang_marconi.model import preset_spec  # noqa: E402
from sglang_marconi.policy.cache import PrefixCache  # noqa: E402
from sglang_marconi.policy.ghost import GhostIndex  # noqa: E402
from sglang_marconi.policy.likelihood import ReuseWeight  # noqa: E402
from sim_mirror import StatePoolCost, sglang_image  # noqa: E402
from sglang_marconi.sglang_integration.cache import MarconiUnifiedRadixCache  # noqa: E402
from sglang_marconi.sglang_integration.options import MarconiSettings  # noqa: E402
from sglang_marconi.sim.generators import generate  # noqa: E402

MAMBA = ComponentType.MAMBA
SPEC = preset_spec("paper-7b")
NEVER = 1 << 20  # a chunk size / track interval no request of these traces reaches


@dataclass(frozen=True)
class Regime:
    name: str
    extra_buffer: bool
    page: int = 1
    mamba_chunk: int | None = None  # SGLang's mamba cache chunk (grid = lcm(it, page))
    running_slots: int = 1          # state slots a running request holds

    def sim(self, grid: int, alpha: float = 0.0, capacity: int | None = None,
            spec=SPEC, plus: dict | None = None) -> PrefixCache:
        # SGLang's extra buffer with a chunk larger than every prompt and no decode
        # snapshot leaves one state per request, at the last grid point of the prompt
        return sglang_image(spec, capacity, extra_buffer=self.extra_buffer, grid=grid,
                            alpha=alpha, max_states_per_request=1 if self.extra_buffer else 2,
                            cache_output=not self.extra_buffer, **(plus or {}))


EXTRA = Regime("extra_buffer", True, mamba_chunk=1, running_slots=3)
EXTRA_GRID16 = Regime("extra_buffer-grid16", True, mamba_chunk=16, running_slots=3)
EXTRA_PAGE16 = Regime("extra_buffer-page16", True, page=16, mamba_chunk=16, running_slots=3)
EXTRA_GRID64 = Regime("extra_buffer-grid64", True, running_slots=3)  # SGLang's FLA chunk, 64
NO_BUFFER = Regime("no_buffer", False)
ADMISSION_REGIMES = [EXTRA, EXTRA_GRID16, EXTRA_PAGE16, EXTRA_GRID64, NO_BUFFER]


# -- the two caches side by side ------------------------------------------------------------
# A state is named by the tokens of its path (two branches may hold states at one length).
def sglang_path(node, root) -> tuple:
    parts = []
    while node is not root:
        parts.append(node.key.raw_token_ids()[:len(node.key)])
        node = node.parent
    return tuple(t for part in reversed(parts) for t in part)


def sglang_state_nodes(cache) -> dict:
    root = cache.tree_core.root_node
    return {sglang_path(n, root): n for n in walk(cache)
            if n.component_data[MAMBA].value is not None}


def sim_state_nodes(sim) -> dict:
    out, stack = {}, list(sim.tree.root.children.values())
    while stack:
        node = stack.pop()
        if node.has_state:
            out[tuple(int(t) for t in sim.tree.path_tokens(node))] = node
        stack.extend(node.children.values())
    return out


def lengths(paths) -> list:
    return sorted(len(p) for p in paths)


@dataclass
class Step:
    hit: int
    branch: int
    states: frozenset
    evicted: tuple


class SGLangSide:
    """MarconiUnifiedRadixCache on CPU pools, with probes for branch and evicted states."""

    def __init__(self, regime: Regime, requests, alpha=0.0, cap=2, mamba_slots=None,
                 unified=None, **settings):
        longest = max(len(i) + len(o) for i, o in requests)
        total = sum(len(i) + len(o) for i, o in requests)
        self.pc = PoolConfig(
            kv_tokens=-(-(total + 4 * longest + 64) // regime.page) * regime.page,
            page_size=regime.page,
            mamba_slots=mamba_slots or 2 * len(requests) + 8,
            max_context_len=longest + 4 * regime.page, extra_buffer=regime.extra_buffer,
            chunked_prefill_size=NEVER, mamba_track_interval=NEVER,
            mamba_cache_chunk_size=regime.mamba_chunk)
        settings = MarconiSettings(alpha=alpha, max_states_per_request=cap,
                                   renormalise_limit=-1, **settings)
        cls = functools.partial(MarconiUnifiedRadixCache, spec=SPEC, settings=settings)
        if unified is None:
            self.cache = build_cache(self.pc, cache_class=cls, tree_core="python")[0]
        else:  # SGLang's unified buffer of ``unified.unified_bytes`` (test_parity_unified)
            self.cache = build_unified_cache(self.pc, unified, cache_class=cls,
                                             tree_core="python")[0]
        # the call sequence the simulator's image models (no publish of the last prefill
        # chunk): parity of the two engines' policy decisions, not of SGLang's sequence
        self.replayer = Replayer(self.cache, chunked_prefill_size=NEVER,
                                 publish_last_chunk=False)
        # where states can land: the checkpoint grid, or any token without the extra buffer
        self.grid = self.replayer.grid if regime.extra_buffer else regime.page
        self.branches, self.evicted = {}, []
        policy = self.cache.marconi
        on_match = policy.on_match

        def probe_match(req, result, *args):
            on_match(req, result, *args)
            self.branches[req.rid] = policy.plan(req).branch

        policy.on_match = probe_match
        component = self.cache.components[MAMBA]
        evict_component = component.evict_component
        root = self.cache.tree_core.root_node

        def probe_evict(node, *args, **kwargs):
            if node.component_data[MAMBA].value is not None:
                self.evicted.append(sglang_path(node, root))
            return evict_component(node, *args, **kwargs)

        component.evict_component = probe_evict

    def run(self, i, input_ids, output_ids) -> Step:
        self.evicted.clear()
        rid = f"r{i}"
        out = self.replayer.run(ReplayRequest(rid, array("q", input_ids), list(output_ids)))
        return Step(out.hit_len, self.branches.pop(rid),
                    frozenset(sglang_state_nodes(self.cache)), tuple(self.evicted))


class SimSide:
    def __init__(self, sim: PrefixCache):
        self.sim = sim
        self.evicted = []
        sim.on_evict = lambda node: self.evicted.append(
            tuple(int(t) for t in sim.tree.path_tokens(node)))

    def run(self, input_ids, output_ids) -> Step:
        self.evicted.clear()
        inp = np.asarray(input_ids, dtype=np.int64)
        full = np.concatenate([inp, np.asarray(output_ids[:-1], dtype=np.int64)])
        plan = self.sim.begin(inp)
        self.sim.finish(plan, full)
        branch = plan.checkpoint_positions[0] if plan.checkpoint_positions else 0
        return Step(plan.hit_len, branch, frozenset(sim_state_nodes(self.sim)),
                    tuple(self.evicted))


def assert_same_decisions(requests, sgl: SGLangSide, sim: SimSide, after=None) -> list:
    """Replay ``requests`` through both; fail at the first request where they differ.
    ``after(i)`` runs further checks after request ``i``."""
    steps = []
    for i, (inp, out) in enumerate(requests):
        a, b = sgl.run(i, inp, out), sim.run(inp, out)
        where = f"request {i} (input {len(inp)}, output {len(out)})"
        assert a.hit == b.hit, f"{where}: hit {a.hit} (SGLang) != {b.hit} (simulator)"
        assert a.branch == b.branch, f"{where}: branch {a.branch} != {b.branch}"
        assert a.evicted == b.evicted, (f"{where}: evicted {[len(p) for p in a.evicted]} "
                                        f"!= {[len(p) for p in b.evicted]}")
        assert a.states == b.states, (f"{where}: states only in SGLang "
                                      f"{lengths(a.states - b.states)}, only in the simulator "
                                      f"{lengths(b.states - a.states)}")
        steps.append(a)
        if after is not None:
            after(i)
    check_idle(sgl.cache)
    return steps


def both(regime, requests, alpha=0.0, cap=2, slots=None):
    """The SGLang cache and its mirror in the simulator. With ``slots`` the state pool has
    that many slots and binds; the simulator's budget is what the tree may keep of it."""
    sgl = SGLangSide(regime, requests, alpha=alpha, cap=cap, mamba_slots=slots)
    capacity = (None if slots is None
                else (slots - regime.running_slots) * SPEC.ssm_state_bytes)
    return sgl, SimSide(regime.sim(sgl.grid, alpha=alpha, capacity=capacity,
                                   spec=StatePoolCost(SPEC)))


# -- traces ---------------------------------------------------------------------------------
class Fresh:
    def __init__(self, start=10**6):
        self.next = start

    def __call__(self, n):
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def shared_system_prompt():
    """One system prompt, four questions: 1st no tree, 2nd a branch, 3rd and 4th hit."""
    t = Fresh()
    system = t(48)
    return [(system + t(20 + 3 * i), t(6)) for i in range(4)]


def multi_turn_chat():
    """Two interleaved sessions; each turn is the whole history plus a user message."""
    t = Fresh()
    sessions = [([], []), ([], [])]
    reqs = []
    for turn in range(4):
        for s, (hist, _) in enumerate(sessions):
            inp = hist + t(17 + 5 * turn + s)
            out = t(9 + turn)
            reqs.append((inp, out))
            sessions[s] = (inp + out, None)
    return reqs


def fork_join():
    """A shared prefix and question, three forks, a join over their outputs, twice."""
    t = Fresh()
    prefix, forks, join = t(40), [t(8) for _ in range(3)], t(5)
    reqs = []
    for _ in range(2):
        base = prefix + t(12)
        outs = [t(10) for _ in range(3)]
        reqs += [(base + f, o) for f, o in zip(forks, outs)]
        reqs.append((base + sum(outs, []) + join, t(4)))
    return reqs


def repeats_and_prefixes():
    """Repeated prompts and prompts that end inside a cached sequence."""
    t = Fresh()
    a, b = t(50), t(70)
    out_b = t(12)
    return [(a, t(5)), (a, t(5)), (a, t(5)), (b, out_b), (b + out_b[:4], t(3)),
            (b[:33], t(3)), (b[:33], t(3)), (a + t(9), t(4))]


def random_mix(seed, n=40, base_len=200, max_output=20):
    """Shared bases, chat continuations, exact repeats and prefixes of cached sequences."""
    rng = random.Random(seed)
    t = Fresh()
    bases = [t(base_len) for _ in range(3)]
    hist, reqs = [], []
    for _ in range(n):
        kind = rng.random()
        if hist and kind < 0.15:
            inp = list(rng.choice(hist)[0])
        elif hist and kind < 0.3:
            i, o = rng.choice(hist)
            inp = (i + o)[:rng.randint(1, len(i) + len(o))]
        elif hist and kind < 0.55:
            i, o = rng.choice(hist)
            inp = i + o + t(rng.randint(1, 25))
        else:
            inp = rng.choice(bases)[:rng.randint(0, base_len)] + t(rng.randint(1, 30))
        out = t(rng.randint(1, max_output))
        hist.append((inp, out))
        reqs.append((inp, out))
    return reqs


def generated(name, seed):
    if name == "chat":
        trace = generate("chat", seed=seed, sessions=8, session_rate=2.0, mean_turns=4,
                         user_median=15, output_median=10, max_len=400)
    else:
        trace = generate("fork-join", seed=seed, programs=6, templates=2, prefix_len=100,
                         question_median=20, forks=3, fork_prompt=6, fork_output_median=10,
                         join_prompt=5, join_output=4)
    return [(r.input_tokens.tolist(), r.output_tokens.tolist()) for r in trace.requests]


HAND_BUILT = {"shared-system-prompt": shared_system_prompt, "multi-turn-chat": multi_turn_chat,
              "fork-join": fork_join, "repeats-and-prefixes": repeats_and_prefixes}


# -- marconi+ -------------------------------------------------------------------------------
# SGLang: MarconiSettings() (no alpha); the simulator: reuse_weight, ghost_tokens, end_threshold
# (sim.policies ``marconi+``), each side's ghost index of the same size: SGLang's,
# ``ghost_factor`` x its token pool (2 x: it never forgets, the pool is larger than the trace).
def both_plus(regime, requests, slots=None, ghost_factor=2.0, end_threshold=0.05,
              chain_weight=None):
    """``chain_weight``: a fixed weight of chain states on both sides (None: learned)."""
    sgl = SGLangSide(regime, requests, alpha=None, mamba_slots=slots,
                     ghost_factor=ghost_factor, end_threshold=end_threshold)
    if chain_weight is not None:
        sgl.cache.marconi.reuse = ReuseWeight(chain_weight=chain_weight)
    capacity = (None if slots is None
                else (slots - regime.running_slots) * SPEC.ssm_state_bytes)
    plus = dict(reuse_weight=ReuseWeight(chain_weight=chain_weight), ghost_tokens=sgl.cache.marconi.ghost.max_tokens,
                end_threshold=end_threshold)
    sim = regime.sim(sgl.grid, capacity=capacity, spec=StatePoolCost(SPEC), plus=plus)
    return sgl, SimSide(sim)


def ghost_marks(index: GhostIndex) -> frozenset:
    """The remembered request ends of a ghost index, by token path."""
    tree = index.tree
    return frozenset(tuple(int(t) for t in tree.path_tokens(n))
                     for n in tree.iter_nodes() if n.has_state)


def same_plus_state(sgl: SGLangSide, sim: SimSide, queues: bool = False):
    """After each request: the same ghost index (tokens, end marks) and end-state counts;
    with ``queues`` the same GDSF victim queue of states (paths, keys, order, aging clock)."""
    policy, cache = sgl.cache.marconi, sim.sim

    def check(i):
        assert policy.ghost.tree.num_kv_tokens == cache.ghost.tree.num_kv_tokens, i
        assert ghost_marks(policy.ghost) == ghost_marks(cache.ghost), f"request {i}: marks"
        a, b = policy.end_usefulness, cache.end_usefulness
        assert (a.ends, a.reused) == (b.ends, b.reused), f"request {i}: end-state counts"
        assert policy.stats.end_states_skipped == cache.stats.end_states_skipped, i
        if not queues:
            return
        root = sgl.cache.tree_core.root_node
        mine = sgl.cache.components[MAMBA].queue
        ref = cache.tree.queue
        order = [sglang_path(n, root) for n in mine.ordered()]
        assert order == [tuple(int(t) for t in cache.tree.path_tokens(n))
                         for n in ref.ordered()], f"request {i}: victim order"
        keys = [ref.key_of(n) for n in ref.ordered()]
        assert [mine.key_of(n) for n in mine.ordered()] == pytest.approx(keys, rel=1e-12), i
        assert mine.clock == pytest.approx(ref.clock, rel=1e-12), i

    return check


# -- scenarios of single tests ---------------------------------------------------------------
def state_reinserted():
    """A state with a hit (at 34) loses its state while it has one child, then the child is
    deleted (SGLang keeps the KV of 34: a KV-only leaf); later a request ends at 34 again."""
    t = Fresh()
    a, o0 = t(30), t(5)
    reqs = [(a, o0), (a + o0[:4] + t(10), t(3))]
    reqs += [(t(60), t(3)) for _ in range(7)]
    reqs += [(a + o0[:3], [o0[3]] + t(1))]  # no_buffer: its state lands at 33 + 2 - 1 = 34
    return reqs + [(t(60), t(3)) for _ in range(3)]


def unreached_ends():
    """40 unrelated prompts (no end is reached again: end states stop being admitted), then
    a repeat of the first, which on a 64-token grid has no end state of its own, then a
    continuation of the second."""
    t = Fresh()
    reqs = [(t(70), t(3)) for _ in range(40)]
    return reqs + [(reqs[0][0], t(3)), (reqs[1][0] + t(80), t(3))]
