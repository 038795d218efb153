"""GPU models the simulator knows: what dcgm-exporter reports for them and what the physics allows.

The product's GPU catalog (`jobs.evaluation.catalog.GPU_SPECS`, the table the database rows are seeded
from) is the one source for every figure it has: dense BF16 peak, TDP, and memory and max boost clock
where the catalog holds a reading. The rest is the simulator's own and approximate (idle clock and power,
memory clock, reserved frame buffer, link speeds), as is memory or max clock for a part whose catalog row
has no nvidia-smi reading yet (H100 PCIe / NVL, H200, B200, L40S): those are marked ``approx_*`` below.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from jobs.evaluation.catalog import match_gpu_name


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


def _from_catalog(
    model_name: str,
    *,
    fb_reserved_mib: int,
    idle_sm_clock_mhz: int,
    mem_clock_mhz: int,
    idle_w: float,
    pcie_gbps: float,
    nvlink_gbps: float,
    approx_fb_total_mib: int | None = None,
    approx_max_sm_clock_mhz: int | None = None,
) -> GpuModel:
    """A simulated model whose peak, TDP, memory and max clock come from the catalog row it matches.

    An ``approx_*`` value is used only where the catalog has no figure, and is refused where it has one
    (two values for one fact is what this module must not hold)."""
    spec = match_gpu_name(model_name)
    if spec is None:
        raise ValueError(f"{model_name!r} matches no row of the GPU catalog")
    peak = spec.peak_tflops.get("bf16")
    if peak is None or spec.tdp_w is None:
        raise ValueError(f"the catalog row {spec.name!r} has no dense BF16 peak or no TDP")
    if spec.memory_mib is not None and approx_fb_total_mib is not None:
        raise ValueError(f"{spec.name}: the catalog has the memory; drop the simulator's approximation")
    if spec.max_clock_mhz is not None and approx_max_sm_clock_mhz is not None:
        raise ValueError(f"{spec.name}: the catalog has the max clock; drop the simulator's approximation")
    fb_total = spec.memory_mib if spec.memory_mib is not None else approx_fb_total_mib
    max_clock = spec.max_clock_mhz if spec.max_clock_mhz is not None else approx_max_sm_clock_mhz
    if fb_total is None or max_clock is None:
        raise ValueError(f"{spec.name}: neither the catalog nor the simulator has its memory and max clock")
    return GpuModel(
        model_name=model_name,
        fb_total_mib=int(fb_total),
        fb_reserved_mib=fb_reserved_mib,
        max_sm_clock_mhz=int(max_clock),
        idle_sm_clock_mhz=idle_sm_clock_mhz,
        mem_clock_mhz=mem_clock_mhz,
        tdp_w=float(spec.tdp_w),
        idle_w=idle_w,
        peak_bf16_tflops=float(peak),
        pcie_gbps=pcie_gbps,
        nvlink_gbps=nvlink_gbps,
    )


_M = _from_catalog
GPU_MODELS: dict[str, GpuModel] = {
    m.model_name: m
    for m in (
        _M("NVIDIA H100 80GB HBM3", fb_reserved_mib=536, idle_sm_clock_mhz=345, mem_clock_mhz=2619,
           idle_w=70, pcie_gbps=50, nvlink_gbps=400),
        _M("NVIDIA H100 PCIe", fb_reserved_mib=536, idle_sm_clock_mhz=345, mem_clock_mhz=1593, idle_w=48,
           pcie_gbps=50, nvlink_gbps=0, approx_fb_total_mib=81559, approx_max_sm_clock_mhz=1755),
        _M("NVIDIA H100 NVL", fb_reserved_mib=536, idle_sm_clock_mhz=345, mem_clock_mhz=2619, idle_w=55,
           pcie_gbps=50, nvlink_gbps=300, approx_fb_total_mib=95830, approx_max_sm_clock_mhz=1785),
        _M("NVIDIA H200", fb_reserved_mib=552, idle_sm_clock_mhz=345, mem_clock_mhz=3201, idle_w=75,
           pcie_gbps=50, nvlink_gbps=400, approx_fb_total_mib=143771, approx_max_sm_clock_mhz=1980),
        _M("NVIDIA A100-SXM4-80GB", fb_reserved_mib=568, idle_sm_clock_mhz=210, mem_clock_mhz=1593,
           idle_w=60, pcie_gbps=25, nvlink_gbps=250),
        _M("NVIDIA A100-SXM4-40GB", fb_reserved_mib=568, idle_sm_clock_mhz=210, mem_clock_mhz=1215,
           idle_w=55, pcie_gbps=25, nvlink_gbps=250),
        _M("NVIDIA A100-PCIE-40GB", fb_reserved_mib=568, idle_sm_clock_mhz=210, mem_clock_mhz=1215,
           idle_w=35, pcie_gbps=25, nvlink_gbps=0),
        _M("NVIDIA B200", fb_reserved_mib=600, idle_sm_clock_mhz=120, mem_clock_mhz=3996, idle_w=140,
           pcie_gbps=55, nvlink_gbps=800, approx_fb_total_mib=183359, approx_max_sm_clock_mhz=1965),
        _M("NVIDIA L40S", fb_reserved_mib=480, idle_sm_clock_mhz=210, mem_clock_mhz=9001, idle_w=35,
           pcie_gbps=25, nvlink_gbps=0, approx_fb_total_mib=46068, approx_max_sm_clock_mhz=2520),
    )
}  # fmt: skip

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
