"""Beyond the paper: reuse likelihood, ghost index, learned end states, online alpha, the
offline reference against an exhaustive optimum."""
import math

import numpy as np
import pytest

from sglang_marconi.model import preset_spec
from sglang_marconi.policy.cache import PrefixCache
from sglang_marconi.policy.ghost import GhostIndex
from sglang_marconi.policy.likelihood import EndStateUsefulness, ReuseWeight
from sglang_marconi.policy.offline import FutureIndex, offline_cache
from sglang_marconi.policy.tree import Node
from sglang_marconi.sim.generators import generate
from sglang_marconi.sim.policies import build_cache, parse_policy
from marconi_reports.sweeps import phase_labels
from sglang_marconi.sim.traces import Request

SPEC = preset_spec("paper-7b")
KV, STATE = SPEC.kv_bytes_per_token, SPEC.ssm_state_bytes


def _node():
    return Node(1, None, np.arange(3), 0.0)


def test_reuse_weight_counts_follow_hits_exactly():
    w = ReuseWeight(branch_bonus=2.0)  # no decay: plain counts
    n = _node()
    assert w(n) == 1.0
    for t in (5, 9, 30):
        w.record_hit(n, t)
    assert n.hit_score == 3.0 and w(n) == 4.0
    n.max_children = 2                      # was a branch point
    assert w(n) == 6.0
    n.children = {7: _node()}               # one child left: still a branch point
    assert w(n) == 6.0
    m = _node()
    m.children = {7: _node()}
    m.max_children = 1                      # a chain state (consumed by its extension)
    w.record_hit(m, 1)
    assert w(m) == w.chain_weight == 0.5      # learned, nothing observed yet: Beta(1, 1)
    assert ReuseWeight(chain_weight=0.0)(m) == 0.0  # a fixed weight


def test_ghost_answer_tells_fresh_divergence_from_extension_and_known_branch():
    g = GhostIndex(10_000)
    first = np.arange(100)
    g.record(first, 100, now=0)
    # a later turn extends the whole remembered sequence: no fresh point
    turn = g.lookup(np.arange(150), 149)
    assert (turn.reused, turn.fresh, turn.end) == (True, False, 100)
    # leaves it in the middle of an edge: a point nobody branched at
    edit = np.concatenate([np.arange(60), 1000 + np.arange(40)])
    a = g.lookup(edit, 99)
    assert (a.reused, a.fresh, a.branch) == (True, True, 60)
    g.record(edit, 0, now=1)
    # the same point again: a known branch now
    b = g.lookup(np.concatenate([np.arange(60), 5000 + np.arange(40)]), 99)
    assert (b.reused, b.fresh, b.branch) == (True, False, 60)
    # nothing shared
    assert not g.lookup(7000 + np.arange(50), 49).reused


def test_chain_weight_is_learned_from_how_requests_leave_remembered_prefixes():
    g = GhostIndex(1_000_000)
    chat, docs = ReuseWeight(), ReuseWeight()
    for i in range(40):  # multi-turn chat: each turn extends the last
        seq = np.arange(100 * (i + 1))
        chat.observe_request(g.lookup(seq, len(seq) - 1))
        g.record(seq, len(seq), now=i)
    d = GhostIndex(1_000_000)
    doc = np.arange(10_000)
    d.record(doc, 0, now=0)
    for i in range(40):  # requests that share a different part of one document
        seq = np.concatenate([doc[:200 * (i + 1) + 7], 50_000 + 100 * i + np.arange(50)])
        docs.observe_request(d.lookup(seq, len(seq) - 1))
        d.record(seq, 0, now=i + 1)
    assert chat.chain_weight < 0.05 < 0.9 < docs.chain_weight


def test_reuse_weight_decays_by_half_life():
    w = ReuseWeight(half_life=10)
    n = _node()
    w.record_hit(n, 0)        # 1
    w.record_hit(n, 10)       # 1 * 0.5 + 1 = 1.5
    w.record_hit(n, 30)       # 1.5 * 0.25 + 1 = 1.375
    assert n.hit_score == pytest.approx(1.375)
    assert ReuseWeight(half_life=math.inf).half_life == math.inf


def test_end_state_usefulness_rate():
    u = EndStateUsefulness(threshold=0.2)
    assert u.rate == 0.5 and u.admit()
    for _ in range(18):
        u.observe_request(False, True)
    assert u.rate == pytest.approx(1 / 20) and not u.admit()
    for _ in range(4):
        u.observe_request(True, False)
    assert u.rate == pytest.approx(5 / 20) and u.admit()


def test_ghost_index_finds_branch_after_eviction():
    """With room for one request only, a request's tail is evicted before a second request
    shares its prefix: speculative insertion against the tree finds no branch point, the
    ghost index does, so the shared prefix gets its checkpoint during this prefill."""
    shared = list(range(5000, 5400))
    capacity = 430 * KV + 2 * STATE
    first = np.array(shared + list(range(10_000, 10_020)))
    filler = np.arange(100_000, 100_420)
    second = np.array(shared + list(range(20_000, 20_020)))
    plans = {}
    for name, ghost in (("plain", None), ("ghost", 10_000)):
        cache = PrefixCache(SPEC, capacity, ghost_tokens=ghost)
        cache.process(first, first)
        cache.process(filler, filler)             # evicts ``first`` entirely
        assert cache.tree.match(first).kv_len == 0
        plans[name] = cache.begin(second)
        cache.finish(plans[name], second)
        cache.tree.check()
        if ghost:
            third = np.array(shared + list(range(30_000, 30_020)))
            assert cache.begin(third).hit_len == len(shared)
    assert plans["plain"].checkpoint_positions == ()
    assert plans["ghost"].checkpoint_positions == (len(shared),)


def test_end_states_learned_per_traffic():
    cap = 4 * 10**9
    chat = generate("chat", seed=0, sessions=60)
    c = build_cache(parse_policy("marconi+"), SPEC, cap)
    for r in chat.requests:
        c.process(r.input_tokens, r.full_tokens)
    assert c.end_usefulness.rate > 0.5 and c.stats.end_states_skipped == 0
    sp = generate("shared-prompt", seed=0, requests=300)   # outputs never reused
    c = build_cache(parse_policy("marconi+"), SPEC, cap)
    for r in sp.requests:
        c.process(r.input_tokens, r.full_tokens)
    assert c.end_usefulness.rate < 0.05 and c.stats.end_states_skipped > 250


def test_shadow_caches_hold_no_tensors():
    c = build_cache(parse_policy("marconi:alpha=online:sample=0.5"), SPEC, 2 * 10**9)
    for r in generate("chat", seed=2, sessions=20).requests:
        c.process(r.input_tokens, r.full_tokens)
    assert len(c.online.shadows) == 4
    for shadow in c.online.shadows.values():
        assert shadow.capacity == 10**9
        for node in shadow.tree.iter_nodes():
            for name in Node.__slots__:
                value = getattr(node, name, None)
                assert type(value).__module__.split(".")[0] != "torch"
            assert node.tokens.dtype == np.int64


def _phase_sums(policy, trace, cap):
    """FLOPs saved per phase (``scan#1``, ``steady``, ``scan#2``), the alpha in use after
    each request, and the cache."""
    c = build_cache(parse_policy(policy), SPEC, cap, trace=trace)
    sums, alphas = {}, []
    for r, phase in zip(trace.requests, phase_labels(trace)):
        before = c.stats.flops_saved
        c.process(r.input_tokens, r.full_tokens)
        sums[phase] = sums.get(phase, 0.0) + c.stats.flops_saved - before
        alphas.append(c.alpha)
    return sums, alphas, c


class _ScriptedShadow:
    """A stand-in shadow cache whose savings per request depend on its alpha and on the phase
    the request's first token names: phase 0 rewards alpha 0, phase 1 rewards alpha 2."""

    def __init__(self, alpha, sample):
        self.alpha = alpha
        self.stats = type("S", (), {"flops_saved": 0.0})()

    def process(self, input_tokens, full_tokens):
        best = 0.0 if int(input_tokens[0]) % 2 == 0 else 2.0
        self.stats.flops_saved += 10.0 - abs(self.alpha - best)


def test_online_alpha_moves_to_each_phase_best_within_a_window():
    from sglang_marconi.policy.online import OnlineAlpha

    online = OnlineAlpha(_ScriptedShadow, alphas=(0.0, 0.5, 1.0, 2.0), window=100, period=25)
    phases = [0] * 400 + [1] * 400 + [0] * 400
    alphas = []
    for i, phase in enumerate(phases):
        tokens = np.array([2 * i + phase, 7])
        new = online.observe(tokens, tokens)
        alphas.append(online.alpha if new is None else new)
    # within one window (+ one decision period) of each phase change it has moved to the best
    assert alphas[399] == 0.0
    assert alphas[400 + 100 + 25] == 2.0 and alphas[799] == 2.0
    assert alphas[800 + 100 + 25] == 0.0 and alphas[-1] == 0.0
    # hysteresis: one move per phase change, no flapping
    assert [a for _, a in online.history] == [0.0, 2.0, 0.0]
    # it waits for the window to favour the new phase (more than half of it, + hysteresis)
    assert 450 < online.history[1][0] <= 525 and 850 < online.history[2][0] <= 925


ALPHA_SHIFT_CAP = 2 * 10**9
FIXED_ALPHAS = (0.0, 0.5, 1.0, 2.0, 4.0)
CLEAR = 1.10  # "clearly better": >= 10% more FLOPs saved in the phase


def test_online_alpha_on_a_drifting_trace():
    """alpha-shift (seed 0, paper-7b, 2 GB), phases scan, steady, scan of 600 requests.

    (a) The best fixed alpha differs between phases, clearly: in each scan phase alpha 0
    saves >= 10% more FLOPs than every alpha in {0.5, 1, 2, 4}; in the steady phase some
    alpha > 0 saves >= 10% more than alpha 0.
    (b) ``marconi:alpha=online`` (window 200, period 50, shadows for the same five alphas)
    follows: within window + period = 250 requests of a phase's start its alpha is one that
    is clearly better in that phase (steady: >= 10% above alpha 0; scan: alpha 0) and stays
    so until the phase ends.
    (c) Over the whole trace it saves >= 95% of what the best fixed alpha in hindsight
    saves, and more than the worst fixed alpha.
    """
    trace = generate("alpha-shift", seed=0)
    n = len(trace.requests) // 3
    fixed = {a: _phase_sums(f"marconi:alpha={a:g}", trace, ALPHA_SHIFT_CAP)[0]
             for a in FIXED_ALPHAS}
    table = {ph: {a: round(fixed[a][ph] / 1e15, 2) for a in FIXED_ALPHAS}
             for ph in fixed[0.0]}  # PFLOP saved, for the messages
    # (a)
    assert list(table) == ["scan#1", "steady", "scan#2"]
    for phase in ("scan#1", "scan#2"):
        assert all(fixed[0.0][phase] >= CLEAR * fixed[a][phase] for a in FIXED_ALPHAS if a), \
            table
    steady_good = {a for a in FIXED_ALPHAS if fixed[a]["steady"] >= CLEAR * fixed[0.0]["steady"]}
    assert steady_good and 0.0 not in steady_good, table
    # (b)
    window, period = 200, 50
    bound = window + period
    shadows = "/".join(f"{a:g}" for a in FIXED_ALPHAS)
    online, alphas, cache = _phase_sums(
        f"marconi:alpha=online:window={window}:period={period}:alphas={shadows}", trace,
        ALPHA_SHIFT_CAP)
    history = cache.online.history
    assert set(alphas[:n]) == {0.0}, history                     # already at the best
    steady = alphas[n + bound - 1:2 * n]
    assert steady and set(steady) <= steady_good, (history, table["steady"])
    assert set(alphas[2 * n + bound - 1:]) == {0.0}, history
    # (c)
    totals = {a: sum(fixed[a].values()) for a in FIXED_ALPHAS}
    online_total = sum(online.values())
    assert online_total >= 0.95 * max(totals.values()), (online_total, totals)
    assert online_total > min(totals.values()), (online_total, totals)


def _tiny_trace(seed):
    rng = np.random.default_rng(seed)
    prefixes = [list(range(1000 * (i + 1), 1000 * (i + 1) + int(rng.integers(20, 60))))
                for i in range(4)]
    out, fresh = [], 10**6
    for _ in range(12):
        p = prefixes[int(rng.integers(4))]
        q = list(range(fresh, fresh + int(rng.integers(5, 15))))
        fresh += 100
        out.append(Request(np.array(p + q), np.array([fresh, fresh + 1])))
    return out


def exhaustive_best(requests, make_cache, limit: int = 200_000) -> tuple[float, float, int]:
    """(best, worst, runs): the most and least FLOPs any sequence of eviction choices saves
    on ``requests`` (tiny traces only), and how many replays the search took.

    Replays the trace once per sequence of choices, enumerating them depth first: each
    replay follows a fixed prefix of choices (candidates sorted by node id) and records how
    many candidates each further decision had."""
    best, worst = 0.0, float("inf")
    stack = [()]
    runs = 0
    while stack:
        prefix = stack.pop()
        runs += 1
        if runs > limit:
            raise RuntimeError("exhaustive search too large")
        decisions: list[int] = []  # number of options at each decision of this run

        def choose(cache, prefix=prefix, decisions=decisions):
            options = sorted(cache.tree.candidates(), key=lambda n: n.id)
            k = len(decisions)
            decisions.append(len(options))
            return options[prefix[k] if k < len(prefix) else 0]

        cache = make_cache()
        cache.victim_chooser = choose
        for r in requests:
            cache.process(r.input_tokens, r.full_tokens)
        best = max(best, cache.stats.flops_saved)
        worst = min(worst, cache.stats.flops_saved)
        # branch on every decision beyond the fixed prefix
        for k in range(len(prefix), len(decisions)):
            base = prefix + (0,) * (k - len(prefix))
            for choice in range(1, decisions[k]):
                stack.append(base + (choice,))
    return best, worst, runs


@pytest.mark.parametrize("seed", [0, 1, 3, 4, 5])
def test_offline_against_exhaustive_optimum(seed):
    reqs = _tiny_trace(seed)
    capacity = 150 * KV + 2 * STATE
    off = offline_cache(SPEC, capacity, reqs)
    for r in reqs:
        off.process(r.input_tokens, r.full_tokens)
    best, worst, runs = exhaustive_best(reqs, lambda: offline_cache(SPEC, capacity, reqs))
    assert best > 0 and off.stats.evictions > 0
    assert runs > 1 and worst < best      # the choices matter on this trace
    assert off.stats.flops_saved <= best * (1 + 1e-9)
    gap = 1 - off.stats.flops_saved / best if best else 0.0
    print(f"seed {seed}: offline {off.stats.flops_saved:.4g} optimum {best:.4g} (worst "
          f"{worst:.4g}, {runs} replays) gap {gap:.1%}")
    assert gap < 0.5


def test_future_index_next_use():
    reqs = [np.array([1, 2, 3, 9]), np.array([1, 2, 4, 9]), np.array([5, 6, 9]),
            np.array([1, 2, 3, 7, 9])]
    f = FutureIndex(reqs)
    assert f.users_of(np.array([1, 2])) == [0, 1, 3]
    assert f.next_use(np.array([1, 2, 3]), after=0) == 3
    assert f.next_use(np.array([1, 2, 3, 9]), after=0) is None   # key excludes the last token
    assert f.next_use(np.array([5]), after=2) is None

