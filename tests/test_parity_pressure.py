"""Parity under pressure (issue 18): the plugin in SGLang's unified buffer and the
simulator's model of it (``policy.in_sglang.MarconiSGLangCache``, ``sim --policies
marconi+:materialise=sglang``) take the same decisions request by request while the buffer
fills and evicts.

SGLang side: ``MarconiUnifiedRadixCache`` (what ``ab --memory unified`` builds) on SGLang's
unified buffer, sized by ``driver.sizing`` from ``--cache-gb`` as a server sizes it, driven
through SGLang's real call sequence (``driver.replay``: the overlap loop's 2 tracking slots,
``checkpoint_kv_cache`` after every unfinished prefill chunk and after the last one when
the request decodes, decode-track snapshots, ``release_kv_cache``). Simulator side: the
policy string a user gives ``sim``, on the byte budget ``scripts/bench_baseline_agreement.py``
gives it (``marconi_reports.baseline_agreement.sim_capacity``).

The traces are generated (agent: long shared system prompts and tool loops; chat) with
prefills of several chunks (chunk 256), outputs crossing the decode-track grid (64) and a
buffer of a few requests' worth (0.6 GiB of paper-7b: about 12 states or 9,000 KV tokens),
so every request after the first few evicts. After every request both sides must agree on
the hit, the states each tree holds (by token path), the states evicted and the KV tokens
evicted (the joint walk's victims), the states admitted and, for marconi+, the counts of
its learned end-state rule (end states seen, reached again, skipped).
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

pytest.importorskip("sglang")

from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402

from sglang_marconi.driver.pools import PoolConfig  # noqa: E402
from sglang_marconi.driver.replay import Replayer  # noqa: E402
from sglang_marconi.driver.sizing import size_pools  # noqa: E402
from marconi_reports.baseline_agreement import sim_capacity  # noqa: E402
from sglang_marconi.driver.unified_pools import UnifiedConfig  # noqa: E402
from sglang_marconi.harness.ab import (ABConfig, instrument, make_cache,  # noqa: E402
                                       to_replay_requests)
from sglang_marconi.model import preset_spec  # noqa: E402
from sglang_marconi.sglang_integration.options import MarconiSettings  # noqa: E402
from sglang_marconi.sim.generators import generate  # noqa: E402
from sglang_marconi.sim.policies import build_cache, parse_policy  # noqa: E402

MAMBA = ComponentType.MAMBA
SPEC = preset_spec("paper-7b")
PAGE, CHUNK, TRACK = 16, 256, 64
CACHE_GB = 0.6


def _digest(tokens) -> str:
    return hashlib.blake2b(np.asarray(tokens, dtype=np.int64).tobytes(),
                           digest_size=8).hexdigest()


def sglang_states(cache) -> frozenset:
    """(depth, path digest) of every state in SGLang's tree."""
    out, stack = [], [(cache.tree_core.root_node, [])]
    while stack:
        node, path = stack.pop()
        for child in node.children.values():
            tokens = path + list(child.key.raw_token_ids()[:len(child.key)])
            if child.component_data[MAMBA].value is not None:
                out.append((len(tokens), _digest(tokens)))
            stack.append((child, tokens))
    return frozenset(out)


def sim_states(sim) -> frozenset:
    """The same for ``MarconiSGLangCache``'s tree."""
    out, stack = [], [(sim.root, [])]
    while stack:
        node, path = stack.pop()
        for child in node.children.values():
            tokens = path + child.key.tolist()
            if child.state:
                out.append((len(tokens), _digest(tokens)))
            stack.append((child, tokens))
    return frozenset(out)


def _trace(workload: str, seed: int):
    if workload == "agent":
        return generate("agent", seed=seed, sessions=5, session_rate=0.5, system_prompt=700,
                        task_median=150, min_turns=4, max_turns=9, action_median=90,
                        observation_median=250, max_observation=900, keep_last=3)
    return generate("chat", seed=seed, sessions=10, session_rate=1.0, mean_turns=6,
                    user_median=200, output_median=120, max_len=3000)


def run_pair(workload: str, seed: int, cache: str, policy: str, settings: MarconiSettings,
             memory: str = "unified", state_slots: int | None = None):
    """Replay a generated trace through ``ab``'s ``cache`` and the simulator's ``policy``;
    fail at the first request where they differ. Returns (requests, states evicted).
    ``memory`` "static": SGLang's default two pools (the split ``ab --memory static``
    builds; ``state_slots`` replaces its state pool), the simulator's ``kv_tokens`` and
    ``state_slots`` options."""
    trace = _trace(workload, seed)
    requests = to_replay_requests(trace)
    sizes = size_pools(SPEC, CACHE_GB, memory, page_size=PAGE)
    slots = state_slots or sizes.mamba_slots
    longest = max(len(r.input_ids) + r.output_len for r in requests)
    pools = PoolConfig(kv_tokens=sizes.kv_tokens, mamba_slots=slots,
                       page_size=PAGE, max_context_len=longest + 2 * PAGE,
                       chunked_prefill_size=CHUNK, mamba_track_interval=TRACK,
                       extra_buffer=True, overlap_schedule=True)
    unified = UnifiedConfig.from_sizes(sizes) if memory == "unified" else None
    cfg = ABConfig(pools=pools, spec=SPEC, settings=settings, caches=(cache,),
                   unified=unified, overlap=True)
    sgl = make_cache(cache, cfg)[0]
    counters = instrument(sgl)
    replayer = Replayer(sgl, chunked_prefill_size=CHUNK, overlap=True)
    image = f"{policy}:materialise=sglang:chunk={CHUNK}:page={PAGE}:track={TRACK}:overlap=1"
    if memory == "static":
        image += f":kv_tokens={sizes.kv_tokens}:state_slots={slots}"
    sim = build_cache(parse_policy(image), SPEC,
                      sim_capacity(sizes) if memory == "unified" else None, PAGE, trace)
    before = (0, 0, 0)
    chunked = tracked = 0
    for i, (rr, r) in enumerate(zip(requests, trace.requests)):
        hit = replayer.run(rr).hit_len
        sim_hit = sim.process(r.input_tokens, r.full_tokens)
        where = f"request {i} (input {r.input_len}, output {r.output_len})"
        assert hit == sim_hit, f"{where}: hit {hit} (SGLang) != {sim_hit} (simulator)"
        now = (counters.states_admitted, counters.states_evicted, counters.kv_tokens_evicted)
        st = sim.stats
        assert (st.states_admitted, st.states_evicted, st.kv_tokens_evicted) == now, (
            f"{where}: states admitted / evicted, KV tokens evicted: SGLang "
            f"{tuple(b - a for a, b in zip(before, now))}, simulator "
            f"{(st.states_admitted - before[0], st.states_evicted - before[1], st.kv_tokens_evicted - before[2])}")
        policy = sgl.marconi
        if policy.end_usefulness is not None:  # marconi+'s learned end-state rule
            mine = (policy.end_usefulness.ends, policy.end_usefulness.reused,
                    policy.stats.end_states_skipped)
            ref = (sim.end_usefulness.ends, sim.end_usefulness.reused,
                   sim.stats.end_states_skipped)
            assert mine == ref, f"{where}: end states (ends, reused, skipped) {mine} != {ref}"
        ours, theirs = sglang_states(sgl), sim_states(sim)
        assert ours == theirs, (f"{where}: states only in SGLang {sorted(ours - theirs)[:4]}, "
                                f"only in the simulator {sorted(theirs - ours)[:4]}")
        before = now
        chunked += r.input_len - hit > CHUNK
        tracked += r.output_len > TRACK
    # the case at hand: multi-chunk prefills, decode snapshots, a buffer that evicts
    assert chunked and tracked and counters.states_evicted and counters.kv_tokens_evicted
    return len(requests), counters.states_evicted


@pytest.mark.parametrize("workload,seed", [("agent", 0), ("chat", 1)])
def test_marconi_plus_same_victims_as_the_plugin(workload, seed):
    n, evicted = run_pair(workload, seed, "marconi+", "marconi+", MarconiSettings())
    assert evicted > n // 4  # pressure throughout, not only at the end


def test_marconi_fixed_alpha_same_victims_as_the_plugin():
    """marconi with a fixed alpha: the joint walk in normalised-utility mode."""
    run_pair("agent", 1, "marconi", "marconi:alpha=1", MarconiSettings(alpha=1.0))


# ---- static pools (SGLang's default layout): the FULL walk and the MAMBA walk --------------------
@pytest.mark.parametrize("workload,seed", [("agent", 0), ("chat", 1)])
def test_marconi_plus_static_pools_same_victims_as_the_plugin(workload, seed):
    """The plugin's FULL walk (KV leaves by FLOPs per byte of their own KV, SGLang's FULL
    queue aged as it pops) and the simulator's image of it."""
    n, evicted = run_pair(workload, seed, "marconi+", "marconi+", MarconiSettings(),
                          memory="static")
    assert evicted > n // 4


@pytest.mark.parametrize("cache,policy,alpha", [("marconi+", "marconi+", 0.0),
                                                ("marconi", "marconi:alpha=1", 1.0)])
def test_static_pools_short_of_states_same_victims_as_the_plugin(cache, policy, alpha):
    """A state pool of 10 slots: the MAMBA walk runs (states by FLOPs per state; a leaf
    goes with its KV, an inner state becomes a tombstone), beside the FULL walk."""
    run_pair("agent", 1, cache, policy, MarconiSettings(alpha=alpha), memory="static",
             state_slots=10)
