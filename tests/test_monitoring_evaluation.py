"""An uploaded nvidia-smi log feeds the evaluation where DCGM has no samples (issue 24.2)."""

from __future__ import annotations

import io
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pytest
from django.utils import timezone

from jobs.intake.artifacts import parse_artifact, store_upload
from jobs.intake.registry import register_job
from jobs.models import Artifact, Finding, Job, PriceEntry
from tests.conftest import job_body

PRICE_USD_PER_GPU_HOUR = 2.0


def _stamp(t: datetime) -> str:
    return t.strftime("%Y/%m/%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}"


def _log(start: datetime, sweeps: int, idle_gpu1_sweeps: int, interval_s: int = 15) -> bytes:
    """`nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,memory.used --format=csv -l 15` on a
    2-GPU host, no index column, local time = UTC: GPU 0 busy (95 %) throughout; GPU 1 at 0 % for the
    first `idle_gpu1_sweeps` sweeps, then 90 %. Each GPU's row carries its own ms timestamp (4 ms apart)."""
    lines = ["timestamp, utilization.gpu [%], power.draw [W], memory.used [MiB]\n"]
    for k in range(sweeps):
        at = start + timedelta(seconds=interval_s * k)
        lines.append(f"{_stamp(at + timedelta(milliseconds=2))}, 95 %, 650.00 W, 70000 MiB\n")
        idle = k < idle_gpu1_sweeps
        lines.append(
            f"{_stamp(at + timedelta(milliseconds=6))}, {0 if idle else 90} %, "
            f"{70.0 if idle else 640.0:.2f} W, {500 if idle else 68000} MiB\n"
        )
    return "".join(lines).encode()


@pytest.fixture
def two_gpu_job(db: Any, make_team: Any, catalog: Any, media_root: Any) -> tuple[Job, datetime]:
    from jobs.api.serializers import JobRegisterSerializer

    make_team("llm")
    start = (timezone.now() - timedelta(hours=3)).replace(microsecond=0)
    end = start + timedelta(hours=1)
    body = JobRegisterSerializer(
        data=job_body(
            "smi-1",
            started_at=start.isoformat(),
            ended_at=end.isoformat(),
            price_tier="on_demand",
            gpus=[{"hostname": "node-1", "gpu": "0"}, {"hostname": "node-1", "gpu": "1"}],
            parallelism={"tp": 1, "pp": 1, "dp": 2, "ep": 1},
        )
    )
    body.is_valid(raise_exception=True)
    job = register_job(body.validated_data).job
    assert job.gpu_model is not None
    PriceEntry.objects.filter(gpu_model=job.gpu_model, tier="on_demand").delete()
    PriceEntry.objects.create(
        gpu_model=job.gpu_model,
        tier="on_demand",
        usd_per_gpu_hour=PRICE_USD_PER_GPU_HOUR,
        effective_from=start - timedelta(days=1),
    )
    job.status = job.Status.FINALIZED
    job.save()
    return job, start


@pytest.mark.django_db
def test_a_job_with_only_an_nvidia_smi_log_gets_its_idle_share_waste_and_finding(
    two_gpu_job: tuple[Job, datetime],
) -> None:
    job, start = two_gpu_job
    assert job.gpu_count == 2
    # By hand: 240 sweeps × 15 s = the job's hour; GPU 1 idle (0 %) for the first 120 sweeps (30 min),
    # GPU 0 never: 120 idle of 2 × 240 = 480 GPU samples = 25.0 %. Cost/day = 2 GPUs × $2 × 24 h = $96;
    # idle waste = $96 × 0.25 = $24/day. The idle stretch (30 min) is longer than the idle rule's 10 min.
    data = _log(start, sweeps=240, idle_gpu1_sweeps=120)
    artifact = store_upload(job, io.BytesIO(data), filename="gpu.csv", parse=False)
    assert artifact.kind == Artifact.Kind.NVIDIA_SMI
    parse_artifact(artifact.pk)  # parse, run check, re-evaluate, diagnose
    artifact.refresh_from_db()
    assert artifact.status == Artifact.Status.DONE, artifact.error
    assert artifact.analysis["gpu_assignment"]["gpu_count"] == 2
    job.refresh_from_db()
    ev = job.evaluated
    assert ev is not None
    assert ev.idle_share == pytest.approx(0.25)
    assert ev.idle_share_exact is True
    assert job.cost_per_day_usd == pytest.approx(96.0)
    assert job.idle_waste_per_day_usd == pytest.approx(24.0)
    assert "utilisation unknown" not in job.waste_unknown_reason
    # Utilisation mean over the hour: GPU 0 0.95; GPU 1 half 0 and half 0.90 -> (0.95 + 0.45) / 2 = 0.70.
    assert job.gpu_util_mean == pytest.approx(0.70, abs=0.01)
    assert ev.coverage["gpu_util"] == pytest.approx(1.0, abs=0.01)
    assert ev.signal_sources["gpu_util"].startswith("from the uploaded nvidia-smi log 'gpu.csv'")
    assert {"gpu_util", "power_usage", "fb_used"} <= set(ev.signal_sources)
    assert "utilization.gpu from the uploaded nvidia-smi log" in ev.variants["idle"]
    assert any("from the uploaded nvidia-smi log" in note for note in ev.notes)
    # Peak memory from memory.used (MiB), energy from power.draw (W) over the hour.
    assert ev.peak_memory_mib == pytest.approx(70000.0)
    assert ev.energy_kwh == pytest.approx((650 + (70 + 640) / 2) * 1.0 / 1000, rel=0.03)
    finding = Finding.objects.get(job=job, code="idle_gpus")
    assert finding.waste_per_day_usd == pytest.approx(24.0, abs=0.02)


@pytest.mark.django_db
def test_the_job_page_says_the_utilisation_came_from_the_uploaded_log(
    two_gpu_job: tuple[Job, datetime], client: Any, make_user: Any
) -> None:
    job, start = two_gpu_job
    artifact = store_upload(job, io.BytesIO(_log(start, 240, 120)), filename="gpu.csv", parse=False)
    parse_artifact(artifact.pk)
    client.force_login(make_user("alice", teams=[job.team]))
    page = client.get(f"/jobs/{job.external_id}/").content.decode()
    assert "from the uploaded nvidia-smi log" in page
    # The resolution stated is the log's 15 s sampling, not the 30 s scrape interval.
    assert "sampled every 15 s" in page
    # The artifact's facts: how rows became GPUs, and the zone its local timestamps were read in.
    assert "GPUs told apart by" in page and "sweeps by time gaps" in page
    assert "Timestamps read in" in page and "read as UTC (assumed)" in page


@pytest.mark.django_db
def test_a_node_log_of_more_gpus_than_the_job_uses_only_the_jobs_registered_gpus(
    two_gpu_job: tuple[Job, datetime],
) -> None:
    job, start = two_gpu_job
    # 4 GPUs logged with an index column; the job registered GPUs 0 and 1: GPUs 2 and 3 (idle) are
    # another job's and must not count. GPU 0 and 1 busy throughout -> idle share 0.
    lines = ["timestamp, index, utilization.gpu [%], power.draw [W]\n"]
    for k in range(240):
        at = _stamp(start + timedelta(seconds=15 * k))
        for g, util in enumerate((95, 90, 0, 0)):
            lines.append(f"{at}, {g}, {util} %, 300.00 W\n")
    artifact = store_upload(job, io.BytesIO("".join(lines).encode()), filename="node.csv", parse=False)
    parse_artifact(artifact.pk)
    job.refresh_from_db()
    ev = job.evaluated
    assert ev is not None and ev.idle_share == pytest.approx(0.0)
    assert "2 GPU(s)" in ev.signal_sources["gpu_util"]
    assert not Finding.objects.filter(job=job, code="idle_gpus").exists()


@pytest.mark.django_db
def test_the_upload_sets_the_logs_time_zone_and_the_analysis_states_it(
    two_gpu_job: tuple[Job, datetime],
    make_user: Any,
    api_client_for: Any,
    celery_eager: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    job, start = two_gpu_job
    client = api_client_for(make_user("alice", teams=[job.team]))
    url = f"/api/v1/jobs/{job.external_id}/artifacts/"
    data = _log(start, 240, 120)
    bad = client.post(url, {"file": SimpleUploadedFile("gpu.csv", data), "timezone": "Mars/Olympus"})
    assert bad.status_code == 400 and "unknown time zone" in str(bad.json()["file"])
    # The host was on UTC+02:00: its local 'start' wall-clock time is 2 h before the job started in UTC,
    # so the log now lies outside the job's window and is not used.
    with django_capture_on_commit_callbacks(execute=True):
        got = client.post(url, {"file": SimpleUploadedFile("gpu.csv", data), "timezone": "+02:00"})
    assert got.status_code == 201, got.content
    artifact = Artifact.objects.get(pk=got.json()["id"])
    assert artifact.status == Artifact.Status.DONE, artifact.error
    zone = artifact.analysis["time_zone"]
    assert zone["zone"] == "UTC+02:00" and zone["source"] == "given on upload" and zone["assumed"] is False
    assert artifact.analysis["start_unix_s"] == pytest.approx(start.timestamp() - 7200 + 0.002, abs=1e-3)
    assert artifact.analysis["upload_options"] == {"timezone": "UTC+02:00"}
    # The same bytes again without a zone: UTC, re-parsed, now inside the job's window.
    with django_capture_on_commit_callbacks(execute=True):
        again = client.post(url, {"file": SimpleUploadedFile("gpu.csv", data), "timezone": "UTC"})
    assert again.status_code == 201 and again.json()["id"] == artifact.pk
    artifact.refresh_from_db()
    assert artifact.analysis["time_zone"]["zone"] == "UTC"
    job.refresh_from_db()
    assert job.evaluated is not None and job.evaluated.idle_share == pytest.approx(0.25)


@pytest.mark.django_db
def test_logs_taken_from_the_diagnosis_artifacts_read_equal_the_logs_query(
    two_gpu_job: tuple[Job, datetime],
) -> None:
    """The diagnosis passes the artifacts it read (`used`) instead of a second query: same logs, newest
    first, so the same merge, sources, notes and interval."""
    from jobs.evaluation.load import DEFAULT_STEP_S
    from jobs.evaluation.monitoring_logs import with_monitoring_logs
    from jobs.metrics.signals import grid

    job, start = two_gpu_job
    for name, idle in (("old.csv", 120), ("new.csv", 40)):  # the newer log wins where both have samples
        artifact = store_upload(job, io.BytesIO(_log(start, 240, idle)), filename=name, parse=False)
        parse_artifact(artifact.pk)
    job.refresh_from_db()
    used = list(Artifact.objects.used_in_diagnosis().filter(job=job).order_by("uploaded_at", "pk"))
    assert len(used) == 2
    end = job.ended_at.timestamp() if job.ended_at else start.timestamp()
    ts = grid(start.timestamp(), end, DEFAULT_STEP_S)
    queried = with_monitoring_logs(job, None, ts, float(DEFAULT_STEP_S), end)
    given = with_monitoring_logs(job, None, ts, float(DEFAULT_STEP_S), end, used=used)
    assert queried.signals is not None and given.signals is not None
    assert (given.sources, given.notes, given.interval_s) == (
        queried.sources,
        queried.notes,
        queried.interval_s,
    )
    assert "new.csv" in given.sources["gpu_util"]
    for key, series in queried.signals.signals.items():
        for stat, values in series.stats.items():
            assert np.array_equal(given.signals.signals[key].stats[stat], values, equal_nan=True), (key, stat)
