"""What the job page shows of each artifact's analysis: key numbers with units, tables and figures.

Everything here is read from `Artifact.analysis` (written by the parsers in jobs.profiling); names from
traces are rendered by templates with autoescaping and put into figures through jobs.charts.escape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jobs import charts
from jobs.charts import CaptureMark
from jobs.diagnosis.artifacts import capture
from jobs.models import Artifact
from jobs.outputs.numbers import format_number
from jobs.profiling.schema.monitoring import decode_monitoring
from jobs.profiling.schema.pyspy import decode_pyspy
from jobs.profiling.schema.summaries import decode_ncu, decode_nsys_stats
from jobs.profiling.schema.trace import TraceRank, TraceSummary, decode_trace

TOP_ROWS = 10


@dataclass
class Table:
    """A small table: column headings (with units) and rows of display strings; `numeric` marks columns."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    numeric: set[int] = field(default_factory=set)
    titles: list[str] = field(default_factory=list)  # full text of the first cell (long kernel names)

    @property
    def body(self) -> list[tuple[str, list[str]]]:
        """Rows with the full text of their first cell (for its title attribute)."""
        return [(self.titles[i] if i < len(self.titles) else "", row) for i, row in enumerate(self.rows)]


@dataclass
class ArtifactView:
    """One artifact on the job page."""

    artifact: Artifact
    facts: list[tuple[str, str, str]] = field(default_factory=list)  # (label, value with unit, definition)
    tables: list[Table] = field(default_factory=list)
    figures: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # (figure id, caption, fig)
    warnings: list[str] = field(default_factory=list)


def _num(value: Any, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "—"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)[:100]
    except OverflowError:  # an integer past 1e308 stored by an older parser
        return "out of range"
    if not math.isfinite(number):
        return "—"
    text = f"{number:,.{digits}f}"
    return f"{text} {unit}".strip() if unit != "%" else f"{text} %"


def _pct(value: Any) -> str:
    """A percentage in the pages' one number format (jobs.outputs.numbers: 70 %, 0.205 %), as findings'
    evidence and the compare page write it."""
    try:
        return f"{format_number(float(value))} %"
    except (TypeError, ValueError, OverflowError):
        return "—"


def _fact(
    view: ArtifactView, label: str, value: Any, unit: str, definition: str = "", digits: int = 1
) -> None:
    if value is not None:
        view.facts.append((label, _num(value, unit, digits), definition))


def _trace(view: ArtifactView, a: Mapping[str, Any]) -> None:
    trace = decode_trace(a)
    summary = trace.summary
    ranks = [r for r in trace.ranks if r.has_gpu_kernels is not False]
    _fact(view, "Ranks with GPU work", summary.ranks_with_gpu_ops, "", digits=0)
    # The rank with the most kernel time represents the trace in the facts and tables.
    rank = max(ranks, key=lambda r: r.kernel_breakdown.kernel_time_ms or 0) if ranks else None
    label = rank.name if rank else ""
    if rank is not None and _idle_of_step(view, rank, label):
        # Busy time in the same unit as the idle time beside it (they add up to the step).
        steps = rank.step_breakdown
        for name, value, always in (
            ("Compute kernels", steps.kernel_pct, True),
            ("Communication", steps.communication_pct, False),
        ):
            if value is not None and (always or value > 0):
                view.facts.append(
                    (
                        f"{name} ({label})",
                        f"{_pct(value)} of the step",
                        "share of the profiled steps (TensorBoard profiler plugin's step breakdown)",
                    )
                )
    else:
        _idle_of_span(view, summary)
        _fact(view, "Compute", summary.compute_pct_mean, "%",
              "share of the GPU span (first to last GPU op) in compute kernels, mean over ranks")  # fmt: skip
    if rank is not None:
        _fact(view, f"Step time (median, {label})", rank.step_times.median_ms, "ms")
        tiny = rank.kernel_breakdown.tiny_kernels
        if tiny.count_pct is not None:
            view.facts.append((
                "Tiny kernels",
                f"{_num(tiny.count_pct, '%')} of kernels, {_num(tiny.time_pct, '%')} of time",
                f"kernels shorter than {_num(tiny.threshold_us, 'µs', 0)}: launch overhead when many",
            ))  # fmt: skip
        _fact(view, "Launch delay p50", rank.launch_stats.launch_delay.p50_us, "µs",
              "from the CUDA launch call to the kernel start")  # fmt: skip
        _fact(view, "Comm/compute overlap", rank.comm_compute_overlap.overlap_pct, "%",
              "share of communication time hidden under compute")  # fmt: skip
        _fact(view, "Tensor-core kernel time", rank.tensor_cores.tensor_core_time_pct, "%",
              "share of kernel time in tensor-core kernels (kernel-name heuristic)")  # fmt: skip
        _fact(view, "Pageable memcpy bytes", rank.memcpy.pageable_bytes_pct, "%",
              "share of copied bytes from pageable host memory (slow, synchronous)")  # fmt: skip
        kernels = rank.kernel_breakdown.top_kernels[:TOP_ROWS]
        if kernels:
            view.tables.append(Table(
                f"Top kernels by time ({label})",
                ["Kernel", "Class", "Launches", "Total (ms)", "Mean (µs)", "Share of kernel time (%)"],
                [[str(k.short_name or k.name), k.kernel_class or "", _num(k.count, digits=0),
                  _num(k.total_ms, digits=2), _num(k.mean_us), _num(k.time_pct)] for k in kernels],
                numeric={2, 3, 4, 5}, titles=[k.name or "" for k in kernels],
            ))  # fmt: skip
    view.warnings += trace.warnings[:5]
    for fig_id, caption, build in (
        ("breakdown", "Temporal breakdown per rank (HTA): compute, non-compute, idle, as shares of each "
         "rank's GPU span (first to last GPU op), not of the step",
         charts.trace_breakdown_figure),
        ("steps", "Step time breakdown per rank (TensorBoard profiler plugin)", charts.step_breakdown_figure),
    ):  # fmt: skip
        if fig := build(a):
            view.figures.append((fig_id, caption, fig))


def _idle_of_step(view: ArtifactView, rank: TraceRank, label: str) -> bool:
    """GPU idle as a share of the profiled steps, split by what the host was doing: the definition the
    findings use (their evidence reads "% of step"), so the card and a finding show one number (issue 28
    item 6: the card showed 57.1 % of the GPU span beside a finding's 70 % of the step). False when the
    analysis has no attribution (older analyses, no GPU ops)."""
    att = rank.gpu_idle_attribution
    idle = att.idle_pct
    if idle is None or att.has_gpu_ops is False:
        return False
    basis = "profiled steps" if att.basis == "ProfilerStep" else "captured window"
    parts = (
        ("waiting for input", att.input_pct),
        ("host blocking", att.host_sync_pct),
        ("launch gaps", att.launch_gaps_pct),
        ("other", att.other_pct),
    )
    split = ", ".join(f"{name} {_pct(v)}" for name, v in parts if v is not None)
    view.facts.append((
        f"GPU idle ({label})",
        f"{_pct(idle)} of the step" if basis == "profiled steps" else f"{_pct(idle)} of the window",
        f"share of the {basis} with no GPU op, the findings' definition; by host activity, in % of the "
        f"{'step' if basis == 'profiled steps' else 'window'}: {split}",
    ))  # fmt: skip
    return True


def _idle_of_span(view: ArtifactView, summary: TraceSummary) -> None:
    """Without a per-step attribution: HTA's idle share of the GPU span, and its host wait in the same
    unit (a share of a tiny idle time is not shown as if it were big: 100 % of 0.2 % idle is 0.2 %)."""
    idle = summary.idle_pct_mean
    if idle is None:
        return
    view.facts.append(
        ("GPU idle", _pct(idle), "share of the GPU span (first to last GPU op) with no GPU op (HTA)")
    )
    host_wait = summary.host_wait_pct_mean
    if host_wait is None:
        return
    of_span = idle * host_wait / 100.0
    view.facts.append((
        "Idle waiting for the host",
        f"{_pct(of_span)} of the span",
        f"{_pct(host_wait)} of the {_pct(idle)} idle: the next op was not launched yet (HTA host "
        "wait)",
    ))  # fmt: skip


def _pyspy(view: ArtifactView, a: Mapping[str, Any]) -> None:
    profile = decode_pyspy(a)
    unit = "s" if profile.weight_unit == "seconds" else "samples"
    _fact(view, "Samples", profile.samples, "", digits=0)
    _fact(view, "Profiled time", profile.total_weight, unit, digits=2)
    _fact(view, "Input pipeline", profile.input_pipeline_pct, "%",
          "data loading + tokenisation + collate, share of samples")  # fmt: skip
    hot = profile.hot_self[:TOP_ROWS]
    if hot:
        view.tables.append(Table(
            "Hottest Python frames (self time)", ["Frame", "Class", "Self (% of samples)", "Inclusive (%)"],
            [[str(h.label), (h.frame_class or "").replace("_", " "), _num(h.self_pct), _num(h.inclusive_pct)]
             for h in hot],
            numeric={2, 3}, titles=[h.file or "" for h in hot],
        ))  # fmt: skip
    if fig := charts.pyspy_classes_figure(profile):
        view.figures.append(("classes", "Where the Python time went, by frame class", fig))
    if fig := charts.icicle_figure(profile):
        kept, total = profile.icicle.kept_nodes, profile.icicle.total_nodes
        note = f" (the {kept} heaviest of {total} frames)" if kept and total and kept < total else ""
        view.figures.append(
            (
                "icicle",
                f"Flame graph as an icicle: width = share of samples, colour = frame class as above{note}",
                fig,
            )
        )


def _ncu(view: ArtifactView, a: Mapping[str, Any]) -> None:
    ncu = decode_ncu(a)
    _fact(view, "Kernel launches", ncu.kernel_launches, "", digits=0)
    _fact(view, "Kernel time", ncu.total_duration_ms, "ms", digits=2)
    _fact(view, "SM throughput", ncu.duration_weighted_sm_throughput_pct, "%", "duration-weighted")
    _fact(view, "Memory throughput", ncu.duration_weighted_memory_throughput_pct, "%", "duration-weighted")
    _fact(view, "Achieved occupancy", ncu.duration_weighted_achieved_occupancy_pct, "%", "duration-weighted")
    kernels = ncu.kernels[:TOP_ROWS]
    if kernels:
        view.tables.append(Table(
            "Kernels by time (Nsight Compute)",
            ["Kernel", "Bound", "Launches", "Total (ms)", "SM throughput (%)", "Memory throughput (%)"],
            [[str(k.kernel), k.bound or "", _num(k.launches, digits=0), _num(k.total_duration_ms, digits=3),
              _num(k.sm_throughput_pct), _num(k.memory_throughput_pct)] for k in kernels],
            numeric={2, 3, 4, 5},
        ))  # fmt: skip


def _nsys_stats(view: ArtifactView, a: Mapping[str, Any]) -> None:
    k = decode_nsys_stats(a).kernels
    _fact(view, "Kernel time", k.total_time_ms, "ms", digits=2)
    _fact(view, "Kernel instances", k.instances, "", digits=0)
    threshold = k.tiny_threshold_us if k.tiny_threshold_us is not None else 10
    _fact(view, "Tiny kernels", k.tiny_instance_share_pct, "%",
          f"instances shorter than {format_number(threshold)} µs")  # fmt: skip
    _fact(view, "NCCL share of kernel time", k.nccl_time_share_pct, "%")
    top = k.top[:TOP_ROWS]
    if top:
        view.tables.append(Table(
            "Top kernels by time (nsys stats)",
            ["Kernel", "Share (%)", "Total (ms)", "Instances", "Mean (µs)"],
            [[str(r.name), _num(r.time_pct), _num(r.total_time_ms, digits=2), _num(r.instances, digits=0),
              _num(r.avg_us)] for r in top],
            numeric={1, 2, 3, 4},
        ))  # fmt: skip


def _monitoring(view: ArtifactView, a: Mapping[str, Any]) -> None:
    log = decode_monitoring(a)
    _fact(view, "Duration", log.duration_s, "s", digits=0)
    _fact(view, "GPUs", log.gpu_count, "", digits=0)
    if log.gpu_assignment.method:
        view.facts.append(("GPUs told apart by", log.gpu_assignment.method[:200],
                           "how each row was assigned to its GPU (jobs.profiling.nvidia_smi)"))  # fmt: skip
    _fact(view, "Mean nvidia-smi util", log.mean_utilization_gpu_pct, "%")
    _fact(view, "Idle share", log.idle_share_pct, "%", "samples at or below the idle threshold")
    _fact(view, "Mean power", log.mean_power_draw_w, "W", digits=0)
    _fact(view, "Max GPU temperature", log.max_temperature_gpu_c, "°C", digits=0)
    host = log.summary  # dstat's
    _fact(view, "CPU iowait (mean)", host.cpu_wait_mean_pct, "%", "dstat: CPU waiting for I/O")
    _fact(view, "CPU idle (mean)", host.cpu_idle_mean_pct, "%")
    _fact(view, "Disk read (mean)", host.disk_read_mean_bytes_per_s, "B/s", digits=0)
    zone = log.time_zone
    if zone.local_timestamps:
        view.facts.append(("Timestamps read in", str(zone.zone)[:64], str(zone.source)[:300]))
        if zone.assumed:
            view.warnings.append(
                f"The log's local timestamps were read as {zone.zone} (assumed): upload it again with "
                "its host's time zone if that was not UTC, or it may be placed at the wrong time."
            )


_BY_KIND: dict[str, Callable[[ArtifactView, Mapping[str, Any]], None]] = {
    Artifact.Kind.KINETO: _trace,
    Artifact.Kind.NSYS_SQLITE: _trace,
    Artifact.Kind.PYSPY_RAW: _pyspy,
    Artifact.Kind.PYSPY_SPEEDSCOPE: _pyspy,
    Artifact.Kind.NCU: _ncu,
    Artifact.Kind.NSYS_STATS: _nsys_stats,
    Artifact.Kind.NVIDIA_SMI: _monitoring,
    Artifact.Kind.DSTAT: _monitoring,
}


def present(artifact: Artifact) -> ArtifactView:
    """The artifact's key numbers, tables and figures (empty until its analysis is done)."""
    view = ArtifactView(artifact)
    if artifact.status == Artifact.Status.DONE and artifact.analysis:
        build = _BY_KIND.get(artifact.kind)
        if build is not None:
            build(view, artifact.analysis)
    return view


def capture_marks(artifacts: Iterable[Artifact]) -> list[CaptureMark]:
    """The capture windows of the artifacts the diagnosis uses, where the file states its time."""
    marks: list[CaptureMark] = []
    for art in artifacts:
        if not art.used_in_diagnosis:
            continue
        cap = capture(art.analysis)
        start = cap.start_unix if cap else None
        end = cap.end_unix if cap else None
        if start is not None:
            marks.append(CaptureMark(start, max(end if end is not None else start, start), art.original_name))
    return marks


def figures_of(views: list[ArtifactView]) -> dict[str, dict[str, Any]]:
    """All artifact figures keyed by the DOM id the template gives their containers."""
    return {f"artifact-{v.artifact.pk}-{fig_id}": fig for v in views for fig_id, _, fig in v.figures}
