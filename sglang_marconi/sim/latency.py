"""A first-order TTFT model for the simulator: FLOPs of the uncached prefill / (dense peak x
MFU) + a fixed overhead; no queueing, so it isolates what a hit saves."""
from __future__ import annotations

from dataclasses import dataclass

from sglang_marconi.errors import UserError

GPU_PEAK_TFLOPS = {"a100": 312.0, "h100": 989.0, "h200": 989.0, "l40s": 362.0, "b200": 2250.0}


@dataclass(frozen=True)
class LatencyModel:
    gpu: str = "a100"
    mfu: float = 0.5
    overhead_s: float = 0.02

    def __post_init__(self):
        if self.gpu not in GPU_PEAK_TFLOPS:
            raise UserError(f"unknown --gpu {self.gpu!r}; known: {', '.join(GPU_PEAK_TFLOPS)}")
        if not 0 < self.mfu <= 1:
            raise UserError(f"--mfu must be in (0, 1], got {self.mfu}")
        if self.overhead_s < 0:
            raise UserError("--ttft-overhead must be >= 0")

    @property
    def flops_per_s(self) -> float:
        return GPU_PEAK_TFLOPS[self.gpu] * 1e12 * self.mfu

    def ttft(self, spec, input_len: int, hit_len: int) -> float:
        return (spec.prefill_flops(input_len) - spec.prefill_flops(hit_len)) / self.flops_per_s \
            + self.overhead_s
