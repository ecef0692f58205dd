"""``CostModel``: what the policy needs to know of a model (a typed interface implemented by
``HybridModelSpec`` and ``policy.ghost.UnitCost``)."""
from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class CostModel(Protocol):
    """Bytes and FLOPs of one hybrid model."""

    name: str

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes one token holds over all attention layers."""

    @property
    def ssm_state_bytes(self) -> int:
        """Bytes of one SSM-state checkpoint over all SSM layers."""

    def prefill_flops(self, L: float) -> float:
        """FLOPs of a prefill of ``L`` tokens without any cache."""

    def flops_saved(self, T: float, P: float = 0) -> float:
        """FLOPs a hit at ``T`` tokens saves over a hit at ``P`` tokens."""
