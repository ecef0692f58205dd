"""The virtual clock's time model of one forward step on a GPU (uncalibrated).

- prefill (extend) step: the cost model's FLOPs of the tokens computed, attention over the
  cached context included (``spec.prefill_flops(end) - spec.prefill_flops(start)`` per
  request: the ``b*L^2`` term of the difference is the new tokens' attention over the
  whole context), divided by ``mfu * dense peak``;
- decode step: a roofline, ``max(bytes / (hbm_efficiency * bandwidth), flops / (mfu *
  peak))``; bytes = the weights once (active parameters, ``spec``'s linear FLOPs per token
  / 2, times the dtype's bytes) + the KV of every running sequence + every request's SSM
  state read and written; flops = 2 * active parameters per token + attention over the
  context;
- every step adds ``step_overhead_s`` (scheduling, launch, sampling).

Presets' peaks are the vendors' datasheet numbers (dense BF16 tensor-core FLOP/s, HBM
bandwidth): NVIDIA A100 SXM 80GB datasheet (312 TFLOP/s, 2.039 TB/s); H100 SXM datasheet
(989 TFLOP/s, 3.35 TB/s); H200 SXM datasheet (989 TFLOP/s, 4.8 TB/s); B200 (HGX B200
datasheet: 2.25 PFLOP/s dense BF16, 8 TB/s). The host link (HiCache's host -> device
load-back, ``pcie_bytes_s``) is one direction of the datasheets' bidirectional PCIe figure:
A100 "PCIe Gen4: 64 GB/s" -> 32 GB/s; H100 and H200 "PCIe Gen5: 128 GB/s" -> 64 GB/s; B200
assumed the same Gen5 x16 link as the H200 (not checked against a datasheet). MFU, HBM efficiency and the overhead are
assumptions, not measurements: no GPU was available to calibrate them. MoE models: the
weights read per decode step are the *active* parameters (a lower bound when a large batch
touches every expert).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from sglang_marconi.model.spec import dtype_bytes
from sglang_marconi.policy.host_tier import HostLink


@dataclass(frozen=True)
class GpuPreset:
    name: str
    peak_flops: float          # dense BF16 tensor-core FLOP/s (datasheet)
    hbm_bytes_s: float         # HBM bandwidth, bytes/s (datasheet)
    mfu: float = 0.45          # assumed fraction of the peak a prefill reaches
    hbm_efficiency: float = 0.7  # assumed fraction of the bandwidth a decode step reaches
    step_overhead_s: float = 0.002  # assumed fixed cost of one scheduler step + launch
    pcie_bytes_s: float = 64e9    # host -> device bytes/s (one direction of the datasheet's)

    def as_dict(self) -> dict:
        return asdict(self)


PRESETS = {
    "a100": GpuPreset("a100", 312e12, 2.039e12, pcie_bytes_s=32e9),
    "h100": GpuPreset("h100", 989e12, 3.35e12),
    "h200": GpuPreset("h200", 989e12, 4.8e12),
    "b200": GpuPreset("b200", 2250e12, 8.0e12),
}
OVERRIDABLE = ("peak_flops", "hbm_bytes_s", "mfu", "hbm_efficiency", "step_overhead_s",
               "pcie_bytes_s")
DEFAULT_HOST_GPU = "h200"  # the GPU the SGLang cache's two-tier rule assumes (it has no clock)


def preset(name: str, **overrides) -> GpuPreset:
    """A preset with the non-None ``overrides`` applied (KeyError for an unknown name)."""
    return replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})


def host_link_preset(name: str = DEFAULT_HOST_GPU, **overrides) -> HostLink:
    """The two-tier rule's cost of a host load on a preset: PCIe bytes/s and the prefill
    FLOP rate (mfu x peak) whose FLOPs a load's time forgoes."""
    gpu = preset(name, **overrides)
    return HostLink(gpu.pcie_bytes_s, gpu.mfu * gpu.peak_flops)


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

    def prefill_seconds(self, flops: float) -> float:
        return flops / self.prefill_flops_s + self.gpu.step_overhead_s

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
