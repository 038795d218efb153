"""The demo's running job that goes idle (demo.cluster.IDLE_LIVE_JOB) shows an alert once polled through a
real Prometheus: on the job page, the job list, the team's alerts page and the API."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from jobs.demo import cluster
from jobs.metrics.prometheus import PrometheusClient
from jobs.models import AlertIncident
from jobs.pipeline import poll as pipeline
from jobs.simulate import backfill, simulate, write_openmetrics
from tests.prom_server import PrometheusProcess, prometheus_binary

pytestmark = [pytest.mark.prometheus]
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.mark.django_db
def test_the_demo_job_that_goes_idle_shows_an_alert(tmp_path, client, catalog):
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (Debian package 'prometheus')")
    [planned] = [d for d in cluster.plan(NOW) if d.spec.job_id == cluster.IDLE_LIVE_JOB]
    assert not planned.ended
    result = cluster.truncate(simulate(planned.spec), NOW.timestamp())
    write_openmetrics([result], tmp_path / "demo.om")
    backfill(tmp_path / "demo.om", tmp_path / "tsdb")
    teams = cluster.ensure_people()
    job = cluster.register(planned, result, teams, NOW)
    with PrometheusProcess(tmp_path / "tsdb") as prom:
        pipeline.poll_job(job, PrometheusClient(prom.url, timeout_s=10, retries=0), now=NOW)
    opened = AlertIncident.objects.filter(job=job, resolved_at__isnull=True)
    [incident] = opened.filter(rule="gpus_idle")
    assert incident.finding_code == "idle_gpus"
    # It worked for 90 minutes, then 2 of its 8 GPUs went idle 30 minutes before now.
    assert abs((NOW - incident.started_at).total_seconds() - 1800) <= 120
    client.login(username="demo", password=cluster.DEMO_PASSWORD)
    page = client.get(f"/jobs/{job.external_id}/").content.decode()
    assert f'data-incident="{incident.pk}"' in page and "GPUs idle" in page
    assert "#alerts" in client.get("/").content.decode()
    assert incident.title in client.get(f"/teams/{job.team.slug}/alerts/").content.decode()
    api = client.get(f"/api/v1/alerts/?team={job.team.slug}&state=open").json()
    assert {r["job"] for r in api["results"]} == {job.external_id}
    assert "gpus_idle" in {r["rule"] for r in api["results"]}
