"""The simulator configured as SGLang's image: one factory for every place that needs it.

SGLang's cache differs from the paper's single budget in ways a ``PrefixCache`` can mirror
(``PrefixCache`` documents each knob): two pools, so a cache of the state pool alone
(``StatePoolCost``: KV free); SGLang's eviction timing (``evict_at="begin"``), branch rule
(``"kv"`` with the extra buffer, ``"none"`` without), recency stamps (an insert half a tick
after the hit) and normalisation. The parity tests (``parity_harness.py``) build their simulators here.
"""
from __future__ import annotations

from typing import Optional

from sglang_marconi.model.cost import CostModel
from sglang_marconi.policy import defaults
from sglang_marconi.policy.cache import PrefixCache



def running_state_slots(extra_buffer: bool) -> int:
    """State slots one running SGLang request holds: working + 2 ping-pong with the extra
    buffer, the working slot alone without."""
    return 3 if extra_buffer else 1

class StatePoolCost:
    """A cost model as SGLang's state pool sees it: KV has its own pool, so it is free; a
    simulator cache with this model budgets state slots only."""

    kv_bytes_per_token = 0

    def __init__(self, spec: CostModel):
        self.spec = spec
        self.name = spec.name
        self.ssm_state_bytes = spec.ssm_state_bytes

    def prefill_flops(self, L: float) -> float:
        return self.spec.prefill_flops(L)

    def flops_saved(self, T: float, P: float = 0) -> float:
        return self.spec.flops_saved(T, P)


def sglang_image(spec: CostModel, capacity_bytes: Optional[int], *, extra_buffer: bool,
                 grid: int, alpha=0.0, max_states_per_request: int,
                 cache_output: bool = True, renormalise: bool = True,
                 **plus) -> PrefixCache:
    """A ``PrefixCache`` that makes SGLang's decisions where the two models coincide.

    ``extra_buffer``: SGLang's ``--mamba-radix-cache-strategy`` (branch states only with
    the extra buffer). ``grid``: the cache's checkpoint grid. ``renormalise``: the per-walk
    min-max refresh (SGLang's, below ``--marconi-renormalise-limit`` candidates).
    ``plus``: marconi+ knobs (``reuse_weight``, ``ghost_tokens``, ``end_threshold``)."""
    return PrefixCache(
        spec, capacity_bytes, alpha=alpha, grid=grid,
        max_states_per_request=max_states_per_request, cache_output=cache_output,
        branch_rule="kv" if extra_buffer else "none", evict_at="begin",
        renormalise=renormalise, insert_clock_offset=defaults.INSERT_CLOCK_OFFSET, **plus)


def state_pool_image(spec: CostModel, state_slots: int, *, extra_buffer: bool, grid: int,
                     alpha: float, max_states_per_request: int, renormalise_limit: int,
                     sample: float = 1.0) -> PrefixCache:
    """The image of one SGLang state pool of ``state_slots`` slots: the slots a running
    request leaves to the tree, KV free, ``sample`` of the prefix families; renormalised
    per walk as the SGLang cache is (``--marconi-renormalise-limit``: -1 always, else up to
    that many candidates)."""
    slots = max(1, state_slots - running_state_slots(extra_buffer))
    renormalise = renormalise_limit < 0 or slots <= renormalise_limit
    return sglang_image(StatePoolCost(spec), int(slots * spec.ssm_state_bytes * sample),
                        extra_buffer=extra_buffer, grid=grid, alpha=alpha,
                        max_states_per_request=max_states_per_request,
                        renormalise=renormalise)
