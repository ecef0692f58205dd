"""GPU presets: datasheet peaks and bandwidths (``pcie_bytes_s``: one direction) and assumed
efficiencies, for the serving clock and the two-tier rule's load cost."""
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
