"""Jobs discovered from exporter labels (hpc_job) in a real Prometheus, and ended when the label goes away."""

from datetime import UTC, datetime, timedelta

import pytest

from jobs.metrics.prometheus import PrometheusClient
from jobs.models import Job
from jobs.pipeline.discovery import discover
from jobs.simulate import DEFAULT_START, SimSpec, backfill, simulate, write_openmetrics
from tests.prom_server import PrometheusProcess, prometheus_binary

pytestmark = [pytest.mark.prometheus]
START = datetime.fromtimestamp(DEFAULT_START, tz=UTC)


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (Debian package 'prometheus')")
    work = tmp_path_factory.mktemp("discovery")
    sims = [
        simulate(
            SimSpec(scenario="healthy", gpus=4, job_id="777", duration_s=7200, hosts=("node-d",), seed=1)
        ),
        simulate(
            SimSpec(scenario="healthy", gpus=2, job_id='x"y', duration_s=7200, hosts=("node-e",), seed=2)
        ),
    ]
    write_openmetrics(sims, work / "d.om")
    backfill(work / "d.om", work / "tsdb")
    with PrometheusProcess(work / "tsdb") as server:
        yield PrometheusClient(server.url, timeout_s=10, retries=0)


@pytest.fixture
def discovery(settings, make_team):
    settings.DISCOVERY_LABEL = "hpc_job"
    settings.DISCOVERY_TEAM = "unassigned"
    return make_team("unassigned")


@pytest.mark.django_db
def test_unknown_label_values_become_jobs_and_end_when_they_disappear(prom, discovery, catalog):
    report = discover(prom, now=START + timedelta(hours=1))
    assert report["created"] == ["hpc_job:777", 'hpc_job:x"y']
    job = Job.objects.get(external_id="hpc_job:777")
    assert job.gpu_count == 4 and job.gpu_model.name == "H100 SXM"
    assert job.selector == {"hpc_job": "777"}
    assert job.kind == Job.Kind.TRAINING  # DISCOVERY_JOB_KIND's default
    # Platform-seen but vouched for by no scheduler: a member cannot take it, the policy never cancels it.
    assert (job.registered_by, job.registered_via) == ("discovery", "discovery on hpc_job")
    assert abs((job.started_at - START).total_seconds()) <= 120
    assert discover(prom, now=START + timedelta(hours=1, minutes=5))["created"] == []
    ended = discover(prom, now=START + timedelta(hours=2, minutes=30))
    assert sorted(ended["ended"]) == ["hpc_job:777", 'hpc_job:x"y']
    job.refresh_from_db()
    assert job.status == Job.Status.ENDED
    assert abs((job.ended_at - (START + timedelta(hours=2))).total_seconds()) <= 120


@pytest.mark.django_db
def test_discovered_jobs_take_the_configured_kind(prom, discovery, catalog, settings):
    settings.DISCOVERY_JOB_KIND = "inference"
    discover(prom, now=START + timedelta(hours=1))
    assert set(Job.objects.values_list("kind", flat=True)) == {Job.Kind.INFERENCE}


@pytest.mark.django_db
def test_discovery_is_off_without_a_label_and_refuses_an_unknown_team(prom, settings):
    settings.DISCOVERY_LABEL = ""
    assert discover(prom, now=START + timedelta(hours=1)) == {"created": [], "ended": []}
    settings.DISCOVERY_LABEL, settings.DISCOVERY_TEAM = "hpc_job", "nope"
    with pytest.raises(ValueError, match="DISCOVERY_TEAM"):
        discover(prom, now=START + timedelta(hours=1))
    assert not Job.objects.exists()
