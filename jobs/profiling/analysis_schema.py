"""Typed views of the stored artifact analyses (Artifact.analysis): msgspec Structs decoded leniently.

The parsers in jobs.profiling write plain JSON dicts (kept as stored: no migration); the diagnosis rules
and pages read them through these Structs, so a reader names fields instead of walking
`dict[str, Any]` paths. Only the blocks something reads are declared; everything else in the stored
JSON is ignored.

Decoding is lenient because analyses stored by older parser versions (or partial parses) lack keys or
carry other types: a missing key or a value of the wrong type reads as the field's default (None for
numbers and text, [] for lists, an empty block for a nested block), a list entry of the wrong shape is
dropped, unknown keys are ignored, a non-finite number reads as None. Decoding never raises on stored
data. This differs from jobs.evaluation.schema, whose one writer is ours and whose payload is refused
whole when it does not fit.

Units are the parsers' own (see jobs.profiling.trace_analysis, nsys_stats, ncu, pyspy, monitoring):
`*_pct` are percentages (0-100) of the basis the block states, `*_ms`/`*_us` milliseconds/microseconds,
`*_unix` seconds since the epoch.

Pure: no Django.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from functools import cache
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import inspect as mi

S = TypeVar("S", bound=msgspec.Struct)

#: A finite float. The bounds make msgspec refuse NaN and ±inf (a comparison with NaN is false), so the
#: strict fast path of `lenient` falls back to the field-by-field walk, which reads them as None.
Num = Annotated[float, msgspec.Meta(ge=-sys.float_info.max, le=sys.float_info.max)]


class _Unfit(Exception):
    """A stored value does not fit the declared type (internal: the field then takes its default)."""


@cache
def _info(cls: type[msgspec.Struct]) -> mi.StructType:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType), cls
    return info


def _fit(value: Any, t: mi.Type) -> Any:
    """`value` as type `t`, or _Unfit. Lists and dicts keep the entries that fit."""
    if isinstance(t, mi.AnyType):
        return value
    if isinstance(t, mi.NoneType):
        if value is None:
            return None
        raise _Unfit
    if isinstance(t, mi.UnionType):
        for member in t.types:
            try:
                return _fit(value, member)
            except _Unfit:
                continue
        raise _Unfit
    if isinstance(t, mi.BoolType):
        if isinstance(value, bool):
            return value
        raise _Unfit
    if isinstance(t, mi.IntType):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Unfit
    if isinstance(t, mi.FloatType):
        # bool is an int in Python but never a measurement; NaN/inf are "unknown" (make_storable writes None).
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise _Unfit
    if isinstance(t, mi.StrType):
        if isinstance(value, str):
            return value
        raise _Unfit
    if isinstance(t, mi.ListType):
        if not isinstance(value, list):
            raise _Unfit
        out = []
        for item in value:
            try:
                out.append(_fit(item, t.item_type))
            except _Unfit:
                continue
        return out
    if isinstance(t, mi.DictType):
        if not isinstance(value, Mapping):
            raise _Unfit
        kept = {}
        for k, v in value.items():
            if not isinstance(k, str):
                continue
            try:
                kept[k] = _fit(v, t.value_type)
            except _Unfit:
                continue
        return kept
    if isinstance(t, mi.StructType):
        return _struct(value, t)
    raise TypeError(f"analysis_schema cannot decode {t!r}")  # a declaration error, not bad data


def _struct(value: Any, t: mi.StructType) -> Any:
    if not isinstance(value, Mapping):
        raise _Unfit
    kwargs: dict[str, Any] = {}
    for field in t.fields:
        if field.encode_name in value:
            try:
                kwargs[field.name] = _fit(value[field.encode_name], field.type)
            except _Unfit:
                continue  # the field's default: a wrong type reads as absent
    return t.cls(**kwargs)


def lenient(payload: Any, cls: type[S]) -> S:
    """`payload` decoded as `cls`, field by field: what is missing or does not fit takes the default.

    A payload that is not a mapping at all gives `cls()` (every field at its default). A payload that
    fits as a whole is converted by msgspec in one call (about 0.01 ms for a trace analysis where the
    walk takes about 1 ms); one that does not is walked field by field.
    """
    if isinstance(payload, dict):
        try:
            return msgspec.convert(payload, cls)
        except msgspec.ValidationError:
            pass
    try:
        out = _struct(payload, _info(cls))
    except _Unfit:
        return cls()
    assert isinstance(out, cls)
    return out


def declared_paths(cls: type[msgspec.Struct]) -> list[str]:
    """Every leaf a Struct declares, as stored-key paths ("a.b", "a.c[].d"): what its readers can read.

    The parsers' authors check a rename against this (tests/unit/test_real_samples_diagnosis).
    """
    out: list[str] = []

    def walk(t: mi.Type, prefix: str) -> None:
        if isinstance(t, mi.UnionType):
            structs = [m for m in t.types if isinstance(m, mi.StructType)]
            if structs:
                walk(structs[0], prefix)
                return
        if isinstance(t, mi.StructType):
            for field in t.fields:
                walk(field.type, f"{prefix}.{field.encode_name}" if prefix else field.encode_name)
            return
        if isinstance(t, mi.ListType) and isinstance(t.item_type, mi.StructType):
            walk(t.item_type, prefix + "[]")
            return
        out.append(prefix)

    walk(_info(cls), "")
    return out


# --- shared blocks ---------------------------------------------------------------------------------


class Capture(msgspec.Struct, frozen=True, kw_only=True):
    """What an artifact captured and when (jobs.profiling.capture contract); None/[] = unknown."""

    gpu_names: list[str] = []
    start_unix: Num | None = None
    end_unix: Num | None = None
    ranks: list[int] = []
    world_size: int | None = None
    source: str | None = None
    hosts: list[str] = []
    pids: list[int] = []
    commands: list[str] = []

    @property
    def window(self) -> tuple[float, float] | None:
        """(start_unix, end_unix) when both are known and in order."""
        if self.start_unix is None or self.end_unix is None or self.end_unix < self.start_unix:
            return None
        return self.start_unix, self.end_unix


class NamedTime(msgspec.Struct, frozen=True, kw_only=True):
    """A named kernel or call with its count and total time (ms)."""

    name: str | None = None
    count: Num | None = None
    time_ms: Num | None = None


class TensorCores(msgspec.Struct, frozen=True, kw_only=True):
    """Tensor-core vs SIMT (FP32 pipe) compute (trace, nsys stats and ncu analyses; % of compute time,
    `tensor_core_time_pct` of all kernel time).

    `tensor_pipe_active_pct` is ncu's measured tensor pipe utilisation; the rest are classified by
    kernel name (jobs.profiling.kernel_classes.math_class).
    """

    tensor_core_time_pct: Num | None = None
    tensor_core_compute_time_pct: Num | None = None
    simt_compute_time_pct: Num | None = None
    compute_share_of_kernel_time_pct: Num | None = None
    tensor_pipe_active_pct: Num | None = None
    top_simt_kernels: list[NamedTime] = []


# --- trace analyses (Kineto / Nsight Systems export: trace_analysis.analyze_trace) ----------------------


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
    """GPU idle time by cause (HTA's idle-time breakdown; % of idle time)."""

    host_wait_pct: Num | None = None
    kernel_wait_pct: Num | None = None
    other_pct: Num | None = None


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


class KernelBreakdown(msgspec.Struct, frozen=True, kw_only=True):
    """Kernel counts and time of the analysed window."""

    kernel_count: Num | None = None
    kernel_time_ms: Num | None = None
    tiny_kernels: TinyKernels = TinyKernels()
    top_kernels: list[TopKernel] = []


class LaunchDelay(msgspec.Struct, frozen=True, kw_only=True):
    """From the CUDA launch call to the kernel start (µs)."""

    p50_us: Num | None = None


class LaunchStats(msgspec.Struct, frozen=True, kw_only=True):
    """CPU launch vs GPU duration of the kernels."""

    launches: Num | None = None
    gpu_shorter_than_launch_pct: Num | None = None
    launch_delay: LaunchDelay = LaunchDelay()


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


class Window(msgspec.Struct, frozen=True, kw_only=True):
    """What part of the trace was analysed (ProfilerStep count, last step left out or not)."""

    profiler_steps: Num | None = None
    excludes_last_profiler_step: bool | None = None


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
    """Where a step's time goes (% of the step)."""

    steps: Num | None = None
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
    """Host calls that block the CPU until the GPU catches up (% of the step / of CPU busy time)."""

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


# --- nsys stats / ncu CSV analyses -----------------------------------------------------------------


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


# --- py-spy and monitoring logs -----------------------------------------------------------------------


class HotFrame(msgspec.Struct, frozen=True, kw_only=True):
    """A Python frame with its self and inclusive shares of samples (%) and its class (data_loading, ...)."""

    label: str | None = None
    file: str | None = None
    frame_class: str | None = msgspec.field(default=None, name="class")
    self_pct: Num | None = None
    inclusive_pct: Num | None = None


class Icicle(msgspec.Struct, frozen=True, kw_only=True):
    """How much of the call tree the stored icicle keeps (the heaviest `kept_nodes` of `total_nodes`)."""

    kept_nodes: int | None = None
    total_nodes: int | None = None


class PySpyAnalysis(msgspec.Struct, frozen=True, kw_only=True):
    """A py-spy profile analysis (pyspy.analyze_pyspy): samples by class (% of samples).

    `total_weight` is in `weight_unit` ("seconds" for speedscope time-weighted profiles, else samples).
    """

    samples: Num | None = None
    total_weight: Num | None = None
    weight_unit: str | None = None
    classes_pct: dict[str, Num] | None = None
    input_pipeline_pct: Num | None = None
    hot_self: list[HotFrame] = []
    hot_inclusive: list[HotFrame] = []
    icicle: Icicle = Icicle()
    capture: Capture | None = None


class MonitoredGpu(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU of a monitoring log; `gpu_name` is the older parsers' key for `name`."""

    name: str | None = None
    gpu_name: str | None = None


class GpuAssignment(msgspec.Struct, frozen=True, kw_only=True):
    """How an nvidia-smi log's rows were told apart by GPU (jobs.profiling.nvidia_smi)."""

    method: str | None = None


class TimeZone(msgspec.Struct, frozen=True, kw_only=True):
    """How a log's local timestamps were placed on the clock (monitoring_common.zone_statement).

    `local_timestamps`: how many timestamps carried no zone; `assumed`: their zone was assumed, not given.
    """

    zone: str | None = None
    source: str | None = None
    assumed: bool | None = None
    local_timestamps: int | None = None


class HostSummary(msgspec.Struct, frozen=True, kw_only=True):
    """dstat's means over the log: CPU iowait and idle (% of CPU time), disk reads (bytes/s)."""

    cpu_wait_mean_pct: Num | None = None
    cpu_idle_mean_pct: Num | None = None
    disk_read_mean_bytes_per_s: Num | None = None


class MonitoringAnalysis(msgspec.Struct, frozen=True, kw_only=True):
    """A monitoring log analysis (analyze_nvidia_smi: "nvidia_smi_csv"; analyze_dstat: "dstat_csv")."""

    format: str | None = None
    start_unix_s: Num | None = None
    end_unix_s: Num | None = None
    duration_s: Num | None = None
    host: str | None = None
    gpus: list[MonitoredGpu] = []
    gpu_count: int | None = None
    gpu_assignment: GpuAssignment = GpuAssignment()
    mean_utilization_gpu_pct: Num | None = None
    idle_share_pct: Num | None = None
    mean_power_draw_w: Num | None = None
    max_temperature_gpu_c: Num | None = None
    #: dstat's (nvidia-smi logs have none).
    summary: HostSummary = HostSummary()
    time_zone: TimeZone = TimeZone()


# --- one decoder per kind --------------------------------------------------------------------------


def decode_capture(payload: Any) -> Capture | None:
    """The `capture` block of an analysis, or None when the analysis has none (or it is not a mapping).

    Monitoring logs write none: jobs.diagnosis.artifacts.capture derives theirs from their own columns.
    """
    block = payload.get("capture") if isinstance(payload, Mapping) else None
    return lenient(block, Capture) if isinstance(block, Mapping) else None


def decode_trace(payload: Any) -> TraceAnalysis:
    """A stored trace analysis (Kineto / nsys SQLite); ranks that are not mappings are dropped."""
    return lenient(payload, TraceAnalysis)


def decode_nsys_stats(payload: Any) -> NsysStatsAnalysis:
    """A stored `nsys stats` CSV analysis."""
    return lenient(payload, NsysStatsAnalysis)


def decode_ncu(payload: Any) -> NcuAnalysis:
    """A stored Nsight Compute CSV analysis."""
    return lenient(payload, NcuAnalysis)


def decode_pyspy(payload: Any) -> PySpyAnalysis:
    """A stored py-spy analysis."""
    return lenient(payload, PySpyAnalysis)


def decode_monitoring(payload: Any) -> MonitoringAnalysis:
    """A stored nvidia-smi / dstat log analysis."""
    return lenient(payload, MonitoringAnalysis)
