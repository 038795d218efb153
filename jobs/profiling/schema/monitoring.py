"""Typed view of a stored monitoring log analysis (jobs.profiling.nvidia_smi, jobs.profiling.dstat).

Units are the parsers': `*_pct` percentages (0-100), `*_w` watts, `*_c` degrees Celsius, `*_s` /
`*_unix_s` seconds (since the epoch). Pure: no Django.
"""

from __future__ import annotations

from typing import Any

import msgspec

from jobs.profiling.schema.common import Num, lenient


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


def decode_monitoring(payload: Any) -> MonitoringAnalysis:
    """A stored nvidia-smi / dstat log analysis."""
    return lenient(payload, MonitoringAnalysis)


#: A log's column: one value per sample (or per bucket of a long log); None where there was no reading.
Column = list[Num | None]


class LoggedGpu(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU of an nvidia-smi log as the evaluation reads it: its label and its sampling interval."""

    gpu: str | None = None
    median_interval_s: Num | None = None


class NvidiaSmiLog(msgspec.Struct, frozen=True, kw_only=True):
    """An nvidia-smi log analysis as the evaluation reads it (jobs.evaluation.monitoring_signals).

    `series`: per GPU label, column -> values: `t_unix_s`, the field columns (`utilization_gpu_pct`,
    `power_draw_w`, ...) and, for a log stored as bucket means, `bucket_samples` and the utilisation's
    `*_valid_samples`, `*_idle_samples`, `*_idle_mean` (jobs.profiling.monitoring_common.downsample).
    """

    time_axis: str | None = None
    #: None: parsed before rows were assigned to GPUs by evidence (the older parser wrote none).
    gpu_assignment: GpuAssignment | None = None
    gpus: list[LoggedGpu] = []
    series: dict[str, dict[str, Column]] = {}
    time_zone: TimeZone = TimeZone()


class DstatLog(msgspec.Struct, frozen=True, kw_only=True):
    """A dstat log analysis as the host signals read it (jobs.evaluation.monitoring_host).

    `series`: column -> values (`t_unix_s`, `cpu_idl_pct`, `dsk_total_read_bytes_per_s`, ... and, for a
    log stored as bucket means, `bucket_samples`).
    """

    host: str | None = None
    time_axis: str | None = None
    median_interval_s: Num | None = None
    series: dict[str, Column] = {}


def decode_nvidia_smi_log(payload: Any) -> NvidiaSmiLog:
    """A stored nvidia-smi log analysis, as the evaluation reads it."""
    return lenient(payload, NvidiaSmiLog)


def decode_dstat_log(payload: Any) -> DstatLog:
    """A stored dstat log analysis, as the host signals read it."""
    return lenient(payload, DstatLog)
