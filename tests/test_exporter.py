"""/metrics exports per-job numbers in Prometheus text format, escaped, and honours METRICS_TOKEN (and is
closed without one unless METRICS_PUBLIC=true)."""

import subprocess
from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from jobs.models import Finding, Job
from jobs.outputs.exporter import _GAUGES, INFO


@pytest.fixture(autouse=True)
def metrics_public(settings):
    """These tests read /metrics without a token, as the loopback demo does."""
    settings.METRICS_TOKEN = ""
    settings.METRICS_PUBLIC = True


@pytest.fixture
def jobs(make_team):
    team = make_team("llm")
    now = timezone.now()
    running = Job.objects.create(
        external_id='evil"} 1\nx', team=team, gpu_count=8, started_at=now - timedelta(hours=3),
        model_name="llama-7b", mfu=0.31, cost_per_day_usd=1321.0, waste_per_day_usd=408.0,
    )  # fmt: skip
    Job.objects.create(
        external_id="old", team=team, gpu_count=8, started_at=now - timedelta(days=30),
        ended_at=now - timedelta(days=29), mfu=0.5, status=Job.Status.FINALIZED,
    )  # fmt: skip
    Finding.objects.create(
        job=running, code="false_saturation", severity="warning", confidence=0.9, title="t",
        recommendation="r", waste_per_day_usd=100,
    )  # fmt: skip
    return running


@pytest.mark.django_db
def test_metrics_lists_recent_jobs_with_escaped_labels(client, jobs):
    response = client.get("/metrics")
    assert response.status_code == 200
    text = response.content.decode()
    assert 'job_id="evil\\"} 1\\nx"' in text
    assert "efficiency_job_mfu_ratio{" in text and " 0.31\n" in text
    evil = {"job_id": 'evil"} 1\nx', "team": "llm"}
    assert ("efficiency_job_findings", {**evil, "code": "false_saturation", "severity": "warning"}, 1.0) in (
        _samples(text)
    )
    assert 'job_id="old"' not in text


@pytest.mark.django_db
def test_series_labels_are_stable_and_status_is_on_the_info_metric(client, jobs):
    """`job` is Prometheus' target label (it would become exported_job); a status change must not start
    new series, so status, model and GPU model live on efficiency_job_info only."""
    text = client.get("/metrics").content.decode()
    # The per-job series (the service's own health metrics below them carry no job labels).
    samples = [line for line in text.splitlines() if line.startswith("efficiency_job_")]
    assert samples
    for line in samples:
        labels = line[line.index("{") + 1 : line.rindex("}")]
        assert not labels.startswith("job=") and ',job="' not in labels, line
        if line.startswith("efficiency_job_info{"):
            assert 'status="running"' in line and 'model="llama-7b"' in line
            assert float(line.rsplit(" ", 1)[1]) == 1, line
        else:
            assert "status=" not in labels and "model=" not in labels, line


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of an exposition as Prometheus reads it (label values unescaped)."""
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


@pytest.mark.django_db
def test_each_per_job_family_reads_back_with_its_labels_and_values(client, jobs):
    """The exposition parsed as Prometheus parses it: the job collector's names, the two stable labels on
    every per-job series (the descriptive ones on the info metric only) and the job's numbers, with the
    external id read back exactly as registered (escaping round-trips)."""
    samples = _samples(client.get("/metrics").content.decode())
    per_job = [s for s in samples if s[0].startswith("efficiency_job_")]
    assert {name for name, _, _ in per_job} <= {name for name, _, _ in _GAUGES} | {
        INFO,
        "efficiency_job_findings",
    }
    evil = {"job_id": 'evil"} 1\nx', "team": "llm"}
    info = {"status": "running", "model": "llama-7b", "gpu_model": "unknown", "name": ""}
    assert (INFO, {**evil, **info}, 1.0) in per_job
    for name, value in [
        ("efficiency_job_mfu_ratio", 0.31),
        ("efficiency_job_cost_usd_per_day", 1321.0),
        ("efficiency_job_waste_usd_per_day", 408.0),
        ("efficiency_job_waste_known", 1.0),
        ("efficiency_job_gpus", 8.0),
    ]:
        assert (name, evil, value) in per_job, name
    # Unknown numbers are absent, never 0: the job has no HFU, throughput or SM-active mean.
    assert not any(name == "efficiency_job_hfu_ratio" for name, _, _ in per_job)
    assert all(labels["job_id"] != "old" for _, labels, _ in per_job)


@pytest.mark.django_db
def test_metrics_text_is_valid_for_promtool(client, jobs, tmp_path):
    path = tmp_path / "metrics.txt"
    path.write_bytes(client.get("/metrics").content)
    try:
        result = subprocess.run(["promtool", "check", "metrics"], stdin=path.open("rb"), capture_output=True,
                                text=True, timeout=30)  # fmt: skip
    except FileNotFoundError:
        pytest.skip("promtool is not installed (Debian package 'prometheus')")
    assert "parsing error" not in (result.stdout + result.stderr), result.stdout + result.stderr


@pytest.mark.django_db
def test_metrics_requires_the_bearer_token_when_configured(client, jobs, settings):
    settings.METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200


@pytest.mark.django_db
def test_metrics_without_a_token_is_closed_unless_public_with_how_to_configure_it(client, jobs, settings):
    settings.METRICS_PUBLIC = False
    response = client.get("/metrics")
    assert response.status_code == 403
    assert "METRICS_TOKEN" in response.content.decode() and "METRICS_PUBLIC=true" in response.content.decode()
    settings.METRICS_PUBLIC = True
    assert client.get("/metrics").status_code == 200
