"""Property tests on random traces: capacity, accounting, hit bounds, the infinite ceiling."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_marconi.model import preset_spec
from sglang_marconi.sim.policies import build_cache, parse_policy
from sglang_marconi.sim.traces import Request, Trace

SPEC = preset_spec("paper-7b")
KV, STATE = SPEC.kv_bytes_per_token, SPEC.ssm_state_bytes


@st.composite
def traces(draw):
    """Requests built from a few shared prefixes, previous requests' sequences (multi-turn)
    and fresh tokens, so that hits, branches and evictions all happen."""
    n = draw(st.integers(2, 25))
    prefixes = [list(range(1000 * (i + 1), 1000 * (i + 1) + draw(st.integers(1, 60))))
                for i in range(3)]
    fresh = [10**6]
    seqs, reqs = [], []

    def new(k):
        fresh[0] += k
        return list(range(fresh[0] - k, fresh[0]))

    for _ in range(n):
        kind = draw(st.sampled_from(["prefix", "extend", "fresh", "cut"]))
        if kind == "prefix":
            inp = draw(st.sampled_from(prefixes)) + new(draw(st.integers(1, 30)))
        elif kind == "extend" and seqs:
            inp = draw(st.sampled_from(seqs)) + new(draw(st.integers(1, 30)))
        elif kind == "cut" and seqs:
            s = draw(st.sampled_from(seqs))
            inp = s[:draw(st.integers(1, len(s)))] + new(draw(st.integers(1, 10)))
        else:
            inp = new(draw(st.integers(1, 80)))
        out = new(draw(st.integers(0, 20)))
        reqs.append(Request(np.array(inp), np.array(out, dtype=np.int64)))
        seqs.append(inp + out)
    return Trace("random", reqs)


def lcp(a, b):
    n = min(len(a), len(b))
    neq = np.nonzero(a[:n] != b[:n])[0]
    return int(neq[0]) if len(neq) else n


POLICIES = ["vllm+:block=8", "paper-sglang+", "marconi:alpha=1.5", "marconi:alpha=auto:k=1"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), cap_tokens=st.integers(50, 600), states=st.integers(1, 6),
       grid=st.sampled_from([1, 4, 16]))
def test_random_traces_keep_invariants(trace, cap_tokens, states, grid):
    capacity = cap_tokens * KV + states * STATE
    ceiling = build_cache(parse_policy("infinite"), SPEC, None, grid)
    ceiling_hits = [ceiling.process(r.input_tokens, r.full_tokens) for r in trace.requests]
    for name in POLICIES:
        cache = build_cache(parse_policy(name), SPEC, capacity, grid)
        previous = []
        for r in trace.requests:
            hit = cache.process(r.input_tokens, r.full_tokens)
            # bytes never above capacity; accounting equals the sum over nodes
            assert cache.tree.bytes_used <= capacity
            cache.tree.check()
            # a hit never exceeds the true common prefix with an earlier request (and leaves
            # at least one token to compute)
            true = max([lcp(r.input_tokens, p) for p in previous], default=0)
            assert hit <= min(true, r.input_len - 1)
            previous.append(r.full_tokens)
        assert cache.stats.peak_bytes <= capacity
        if not name.startswith("vllm"):
            # same admission with unlimited room: no policy saves more
            assert cache.stats.hit_tokens <= sum(ceiling_hits)
