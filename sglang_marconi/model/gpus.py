"""GPU presets: the datasheet numbers the time models read (peak FLOP/s, HBM and host-link
bandwidth) and the assumed efficiencies, one home for the serving replay's clock
(``serving.gpu_model``) and the two-tier rule's load cost (``policy.host_tier``).

Peaks are the vendors' datasheet numbers (dense BF16 tensor-core FLOP/s, HBM bandwidth):
NVIDIA A100 SXM 80GB datasheet (312 TFLOP/s, 2.039 TB/s); H100 SXM datasheet (989 TFLOP/s,
3.35 TB/s); H200 SXM datasheet (989 TFLOP/s, 4.8 TB/s); B200 (HGX B200 datasheet: 2.25
PFLOP/s dense BF16, 8 TB/s). The host link (HiCache's host -> device load-back,
``pcie_bytes_s``) is one direction of the datasheets' bidirectional PCIe figure: A100 "PCIe
Gen4: 64 GB/s" -> 32 GB/s; H100 and H200 "PCIe Gen5: 128 GB/s" -> 64 GB/s; B200 assumed the
same Gen5 x16 link as the H200 (not checked against a datasheet). MFU, HBM efficiency and
the step overhead are assumptions, not measurements: no GPU was available to calibrate them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace


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
DEFAULT_HOST_GPU = "h200"  # the GPU the SGLang cache's two-tier rule assumes (it has no clock)


def preset(name: str, **overrides) -> GpuPreset:
    """A preset with the non-None ``overrides`` applied (KeyError for an unknown name)."""
    return replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})
