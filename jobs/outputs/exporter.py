"""/metrics: per-job MFU, cost, waste and finding counts in Prometheus text format, for Grafana users.

Only running jobs and jobs that ended in the last week are exported, so the number of series stays
bounded however long the job history grows.

Labels: every series carries `job_id` (the scheduler's id; not `job`, which is Prometheus' own target
label and would be renamed `exported_job` on scrape) and `team`, which never change during a job. What
does change or only describes the job (`status`, `model`, `gpu_model`, `name`) is on one info metric,
`efficiency_job_info{...} 1`, joined in queries with `* on (job_id) group_left (status) efficiency_job_info`:
a job finishing does not start new series. The dashboard and rules in efficiency/deploy/ read these names.

Access: `Authorization: Bearer <METRICS_TOKEN>`. Without a token /metrics answers 403 unless
METRICS_PUBLIC=true opens it on purpose (the demo on loopback): job names and costs are not public data.

Both parts are prometheus_client Collectors (`JobCollector`, `ServiceCollector`), written out by its
`generate_latest` (label values escaped by it).

The service's own health (`ServiceCollector`, prometheus_client, read at scrape time; a number that is not
known is not exported, never 0):

- `efficiency_poll_lag_seconds{job_id}`: now − data_until of each running job, seconds (absent before its
  first archived sample).
- `efficiency_poll_cycle_duration_seconds`, `efficiency_poll_cycle_requests` (Prometheus HTTP requests),
  `efficiency_poll_cycle_jobs`, `efficiency_poll_cycle_stale_jobs`,
  `efficiency_poll_cycle_finished_timestamp_seconds` (Unix s): the last poll cycle, from the summary the
  poller leaves in the shared cache (`efficiency:poll_cycle`); absent until a cycle has finished.
- `efficiency_celery_queue_length{queue}`: messages waiting in each Celery queue of CELERY_TASK_QUEUES
  (Redis LLEN); `efficiency_broker_up` 1/0 whether the broker answered (lengths absent when it did not).
- `efficiency_artifacts{status}`: artifacts per parse status (queued, parsing, done, failed);
  `efficiency_artifacts_stuck_parsing`: parsing past ARTIFACT_PARSE_BUDGET_S plus the hard-limit grace.
- `efficiency_artifact_parse_duration_seconds`: histogram of parse_started_at → parsed_at, seconds, of the
  artifacts whose parse ended in the last 24 h.
- `efficiency_alert_deliveries{status}`: alert deliveries per state (pending, claimed, sent, failed,
  gave_up).
- `efficiency_task_runs_total{task,outcome}`, `efficiency_task_duration_seconds{task}` (histogram): every
  Celery task's runs (succeeded, failed, retried) and wall time, recorded by the workers in Redis
  (efficiency.task_metrics).
- `efficiency_service_degraded{reason}`: 1 while the service itself is degraded, else 0; `reason` is
  `poll_stalled` (no poll cycle completed for POLL_STALLED_AFTER_S: ingestion_stale alerts are held, this
  is the one signal instead), `ok`, or `unknown` (no cycle has completed yet). jobs.runtime.service_health.
"""

from __future__ import annotations

import hmac
import logging
import math
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import redis
from django.conf import settings
from django.core.cache import cache
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from efficiency import task_metrics
from jobs.evaluation.kpis import CONVENTION_LABELS
from jobs.intake.artifacts import PARSE_HARD_LIMIT_GRACE_S
from jobs.models import AlertDelivery, Artifact, Finding, Job
from jobs.runtime import service_health

logger = logging.getLogger(__name__)

RECENT = timedelta(days=7)
INFO = "efficiency_job_info"
#: The labels of every per-job series: stable for the job's life (see the module docstring).
JOB_LABELS = ["job_id", "team"]
_GAUGES = (
    ("efficiency_job_mfu_ratio", "mfu", "Model FLOPs utilization of the job ({convention}), 0-1."),
    ("efficiency_job_hfu_ratio", "hfu", "Hardware FLOPs utilization incl. recomputation, 0-1."),
    ("efficiency_job_tokens_per_second", "tokens_per_second", "Training throughput of the whole job."),
    ("efficiency_job_sm_active_ratio", "sm_active_mean", "Mean DCGM SM active over the job's GPUs, 0-1."),
    ("efficiency_job_cost_usd_per_day", "cost_per_day_usd", "GPUs x USD per GPU-hour x 24 (price book)."),
    (
        "efficiency_job_waste_usd_per_day",
        "waste_per_day_usd",
        "Total waste: cost/day x max(idle share, 1 - MFU / reference MFU); absent when MFU is unknown.",
    ),
    (
        "efficiency_job_waste_lower_bound_usd_per_day",
        "waste_lower_bound_per_day_usd",
        "What is certainly wasted, USD/day: the total when known, else the idle part.",
    ),
    (
        "efficiency_job_idle_waste_usd_per_day",
        "idle_waste_per_day_usd",
        "cost/day x share of observed GPU time at ~0 % GPU_UTIL (needs no MFU).",
    ),
    (
        "efficiency_job_waste_known",
        "waste_known",
        "1 when the total waste is computed, 0 when only its lower bound is known (MFU or price missing).",
    ),
    (
        "efficiency_job_mfu_fallback",
        "mfu_fallback",
        "1 when the job's MFU used 6N because its shape lacks what the organisation's convention needs.",
    ),
    ("efficiency_job_gpus", "gpu_count", "GPUs allocated to the job."),
)


def _value(job: Job, field: str) -> float | None:
    if field == "waste_known":
        return None if job.cost_per_day_usd is None else float(job.waste_per_day_usd is not None)
    if field == "mfu_fallback":
        return None if job.mfu is None else float(job.mfu_fallback)
    value = getattr(job, field)
    # Six significant digits, as the exposition always carried: more would be noise of the estimates.
    return None if value is None else float(f"{float(value):.6g}")


class JobCollector(Collector):
    """The per-job families (the module docstring says which), read from the database at scrape time.

    prometheus_client writes the exposition: label values are escaped by it, label names come out
    sorted (order carries no meaning to Prometheus), values as Go would print them (`1.0`)."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now

    def collect(self) -> Iterator[Metric]:
        """efficiency_job_info, one gauge family per `_GAUGES` entry, and efficiency_job_findings."""
        since = (self.now or timezone.now()) - RECENT
        jobs = list(
            Job.objects.filter(Q(ended_at__isnull=True) | Q(ended_at__gte=since))
            .select_related("team", "gpu_model")
            .order_by("external_id")
        )
        identity = {j.pk: [j.external_id, j.team.slug] for j in jobs}
        info = GaugeMetricFamily(
            INFO,
            "The job's descriptive labels (status, model, GPU model, name); value 1.",
            labels=[*JOB_LABELS, "status", "model", "gpu_model", "name"],
        )
        for j in jobs:
            gpu_model = j.gpu_model.name if j.gpu_model else "unknown"
            info.add_metric([*identity[j.pk], j.status, j.model_name, gpu_model, j.name], 1.0)
        yield info
        convention = CONVENTION_LABELS[settings.MFU_FLOPS_CONVENTION]
        for name, field, help_text in _GAUGES:
            family = GaugeMetricFamily(name, help_text.format(convention=convention), labels=JOB_LABELS)
            for job in jobs:
                value = _value(job, field)
                if value is not None:
                    family.add_metric(identity[job.pk], value)
            yield family
        counts = Counter(
            Finding.objects.filter(job_id__in=identity).values_list("job_id", "code", "severity").iterator()
        )
        findings = GaugeMetricFamily(
            "efficiency_job_findings",
            "Open diagnosis findings of the job by code and severity.",
            labels=[*JOB_LABELS, "code", "severity"],
        )
        for (job_id, code, severity), n in sorted(counts.items()):
            findings.add_metric([*identity[job_id], code, severity], float(n))
        yield findings


def render(now: datetime | None = None) -> str:
    """The per-job families in the text exposition format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobCollector(now))
    return generate_latest(registry).decode()


POLL_CYCLE_KEY = "efficiency:poll_cycle"
#: Every metric family ServiceCollector may export (histograms add _bucket, _sum and _count).
SERVICE_METRICS = (
    "efficiency_poll_lag_seconds",
    "efficiency_poll_cycle_duration_seconds",
    "efficiency_poll_cycle_requests",
    "efficiency_poll_cycle_jobs",
    "efficiency_poll_cycle_stale_jobs",
    "efficiency_poll_cycle_finished_timestamp_seconds",
    "efficiency_broker_up",
    "efficiency_celery_queue_length",
    "efficiency_artifacts",
    "efficiency_artifacts_stuck_parsing",
    "efficiency_artifact_parse_duration_seconds",
    "efficiency_alert_deliveries",
    "efficiency_service_degraded",
    "efficiency_task_runs",
    "efficiency_task_duration_seconds",
)
#: Parse-duration histogram buckets, seconds: a small trace parses in about a second, the budget is 900 s.
PARSE_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)
PARSE_WINDOW = timedelta(hours=24)
_POLL_CYCLE_FIELDS = (
    (
        "efficiency_poll_cycle_duration_seconds",
        "duration_s",
        "Wall-clock duration of the last poll cycle, s.",
    ),
    ("efficiency_poll_cycle_requests", "requests", "Prometheus HTTP requests of the last poll cycle."),
    ("efficiency_poll_cycle_jobs", "jobs", "Jobs polled in the last poll cycle."),
    ("efficiency_poll_cycle_stale_jobs", "stale", "Jobs left stale (poll failed) by the last poll cycle."),
    (
        "efficiency_poll_cycle_finished_timestamp_seconds",
        "finished_at",
        "When the last poll cycle finished, Unix seconds.",
    ),
)


def _finite_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _per_status(name: str, help_text: str, rows: QuerySet[Any], statuses: list[str]) -> GaugeMetricFamily:
    """One gauge per status of `rows` (one GROUP BY query); a status with no rows reads 0 (a real count)."""
    family = GaugeMetricFamily(name, help_text, labels=["status"])
    counts = dict(rows.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    for status in statuses:
        family.add_metric([status], float(counts.get(status, 0)))
    return family


class ServiceCollector(Collector):
    """Both parts are prometheus_client Collectors (`JobCollector`, `ServiceCollector`), written out by its
    `generate_latest` (label values escaped by it).

    The service's own health, read from the database, the shared cache and the broker at scrape time."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now

    def collect(self) -> Iterator[Metric]:
        """Every service metric family (see the module docstring for names and units)."""
        now = self.now or timezone.now()
        yield from self._poll_lag(now)
        yield from self._poll_cycle()
        yield from self._queues()
        yield from self._tasks()
        yield from self._artifacts(now)
        yield _per_status(
            "efficiency_alert_deliveries", "Alert deliveries per state.", AlertDelivery.objects.all(),
            AlertDelivery.Status.values,
        )  # fmt: skip
        state = service_health.poller(now)
        degraded = GaugeMetricFamily(
            "efficiency_service_degraded",
            "1 while the service is degraded (reason poll_stalled: no poll cycle completed lately), else 0.",
            labels=["reason"],
        )
        degraded.add_metric([state.code], 1.0 if state.degraded else 0.0)
        yield degraded

    def _poll_lag(self, now: datetime) -> Iterator[Metric]:
        lag = GaugeMetricFamily(
            "efficiency_poll_lag_seconds",
            "Seconds between now and the end of the archived data (data_until) of each running job.",
            labels=["job_id"],
        )
        running = Job.objects.filter(status=Job.Status.RUNNING, data_until__isnull=False).order_by(
            "external_id"
        )
        for external_id, data_until in running.values_list("external_id", "data_until"):
            if data_until is not None:
                lag.add_metric([external_id], max(0.0, (now - data_until).total_seconds()))
        yield lag

    def _poll_cycle(self) -> Iterator[Metric]:
        cycle = cache.get(POLL_CYCLE_KEY)
        if not isinstance(cycle, dict):
            return  # no cycle finished yet (or the cache was flushed): unknown, not 0
        for name, key, help_text in _POLL_CYCLE_FIELDS:
            value = _finite_number(cycle.get(key))
            if value is not None:
                yield GaugeMetricFamily(name, help_text, value=value)

    def _queues(self) -> Iterator[Metric]:
        names = [str(getattr(q, "name", q)) for q in settings.CELERY_TASK_QUEUES]
        try:
            client = redis.Redis.from_url(
                settings.CELERY_BROKER_URL, socket_timeout=1.0, socket_connect_timeout=1.0
            )
            try:
                lengths = [int(client.llen(name)) for name in names]
            finally:
                client.close()
        except (redis.RedisError, OSError, ValueError):
            logger.warning("metrics: the broker did not answer for queue lengths", exc_info=True)
            yield GaugeMetricFamily("efficiency_broker_up", "1 when the Celery broker answered.", value=0.0)
            return
        yield GaugeMetricFamily("efficiency_broker_up", "1 when the Celery broker answered.", value=1.0)
        queues = GaugeMetricFamily(
            "efficiency_celery_queue_length", "Messages waiting in the Celery queue.", labels=["queue"]
        )
        for name, length in zip(names, lengths, strict=True):
            queues.add_metric([name], float(length))
        yield queues

    def _tasks(self) -> Iterator[Metric]:
        """Every Celery task's runs by outcome and its duration histogram, as the workers recorded them
        (efficiency.task_metrics); absent when Redis does not answer (unknown, not 0)."""
        try:
            client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1.0, socket_connect_timeout=1.0)
            try:
                stats = task_metrics.read(client)
            finally:
                client.close()
        except (redis.RedisError, OSError, ValueError):
            logger.warning("metrics: Redis did not answer for task metrics", exc_info=True)
            return
        runs = CounterMetricFamily(
            "efficiency_task_runs",
            "Celery task runs by outcome (succeeded, failed, retried), as the workers counted them.",
            labels=["task", "outcome"],
        )
        durations = HistogramMetricFamily(
            "efficiency_task_duration_seconds", "Wall time of Celery task runs.", labels=["task"]
        )
        for s in stats:
            for outcome in task_metrics.OUTCOMES:
                runs.add_metric([s.task, outcome], float(s.outcomes.get(outcome, 0)))
            if s.duration_count:
                durations.add_metric(
                    [s.task], [(le, float(n)) for le, n in s.cumulative()], sum_value=s.duration_sum_s
                )
        yield runs
        yield durations

    def _artifacts(self, now: datetime) -> Iterator[Metric]:
        yield _per_status(
            "efficiency_artifacts", "Artifacts per parse status.", Artifact.objects.all(),
            Artifact.Status.values,
        )  # fmt: skip
        cutoff = now - timedelta(seconds=settings.ARTIFACT_PARSE_BUDGET_S + PARSE_HARD_LIMIT_GRACE_S)
        stuck = (
            Artifact.objects.filter(status=Artifact.Status.PARSING)
            .filter(Q(parse_started_at__lt=cutoff) | Q(parse_started_at__isnull=True, uploaded_at__lt=cutoff))
            .count()
        )
        yield GaugeMetricFamily(
            "efficiency_artifacts_stuck_parsing",
            "Artifacts parsing for longer than ARTIFACT_PARSE_BUDGET_S plus the hard-limit grace.",
            value=float(stuck),
        )
        spans = Artifact.objects.filter(
            status__in=(Artifact.Status.DONE, Artifact.Status.FAILED),
            parsed_at__gte=now - PARSE_WINDOW,
            parse_started_at__isnull=False,
        ).values_list("parse_started_at", "parsed_at")
        durations = [max(0.0, (end - start).total_seconds()) for start, end in spans if start and end]
        buckets = [(str(b), float(sum(d <= b for d in durations))) for b in PARSE_BUCKETS]
        buckets.append(("+Inf", float(len(durations))))
        yield HistogramMetricFamily(
            "efficiency_artifact_parse_duration_seconds",
            "Parse wall-clock time (parse start to end) of artifacts whose parse ended in the last 24 h.",
            buckets=buckets,
            sum_value=float(sum(durations)),
        )


def render_service(now: datetime | None = None) -> str:
    """The service metrics in the text exposition format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServiceCollector(now))
    return generate_latest(registry).decode()


NOT_CONFIGURED = (
    "/metrics is closed: set METRICS_TOKEN to a secret and give Prometheus the same value as its bearer "
    "token (authorization: credentials in prometheus.yml), or set METRICS_PUBLIC=true to serve it without "
    "a token (only where every client may read every team's job names and costs, e.g. a loopback demo)\n"
)


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape endpoint: requires `Authorization: Bearer <METRICS_TOKEN>`; without a token it is
    403 unless METRICS_PUBLIC=true."""
    token = settings.METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            return HttpResponse("a bearer token is required\n", status=401, content_type="text/plain")
    elif not settings.METRICS_PUBLIC:
        return HttpResponse(NOT_CONFIGURED, status=403, content_type="text/plain; charset=utf-8")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobCollector())
    registry.register(ServiceCollector())
    # The 0.0.4 text format (prometheus_client's 1.0.0 content type only adds escaping options this
    # output does not use).
    return HttpResponse(generate_latest(registry), content_type="text/plain; version=0.0.4; charset=utf-8")
