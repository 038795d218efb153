"""GPU models the simulator knows: what dcgm-exporter reports for them and what the physics allows.

Approximate values for simulation only (capacities as `nvidia-smi` shows them, typical idle power and
clocks); the product's GPU catalog, not this table, is the authority for peaks and prices. Dense BF16
peaks are from `reference/gpus.md`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuModel:
    """Static properties of one GPU model as the simulator uses them."""

    model_name: str  # dcgm-exporter's modelName label
    fb_total_mib: int
    fb_reserved_mib: int
    max_sm_clock_mhz: int
    idle_sm_clock_mhz: int
    mem_clock_mhz: int
    tdp_w: float
    idle_w: float
    peak_bf16_tflops: float  # dense
    pcie_gbps: float  # practical host<->device bandwidth per direction, GB/s
    nvlink_gbps: float  # practical NVLink bandwidth per direction, GB/s (0: none)


GPU_MODELS: dict[str, GpuModel] = {
    m.model_name: m
    for m in (
        GpuModel("NVIDIA H100 80GB HBM3", 81559, 536, 1980, 345, 2619, 700, 70, 989.5, 50, 400),
        GpuModel("NVIDIA H100 PCIe", 81559, 536, 1755, 345, 1593, 350, 48, 756, 50, 0),
        GpuModel("NVIDIA H100 NVL", 95830, 536, 1785, 345, 2619, 400, 55, 835.5, 50, 300),
        GpuModel("NVIDIA H200", 143771, 552, 1980, 345, 3201, 700, 75, 989.5, 50, 400),
        GpuModel("NVIDIA A100-SXM4-80GB", 81920, 568, 1410, 210, 1593, 400, 60, 312, 25, 250),
        GpuModel("NVIDIA A100-SXM4-40GB", 40960, 568, 1410, 210, 1215, 400, 55, 312, 25, 250),
        GpuModel("NVIDIA A100-PCIE-40GB", 40960, 568, 1410, 210, 1215, 250, 35, 312, 25, 0),
        GpuModel("NVIDIA B200", 183359, 600, 1965, 120, 3996, 1000, 140, 2250, 55, 800),
        GpuModel("NVIDIA L40S", 46068, 480, 2520, 210, 9001, 350, 35, 362, 25, 0),
    )
}

# Bus ids of an 8-GPU HGX board (DGX H100 order); further indexes get synthetic ids.
_HGX_BUS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")


def gpu_model(name: str) -> GpuModel:
    """The model for a modelName; unknown names raise ValueError (no silent A100 fallback)."""
    try:
        return GPU_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown GPU model {name!r}; known: {', '.join(GPU_MODELS)}") from None


def pci_bus_id(index: int) -> str:
    """dcgm-exporter's pci_bus_id label for the GPU at `index` on an HGX-style board."""
    bus = _HGX_BUS[index] if index < len(_HGX_BUS) else f"{0xC0 + index:02X}"
    return f"00000000:{bus}:00.0"


def gpu_uuid(hostname: str, index: int) -> str:
    """A stable, realistic-looking UUID for a physical GPU (same host and index -> same UUID)."""
    h = hashlib.sha256(f"{hostname}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
