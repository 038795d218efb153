"""Typed view of a stored trace analysis (Kineto JSON or an Nsight Systems SQLite export:
jobs.profiling.trace_analysis.analyze_trace), one `TraceRank` per rank.

Units are the parser's: `*_pct` percentages (0-100) of the basis each block states, `*_ms`/`*_us`
milliseconds/microseconds, `*_unix` seconds since the epoch. Pure: no Django.
"""

from __future__ import annotations

from typing import Any

import msgspec

from jobs.profiling.schema.blocks import Capture, NamedTime, TensorCores
from jobs.profiling.schema.common import Num, lenient


class TemporalBreakdown(msgspec.Struct, frozen=True, kw_only=True):
    """The rank's GPU span split into idle / compute / non-compute time (HTA's temporal breakdown)."""

    idle_pct: Num | None = None
    compute_pct: Num | None = None
    non_compute_pct: Num | None = None
    idle_ms: Num | None = None
    compute_ms: Num | None = None
    non_compute_ms: Num | None = None
    span_ms: Num | None = None


class IdleBreakdown(msgspec.Struct, frozen=True, kw_only=True):
    """GPU idle time by cause (HTA's idle-time breakdown): `*_pct` % of idle time, `*_ms` milliseconds;
    `idle_ms` is the idle time of all streams together."""

    host_wait_pct: Num | None = None
    kernel_wait_pct: Num | None = None
    other_pct: Num | None = None
    host_wait_ms: Num | None = None
    kernel_wait_ms: Num | None = None
    other_ms: Num | None = None
    idle_ms: Num | None = None


class TinyKernels(msgspec.Struct, frozen=True, kw_only=True):
    """Kernels shorter than `threshold_us`."""

    threshold_us: Num | None = None
    count: Num | None = None
    count_pct: Num | None = None
    time_pct: Num | None = None


class TopKernel(msgspec.Struct, frozen=True, kw_only=True):
    """One of the kernels with the most time (`time_pct` of kernel time)."""

    name: str | None = None
    short_name: str | None = None
    kernel_class: str | None = None
    count: Num | None = None
    total_ms: Num | None = None
    mean_us: Num | None = None
    time_pct: Num | None = None


class KernelClassTime(msgspec.Struct, frozen=True, kw_only=True):
    """Kernels of one HTA category (COMPUTATION, COMMUNICATION, MEMORY): launches and total time (ms)."""

    kernel_class: str | None = None
    count: Num | None = None
    time_ms: Num | None = None


class KernelBreakdown(msgspec.Struct, frozen=True, kw_only=True):
    """Kernel counts and time of the analysed window; `top_kernels` lists the `distinct_kernels` names
    only in part when there are more of them than the parser keeps."""

    kernel_count: Num | None = None
    kernel_time_ms: Num | None = None
    distinct_kernels: Num | None = None
    by_class: list[KernelClassTime] = []
    tiny_kernels: TinyKernels = TinyKernels()
    top_kernels: list[TopKernel] = []


class Percentiles(msgspec.Struct, frozen=True, kw_only=True):
    """Percentiles of a per-launch duration (µs; jobs.profiling.gpu_stats._percentiles_us)."""

    p50_us: Num | None = None
    p90_us: Num | None = None


class LaunchStats(msgspec.Struct, frozen=True, kw_only=True):
    """CPU launch vs GPU duration of the kernels (HTA's kernel launch statistics): `launch_delay` from the
    end of the CUDA launch call to the kernel start, `cpu_launch_duration` the launch call itself,
    `gpu_duration` the op on the GPU; `launch_delay_outliers_count` launches delayed past the cutoff."""

    launches: Num | None = None
    gpu_shorter_than_launch_pct: Num | None = None
    launch_delay_outliers_count: Num | None = None
    launch_delay: Percentiles = Percentiles()
    cpu_launch_duration: Percentiles = Percentiles()
    gpu_duration: Percentiles = Percentiles()


class CopyKind(msgspec.Struct, frozen=True, kw_only=True):
    """Memory copies of one direction (HtoD, DtoH, DtoD, ...)."""

    copy_kind: str | None = None
    count: Num | None = None
    bytes: Num | None = None
    time_ms: Num | None = None


class Memcpy(msgspec.Struct, frozen=True, kw_only=True):
    """Memory copies; `pageable_bytes_pct` = share of host-side bytes from pageable memory (None: unknown)."""

    total_ms: Num | None = None
    by_kind: list[CopyKind] = []
    pageable_bytes_pct: Num | None = None


class Sync(msgspec.Struct, frozen=True, kw_only=True):
    """CPU-side synchronising calls and GPU-side sync records."""

    cpu_sync_calls: Num | None = None
    cpu_sync_ms: Num | None = None
    gpu_sync_count: Num | None = None
    cpu_sync_by_call: list[NamedTime] = []


class CommComputeOverlap(msgspec.Struct, frozen=True, kw_only=True):
    """Communication kernel time and how much of it overlaps computation."""

    communication_ms: Num | None = None
    computation_ms: Num | None = None
    overlap_ms: Num | None = None
    overlap_pct: Num | None = None


class Window(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What part of the trace was analysed (jobs.profiling.trace_analysis.analysis_window): ProfilerStep
    count, last step left out or not, GPU ops in the trace and in the window, and how it was chosen.

    `omit_defaults`: encoded (msgspec.to_builtins) it gives back the keys the parser wrote, not None for
    the ones an older analysis lacks.
    """

    profiler_steps: int | None = None
    excludes_last_profiler_step: bool | None = None
    gpu_ops_total: int | None = None
    gpu_ops_analysed: int | None = None
    note: str | None = None
    timestamps_rounded_to_us: bool | None = None


class StepSample(msgspec.Struct, frozen=True, kw_only=True):
    """One step of the trace and its duration (ms)."""

    name: str | None = None
    duration_ms: Num | None = None


class StepTimes(msgspec.Struct, frozen=True, kw_only=True):
    """Step durations (ProfilerStep or the step annotation the trace has)."""

    source: str | None = None
    count: Num | None = None
    mean_ms: Num | None = None
    median_ms: Num | None = None
    steps: list[StepSample] = []


class StepBreakdown(msgspec.Struct, frozen=True, kw_only=True):
    """Where a step's time goes (% of the step); `step_ms_mean` = the mean step (ms) over the window."""

    steps: Num | None = None
    step_ms_mean: Num | None = None
    kernel_pct: Num | None = None
    communication_pct: Num | None = None
    memcpy_pct: Num | None = None
    memset_pct: Num | None = None
    runtime_pct: Num | None = None
    dataloader_pct: Num | None = None
    cpu_exec_pct: Num | None = None
    other_pct: Num | None = None


class IdleGap(msgspec.Struct, frozen=True, kw_only=True):
    """GPU idle gaps with a duration in [lower_us, upper_us)."""

    lower_us: Num | None = None
    upper_us: Num | None = None
    count: Num | None = None
    time_ms: Num | None = None


class HostOp(msgspec.Struct, frozen=True, kw_only=True):
    """A host op the GPU waited behind (% of the attribution window)."""

    name: str | None = None
    count: Num | None = None
    idle_ms: Num | None = None
    idle_pct: Num | None = None


class HostWork(msgspec.Struct, frozen=True, kw_only=True):
    """Late-launch GPU idle split by what the host was doing (% of the window)."""

    late_launch_pct: Num | None = None
    queued_pct: Num | None = None
    runtime_pct: Num | None = None
    cpu_ops_pct: Num | None = None
    untraced_pct: Num | None = None
    cpu_ops_steps: Num | None = None
    cpu_ops_gaps: Num | None = None
    cpu_ops_largest_gap_pct: Num | None = None
    top_ops: list[HostOp] = []


class GpuIdleAttribution(msgspec.Struct, frozen=True, kw_only=True):
    """GPU idle time attributed to host activity (jobs.profiling.host_analysis; % of the profiled steps).

    Analyses older than this section lack it (`has_gpu_ops` None): rules then use their older criteria.
    """

    has_gpu_ops: bool | None = None
    #: "ProfilerStep" (% of the profiled steps) or the steady-state window's basis (% of the window).
    basis: str | None = None
    steps: Num | None = None
    idle_pct: Num | None = None
    input_pct: Num | None = None
    host_sync_pct: Num | None = None
    launch_gaps_pct: Num | None = None
    other_pct: Num | None = None
    launch_gaps_host_busy_pct: Num | None = None
    idle_gaps: list[IdleGap] = []
    host_sync_steps: Num | None = None
    host_sync_gaps: Num | None = None
    host_sync_largest_gap_pct: Num | None = None
    host_work: HostWork = HostWork()


class InputPipeline(msgspec.Struct, frozen=True, kw_only=True):
    """DataLoader time on the host; `iterator` = the iterator class ("single_process", "multi_process")."""

    dataloader_step_pct: Num | None = None
    iterator: str | None = None


class BlockingKind(msgspec.Struct, frozen=True, kw_only=True):
    """Blocking host calls of one kind (synchronize, pageable copy, ...)."""

    kind: str | None = None
    count: Num | None = None
    time_ms: Num | None = None


class BlockingSite(msgspec.Struct, frozen=True, kw_only=True):
    """A call site where the host blocks, with its share of the step."""

    site: str | None = None
    kind: str | None = None
    count: Num | None = None
    time_ms: Num | None = None
    step_pct: Num | None = None


class HostBlocking(msgspec.Struct, frozen=True, kw_only=True):
    """Host calls that block the CPU until the GPU catches up: `calls` and `blocked_ms` in all, and % of
    the step / of CPU busy time."""

    calls: Num | None = None
    blocked_ms: Num | None = None
    step_pct: Num | None = None
    cpu_time_pct: Num | None = None
    by_kind: list[BlockingKind] = []
    sites: list[BlockingSite] = []


class Phases(msgspec.Struct, frozen=True, kw_only=True):
    """The steady-state window; `basis` "gpu_span" = first kernel to last GPU activity (no ProfilerStep)."""

    basis: str | None = None
    window_start_unix: Num | None = None
    window_end_unix: Num | None = None


class TraceRank(msgspec.Struct, frozen=True, kw_only=True):
    """One rank of a trace analysis. An absent block reads as an empty one (all its numbers None), except
    `host_blocking`, whose presence is itself evidence (the parser's blocking-call analysis ran)."""

    rank: int | None = None
    label: str | None = None
    #: False for a rank without GPU kernels (CPU-only); older analyses lack it (None: assume it has some).
    has_gpu_kernels: bool | None = None
    temporal_breakdown: TemporalBreakdown = TemporalBreakdown()
    idle_breakdown: IdleBreakdown = IdleBreakdown()
    kernel_breakdown: KernelBreakdown = KernelBreakdown()
    launch_stats: LaunchStats = LaunchStats()
    memcpy: Memcpy = Memcpy()
    sync: Sync = Sync()
    comm_compute_overlap: CommComputeOverlap = CommComputeOverlap()
    window: Window = Window()
    tensor_cores: TensorCores = TensorCores()
    step_times: StepTimes = StepTimes()
    step_breakdown: StepBreakdown = StepBreakdown()
    gpu_idle_attribution: GpuIdleAttribution = GpuIdleAttribution()
    input_pipeline: InputPipeline = InputPipeline()
    host_blocking: HostBlocking | None = None
    phases: Phases = Phases()

    @property
    def attributed(self) -> bool:
        """True when the analysis splits GPU idle time by host activity (`gpu_idle_attribution`)."""
        return self.gpu_idle_attribution.has_gpu_ops is True

    @property
    def name(self) -> str:
        """The rank's label ("rank 3") as the parser wrote it, else from its number."""
        return self.label or f"rank {self.rank}"


class TraceSummary(msgspec.Struct, frozen=True, kw_only=True):
    """Means over the ranks (HTA's temporal and idle breakdowns; % of each rank's GPU span)."""

    ranks_with_gpu_ops: Num | None = None
    idle_pct_mean: Num | None = None
    compute_pct_mean: Num | None = None
    host_wait_pct_mean: Num | None = None


class TraceAnalysis(msgspec.Struct, frozen=True, kw_only=True):
    """A trace analysis (Kineto JSON or an Nsight Systems SQLite export)."""

    source: str | None = None
    capture: Capture | None = None
    summary: TraceSummary = TraceSummary()
    warnings: list[str] = []
    ranks: list[TraceRank] = []


def decode_trace(payload: Any) -> TraceAnalysis:
    """A stored trace analysis (Kineto / nsys SQLite); ranks that are not mappings are dropped."""
    return lenient(payload, TraceAnalysis)
