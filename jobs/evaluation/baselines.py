"""Baselines: promote healthy finished runs to a model + config baseline, retire it, compare a job with it.

A baseline holds robust statistics (jobs.evaluation.robust.summarize: median, scaled MAD, IQR, n, min, max)
of a few per-run numbers over every run promoted to it. Baselines are team-scoped: one active baseline per
team and config fingerprint (a database constraint); another team running the same model and config gets
its own. Promoting another run of the team's fingerprint extends it. Retired baselines stay for history.

`promote` is the only way into a baseline and holds every rule (the job page, `POST /api/v1/baselines/`
and the demo loader all call it; nothing else decides): the promoter may write the job's team; the run is
finished, has a fingerprint and numbers; it is healthy (no warning-or-worse `gpu_errors`, `throttling` or
`straggler` finding) unless an override reason is given, which is then recorded as a PromotionOverride; and
it joins its own team's baseline only.

What a job is compared with (its page, the API summary, the reference MFU its waste is measured against,
the diagnosis' `baseline_regression`, the compare page's noise): the active baseline of its own team and
fingerprint (`active_baseline`). Another team's runs never move a team's reference.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from jobs.access.permissions import can_write_team
from jobs.evaluation.baseline_stats import MetricStats, decode_stats, encode_stats
from jobs.evaluation.robust import RegressionCheck, Summary, canonical_config, check_regression, summarize
from jobs.intake.registry import config_fields
from jobs.models import Baseline, Finding, Job, PromotionOverride
from jobs.runtime.enqueue import enqueue

log = logging.getLogger(__name__)

#: Finding codes that say the hardware or its health was off (XID errors, throttled clocks, a slow GPU): a
#: run with one of them at warning or worse is not a healthy reference unless someone says why it is.
HEALTH_FINDING_CODES = ("gpu_errors", "throttling", "straggler")
#: PromotionOverride.reason's column width.
OVERRIDE_REASON_MAX = 500


class BaselineError(ValueError):
    """A promotion that cannot be done; the message says why (shown to the user). The API answers 400."""


class PromotionForbidden(BaselineError):
    """The promoter may not write the job's team (the API answers 403, the page too)."""


class UnhealthyRun(BaselineError):
    """The run has warning-or-worse hardware/health findings and no override reason was given (409)."""

    def __init__(self, blockers: Sequence[Finding]) -> None:
        self.blockers = list(blockers)
        names = ", ".join(f"{f.code} ({f.severity})" for f in self.blockers)
        super().__init__(
            f"this run has hardware or health findings ({names}), so it is not a healthy reference; "
            "give an override reason to promote it regardless"
        )

    @property
    def codes(self) -> list[str]:
        """The blocking findings' codes, sorted."""
        return sorted({f.code for f in self.blockers})


class _System:
    """The service itself (the demo loader, management commands): promotes without a user's team rights."""

    is_authenticated = False

    def __repr__(self) -> str:
        return "SYSTEM"


#: Pass as `promote(..., actor=SYSTEM)` for promotions the service makes on its own (no person's rights
#: apply); every request path passes the requesting user instead.
SYSTEM: Any = _System()


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
    """Baseline.stats for a set of runs: metric key -> summarize() of the runs' values (baseline_stats)."""
    return encode_stats({m.key: summarize([m.read(run) for run in runs]) for m in METRICS})


def health_blockers(findings: Sequence[Finding]) -> list[Finding]:
    """The findings (of one job) that stop a plain promote: hardware/health codes at warning or worse."""
    blocking = (Finding.Severity.WARNING, Finding.Severity.CRITICAL)
    return [f for f in findings if f.code in HEALTH_FINDING_CODES and f.severity in blocking]


@dataclass(frozen=True)
class Promotion:
    """What `promote` did: the baseline the run is in, whether it was added now (False: it already was),
    and the override recorded for it (None for a healthy run)."""

    baseline: Baseline
    added: bool
    override: PromotionOverride | None

    @property
    def runs(self) -> int:
        """Runs in the baseline now."""
        return self.baseline.runs.count()


def promote(job: Job, actor: Any, *, override_reason: str = "") -> Promotion:
    """Add a finished, healthy job to its own team's active baseline of its config fingerprint (created
    when there is none) and recompute the baseline's statistics over all its runs.

    `actor` is the requesting user (or token's user), or SYSTEM for the service's own promotions.
    `override_reason`: why a run with warning-or-worse hardware/health findings is a healthy reference
    anyway; recorded (who, which findings, why) as a PromotionOverride. Ignored for a healthy run.

    Idempotent: a job already in the baseline changes nothing (its first override stays the record).
    Raises PromotionForbidden (the actor may not write the job's team), UnhealthyRun (health findings and
    no reason), BaselineError (running, no fingerprint, no numbers).
    """
    if actor is not SYSTEM and not can_write_team(actor, job.team_id):
        raise PromotionForbidden("only members of the job's team can promote it to a baseline")
    if not job.config_fingerprint:
        raise BaselineError("the job has no config fingerprint (model name and config are needed)")
    if job.ended_at is None or job.status == Job.Status.RUNNING:
        raise BaselineError("only finished jobs can become baselines: a running job's numbers still change")
    if all(m.read(job) is None for m in METRICS):
        raise BaselineError("the job has no MFU, throughput or DCGM numbers yet; wait for its data")
    reason = " ".join(override_reason.split())[:OVERRIDE_REASON_MAX]
    blockers = health_blockers(list(job.findings.all()))
    if blockers and not reason:
        raise UnhealthyRun(blockers)
    user = actor if getattr(actor, "is_authenticated", False) else None
    for attempt in range(2):
        try:
            with transaction.atomic():
                promotion = _promote_locked(job, user, blockers, reason)
        except IntegrityError:
            # Another request created the team's active baseline for this fingerprint between our read
            # and insert: the second attempt finds and extends it.
            if attempt:
                raise
        else:
            if promotion.override is not None and promotion.added:
                log.warning(
                    "job %s promoted to baseline %s despite %s by %s: %s",
                    job.external_id,
                    promotion.baseline.pk,
                    ", ".join(promotion.override.finding_codes),
                    user.get_username() if user is not None else actor,
                    reason,
                )
            return promotion
    raise AssertionError("unreachable")


def _promote_locked(job: Job, user: Any, blockers: list[Finding], reason: str) -> Promotion:
    # The team is part of the key: a run joins only its own team's baseline (never another team's with
    # the same model and config, whose statistics it would move).
    baseline = (
        Baseline.objects.select_for_update()
        .filter(team_id=job.team_id, fingerprint=job.config_fingerprint, retired_at__isnull=True)
        .first()
    )
    if baseline is None:
        baseline = Baseline.objects.create(
            fingerprint=job.config_fingerprint,
            model_name=job.model_name or "unnamed",
            team_id=job.team_id,
            config=config_of(job),
            created_by=user,
        )
    override = None
    if blockers:
        override = PromotionOverride.objects.filter(baseline=baseline, job=job).first()
    if baseline.runs.filter(pk=job.pk).exists():
        return Promotion(baseline, added=False, override=override)
    if blockers and override is None:
        override = PromotionOverride.objects.create(
            baseline=baseline,
            job=job,
            user=user,
            finding_codes=sorted({f.code for f in blockers}),
            reason=reason,
        )
    baseline.runs.add(job)
    baseline.stats = stats_for(list(baseline.runs.all()))
    baseline.save(update_fields=["stats", "updated_at"])
    _reference_changed(baseline)
    return Promotion(baseline, added=True, override=override)


def jobs_of_baseline(baseline: Baseline) -> list[int]:
    """Jobs whose reference MFU is this baseline's (its team's jobs of the same config fingerprint)."""
    jobs = Job.objects.filter(team_id=baseline.team_id, config_fingerprint=baseline.fingerprint)
    return list(jobs.values_list("pk", flat=True))


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
    """A job against its team's active baseline of its fingerprint."""

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


def _summary(stats: MetricStats | None) -> Summary | None:
    # A metric no run had (n = 0) has no band to compare against.
    return stats.summary() if stats is not None and stats.n else None


def compare_with(job: Job, baseline: Baseline) -> Comparison:
    """Per metric: the job's value, the baseline's robust summary, deviation in % and robust z
    (jobs.evaluation.robust.check_regression: outside the band when > 3 robust sd and > 5 % from the
    median)."""
    rows = []
    stats = decode_stats(baseline.stats)
    for metric in METRICS:
        value = metric.read(job)
        summary = _summary(stats.get(metric.key))
        check = (
            check_regression(value, summary, higher_is_better=metric.higher_is_better)
            if value is not None and summary is not None
            else None
        )
        rows.append(MetricComparison(metric, value, summary, check))
    return Comparison(baseline, rows)


def active_baseline(job: Job) -> Baseline | None:
    """The active baseline of the job's own team and fingerprint with its runs prefetched, or None.

    Every comparison reads this one (job page, API summary, reference MFU, diagnosis, compare noise): a
    job is measured against its own team's healthy runs, never another team's baseline."""
    if not job.config_fingerprint:
        return None
    return (
        Baseline.objects.filter(
            team_id=job.team_id, fingerprint=job.config_fingerprint, retired_at__isnull=True
        )
        .prefetch_related("runs")
        .first()
    )


def compare(job: Job) -> Comparison | None:
    """The job against its team's active baseline, or None when its config has none in its team."""
    baseline = active_baseline(job)
    return compare_with(job, baseline) if baseline is not None else None
