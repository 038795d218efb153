"""Issue 23 item 7, the alerts: while the service itself was not polling, ingestion_stale does not fire for
every job; one "service degraded" signal shows on /healthz and /metrics instead. When polling resumes the
jobs catch up without stale incidents, and a job whose own data stopped while the service polled fine
still gets its ingestion_stale incident."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from jobs.alerts import incidents
from jobs.metrics import ingest
from jobs.models import AlertIncident, Job, ServiceHeartbeat
from jobs.outputs.exporter import render_service
from jobs.pipeline import poll as pipeline
from jobs.runtime import service_health

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_the_poller_is_stalled_only_after_the_limit_and_unknown_before_any_cycle():
    unknown = service_health.judge_poller(None, T0, 150)
    assert unknown.code == "unknown" and not unknown.degraded
    fresh = service_health.judge_poller(T0 - timedelta(seconds=149), T0, 150)
    assert fresh.code == "ok" and not fresh.degraded
    stalled = service_health.judge_poller(T0 - timedelta(minutes=11), T0, 150)
    assert stalled.degraded and stalled.code == "poll_stalled"
    assert "no poll cycle has completed for 11 min" in stalled.reason
    assert stalled.as_json()["status"] == "degraded" and stalled.as_json()["age_s"] == 660.0


@pytest.fixture(autouse=True)
def _alert_settings(settings):
    settings.ALERT_STALE_MINUTES = 10
    settings.POLL_STALLED_AFTER_S = 150
    settings.ALERTS_ENABLED = True


def _jobs(team, now: datetime, data_age: timedelta, n: int = 3) -> list[Job]:
    return [
        Job.objects.create(
            external_id=f"9100{i}",
            name=f"run-{i}",
            team=team,
            gpu_count=8,
            gpus=[{"hostname": f"node-{i}", "gpu": str(g)} for g in range(8)],
            started_at=now - timedelta(hours=3),
            data_until=now - data_age,
        )
        for i in range(n)
    ]


def _stale_incidents() -> int:
    return AlertIncident.objects.filter(rule="ingestion_stale").count()


def _degraded_gauge(now: datetime) -> dict[str, float]:
    for family in text_string_to_metric_families(render_service(now)):
        if family.name == "efficiency_service_degraded":
            return {s.labels["reason"]: s.value for s in family.samples}
    raise AssertionError("efficiency_service_degraded not exported")


@pytest.mark.django_db
def test_an_eleven_minute_gap_in_polling_opens_no_stale_incident_and_shows_degraded(make_team, client):
    team = make_team("llm")
    now = timezone.now()
    # The last cycle completed 11 minutes ago, having read every job up to then; then the worker died.
    service_health.record_cycle(now - timedelta(minutes=11), 40.0)
    jobs = _jobs(team, now, data_age=timedelta(minutes=11, seconds=30))
    assert incidents.sweep(now) == len(jobs)  # the sweep looked at every job whose data is old ...
    assert _stale_incidents() == 0  # ... and opened nothing
    body = client.get("/healthz").json()
    assert body["poller"]["status"] == "degraded"
    assert "no poll cycle has completed for 11 min" in body["poller"]["reason"]
    assert body["status"] == ("degraded" if body["ok"] else "down")
    assert _degraded_gauge(now) == {"poll_stalled": 1.0}

    # Polling resumes: the first cycle reads each job's data since its data_until (what poll_window asks
    # for), then records its end. The sweep after it finds nothing stale.
    for job in jobs:
        assert ingest.poll_window(job, now).start <= job.data_until.timestamp()
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(data_until=now - timedelta(seconds=30))
    service_health.record_cycle(now + timedelta(seconds=20), 20.0)
    later = now + timedelta(seconds=30)
    incidents.sweep(later)
    for job in Job.objects.all():
        incidents.evaluate_job(job, later)  # what each job's poll runs
    assert _stale_incidents() == 0
    assert _degraded_gauge(later) == {"ok": 0.0}
    assert client.get("/healthz").json()["poller"]["status"] == "ok"


@pytest.mark.django_db
def test_a_job_whose_own_data_stopped_while_the_service_polled_still_gets_ingestion_stale(make_team):
    team = make_team("llm")
    now = timezone.now()
    service_health.record_cycle(now - timedelta(seconds=30), 25.0)  # the poller is fine
    fresh = _jobs(team, now, data_age=timedelta(seconds=40), n=1)[0]
    stopped = Job.objects.create(
        external_id="91099",
        name="exporter-gone",
        team=team,
        gpu_count=8,
        gpus=[{"hostname": "node-x", "gpu": str(g)} for g in range(8)],
        started_at=now - timedelta(hours=3),
        data_until=now - timedelta(minutes=11),
    )
    incidents.sweep(now)
    incidents.evaluate_job(fresh, now)
    assert list(AlertIncident.objects.filter(rule="ingestion_stale").values_list("job_id", flat=True)) == [
        stopped.pk
    ]


@pytest.mark.django_db
def test_an_open_stale_incident_is_held_not_resolved_while_the_poller_is_stalled(make_team):
    team = make_team("llm")
    now = timezone.now()
    service_health.record_cycle(now - timedelta(minutes=1), 25.0)
    [job] = _jobs(team, now, data_age=timedelta(minutes=12), n=1)
    incidents.evaluate_job(job, now)
    [incident] = AlertIncident.objects.filter(rule="ingestion_stale")
    later = now + timedelta(minutes=5)  # the poller stopped meanwhile
    incidents.evaluate_job(job, later)
    incident.refresh_from_db()
    assert incident.resolved_at is None and incident.last_seen_at == now


@pytest.mark.django_db
def test_each_completed_cycle_records_the_heartbeat_and_a_late_record_never_moves_it_back(monkeypatch):
    def fake_cycle(client, now):  # the cycle's body; poll_cycle's lock and heartbeat are the real ones
        return {"duration_s": 12.5, "jobs": 3, "stale": 0, "requests": 40, "polled": [], "stale_jobs": []}

    monkeypatch.setattr(pipeline, "_poll_cycle", fake_cycle)
    pipeline.poll_cycle(client=object(), now=T0)
    row = ServiceHeartbeat.objects.get(name="poll_cycle")
    assert row.finished_at == T0 + timedelta(seconds=12.5) and row.detail["jobs"] == 3
    service_health.record_cycle(T0 - timedelta(minutes=5), 1.0)
    assert ServiceHeartbeat.objects.get(name="poll_cycle").finished_at == T0 + timedelta(seconds=12.5)


def test_before_any_cycle_only_a_job_whose_data_was_never_read_is_held():
    unknown = service_health.judge_poller(None, T0, 150)
    ok = service_health.judge_poller(T0 - timedelta(seconds=30), T0, 150)
    stalled = service_health.judge_poller(T0 - timedelta(minutes=11), T0, 150)
    assert service_health.holds_ingestion_stale(unknown, job_read=False)
    assert not service_health.holds_ingestion_stale(unknown, job_read=True)
    assert not service_health.holds_ingestion_stale(ok, job_read=False)
    assert service_health.holds_ingestion_stale(stalled, job_read=True)


@pytest.mark.django_db
def test_a_fresh_install_opens_no_stale_incident_for_jobs_not_yet_read_until_a_cycle_completes(make_team):
    team = make_team("llm")
    now = timezone.now()
    # Registered an hour ago and never read: the first poll cycle has not completed (no heartbeat yet).
    fresh = [
        Job.objects.create(
            external_id=f"9200{i}",
            name=f"new-{i}",
            team=team,
            gpu_count=8,
            gpus=[{"hostname": f"node-{i}", "gpu": str(g)} for g in range(8)],
            started_at=now - timedelta(hours=1),
        )
        for i in range(2)
    ]
    # A job whose data was read once (archived up to 30 minutes ago) is judged as usual even now.
    (read_once,) = _jobs(team, now, data_age=timedelta(minutes=30), n=1)
    incidents.sweep(now)
    stale = set(
        AlertIncident.objects.filter(rule="ingestion_stale").values_list("job__external_id", flat=True)
    )
    assert stale == {read_once.external_id}
    # Once a cycle has completed the never-read jobs are judged too: nothing is held for good.
    service_health.record_cycle(now, 30.0)
    incidents.sweep(now + timedelta(seconds=5))
    stale = set(
        AlertIncident.objects.filter(rule="ingestion_stale").values_list("job__external_id", flat=True)
    )
    assert stale == {read_once.external_id, *(j.external_id for j in fresh)}
