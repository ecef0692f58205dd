"""The virtual clock's time model of one forward step on a GPU (uncalibrated): prefill FLOPs
over ``mfu * peak``, a decode roofline, a fixed step overhead, and host load-backs overlapped
with the forward. Presets: ``model.gpus``."""
from __future__ import annotations

# the presets live in model.gpus (the SGLang cache reads them too); re-exported here
from sglang_marconi.model.gpus import PRESETS, GpuPreset, preset  # noqa: F401
from sglang_marconi.model.spec import dtype_bytes


class GpuTimeModel:
    """Seconds of one forward step for a model spec on a GPU preset."""

    def __init__(self, spec, gpu: GpuPreset):
        self.spec = spec
        self.gpu = gpu
        linear, self.attn_coeff = spec._coeffs  # prefill_flops(L) = linear*L + attn*L^2
        self.flops_per_token = linear
        self.weight_bytes = linear / 2 * dtype_bytes(spec.dtype)
        self.kv_bytes_per_token = spec.kv_bytes_per_token
        self.state_bytes = spec.ssm_state_bytes
        self.prefill_flops_s = gpu.mfu * gpu.peak_flops
        self.decode_bytes_s = gpu.hbm_efficiency * gpu.hbm_bytes_s

    def extend_flops(self, start: int, end: int) -> float:
        """FLOPs of computing tokens [start, end) over a cached context of ``start``."""
        return self.spec.prefill_flops(end) - self.spec.prefill_flops(start)

    def prefill_seconds(self, flops: float, load_s: float = 0.0) -> float:
        """An extend step: the longer of its forward and its host load-back ``load_s``."""
        return max(flops / self.prefill_flops_s, load_s) + self.gpu.step_overhead_s

    def load_seconds(self, nbytes: float) -> float:
        """A host -> device copy of ``nbytes`` over the host link (``pcie_bytes_s``)."""
        return nbytes / self.gpu.pcie_bytes_s

    def decode_seconds(self, seq_lens_sum: int, batch_size: int) -> float:
        if batch_size == 0:
            return 0.0
        read = (self.weight_bytes + seq_lens_sum * self.kv_bytes_per_token
                + 2 * batch_size * self.state_bytes)
        flops = batch_size * self.flops_per_token + 2 * self.attn_coeff * seq_lens_sum
        return (max(read / self.decode_bytes_s, flops / self.prefill_flops_s)
                + self.gpu.step_overhead_s)

    def describe(self) -> str:
        g = self.gpu
        return (f"{g.name}: {g.peak_flops / 1e12:g} TFLOP/s dense x MFU {g.mfu:g}, "
                f"{g.hbm_bytes_s / 1e12:g} TB/s x {g.hbm_efficiency:g}, "
                f"{g.step_overhead_s * 1e3:g} ms/step overhead (uncalibrated)")
