"""Typed views of stored `nsys stats` CSV analyses (jobs.profiling.nsys_stats) and Nsight Compute
CSV analyses (jobs.profiling.ncu).

Units are the parsers': `*_pct` percentages (0-100), `*_ms`/`*_us` milliseconds/microseconds.
Pure: no Django.
"""

from __future__ import annotations

from typing import Any

import msgspec

from jobs.profiling.schema.blocks import TensorCores
from jobs.profiling.schema.common import Num, lenient


class NsysTopKernel(msgspec.Struct, frozen=True, kw_only=True):
    """One of the kernels with the most time in `nsys stats` (`time_pct` of kernel time)."""

    name: str | None = None
    time_pct: Num | None = None
    total_time_ms: Num | None = None
    instances: Num | None = None
    avg_us: Num | None = None


class NsysKernels(msgspec.Struct, frozen=True, kw_only=True):
    """Kernel summary of `nsys stats` (cuda_gpu_kern_sum); tiny = shorter than `tiny_threshold_us`."""

    total_time_ms: Num | None = None
    instances: Num | None = None
    tiny_threshold_us: Num | None = None
    tiny_instance_share_pct: Num | None = None
    nccl_time_share_pct: Num | None = None
    top: list[NsysTopKernel] = []


class NsysCudaApi(msgspec.Struct, frozen=True, kw_only=True):
    """CUDA API summary of `nsys stats` (cuda_api_sum): synchronising calls."""

    sync_calls: Num | None = None
    sync_share_of_api_pct: Num | None = None


class MemoryOperation(msgspec.Struct, frozen=True, kw_only=True):
    """One memory operation of `nsys stats` (cuda_gpu_mem_time_sum), e.g. "[CUDA memcpy Host-to-Device]"."""

    operation: str | None = None
    total_time_ms: Num | None = None


class NsysMemoryOps(msgspec.Struct, frozen=True, kw_only=True):
    """Memory operations of `nsys stats`."""

    by_operation: list[MemoryOperation] = []


class NsysStatsAnalysis(msgspec.Struct, frozen=True, kw_only=True):
    """An `nsys stats` CSV analysis (nsys_stats.analyze_nsys_stats; `format` "nsys_stats_csv")."""

    format: str | None = None
    kernels: NsysKernels = NsysKernels()
    cuda_api: NsysCudaApi = NsysCudaApi()
    memory_ops: NsysMemoryOps = NsysMemoryOps()
    tensor_cores: TensorCores = TensorCores()


class NcuKernel(msgspec.Struct, frozen=True, kw_only=True):
    """One kernel of an Nsight Compute report, its launches summed; throughputs in % of peak."""

    kernel: str | None = None
    bound: str | None = None
    launches: Num | None = None
    total_duration_ms: Num | None = None
    sm_throughput_pct: Num | None = None
    memory_throughput_pct: Num | None = None


class NcuAnalysis(msgspec.Struct, frozen=True, kw_only=True):
    """An Nsight Compute CSV analysis (ncu.analyze_ncu; `format` "ncu_csv").

    `bound_time_share_pct` / `ncu_verdict_time_share_pct`: share of kernel time per bound ("memory",
    "compute", ...) by our roofline reading and by ncu's own verdict; `duration_weighted_*`: per-kernel
    metrics weighted by kernel duration.
    """

    format: str | None = None
    kernel_launches: Num | None = None
    total_duration_ms: Num | None = None
    duration_weighted_achieved_occupancy_pct: Num | None = None
    kernels: list[NcuKernel] = []
    bound_time_share_pct: dict[str, Num] = {}
    ncu_verdict_time_share_pct: dict[str, Num] = {}
    duration_weighted_memory_throughput_pct: Num | None = None
    duration_weighted_sm_throughput_pct: Num | None = None
    tensor_cores: TensorCores = TensorCores()


def decode_nsys_stats(payload: Any) -> NsysStatsAnalysis:
    """A stored `nsys stats` CSV analysis."""
    return lenient(payload, NsysStatsAnalysis)


def decode_ncu(payload: Any) -> NcuAnalysis:
    """A stored Nsight Compute CSV analysis."""
    return lenient(payload, NcuAnalysis)
