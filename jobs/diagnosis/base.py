"""What the diagnosis reads (`DiagnosisInput`) and what it returns (`Finding`). Pure: no Django.

A rule is a function `(inp, features) -> Finding | None`; `engine.diagnose` runs them all and turns each
finding's estimated `impact` (share of the job's GPU time the cause costs) into dollars per day.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

from jobs.diagnosis import thresholds as T
from jobs.evaluation.schema import GpuSharing
from jobs.metrics.signals import JobSignals
from jobs.profiling.schema.pyspy import PySpyAnalysis, decode_pyspy
from jobs.profiling.schema.summaries import NcuAnalysis, NsysStatsAnalysis, decode_ncu, decode_nsys_stats
from jobs.profiling.schema.trace import TraceAnalysis, decode_trace

CODES: tuple[str, ...] = (
    "false_saturation",
    "data_pipeline_stall",
    "launch_overhead",
    "communication_wait",
    "throttling",
    "tensor_cores_idle",
    "memory_bound",
    "host_device_copy",
    "host_sync",
    "straggler",
    "idle_gpus",
    "shared_gpu",
    "memory_headroom",
    "baseline_regression",
    "gpu_errors",
    "unexplained_waste",
)
#: Each finding code as people read it (alerts, emails and pages show this, not the code).
FINDING_NAMES: dict[str, str] = {
    "false_saturation": "Busy GPUs doing little work",
    "data_pipeline_stall": "Input or host-side stall",
    "launch_overhead": "Kernel launch overhead",
    "communication_wait": "Communication wait",
    "throttling": "Clock throttling",
    "tensor_cores_idle": "Tensor cores idle",
    "memory_bound": "Memory-bound kernels",
    "host_device_copy": "Host-device copies",
    "host_sync": "CPU-GPU synchronisation",
    "straggler": "Straggler GPU",
    "idle_gpus": "Idle GPUs",
    "shared_gpu": "Shared GPUs",
    "memory_headroom": "Unused GPU memory",
    "baseline_regression": "Worse than the baseline",
    "gpu_errors": "GPU errors",
    "unexplained_waste": "Waste no finding explains",
}


def finding_name(code: str) -> str:
    """The readable name of a finding code; an unknown code reads as itself, with spaces."""
    return FINDING_NAMES.get(code, code.replace("_", " "))


#: Codes that describe a symptom rather than a cause: when a cause is found they are kept as context
#: (info severity) and get only the waste the causes leave unexplained.
SYMPTOM_CODES: frozenset[str] = frozenset({"false_saturation", "baseline_regression", "unexplained_waste"})


class Severity(StrEnum):
    """How urgent a finding is; the values match jobs.models.Finding.Severity."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        """0 info, 1 warning, 2 critical."""
        return ("info", "warning", "critical").index(self.value)


#: The catch-all finding: the waste that no other finding explains. It ranks below every specific cause and
#: the job page shows it once, as a footer line under the findings, never as the top finding.
REMAINDER_CODE = "unexplained_waste"


def rank_key(
    code: str, waste_per_day_usd: float | None, severity: str, confidence: float
) -> tuple[bool, float, int, float, str]:
    """The one order of a job's findings (page, leaderboard main finding, weekly email, diagnosis output):
    specific causes before the unexplained remainder, then most $/day first (unknown dollars below every
    known amount, $0 included), then the more severe, then the more confident, then the code (stable).

    `jobs.models.jobs.FINDING_RANK_ORDER` is the same key in SQL (tests/test_finding_rank.py: equal).
    """
    usd = -1.0 if waste_per_day_usd is None else waste_per_day_usd
    return (code == REMAINDER_CODE, -usd, -Severity(severity).rank, -confidence, code)


@dataclass(frozen=True, slots=True)
class Evidence:
    """One number behind a finding, with its unit ("ratio", "%", "MHz", "s", "GB/s", "count", ...)."""

    label: str
    value: float | int | str | None
    unit: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe form ({label, value, unit}); floats rounded to 4 significant places."""
        value = self.value
        if isinstance(value, float):
            value = None if not math.isfinite(value) else float(f"{value:.4g}")
        return {"label": self.label, "value": value, "unit": self.unit}


@dataclass(slots=True)
class Finding:
    """A diagnosis of one job.

    `impact` is the rule's estimate of the share of the job's GPU time the cause costs (0-1); the engine
    turns it into `waste_per_day_usd` and `waste_share` (share of the job's waste/day). `windows` are
    [start_unix, end_unix] pairs; `missing_signals` names the signals whose absence lowered `confidence`.
    """

    code: str
    severity: Severity
    confidence: float
    title: str
    recommendation: str
    evidence: list[Evidence] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)
    impact: float = 0.0
    missing_signals: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # "metrics", "kineto trace", "py-spy", ...
    waste_per_day_usd: float | None = None  # None = impact unknown (the job's waste is unknown)
    waste_share: float | None = None

    @property
    def window_start(self) -> float | None:
        """Earliest window start (unix seconds), None without windows."""
        return min((w[0] for w in self.windows), default=None)

    @property
    def window_end(self) -> float | None:
        """Latest window end (unix seconds), None without windows."""
        return max((w[1] for w in self.windows), default=None)

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe form, as the API and `job_summary --json` show findings."""
        return {
            "code": self.code,
            "severity": self.severity.value,
            "confidence": round(self.confidence, 3),
            "title": self.title,
            "window_start": self.window_start,
            "window_end": self.window_end,
            "windows": [[float(a), float(b)] for a, b in self.windows],
            "evidence": [e.as_dict() for e in self.evidence],
            "recommendation": self.recommendation,
            "waste_per_day_usd": None if self.waste_per_day_usd is None else round(self.waste_per_day_usd, 2),
            "waste_share": None if self.waste_share is None else round(self.waste_share, 4),
            "impact": round(self.impact, 4),
            "missing_signals": list(self.missing_signals),
            "sources": list(self.sources),
        }


@dataclass(frozen=True)
class ArtifactAnalysis:
    """A parsed artifact: its kind (jobs.models.Artifact.Kind value) and the analysis dict its parser made.

    Rules read the analysis through its typed views (jobs.profiling.schema), decoded once per
    diagnosis and cached on the instance (hence no slots: cached_property needs a __dict__).
    """

    kind: str
    analysis: Mapping[str, Any]
    name: str = ""
    rank: int | None = None

    @cached_property
    def trace(self) -> TraceAnalysis:
        """The analysis as a trace analysis (no ranks when it is not one)."""
        return decode_trace(self.analysis)

    @cached_property
    def nsys_stats(self) -> NsysStatsAnalysis:
        """The analysis as an `nsys stats` CSV analysis (check `.format`)."""
        return decode_nsys_stats(self.analysis)

    @cached_property
    def ncu(self) -> NcuAnalysis:
        """The analysis as an Nsight Compute CSV analysis (check `.format`)."""
        return decode_ncu(self.analysis)

    @cached_property
    def pyspy(self) -> PySpyAnalysis:
        """The analysis as a py-spy analysis (`classes_pct` is None when it is not one)."""
        return decode_pyspy(self.analysis)


@dataclass(slots=True)
class DiagnosisInput:
    """Everything the rules read about one job. Unknown numbers are None, never 0.

    `baseline` is the active baseline's stats as stored ({metric: {median, mad, iqr, n, ...}}); rules read
    them through jobs.evaluation.baseline_stats.decode_stats (lenient, like the artifact analyses).
    """

    signals: JobSignals | None
    gpu_count: int
    dtype: str = "bf16"
    mfu: float | None = None
    reference_mfu: float | None = None
    tokens_per_second: float | None = None
    cost_per_day_usd: float | None = None
    waste_per_day_usd: float | None = None
    idle_waste_per_day_usd: float | None = None
    gpu_memory_mib: float | None = None
    max_clock_mhz: float | None = None  # max boost clock (catalog), what throttling is judged against
    tdp_w: float | None = None
    baseline: Mapping[str, Any] | None = None
    artifacts: Sequence[ArtifactAnalysis] = ()
    step_time_ms: float | None = None
    #: What the job does: "training", "fine_tuning" or "inference" (jobs.models.Job.Kind values); the
    #: rules' advice and minimum evidence depend on it.
    kind: str = "training"
    #: Share of the job's GPU time idle (~0 % util), as the evaluation defines it (None = unknown); the
    #: idle_gpus rule reports this number rather than computing its own.
    idle_share: float | None = None
    #: Seconds between samples of each signal as stored (scrape interval or query step, whichever is
    #: coarser); patterns shorter than ~4 of these are unresolved (see jobs.diagnosis.regimes).
    sample_interval_s: float | None = None
    #: Waste/day (USD) at or above which a job whose waste no cause explains gets `unexplained_waste`
    #: (setting; the Django side fills it).
    material_waste_usd_per_day: float = 50.0
    #: The job's share of GPUs other jobs also used (time-slicing) or of MIG slices, as the evaluation
    #: attributed it (jobs.evaluation.sharing; None = its GPUs were its own or sharing was not checked). Cost,
    #: waste and MFU passed in are already per share; the shared_gpu rule explains it.
    sharing: GpuSharing | None = None


def confidence(
    base: float,
    *,
    missing: Sequence[str] = (),
    coverage: float = 1.0,
    factor: float = T.MISSING_SIGNAL_FACTOR,
) -> float:
    """A finding's confidence: `base` lowered by each missing optional signal and by thin data coverage."""
    value = base * factor ** len(missing)
    if coverage < T.FULL_COVERAGE:
        value *= max(coverage, 0.0) / T.FULL_COVERAGE
    return round(min(max(value, T.MIN_CONFIDENCE), 1.0), 3)


def clamp01(value: float) -> float:
    """`value` limited to [0, 1] (NaN -> 0)."""
    if not math.isfinite(value):
        return 0.0
    return min(max(value, 0.0), 1.0)
