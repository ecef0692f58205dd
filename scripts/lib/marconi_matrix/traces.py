"""The matrix's traffic: the bundled Mooncake trace, every seeded generator of
``sglang_marconi.sim.generators`` at a size of at least 1,000 requests, and a
Mooncake-format multi-turn generator (``mooncake_turns``).

``mooncake_turns``: conversations in Mooncake's layout (512-token blocks, as the bundled
trace's ``hash_ids``). A turn's input is an earlier turn's input of the same conversation
(the previous one, or with probability ``p_rewind`` an older one: a regenerated answer, an
edited message) followed by new blocks; outputs are fresh tokens that never reappear in a
later input, so a next turn resumes exactly at an earlier input's end. First inputs are
long (lognormal around ``first_median`` tokens, up to ``max_len``): the long-context case.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sglang_marconi.sim.generators import generate
from sglang_marconi.sim.traces import FRESH_TOKEN_BASE, MOONCAKE_BLOCK, Request, Trace, read_trace


@dataclass
class MooncakeTurns:
    sessions: int = 260
    session_rate: float = 0.4      # conversations started per second (Poisson)
    mean_turns: float = 4.5        # geometric
    max_turns: int = 16
    first_median: int = 12_000     # tokens of the first input (lognormal, sigma 0.6)
    max_len: int = 60_000
    new_blocks_max: int = 4        # blocks a turn adds (1..max)
    p_rewind: float = 0.15
    output_median: int = 250
    think_s: float = 20.0


def mooncake_turns(p: MooncakeTurns, seed: int) -> Trace:
    rng = np.random.default_rng(seed)
    next_block, next_fresh = 0, FRESH_TOKEN_BASE
    reqs = []

    def blocks(n):
        nonlocal next_block
        ids = np.arange(next_block, next_block + n, dtype=np.int64)
        next_block += n
        return ((ids[:, None] * MOONCAKE_BLOCK)
                + np.arange(MOONCAKE_BLOCK, dtype=np.int64)).ravel()

    starts = np.cumsum(rng.exponential(1.0 / p.session_rate, size=p.sessions))
    for s, t in enumerate(starts):
        first = int(np.clip(rng.lognormal(np.log(p.first_median), 0.6), MOONCAKE_BLOCK,
                            p.max_len))
        inputs = [blocks(-(-first // MOONCAKE_BLOCK))]
        turns = min(p.max_turns, int(rng.geometric(1.0 / p.mean_turns)))
        for k in range(turns):
            if k:
                base = (inputs[int(rng.integers(0, len(inputs)))]
                        if len(inputs) > 1 and rng.random() < p.p_rewind else inputs[-1])
                add = blocks(int(rng.integers(1, p.new_blocks_max + 1)))
                inputs.append(np.concatenate([base, add])[:p.max_len])
            n_out = int(np.clip(rng.lognormal(np.log(p.output_median), 0.8), 4, 4000))
            out = np.arange(next_fresh, next_fresh + n_out, dtype=np.int64)
            next_fresh += n_out
            reqs.append(Request(inputs[-1], out, float(t), f"mc-{s}"))
            t += n_out / 50.0 + rng.exponential(p.think_s)
    return Trace("mooncake-turns", sorted(reqs, key=lambda r: r.timestamp))


# name -> (how to build it from a seed); each at least 1,000 requests
GENERATED = {
    "chat": lambda seed: generate("chat", seed=seed, sessions=300),
    "agent": lambda seed: generate("agent", seed=seed, sessions=40),
    "shared-prompt": lambda seed: generate("shared-prompt", seed=seed, requests=1200),
    "fork-join": lambda seed: generate("fork-join", seed=seed, programs=220),
    "drift": lambda seed: generate("drift", seed=seed),
    "alpha-shift": lambda seed: generate("alpha-shift", seed=seed, requests_per_phase=400),
    "mooncake-turns": lambda seed: mooncake_turns(MooncakeTurns(), seed),
}
BUNDLED_LIMIT = 2000  # the bundled trace's first requests (it has no seed)


def build(name: str, seed: int, bundled_path) -> Trace:
    if name == "bundled":
        return read_trace(bundled_path).head(BUNDLED_LIMIT)
    return GENERATED[name](seed)
