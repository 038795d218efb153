"""Celery tasks: thin wrappers that take ids and call one function each.

Re-running any of them is safe (ingestion and finalize merge into the archive: a repeated write stores
the same chunks), hence acks_late. Only transient errors (Prometheus unreachable) are retried.
"""

from __future__ import annotations

import logging
from datetime import datetime

from celery import Task, shared_task
from django.conf import settings

from jobs.alerts import incidents, notify, policy
from jobs.intake import artifacts
from jobs.metrics import ingest
from jobs.models import Job
from jobs.outputs import reports
from jobs.outputs.leaderboard import parse_iso_week
from jobs.pipeline import poll as pipeline
from jobs.pipeline.discovery import discover
from jobs.pipeline.refresh import reevaluate_many
from jobs.pipeline.shards import ShardSpec

log = logging.getLogger(__name__)


@shared_task(acks_late=True, ignore_result=True)
def poll_running_jobs() -> int:
    """One cluster-wide poll cycle (`pipeline.poll_cycle`: each signal read once for all groupable jobs,
    per job only for selectors that cannot be grouped; a cycle already running makes this a no-op)."""
    return int(pipeline.poll_cycle()["jobs"])


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def poll_shard(cycle_id: str, index: int, job_ids: list[int], now: str) -> int:
    """One shard of a sharded poll cycle (POLL_SHARD_JOBS > 0): its jobs' evaluation, diagnosis and alert
    rules from the reads the cycle stored (`pipeline.poll_shard`; idempotent, so a redelivery after a
    worker died mid-shard is safe). Returns the jobs stored."""
    spec = ShardSpec(cycle_id, int(index), tuple(int(i) for i in job_ids), datetime.fromisoformat(now))
    report = pipeline.poll_shard(spec)
    return len(report["polled"]) + len(report["stale"])


@shared_task(acks_late=True, ignore_result=True)
def finalize_ended_jobs() -> int:
    """Fan out one finalize per ended, not yet finalized job."""
    ids = list(ingest.ended_jobs().values_list("id", flat=True))
    for job_id in ids:
        finalize_job.delay(job_id)
    return len(ids)


@shared_task(acks_late=True, ignore_result=True)
def poll_job(job_id: int) -> None:
    """Poll one job; a Prometheus outage is recorded on the job and the next minute's poll retries."""
    job = Job.objects.select_related("gpu_model").filter(pk=job_id).first()
    if job is not None:
        pipeline.poll_job(job)


@shared_task(acks_late=True, ignore_result=True, bind=True, max_retries=5, default_retry_delay=120)
def finalize_job(self: Task, job_id: int) -> None:
    """Finalize one job; retried with a delay while Prometheus is unreachable."""
    job = Job.objects.select_related("gpu_model").filter(pk=job_id).first()
    if job is None or job.status == Job.Status.FINALIZED:
        return
    job = pipeline.finalize_job(job)
    if job.ingest_error:
        raise self.retry()


@shared_task(acks_late=True, ignore_result=True)
def discover_jobs() -> int:
    """Register jobs seen on exporter series under DISCOVERY_LABEL (no-op when it is unset)."""

    report = discover(ingest.prometheus_client())
    return len(report["created"])


@shared_task(acks_late=True, ignore_result=True, bind=True, max_retries=12, default_retry_delay=600)
def send_weekly_reports(self: Task, week: str | None = None) -> int:
    """Send last week's cost-waste email to every team, once per team and week (claims make reruns safe).

    When a send fails (SMTP down), the task retries the same week every 10 minutes; teams already sent
    are skipped by their delivery rows, so only the failed ones go out.
    """

    period = parse_iso_week(week) if week else reports.default_period()
    outcomes = reports.send_weekly_reports(period)
    if any(o.status == reports.Outcome.FAILED for o in outcomes):
        raise self.retry(kwargs={"week": period.label})
    return len(outcomes)


@shared_task(acks_late=True, ignore_result=True)
def reevaluate_jobs(job_ids: list[int]) -> int:
    """Re-evaluate stored jobs after a baseline or price change (idempotent: recomputes from the archive)."""
    return reevaluate_many(job_ids)


# A pathological trace must not hold a worker forever: the soft limit lets the parse record why it stopped,
# the hard limit (60 s later) kills it; the attempt count and the sweep below end every parse.
@shared_task(
    acks_late=True,
    ignore_result=True,
    soft_time_limit=settings.ARTIFACT_PARSE_BUDGET_S,
    time_limit=settings.ARTIFACT_PARSE_BUDGET_S + artifacts.PARSE_HARD_LIMIT_GRACE_S,
)
def parse_artifact(artifact_id: int) -> None:
    """Parse one uploaded artifact; it ends done or failed with a reason (attempts are counted, so a parse
    that kills its worker is not redelivered forever)."""
    artifacts.parse_artifact(artifact_id)


@shared_task(acks_late=True, ignore_result=True)
def sweep_stuck_artifacts() -> int:
    """Fail artifacts left in "parsing" past ARTIFACT_PARSE_BUDGET_S (their worker was lost)."""
    return len(artifacts.sweep_stuck())


# ------------------------------------------------------------------------------------------------ alerts


@shared_task(acks_late=True, ignore_result=True)
def sweep_alerts() -> int:
    """Evaluate alert rules on running jobs whose polls stopped (ingestion stale) and resolve incidents of
    ended jobs; re-queue alert deliveries that are due (lost task, failed past backoff, dead worker)."""
    seen = incidents.sweep()
    for delivery_id in notify.due_deliveries():
        deliver_alert.delay(delivery_id)
    return seen


@shared_task(acks_late=True, ignore_result=True, bind=True)
def deliver_alert(self: Task, delivery_id: int) -> str:
    """Send one incident message once (claimed first); transient failures retry with exponential backoff,
    at most ALERT_DELIVERY_MAX_ATTEMPTS times (read when retrying, not at import)."""
    outcome = notify.send_delivery(delivery_id)
    if outcome is notify.Outcome.RETRY:
        raise self.retry(
            countdown=notify.backoff_s(notify.attempts_of(delivery_id)),
            max_retries=settings.ALERT_DELIVERY_MAX_ATTEMPTS,
        )
    return str(outcome)


@shared_task(acks_late=True, ignore_result=True)
def prune_archive() -> int:
    """Drop per-GPU archive rows at the polled step older than ARCHIVE_RAW_RETENTION_DAYS whose downsampled
    copy exists (idempotent); returns the rows deleted."""
    from django.utils import timezone

    from jobs.metrics import archive

    return archive.prune_raw(timezone.now(), settings.ARCHIVE_RAW_RETENTION_DAYS)


@shared_task(acks_late=True, ignore_result=True)
def apply_idle_policy(job_id: int, at: str | None = None) -> int:
    """Warn / cancel a job with idle GPUs under its team's opt-in idle-GPU policy (once per incident), as of
    `at` (ISO time of the poll that saw the idle GPUs; default now)."""
    return len(policy.apply(job_id, datetime.fromisoformat(at) if at else None))
