"""Baselines: promote healthy finished runs to a model + config baseline, retire it, compare a job with it.

A baseline holds robust statistics (jobs.evaluation.robust.summarize: median, scaled MAD, IQR, n, min, max)
of a few per-run numbers over every run promoted to it. One active baseline per config fingerprint (a database
constraint); promoting another run of the same fingerprint extends it. Retired baselines stay for history.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from jobs.enqueue import enqueue
from jobs.evaluation.robust import RegressionCheck, Summary, canonical_config, check_regression, summarize
from jobs.models import Baseline, Job
from jobs.registry import config_fields


class BaselineError(ValueError):
    """A promotion that cannot be done; the message says why (shown to the user)."""


@dataclass(frozen=True)
class Metric:
    """A per-run number a baseline keeps: key in Baseline.stats, label, unit, how to read it off a job."""

    key: str
    label: str
    unit: str
    read: Callable[[Job], float | None]
    percent: bool = False  # stored as a ratio 0-1, shown in %
    definition: str = ""
    higher_is_better: bool = True


def _per_gpu_tokens(job: Job) -> float | None:
    if job.tokens_per_second is None or not job.gpu_count:
        return None
    return job.tokens_per_second / job.gpu_count


def _peak_memory(job: Job) -> float | None:
    evaluated = job.evaluated
    return evaluated.peak_memory_mib if evaluated is not None else None


METRICS: tuple[Metric, ...] = (
    Metric("mfu", "MFU", "%", lambda j: j.mfu, True, "model FLOPs utilisation over the whole run"),
    Metric("tokens_per_second_per_gpu", "Tokens/s per GPU", "tokens/s", _per_gpu_tokens, False,
           "whole-job tokens/s ÷ GPUs"),
    Metric("sm_active", "SM active", "%", lambda j: j.sm_active_mean, True,
           "DCGM SM_ACTIVE, mean over GPUs and time"),
    Metric("tensor_active", "Tensor active", "%", lambda j: j.tensor_active_mean, True,
           "DCGM PIPE_TENSOR_ACTIVE, mean over GPUs and time"),
    Metric("step_time_ms", "Step time", "ms", lambda j: j.profiler_step_time_ms, False,
           "median ProfilerStep duration in the uploaded traces", higher_is_better=False),
    Metric("comm_share_pct", "Communication share", "% of step", lambda j: j.profiler_comm_share_pct,
           False, "communication share of the step in the uploaded traces", higher_is_better=False),
    Metric("peak_memory_mib", "Peak memory", "MiB", _peak_memory, False,
           "highest DCGM frame buffer used on any of the job's GPUs", higher_is_better=False),
)  # fmt: skip
METRIC_BY_KEY = {m.key: m for m in METRICS}


def config_of(job: Job) -> dict[str, object]:
    """The canonical config the job's fingerprint hashes, kept on the baseline so its page can say what a
    match means."""
    return canonical_config(job.model_name or "unnamed", config_fields(job))


def stats_for(runs: list[Job]) -> dict[str, dict[str, Any]]:
    """Baseline.stats for a set of runs: metric key -> summarize() of the runs' values as a dict."""
    return {m.key: asdict(summarize([m.read(run) for run in runs])) for m in METRICS}


def promote(job: Job, user: Any = None) -> Baseline:
    """Add a finished job to the active baseline of its config fingerprint (created when there is none) and
    recompute the baseline's statistics over all its runs. Idempotent for a job already in the baseline.

    Raises BaselineError when the job cannot serve as a baseline (still running, no fingerprint, no numbers).
    """
    if not job.config_fingerprint:
        raise BaselineError("the job has no config fingerprint (model name and config are needed)")
    if job.ended_at is None or job.status == Job.Status.RUNNING:
        raise BaselineError("only finished jobs can become baselines: a running job's numbers still change")
    if all(m.read(job) is None for m in METRICS):
        raise BaselineError("the job has no MFU, throughput or DCGM numbers yet; wait for its data")
    for attempt in range(2):
        try:
            with transaction.atomic():
                return _promote_locked(job, user)
        except IntegrityError:
            # Another request created the active baseline for this fingerprint between our read and insert.
            if attempt:
                raise
    raise AssertionError("unreachable")


def _promote_locked(job: Job, user: Any) -> Baseline:
    baseline = (
        Baseline.objects.select_for_update()
        .filter(fingerprint=job.config_fingerprint, retired_at__isnull=True)
        .first()
    )
    if baseline is None:
        baseline = Baseline.objects.create(
            fingerprint=job.config_fingerprint,
            model_name=job.model_name or "unnamed",
            team=job.team,
            config=config_of(job),
            created_by=user if getattr(user, "is_authenticated", False) else None,
        )
    baseline.runs.add(job)
    baseline.stats = stats_for(list(baseline.runs.all()))
    baseline.save(update_fields=["stats", "updated_at"])
    _reference_changed(baseline)
    return baseline


def jobs_of_baseline(baseline: Baseline) -> list[int]:
    """Jobs whose reference MFU is this baseline's (same config fingerprint)."""
    return list(Job.objects.filter(config_fingerprint=baseline.fingerprint).values_list("pk", flat=True))


def _reference_changed(baseline: Baseline) -> None:
    """Queue the re-evaluation of the baseline's jobs once the change commits: the baseline's MFU median
    is the reference of every job of its fingerprint, so their waste (and their findings' dollars) move."""
    ids = jobs_of_baseline(baseline)
    if ids:
        transaction.on_commit(lambda: enqueue("reevaluate_jobs", ids))


def retire(baseline: Baseline) -> Baseline:
    """Mark a baseline retired (kept for history; jobs stop being compared with it). Idempotent."""
    if baseline.retired_at is None:
        baseline.retired_at = timezone.now()
        baseline.save(update_fields=["retired_at", "updated_at"])
        _reference_changed(baseline)
    return baseline


@dataclass(frozen=True)
class MetricComparison:
    """One metric of a job against its baseline; `check` is None when either side has no number."""

    metric: Metric
    value: float | None
    baseline: Summary | None
    check: RegressionCheck | None

    @property
    def verdict(self) -> str:
        """'regression', 'improvement', 'within' or 'n/a'."""
        return self.check.verdict if self.check else "n/a"


@dataclass(frozen=True)
class Comparison:
    """A job against the active baseline of its fingerprint."""

    baseline: Baseline
    rows: list[MetricComparison]

    @property
    def regressions(self) -> list[MetricComparison]:
        """Metrics outside the band on the bad side."""
        return [r for r in self.rows if r.verdict == "regression"]

    @property
    def run_ids(self) -> set[int]:
        """Primary keys of the baseline's runs (prefetched)."""
        return {run.pk for run in self.baseline.runs.all()}


def _summary(stats: dict[str, Any] | None) -> Summary | None:
    if not stats or stats.get("median") is None or not stats.get("n"):
        return None
    fields: dict[str, Any] = {k: stats.get(k) for k in ("median", "mad", "iqr", "n", "min", "max")}
    return Summary(**fields)


def compare_with(job: Job, baseline: Baseline) -> Comparison:
    """Per metric: the job's value, the baseline's robust summary, deviation in % and robust z
    (jobs.evaluation.robust.check_regression: outside the band when > 3 robust sd and > 5 % from the
    median)."""
    rows = []
    for metric in METRICS:
        value = metric.read(job)
        summary = _summary((baseline.stats or {}).get(metric.key))
        check = (
            check_regression(value, summary, higher_is_better=metric.higher_is_better)
            if value is not None and summary is not None
            else None
        )
        rows.append(MetricComparison(metric, value, summary, check))
    return Comparison(baseline, rows)


def active_baseline(job: Job) -> Baseline | None:
    """The active baseline of the job's fingerprint with its runs prefetched, or None."""
    if not job.config_fingerprint:
        return None
    return (
        Baseline.objects.filter(fingerprint=job.config_fingerprint, retired_at__isnull=True)
        .prefetch_related("runs")
        .first()
    )


def compare(job: Job) -> Comparison | None:
    """The job against its active baseline, or None when its config has no baseline."""
    baseline = active_baseline(job)
    return compare_with(job, baseline) if baseline is not None else None
