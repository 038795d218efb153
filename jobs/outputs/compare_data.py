"""The comparison of two jobs as the page and the API show it: reads what the evaluation stored (Job
columns, the typed `job.evaluated`, `job.waste_amount`, findings), the archived series and the parsed
traces used in the diagnosis, and hands them to the pure jobs.outputs.compare and compare_traces. One JSON
for both channels (`comparison`), the page's figures beside it (`figures`).

Nothing here computes MFU, cost or waste: the DCGM means the evaluation does not store (DRAM, PCIe, NVLink,
power, SM clock) are `jobs.evaluation.kpis.time_mean` of the archived cross-GPU means, the definition the
evaluation uses for its own utilisation means.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.conf import settings

from jobs import charts
from jobs.access.permissions import readable_jobs
from jobs.charts import compare as compare_charts
from jobs.evaluation import baselines
from jobs.evaluation.costs import J_PER_KWH
from jobs.evaluation.kpis import CONVENTION_LABELS, time_mean
from jobs.evaluation.robust import Summary
from jobs.metrics.archive import load_means, load_per_gpu
from jobs.metrics.signals import JobSignals, SignalSeries
from jobs.models import Artifact, Baseline, Job
from jobs.outputs import compare, compare_traces
from jobs.profiling.schema.trace import decode_trace
from jobs.templatetags.units import job_waste_total

SERIES = (
    "mfu",
    "tokens_per_second",
    "sm_active",
    "tensor_active",
    "gpu_util",
    "dram_active",
    "power_usage",
    "sm_clock",
    "pcie_rx_bytes",
    "pcie_tx_bytes",
    "nvlink_rx_bytes",
    "nvlink_tx_bytes",
    "nvlink_bandwidth_total",
    "fb_used",
)
#: KPI key -> the baseline metric whose spread over runs is its run-to-run noise.
BASELINE_KEYS = {
    "mfu": "mfu",
    "tokens_per_second_per_gpu": "tokens_per_second_per_gpu",
    "sm_active": "sm_active",
    "tensor_active": "tensor_active",
    "step_time_ms": "step_time_ms",
    "peak_memory_mib": "peak_memory_mib",
}


class CompareError(Exception):
    """A request that cannot be compared: 400 (missing or identical ids) or 404 (unknown id)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def get_pair(a_id: str | None, b_id: str | None, user: Any = None) -> tuple[Job, Job]:
    """The two jobs by external id, or a CompareError naming what is wrong. With `user`, only jobs that
    user may read are found (jobs.access.permissions; another team's job is "no job", as on its own page)."""
    a_id, b_id = (a_id or "").strip(), (b_id or "").strip()
    if not a_id or not b_id:
        raise CompareError(400, "two jobs are needed: ?a=<external id of the run before>&b=<the run after>")
    if a_id == b_id:
        raise CompareError(400, f"a and b are the same job ({a_id!r}): choose two different runs to compare")
    qs = Job.objects.select_related("team", "gpu_model").filter(external_id__in=[a_id, b_id])
    if user is not None:
        qs = readable_jobs(user, qs)
    jobs = {j.external_id: j for j in qs}
    for wanted in (a_id, b_id):
        if wanted not in jobs:
            raise CompareError(404, f"no job with external id {wanted!r}")
    return jobs[a_id], jobs[b_id]


@dataclass
class Run:
    """One side of the comparison, as read from the database."""

    job: Job
    sigs: JobSignals | None
    values: dict[str, compare.Value] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)
    traces: list[compare_traces.TraceFact] = field(default_factory=list)


def _mean(sigs: JobSignals | None, key: str) -> np.ndarray | None:
    series = sigs.get(key) if sigs is not None else None
    return series.mean if series is not None else None


def _missing(job: Job, key: str) -> str:
    reasons = job.missing_reasons or {}
    if key in reasons:
        return str(reasons[key])
    if job.last_polled_at is None:
        return "no metrics pulled yet"
    return "not collected for this job"


def _sum(*parts: np.ndarray | None) -> np.ndarray | None:
    if any(p is None for p in parts):
        return None
    total = np.zeros_like(parts[0])
    for p in parts:
        total = total + p
    return total


def _mfu_reason(job: Job) -> str:
    if job.evaluated is None:
        return "not evaluated yet"
    if job.waste_unknown_reason.startswith("MFU unknown"):
        return job.waste_unknown_reason
    return next((n for n in job.evaluated.notes if "MFU" in n or "throughput" in n), "MFU unknown")


def _traces(job: Job) -> list[compare_traces.TraceFact]:
    rows = (
        Artifact.objects.used_in_diagnosis()
        .filter(job=job, kind__in=compare_traces.TRACE_KINDS)
        .order_by("-parsed_at", "-pk")
    )
    return [
        compare_traces.TraceFact(
            a.pk,
            a.kind,
            a.original_name,
            a.rank,
            a.parsed_at.isoformat() if a.parsed_at else "",
            decode_trace(a.analysis),
        )
        for a in rows
    ]


def _step_samples(traces: list[compare_traces.TraceFact]) -> list[float]:
    """Step durations (ms) of the latest trace, every rank: the spread of the step time within the run."""
    if not traces:
        return []
    return [
        step.duration_ms
        for rank in traces[0].analysis.ranks
        for step in rank.step_times.steps
        if step.duration_ms is not None
    ]


def load_run(job: Job) -> Run:
    """The run's stored numbers as KPI values, its archived samples, and its parsed traces."""
    sigs = load_means(job, SERIES)
    run = Run(job, sigs, traces=_traces(job))
    ev = job.evaluated
    v = compare.Value
    mfu_reason = _mfu_reason(job)
    per_gpu_tps = baselines.METRIC_BY_KEY["tokens_per_second_per_gpu"].read(job)
    values = run.values
    values["mfu"] = v(job.mfu, mfu_reason)
    values["hfu"] = v(job.hfu, mfu_reason if job.mfu is None else "HFU needs the model's layers and heads")
    values["tokens_per_second_per_gpu"] = v(
        per_gpu_tps, "no throughput: push progress or set a throughput query"
    )
    values["step_time_ms"] = v(job.profiler_step_time_ms, "no parsed profiler trace with ProfilerSteps")
    for key, column in (
        ("gpu_util", job.gpu_util_mean),
        ("sm_active", job.sm_active_mean),
        ("tensor_active", job.tensor_active_mean),
    ):
        values[key] = v(column, _missing(job, key))
    values["dram_active"] = v(time_mean(_mean(sigs, "dram_active")), _missing(job, "dram_active"))
    pcie = _sum(_mean(sigs, "pcie_rx_bytes"), _mean(sigs, "pcie_tx_bytes"))
    values["pcie_bytes"] = v(time_mean(pcie), _missing(job, "pcie_rx_bytes"))
    nvlink = _sum(_mean(sigs, "nvlink_rx_bytes"), _mean(sigs, "nvlink_tx_bytes"))
    if time_mean(nvlink) is None:
        nvlink = _mean(sigs, "nvlink_bandwidth_total")
    values["nvlink_bytes"] = v(time_mean(nvlink), _missing(job, "nvlink_tx_bytes"))
    values["power_w"] = v(time_mean(_mean(sigs, "power_usage")), _missing(job, "power_usage"))
    values["sm_clock_mhz"] = v(time_mean(_mean(sigs, "sm_clock")), _missing(job, "sm_clock"))
    values["peak_memory_mib"] = v(ev.peak_memory_mib if ev else None, _missing(job, "fb_used"))
    values["cost_per_day"] = v(job.cost_per_day_usd, "no price for this GPU model and tier in the price book")
    waste = job.waste_amount
    values["waste_per_day"] = v(waste.usd, waste.reason, waste.lower_bound)
    values["idle_waste_per_day"] = v(job.idle_waste_per_day_usd, "utilisation or price unknown")
    values["efficiency_waste_per_day"] = v(
        job.efficiency_waste_per_day_usd, job.waste_unknown_reason or "needs MFU"
    )
    energy = ev.energy_kwh if ev else None
    values["energy_kwh"] = v(energy, "no energy counter or board power archived")
    per_token = None
    if energy is not None and job.tokens_per_second and ev is not None and ev.duration_s > 0:
        per_token = energy * J_PER_KWH / (job.tokens_per_second * ev.duration_s)
    values["energy_per_token_j"] = v(per_token, "needs the run's energy and throughput")
    values["cost_usd"] = v(job.cost_usd, "no price for this GPU model and tier in the price book")
    total = job_waste_total(job)
    values["waste_usd"] = v(total.usd, total.reason, total.lower_bound)
    values["gpu_hours"] = v(job.gpu_hours, "not evaluated yet")
    # Per-time samples, in the KPI's unit, for the noise when there is no baseline spread.
    samples = run.samples
    mfu_series = _mean(sigs, "mfu")
    for key, series in (
        ("mfu", mfu_series),
        ("hfu", mfu_series * (job.hfu / job.mfu) if mfu_series is not None and job.hfu and job.mfu else None),
        ("tokens_per_second_per_gpu", _per_gpu(_mean(sigs, "tokens_per_second"), job.gpu_count)),
        ("gpu_util", _mean(sigs, "gpu_util")),
        ("sm_active", _mean(sigs, "sm_active")),
        ("tensor_active", _mean(sigs, "tensor_active")),
        ("dram_active", _mean(sigs, "dram_active")),
        ("pcie_bytes", pcie),
        ("nvlink_bytes", nvlink),
        ("power_w", _mean(sigs, "power_usage")),
        ("sm_clock_mhz", _mean(sigs, "sm_clock")),
    ):
        if series is not None:
            samples[key] = [float(x) for x in series[np.isfinite(series)]]
    samples["step_time_ms"] = _step_samples(run.traces)
    return run


def _per_gpu(series: np.ndarray | None, gpus: int) -> np.ndarray | None:
    return series / gpus if series is not None and gpus else None


def _baseline_noise(a: Job, b: Job) -> tuple[dict[str, compare.Noise], Baseline | None]:
    """Run-to-run noise from the active baseline of A's config (else B's), per metric with ≥ 2 runs."""
    baseline = baselines.active_baseline(a) or baselines.active_baseline(b)
    out: dict[str, compare.Noise] = {}
    if baseline is None:
        return out, None
    label = f"the {baseline.model_name} baseline [{baseline.fingerprint[:8]}]"
    for key, metric in BASELINE_KEYS.items():
        stats = (baseline.stats or {}).get(metric) or {}
        if stats.get("median") is None or not stats.get("n"):
            continue
        fields: dict[str, Any] = {k: stats.get(k) for k in ("median", "mad", "iqr", "n", "min", "max")}
        summary = Summary(**fields)
        noise = compare.noise_from_baseline(summary, label)
        if noise is not None:
            out[key] = noise
    return out, baseline


def _facts(job: Job) -> compare.RunFacts:
    ev = job.evaluated
    try:
        config: dict[str, object] = baselines.config_of(job)
        error = ""
    except ValueError as exc:
        config, error = {}, str(exc)
    return compare.RunFacts(
        external_id=job.external_id,
        config=config,
        config_error=error,
        kind=job.kind,
        flops_variant=job.flops_variant,
        mfu_fallback=job.mfu_fallback,
        reference_mfu=ev.reference_mfu if ev else None,
        reference_source=ev.reference_source if ev else "",
        price_note=ev.price_note if ev else "",
    )


def _run_json(job: Job) -> dict[str, Any]:
    return {
        "external_id": job.external_id,
        "name": job.name,
        "team": job.team.slug,
        "model_name": job.model_name,
        "status": job.status,
        "started_at": job.started_at.isoformat(),
        "ended_at": job.ended_at.isoformat() if job.ended_at else None,
        "gpu_model": job.gpu_model.name if job.gpu_model else (job.gpu_model_name or None),
        "gpu_count": job.gpu_count,
        "dtype": job.dtype,
        "config_fingerprint": job.config_fingerprint,
        "flops_variant": job.flops_variant or None,
        "mfu_fallback": job.mfu_fallback,
        "evaluated": job.evaluated is not None,
    }


def heat_signal(a: Job, b: Job) -> str:
    """SM active per GPU when both runs collect it, else nvidia-smi util (the same signal for both)."""
    lacking = set(a.missing_signals or []) | set(b.missing_signals or [])
    return "gpu_util" if "sm_active" in lacking else "sm_active"


def _gpu_means(series: SignalSeries | None) -> tuple[list[str], list[float | None]]:
    if series is None or series.per_gpu is None or not series.gpus:
        return [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a GPU without samples
        means = np.nanmean(series.per_gpu, axis=1)
    return [str(g) for g in series.gpus], [None if not math.isfinite(m) else float(m) for m in means]


@dataclass(frozen=True)
class Built:
    """The comparison JSON (page and API) and the page's figures."""

    comparison: dict[str, Any]
    figures: dict[str, Any]


def build(a: Job, b: Job, *, points: int = charts.DEFAULT_POINTS) -> Built:
    """Everything the page and the API show about A (before) against B (after)."""
    ra, rb = load_run(a), load_run(b)
    base_noise, baseline = _baseline_noise(a, b)
    step = ra.sigs.step if ra.sigs is not None else None
    noises: dict[str, compare.Noise] = {}
    for kpi in compare.KPIS:
        noises[kpi.key] = base_noise.get(kpi.key) or compare.noise_from_samples(
            ra.samples.get(kpi.key, []),
            rb.samples.get(kpi.key, []),
            step if kpi.key != "step_time_ms" else None,
        )
    ta, tb, trace_reason = compare_traces.pick_traces(ra.traces, rb.traces)
    traces = compare_traces.trace_diff(ta, tb) if ta and tb else compare_traces.unavailable(trace_reason)
    fa = [compare.FindingFact(f.code, f.title, f.severity, f.waste_per_day_usd) for f in a.findings.all()]
    fb = [compare.FindingFact(f.code, f.title, f.severity, f.waste_per_day_usd) for f in b.findings.all()]
    signal = heat_signal(a, b)
    pa, pb = load_per_gpu(a, signal), load_per_gpu(b, signal)
    ga, gb = _gpu_means(pa), _gpu_means(pb)
    label = "SM active" if signal == "sm_active" else "nvidia-smi util"

    def stragglers(series: SignalSeries | None) -> list[dict[str, Any]]:
        return [
            {"gpu": o.gpu, "mean": o.mean, "peers_median": o.median, "below_band": o.below_band}
            for o in charts.gpu_outliers(series)
            if o.below_band
        ]

    notes = []
    if a.started_at > b.started_at:
        notes.append(
            f'A ({a.external_id}) started after B ({b.external_id}): A is read as "before" because '
            "it was given as a; swap them to read the later run as the change"
        )
    comparison = {
        "a": _run_json(a),
        "b": _run_json(b),
        "before": a.external_id,
        "after": b.external_id,
        "delta": "B − A",
        "notes": notes,
        "mfu_convention": CONVENTION_LABELS.get(settings.MFU_FLOPS_CONVENTION, settings.MFU_FLOPS_CONVENTION),
        "config": compare.config_diff(_facts(a), _facts(b)),
        "baseline": {
            "id": baseline.pk,
            "fingerprint": baseline.fingerprint,
            "model_name": baseline.model_name,
            "runs": baseline.runs.count(),
        }
        if baseline
        else None,
        "kpis": compare.kpi_rows(ra.values, rb.values, noises),
        "findings": compare.findings_diff(fa, fb),
        "per_gpu": {
            "a": compare.per_gpu_summary(signal, *ga, stragglers(pa)),
            "b": compare.per_gpu_summary(signal, *gb, stragglers(pb)),
        },
        "traces": traces,
    }
    figures = {
        "overlay": compare_charts.overlay_figure(
            _relative(ra), _relative(rb), (a.name or a.external_id, b.name or b.external_id), points=points
        ),
        "per_gpu": compare_charts.per_gpu_figure(label, ga, gb),
    }
    return Built(comparison, figures)


def _relative(run: Run) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The run's overlay series on seconds since its start (archive points before the start dropped)."""
    sigs = run.sigs
    if sigs is None:
        return {}
    t = sigs.timestamps - run.job.started_at.timestamp()
    keep = t >= 0
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for row in compare_charts.OVERLAY_ROWS:
        if row.key == "tokens_per_second_per_gpu":
            series = _per_gpu(_mean(sigs, "tokens_per_second"), run.job.gpu_count)
        else:
            series = _mean(sigs, row.key)
        if series is not None:
            out[row.key] = (t[keep], series[keep])
    return out
