"""/metrics also exports the service's own health (jobs.outputs.exporter.ServiceCollector): poll lag per
running job, the last poll cycle from the shared cache (absent, never 0, when unknown), Celery queue
lengths from Redis, artifacts per status (stuck ones apart), parse durations and alert deliveries."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
import redis
from django.conf import settings as django_settings
from django.core.cache import cache
from django.utils import timezone
from kombu import Queue
from prometheus_client.parser import text_string_to_metric_families

from jobs.models import AlertDelivery, AlertIncident, AlertSubscription, Artifact, Job
from jobs.outputs.exporter import POLL_CYCLE_KEY, render_service

pytestmark = pytest.mark.django_db


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture
def private_queues(settings):
    """Two Celery queues with unique names on the test Redis, emptied afterwards."""
    names = [f"h5-test-{uuid.uuid4().hex[:8]}-{q}" for q in ("poll", "parse")]
    settings.CELERY_TASK_QUEUES = tuple(Queue(n) for n in names)
    settings.CELERY_BROKER_URL = django_settings.REDIS_URL
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    yield client, names
    client.delete(*names)
    client.close()


@pytest.fixture
def now():
    return timezone.now()


def test_poll_lag_is_now_minus_data_until_for_running_jobs_only(make_team, now, private_queues):
    team = make_team("llm")
    start = now - timedelta(hours=2)
    Job.objects.create(external_id="lagging", team=team, gpu_count=8, started_at=start,
                       data_until=now - timedelta(seconds=90))  # fmt: skip
    Job.objects.create(external_id="fresh-start", team=team, gpu_count=8, started_at=start)  # no data yet
    Job.objects.create(external_id="ended", team=team, gpu_count=8, started_at=start, ended_at=now,
                       status=Job.Status.ENDED, data_until=now - timedelta(hours=1))  # fmt: skip
    samples = _samples(render_service(now))
    lags = {dict(k[1])["job_id"]: v for k, v in samples.items() if k[0] == "efficiency_poll_lag_seconds"}
    assert lags == {"lagging": 90.0}  # unknown lag (no data yet) is absent, not 0; ended jobs don't lag


def test_poll_cycle_metrics_come_from_the_shared_cache_and_are_absent_when_unknown(now, private_queues):
    cache.delete(POLL_CYCLE_KEY)
    assert "efficiency_poll_cycle" not in render_service(now)
    cache.set(POLL_CYCLE_KEY, {"finished_at": 1764590000.5, "duration_s": 12.25, "requests": 40, "jobs": 7,
                               "stale": 1}, None)  # fmt: skip
    try:
        samples = _samples(render_service(now))
    finally:
        cache.delete(POLL_CYCLE_KEY)
    assert samples[("efficiency_poll_cycle_duration_seconds", ())] == 12.25
    assert samples[("efficiency_poll_cycle_requests", ())] == 40
    assert samples[("efficiency_poll_cycle_jobs", ())] == 7
    assert samples[("efficiency_poll_cycle_stale_jobs", ())] == 1
    assert samples[("efficiency_poll_cycle_finished_timestamp_seconds", ())] == 1764590000.5


def test_the_cache_is_redis_under_a_private_test_prefix():
    backend = django_settings.CACHES["default"]
    assert backend["BACKEND"] == "django.core.cache.backends.redis.RedisCache"
    assert backend["KEY_PREFIX"].startswith("test-")


def test_queue_lengths_are_read_from_redis_per_celery_queue(private_queues, now):
    client, (poll, parse) = private_queues
    client.rpush(poll, "a", "b", "c")
    samples = _samples(render_service(now))
    assert samples[("efficiency_celery_queue_length", (("queue", poll),))] == 3
    assert samples[("efficiency_celery_queue_length", (("queue", parse),))] == 0
    assert samples[("efficiency_broker_up", ())] == 1


def test_an_unreachable_broker_says_so_and_exports_no_queue_lengths(settings, now):
    settings.CELERY_TASK_QUEUES = (Queue("poll"),)
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    samples = _samples(render_service(now))
    assert samples[("efficiency_broker_up", ())] == 0
    assert not any(k[0] == "efficiency_celery_queue_length" for k in samples)


def test_artifacts_by_status_stuck_parses_and_parse_duration_histogram(make_team, now, settings,
                                                                       private_queues):  # fmt: skip
    settings.ARTIFACT_PARSE_BUDGET_S = 900
    team = make_team("llm")
    job = Job.objects.create(external_id="j", team=team, gpu_count=8, started_at=now - timedelta(hours=3))

    def artifact(name: str, status: str, started_s_ago: float | None, took_s: float | None) -> None:
        started = now - timedelta(seconds=started_s_ago) if started_s_ago is not None else None
        parsed = started + timedelta(seconds=took_s) if started is not None and took_s is not None else None
        Artifact.objects.create(job=job, kind="kineto", original_name=name, sha256=name, size_bytes=1,
                                status=status, parse_started_at=started, parsed_at=parsed)  # fmt: skip

    artifact("a", "done", 100, 3.0)  # in the <= 5 s bucket
    artifact("b", "done", 200, 40.0)  # <= 60 s
    artifact("c", "failed", 300, 0.5)  # <= 1 s
    artifact("d", "parsing", 60, None)  # parsing for a minute: not stuck
    artifact("e", "parsing", 2 * 3600, None)  # past 900 s + the hard-limit grace: stuck
    artifact("f", "queued", None, None)
    samples = _samples(render_service(now))
    status = {dict(k[1])["status"]: v for k, v in samples.items() if k[0] == "efficiency_artifacts"}
    assert status == {"queued": 1, "parsing": 2, "done": 2, "failed": 1}
    assert samples[("efficiency_artifacts_stuck_parsing", ())] == 1
    hist = "efficiency_artifact_parse_duration_seconds"
    assert samples[(f"{hist}_bucket", (("le", "1.0"),))] == 1
    assert samples[(f"{hist}_bucket", (("le", "5.0"),))] == 2
    assert samples[(f"{hist}_bucket", (("le", "60.0"),))] == 3
    assert samples[(f"{hist}_count", ())] == 3
    assert samples[(f"{hist}_sum", ())] == pytest.approx(3.0 + 40.0 + 0.5)


def test_alert_deliveries_are_counted_per_state(make_team, now, private_queues):
    team = make_team("llm")
    job = Job.objects.create(external_id="j", team=team, gpu_count=8, started_at=now - timedelta(hours=1))
    incident = AlertIncident.objects.create(rule="gpus_idle", job=job, team=team, started_at=now,
                                            opened_at=now, last_seen_at=now, title="t")  # fmt: skip
    for i, state in enumerate(("sent", "sent", "gave_up")):
        sub = AlertSubscription.objects.create(team=team, channel="email", email=f"{i}@example.com")
        AlertDelivery.objects.create(incident=incident, subscription=sub, event="opened", channel="email",
                                     status=state)  # fmt: skip
    samples = _samples(render_service(now))
    states = {dict(k[1])["status"]: v for k, v in samples.items() if k[0] == "efficiency_alert_deliveries"}
    assert states == {"pending": 0, "claimed": 0, "sent": 2, "failed": 0, "gave_up": 1}


def test_metrics_endpoint_serves_job_and_service_metrics_together(client, settings, private_queues):
    settings.METRICS_TOKEN = "s3cret"
    text = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").content.decode()
    assert "# TYPE efficiency_job_info gauge" in text
    assert "# TYPE efficiency_artifacts gauge" in text


def test_every_exported_service_family_is_listed_in_service_metrics(make_team, now, private_queues):
    from jobs.outputs.exporter import SERVICE_METRICS

    make_team("llm")
    cache.set(
        POLL_CYCLE_KEY, {"finished_at": 1.0, "duration_s": 1.0, "requests": 1, "jobs": 1, "stale": 0}, None
    )
    try:
        families = {f.name for f in text_string_to_metric_families(render_service(now))}
    finally:
        cache.delete(POLL_CYCLE_KEY)
    assert families == set(SERVICE_METRICS)


def test_the_service_collector_reads_the_database_in_six_queries(make_team, now, private_queues,
                                                                 django_assert_num_queries):  # fmt: skip
    # Poll lag, artifacts per status, stuck parses, parse durations, deliveries per state, the poll cycle's
    # heartbeat (service degraded): one query each, however many jobs and artifacts there are.
    team = make_team("llm")
    for i in range(3):
        Job.objects.create(external_id=f"j{i}", team=team, gpu_count=8, started_at=now - timedelta(hours=1),
                           data_until=now - timedelta(minutes=i))  # fmt: skip
    with django_assert_num_queries(6):
        render_service(now)


def test_task_runs_and_durations_are_exported_from_what_the_workers_recorded(settings, now, private_queues):
    from efficiency import task_metrics

    settings.REDIS_URL = settings.REDIS_URL.rsplit("/", 1)[0] + "/11"
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(task_metrics.KEY)
    try:
        task_metrics.record(client, "jobs.tasks.poll_running_jobs", "succeeded", 0.4)
        task_metrics.record(client, "jobs.tasks.poll_running_jobs", "succeeded", 12.0)
        task_metrics.record(client, "jobs.tasks.deliver_alert", "retried", 2.0)
        samples = _samples(render_service(now))
    finally:
        client.delete(task_metrics.KEY)
    poll = (("outcome", "succeeded"), ("task", "jobs.tasks.poll_running_jobs"))
    assert samples[("efficiency_task_runs_total", poll)] == 2
    retried = (("outcome", "retried"), ("task", "jobs.tasks.deliver_alert"))
    assert samples[("efficiency_task_runs_total", retried)] == 1
    task = (("task", "jobs.tasks.poll_running_jobs"),)
    assert samples[("efficiency_task_duration_seconds_count", task)] == 2
    assert samples[("efficiency_task_duration_seconds_sum", task)] == 12.4
    assert samples[("efficiency_task_duration_seconds_bucket", (("le", "0.5"), *task))] == 1
    assert samples[("efficiency_task_duration_seconds_bucket", (("le", "15"), *task))] == 2
