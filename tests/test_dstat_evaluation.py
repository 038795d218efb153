"""An uploaded dstat log supplies the job's host signals where node_exporter has none (issue #24 item 2)."""

from __future__ import annotations

import io
from datetime import datetime, timedelta
from typing import Any

import pytest

from jobs.evaluation.monitoring_logs import with_monitoring_logs
from jobs.intake.artifacts import parse_artifact, store_upload
from jobs.metrics.signals import MEAN, grid
from jobs.models import Artifact, Job
from tests.test_monitoring_evaluation import two_gpu_job  # noqa: F401  (the fixture: node-1, 2 GPUs, 1 h)

HEADER = (
    '"Dstat 0.7.3 CSV output"\n'
    '"Author:","Dag Wieers <dag@wieers.com>",,,,"URL:","http://dag.wieers.com/home-made/dstat/"\n'
    '"Host:","{host}",,,,"User:","alice"\n'
    '"Cmdline:","dstat -Tcdn --output host.csv 60",,,,"Date:","{date}"\n'
    '"epoch","total cpu usage",,,,,"dsk/total",,"net/total",\n'
    '"epoch","usr","sys","idl","wai","stl","read","writ","recv","send"\n'
)


def _dstat(host: str, start: datetime, minutes: int) -> bytes:
    """`dstat -Tcdn 60` over the job: the first half hour the CPUs wait on storage (idle 50 %, iowait 40 %),
    the second they compute (idle 20 %, iowait 0 %). Row 0 is dstat's since-boot line (dropped)."""
    text = HEADER.format(host=host, date=start.strftime("%d %b %Y %H:%M:%S UTC"))
    for k in range(minutes + 1):
        at = start.timestamp() + 60 * k
        idle, wait = (50.0, 40.0) if k <= minutes // 2 else (20.0, 0.0)
        usr = 100.0 - idle - wait - 2.0
        text += f"{at:.3f},{usr:.3f},2.000,{idle:.3f},{wait:.3f},0,52428800,0,1048576,2048,\n"
    return text.encode()


@pytest.mark.django_db
def test_a_dstat_log_of_the_jobs_host_supplies_its_host_signals(two_gpu_job: tuple[Job, datetime]) -> None:  # noqa: F811
    job, start = two_gpu_job
    artifact = store_upload(job, io.BytesIO(_dstat("node-1", start, 60)), filename="host.csv", parse=False)
    assert artifact.kind == Artifact.Kind.DSTAT
    parse_artifact(artifact.pk)
    artifact.refresh_from_db()
    assert artifact.status == Artifact.Status.DONE, artifact.error
    assert artifact.run_check == Artifact.RunCheck.MATCHES
    job.refresh_from_db()
    ev = job.evaluated
    assert ev is not None
    source = "from the uploaded dstat log 'host.csv' (host node-1, 60 s samples)"
    for key in ("host_cpu_busy", "host_cpu_iowait", "host_disk_read_bytes", "host_net_rx_bytes"):
        assert ev.signal_sources[key] == source
    assert "host_mem_available" not in ev.signal_sources
    # By hand, on a 60 s grid: the first 30 samples (minutes 1-30) read iowait 0.40 and busy 1 - 0.9 = 0.10,
    # the last 30 iowait 0 and busy 0.80; disk reads 52428800 B/s (50 MiB/s) throughout.
    end = (start + timedelta(hours=1)).timestamp()
    ts = grid(start.timestamp(), end, 60.0)
    got = with_monitoring_logs(job, None, ts, 60.0, end)
    assert got.signals is not None
    iowait = got.signals.signals["host_cpu_iowait"].stats[MEAN]
    busy = got.signals.signals["host_cpu_busy"].stats[MEAN]
    assert iowait[1:31] == pytest.approx([0.40] * 30) and iowait[31:] == pytest.approx([0.0] * 30)
    assert busy[1:31] == pytest.approx([0.10] * 30) and busy[31:] == pytest.approx([0.80] * 30)
    assert got.signals.signals["host_disk_read_bytes"].stats[MEAN][5] == pytest.approx(52428800.0)


@pytest.mark.django_db
def test_a_dstat_log_of_another_host_supplies_nothing(two_gpu_job: tuple[Job, datetime]) -> None:  # noqa: F811
    job, start = two_gpu_job
    artifact = store_upload(job, io.BytesIO(_dstat("node-9", start, 60)), filename="other.csv", parse=False)
    parse_artifact(artifact.pk)
    artifact.refresh_from_db()
    assert artifact.run_check == Artifact.RunCheck.MISMATCH
    job.refresh_from_db()
    ev = job.evaluated
    assert ev is None or not any(k.startswith("host_") for k in ev.signal_sources)


@pytest.mark.django_db
def test_the_job_page_says_the_host_signals_came_from_the_dstat_log(
    two_gpu_job: tuple[Job, datetime],  # noqa: F811
    client: Any,
    make_user: Any,
) -> None:
    job, start = two_gpu_job
    artifact = store_upload(job, io.BytesIO(_dstat("node-1", start, 60)), filename="host.csv", parse=False)
    parse_artifact(artifact.pk)
    client.force_login(make_user("alice", teams=[job.team]))
    page = client.get(f"/jobs/{job.external_id}/").content.decode()
    assert "from the uploaded dstat log" in page
