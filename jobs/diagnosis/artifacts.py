"""How artifact analyses (jobs.profiling output stored in Artifact.analysis) reach the rules.

Analyses are recognised by their shape, not only their kind, and read through the typed views of
jobs.profiling.schema (ArtifactAnalysis.trace / nsys_stats / ncu / pyspy): every key may be
absent or of the wrong type (older parser versions, partial parses) and then reads as None, so a missing
key makes a rule not fire from that source, it never raises. The keys the rules can read are the ones the
schema declares (`schema.common.declared_paths`), checked against real parser output in
tests/unit/test_real_samples_diagnosis.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from jobs.diagnosis import trace_thresholds as TT
from jobs.diagnosis.base import ArtifactAnalysis, DiagnosisInput
from jobs.profiling.capture import capture_from_nvidia_smi, make_capture
from jobs.profiling.schema.blocks import Capture
from jobs.profiling.schema.common import lenient
from jobs.profiling.schema.monitoring import decode_monitoring
from jobs.profiling.schema.trace import GpuIdleAttribution, TraceRank


@dataclass(frozen=True, slots=True)
class RankView:
    """One rank of a trace analysis (typed: jobs.profiling.schema.trace.TraceRank) with its artifact."""

    artifact: ArtifactAnalysis
    rank: TraceRank

    @property
    def label(self) -> str:
        """E.g. "trace.json.gz rank 3"."""
        name = self.artifact.name or self.artifact.kind
        return f"{name} rank {self.rank.rank}" if self.rank.rank is not None else name

    @property
    def source(self) -> str:
        """The artifact kind as a source label ("kineto trace", "nsys_sqlite trace")."""
        return f"{self.artifact.kind} trace"

    def has_gpu_work(self) -> bool:
        """True when the rank has GPU ops (CPU-only traces carry no GPU evidence)."""
        return self.rank.temporal_breakdown.span_ms not in (None, 0.0)

    def too_small(self) -> bool:
        """Fewer kernels than `TT.MIN_TRACE_KERNELS` (when the analysis counts them): no evidence."""
        kernels = self.rank.kernel_breakdown.kernel_count
        return kernels is not None and kernels < TT.MIN_TRACE_KERNELS

    def attributed(self) -> bool:
        """True when the analysis splits GPU idle time by host activity (`gpu_idle_attribution`).

        Analyses stored by parsers older than that section lack it; rules then use their older criteria.
        """
        return self.rank.attributed

    @property
    def idle(self) -> GpuIdleAttribution:
        """The rank's `gpu_idle_attribution` block (shares are % of the profiled steps)."""
        return self.rank.gpu_idle_attribution

    @property
    def windows(self) -> list[tuple[float, float]]:
        """The window this rank's analysis measured, on the wall clock.

        Without ProfilerStep that is the steady state (`phases.window_*_unix`: first kernel to last GPU
        activity), so a finding does not cover the start-up before it; otherwise the capture window of
        the artifact (see `capture_window`).
        """
        phases = self.rank.phases
        if phases.basis == "gpu_span":
            start, end = phases.window_start_unix, phases.window_end_unix
            if start is not None and end is not None and start <= end:
                return [(start, end)]
        return capture_window(self.artifact)


def repetition(
    share: float,
    steps: float | None,
    with_it: float | None,
    gaps: float | None,
    largest_pct: float | None,
) -> tuple[bool, float, str | None]:
    """Whether a trace pattern repeats in the steady state: (repeats?, recurring share, how).

    `share` is the pattern's idle (% of the window); over several profiled steps it repeats when at
    least `TT.REPEAT_MIN_STEPS` steps and `TT.REPEAT_STEP_SHARE_PCT` of them show it (`with_it`), and
    the recurring share is scaled by that fraction; over one window it repeats in at least
    `TT.REPEAT_MIN_GAPS` idle gaps with no gap holding `TT.ONE_OFF_GAP_PCT` of it (`largest_pct`), else
    the largest gap is a one-off and is left out of the recurring share. Without the counts it repeats.
    """
    if (steps or 0.0) >= TT.REPEAT_MIN_STEPS and with_it is not None and steps:
        frac = 100.0 * with_it / steps
        repeats = with_it >= TT.REPEAT_MIN_STEPS and frac >= TT.REPEAT_STEP_SHARE_PCT
        return repeats, share * min(1.0, frac / 100.0), f"in {int(with_it)} of {int(steps)} steps"
    if gaps is None or largest_pct is None:
        return True, share, None
    one_off = largest_pct >= TT.ONE_OFF_GAP_PCT
    recurring = share * (1.0 - largest_pct / 100.0) if one_off else share
    how = f"in {int(gaps)} idle gaps, the largest holding {largest_pct:.1f} % of it"
    return gaps >= TT.REPEAT_MIN_GAPS and not one_off, recurring, how


def trace_ranks(inp: DiagnosisInput) -> Iterator[RankView]:
    """Every rank with GPU work of every trace analysis (Kineto or Nsight Systems export).

    Ranks with fewer than `TT.MIN_TRACE_KERNELS` kernels are left out: a 1-kernel smoke test's "99 %
    idle" says nothing about training.
    """
    for art in inp.artifacts:
        for rank in art.trace.ranks:
            view = RankView(art, rank)
            if view.has_gpu_work() and not view.too_small():
                yield view


def capture_of(analysis: Any) -> Mapping[str, Any] | None:
    """The analysis' `capture` block as stored (jobs.profiling.capture contract), or None when it has none.

    nvidia-smi and dstat analyses made before their parser wrote the block get one derived from their
    own start/end and GPU names (or host). Readers use `capture` (typed); this stays for the run check's
    stored-shape callers and the pages that show the block as stored.
    """
    if not isinstance(analysis, Mapping):
        return None
    block = analysis.get("capture")
    if isinstance(block, Mapping):
        return block
    if analysis.get("format") == "nvidia_smi_csv":
        return capture_from_nvidia_smi(analysis)
    if analysis.get("format") == "dstat_csv":
        return capture_from_dstat(analysis)
    return None


def capture(analysis: Any) -> Capture | None:
    """`capture_of` decoded (jobs.profiling.schema.blocks.Capture), or None when there is none."""
    block = capture_of(analysis)
    return lenient(block, Capture) if block is not None else None


def capture_from_dstat(analysis: Mapping[str, Any]) -> dict[str, Any]:
    """The capture block of a dstat analysis (`monitoring.analyze_dstat`): the "Host:" line, and the time
    range when the log has a time column (dstat knows no GPU and no rank)."""
    log = decode_monitoring(analysis)
    return make_capture(
        start_unix=log.start_unix_s,
        end_unix=log.end_unix_s,
        hosts=[log.host] if log.host is not None else [],
        source="dstat time column (first to last sample)"
        if log.start_unix_s is not None
        else "unknown: the dstat log has no time column",
    )


def capture_window(art: ArtifactAnalysis) -> list[tuple[float, float]]:
    """[(start_unix, end_unix)] of what the artifact captured, or [] when its clock is unknown.

    Findings from a trace cover only this window, not the whole job.
    """
    block = capture(art.analysis)
    window = block.window if block is not None else None
    return [window] if window is not None else []


def merge_windows(windows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Distinct windows in time order (the same trace seen by several ranks gives one window)."""
    return sorted(set(windows))


def by_shape(
    inp: DiagnosisInput, *, fmt: str | None = None, key: str | None = None
) -> list[ArtifactAnalysis]:
    """Analyses whose `format` equals `fmt` (or, for py-spy, that carry `key`)."""
    out = []
    for art in inp.artifacts:
        a = art.analysis
        if not isinstance(a, Mapping):
            continue
        if (fmt is not None and a.get("format") == fmt) or (key is not None and key in a):
            out.append(art)
    return out


def pyspy(inp: DiagnosisInput) -> list[ArtifactAnalysis]:
    """py-spy analyses (they carry `classes_pct`)."""
    return by_shape(inp, key="classes_pct")


def nsys_stats(inp: DiagnosisInput) -> list[ArtifactAnalysis]:
    """nsys stats CSV analyses."""
    return by_shape(inp, fmt="nsys_stats_csv")


def ncu(inp: DiagnosisInput) -> list[ArtifactAnalysis]:
    """Nsight Compute CSV analyses."""
    return by_shape(inp, fmt="ncu_csv")


def source_label(art: ArtifactAnalysis) -> str:
    """Human label of an artifact for evidence lines."""
    return art.name or art.kind
