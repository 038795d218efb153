"""The roofline (#25 item 6) end to end: archived DCGM activities -> the API's `roofline` object and the job
page's section and figure, with unknowns stated (never 0)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from html import unescape
from typing import Any

import numpy as np
import pytest
from django.test import Client

from jobs.evaluation.schema import Evaluation, GpuSharing, SharedWith, encode
from jobs.metrics import archive
from jobs.metrics.archive import Points
from jobs.models import GpuModel, Job, Team

STEP = 30
N = 240  # 2 h of 30 s samples
T0 = 1_780_000_000 // 7200 * 7200
TIMES = T0 + STEP * np.arange(1, N + 1, dtype=float)
# Hand values: GPU 0 busy on the tensor pipe, GPU 1 streaming memory (H100 SXM bf16, ridge 295.37 FLOP/byte).
GPU0 = {"tensor_active": 0.6, "dram_active": 0.2}
GPU1 = {"tensor_active": 0.05, "dram_active": 0.7}


def _rows(job: Job, signals: tuple[str, ...]) -> list[Points]:
    rows = []
    for key in signals:
        a, b = GPU0[key], GPU1[key]
        rows.append(Points(job.pk, key, "mean", "", STEP, TIMES, np.full(N, (a + b) / 2)))
        rows.append(Points(job.pk, key, "gpu", "node-a/0", STEP, TIMES, np.full(N, a)))
        rows.append(Points(job.pk, key, "gpu", "node-a/1", STEP, TIMES, np.full(N, b)))
    return rows


def _job(team: Team, external_id: str, signals: tuple[str, ...], **fields: Any) -> Job:
    start = datetime.fromtimestamp(T0, tz=UTC)
    job = Job.objects.create(
        external_id=external_id, name="r", team=team, gpu_count=2, dtype="bf16",
        gpu_model=GpuModel.objects.get(name="H100 SXM"), started_at=start,
        ended_at=start + timedelta(seconds=STEP * N), data_until=start + timedelta(seconds=STEP * N),
        last_polled_at=start + timedelta(seconds=STEP * N), **fields,
    )  # fmt: skip
    archive.upsert(_rows(job, signals))
    return job


@pytest.fixture
def team(make_team: Any, catalog: Any) -> Team:
    return make_team("llm")


@pytest.fixture
def member(make_user: Any, team: Team) -> Any:
    return make_user("alice", teams=[team])


@pytest.fixture
def both(team: Team) -> Job:
    """DRAM and tensor activity archived, MFU 0.25 (the tensor estimate is 0.325 of peak: agree)."""
    return _job(team, "roof-1", ("tensor_active", "dram_active"), mfu=0.25)


@pytest.fixture
def no_dram(team: Team) -> Job:
    """Tensor activity only: DRAM_ACTIVE was not exported."""
    return _job(
        team, "roof-2", ("tensor_active",), mfu=0.05,
        missing_signals=["dram_active"],
        missing_reasons={"dram_active": "DCGM_FI_PROF_DRAM_ACTIVE not exported"},
    )  # fmt: skip


@pytest.mark.django_db
def test_api_job_detail_has_the_roofline_with_each_gpu_placed(
    api_client_for: Any, member: Any, both: Job
) -> None:
    body = api_client_for(member).get(f"/api/v1/jobs/{both.external_id}/").json()
    r = body["roofline"]
    assert r["gpu_model"] == "H100 SXM" and r["dtype"] == "bf16"
    assert r["peak_flops_per_s"] == pytest.approx(989.5e12)
    assert r["bandwidth_bytes_per_s"] == pytest.approx(3.35e12)
    assert r["ridge_flop_per_byte"] == pytest.approx(295.37, abs=0.01)
    gpus = {g["label"]: g for g in r["gpus"]}
    assert gpus["node-a/0"]["verdict"] == "compute"
    # (0.6 / 0.2) x 295.37 = 886.1 FLOP/byte; (0.05 / 0.7) x 295.37 = 21.1 FLOP/byte (float32 archive).
    assert gpus["node-a/0"]["intensity_flop_per_byte"] == pytest.approx(886.12, rel=1e-5)
    assert gpus["node-a/1"]["verdict"] == "memory"
    assert gpus["node-a/1"]["intensity_flop_per_byte"] == pytest.approx(21.098, rel=1e-4)
    # The job's mean: tensor 0.325, DRAM 0.45: neither roof at half its cycles.
    assert r["job"]["verdict"] == "under_both"
    assert r["job"]["compute_roof_share"] == pytest.approx(0.325, rel=1e-6)
    assert r["job"]["flops_per_s_upper"] == pytest.approx(0.325 * 989.5e12, rel=1e-6)
    assert len(r["over_time"]) <= 120 and r["over_time"][0]["verdict"] == "under_both"
    assert r["mfu_check"]["direction"] == "agree"
    assert any("shares of cycles, not FLOP" in c for c in r["caveats"])


@pytest.mark.django_db
def test_api_missing_dram_is_unknown_with_the_reason_never_zero(
    api_client_for: Any, member: Any, no_dram: Job
) -> None:
    r = api_client_for(member).get(f"/api/v1/jobs/{no_dram.external_id}/").json()["roofline"]
    job = r["job"]
    assert job["verdict"] == "unknown"
    assert job["memory_roof_share"] is None and job["bytes_per_s_upper"] is None
    assert job["intensity_flop_per_byte"] is None
    assert "DCGM_FI_PROF_DRAM_ACTIVE not exported" in job["verdict_text"]
    assert all(g["memory_roof_share"] is None for g in r["gpus"])
    # MFU 0.05 against a tensor estimate of 0.325: more than 2x below, flagged with the likely reason.
    assert r["mfu_check"]["flagged"] and r["mfu_check"]["direction"] == "mfu_far_below_hardware"


def _page_data(html: str) -> dict[str, Any]:
    match = re.search(r'<script id="job-data" type="application/json">(.*?)</script>', html, re.S)
    assert match
    data: dict[str, Any] = json.loads(match.group(1))
    return data


@pytest.mark.django_db
def test_job_page_shows_the_roofline_figure_and_verdict(client: Client, member: Any, both: Job) -> None:
    client.force_login(member)
    html = client.get(f"/jobs/{both.external_id}/").content.decode()
    text = unescape(html)
    section = text[text.index('id="roofline-section"') :]
    section = section[: section.index("</section>")]
    assert "compute roof 989.5 TFLOP/s dense, memory roof 3.35 TB/s, ridge 295 FLOP/byte" in section
    assert "The job: under both roofs" in section
    assert "node-a/0" in section and "near the compute roof" in section and "near the memory roof" in section
    assert "What activity ratios can and cannot say" in section
    # Every 2-minute window (240 samples in 120 windows) reads tensor 0.325, DRAM 0.45: under both.
    assert (
        "Over time (cross-GPU means in 120 windows): near the compute roof 0%, near the memory roof 0%, "
        "under both roofs 100%." in section
    )
    fig = _page_data(html)["roofline"]
    names = [t["name"] for t in fig["data"]]
    assert names[0].startswith("memory roof (3.35 TB/s)") and names[1].startswith("compute roof (989.5")
    assert fig["layout"]["xaxis"]["type"] == "log" and fig["layout"]["yaxis"]["type"] == "log"
    gpus = next(t for t in fig["data"] if t["name"] == "each GPU (time-mean)")
    assert sorted(round(x, 1) for x in gpus["x"]) == [21.1, 886.1]
    assert sorted(round(y, 1) for y in gpus["y"]) == [49.5, 593.7]  # TFLOP/s: 0.05 and 0.6 x 989.5


@pytest.mark.django_db
def test_job_page_without_dram_says_unknown_and_draws_no_figure(
    client: Client, member: Any, no_dram: Job
) -> None:
    client.force_login(member)
    html = client.get(f"/jobs/{no_dram.external_id}/").content.decode()
    text = unescape(html)
    section = text[text.index('id="roofline-section"') :]
    section = section[: section.index("</section>")]
    assert "The job: unknown: memory roof share unknown: DCGM_FI_PROF_DRAM_ACTIVE not exported" in section
    assert 'id="roofline"' not in section
    assert _page_data(html)["roofline"] is None
    assert "far below the tensor-pipe estimate" in section


@pytest.mark.django_db
def test_time_sliced_gpus_are_noted_since_activities_include_the_neighbours(
    api_client_for: Any, member: Any, team: Team
) -> None:
    sharing = GpuSharing(
        share=0.5, gpu_equivalents=1.0, peak_equivalents=1.0,
        shared=[SharedWith(gpu="node-a/0", other_job="other", start=T0, end=T0 + 3600)],
    )  # fmt: skip
    evaluation = encode(Evaluation(duration_s=STEP * N, gpu_hours=1.0, sharing=sharing))
    job = _job(team, "roof-3", ("tensor_active", "dram_active"), evaluation=evaluation)
    r = api_client_for(member).get(f"/api/v1/jobs/{job.external_id}/").json()["roofline"]
    assert "time-sliced with other jobs" in r["gpu_note"]
    assert r["gpus"][0]["verdict"] == "compute"  # still placed: the note qualifies, it does not hide
