"""Find and export (issue 15, item 3): search, "my jobs" and a case-insensitive owner filter in the URL;
CSV downloads of the job list (the filtered set), the leaderboard and a job's series, streamed, with units
in the header, equal to what the pages show."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta
from html import unescape

import numpy as np
import pytest
from django.http import StreamingHttpResponse
from django.urls import reverse
from django.utils import timezone

from jobs.evaluation.schema import Evaluation, encode
from jobs.metrics import archive
from jobs.metrics.signals import GpuKey, JobSignals, SignalSeries
from jobs.models import GpuModel, Job, PriceEntry
from jobs.outputs.leaderboard import iso_week


@pytest.fixture
def team(make_team):
    return make_team("llm", "LLM")


@pytest.fixture
def alice(make_user, team):
    return make_user("alice", teams=[team])


@pytest.fixture
def jobs(team, make_team):
    week = iso_week(timezone.now().date() - timedelta(days=7))
    start = week.start + timedelta(days=1)
    # $2.50/GPU-h on demand: 8 GPUs at $480/day. Period totals price jobs from their dated book.
    gpu = GpuModel.objects.create(name="Export test GPU")
    PriceEntry.objects.create(
        gpu_model=gpu, tier="on_demand", usd_per_gpu_hour=2.5, effective_from=week.start - timedelta(days=30)
    )

    def make(external_id, name, owner, hours, **kw):
        fields = dict(
            team=team, external_id=external_id, name=name, owner=owner, started_at=start, gpu_model=gpu,
            ended_at=start + timedelta(hours=hours), gpu_count=8, gpu_hours=8.0 * hours, mfu=0.3,
            cost_usd=20.0 * hours, cost_per_day_usd=480.0, waste_per_day_usd=160.0,
            waste_lower_bound_per_day_usd=160.0, status=Job.Status.FINALIZED,
            evaluation=encode(Evaluation(duration_s=hours * 3600.0, gpu_hours=8.0 * hours)),
        )  # fmt: skip
        fields.update(kw)
        return Job.objects.create(**fields)

    return week, [
        make("48213", "pretrain-llama", "Alice", 24),
        make("48214", "finetune-LLAMA-lora", "bob", 6),
        make(
            "90001",
            '=HYPERLINK("x")',
            "carol",
            3,
            team=make_team("vision", "Vision"),
            mfu=None,
            waste_per_day_usd=None,
            waste_lower_bound_per_day_usd=48.0,
            waste_unknown_reason="MFU unknown (no throughput)",
        ),
    ]


def _csv(response) -> list[dict[str, str]]:
    assert isinstance(response, StreamingHttpResponse), "CSV downloads are streamed"
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith("attachment;")
    text = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(text)))


def _listed(client, query: str) -> list[str]:
    html = client.get(f"/?{query}").content.decode()
    return sorted(set(re.findall(r'href="/jobs/([^/"]+)/"', html)))


def test_search_my_jobs_and_owner_filter_live_in_the_url(client, alice, jobs):
    client.force_login(alice)
    assert _listed(client, "q=llama") == ["48213", "48214"]  # substring of the name, any case
    assert _listed(client, "q=4821") == ["48213", "48214"]  # substring of the external id
    assert _listed(client, "mine=1") == ["48213"]  # owner "Alice" = logged-in "alice", case-insensitive
    assert _listed(client, "owner=BOB") == ["48214"]
    assert _listed(client, "q=lora&owner=bob") == ["48214"]
    html = unescape(client.get("/?q=lora&mine=1").content.decode())
    assert 'value="lora"' in html and 'name="mine" value="1" checked' in html
    assert "q=lora" in html and "mine=1" in html  # sort links and the CSV link keep the filters


def test_job_list_csv_is_the_filtered_set_with_units_and_matches_the_page(client, alice, jobs):
    client.force_login(alice)
    rows = _csv(client.get(reverse("job-list-csv") + "?q=llama&sort=-started"))
    # The page's order: same start, newest registration first.
    assert [r["job id"] for r in rows] == ["48214", "48213"]
    header = list(rows[0])
    assert "cost ($ total)" in header and "waste ($ total)" in header and "waste ($/day)" in header
    assert "MFU (ratio 0-1)" in header
    first = rows[1]
    # 24 h on 8 GPUs: cost $480 total; waste $160/day x 1 day = $160 total (ended: no waste/day).
    assert first["cost ($ total)"] == "480.00" and first["waste ($ total)"] == "160.00"
    assert first["waste kind"] == "exact" and first["waste/day kind"] == "ended"
    page = unescape(client.get("/?q=llama").content.decode())
    assert "$480 total" in page and "$160 total" in page


def test_job_list_csv_unknown_is_empty_never_zero_and_text_is_not_a_formula(client, alice, jobs):
    client.force_login(alice)
    rows = _csv(client.get(reverse("job-list-csv") + "?team=vision"))
    (row,) = rows
    assert row["name"].startswith("'=")  # CSV injection: text is never read as a formula
    # 3 h at a lower bound of $48/day: at least $6 of waste.
    assert row["waste ($ total)"] == "6.00" and row["waste kind"] == "at least"
    assert row["MFU (ratio 0-1)"] == ""


def test_job_list_csv_refuses_bad_filters(client, alice, jobs):
    client.force_login(alice)
    assert client.get(reverse("job-list-csv") + "?since=2026-02-30").status_code == 400


def test_leaderboard_csv_matches_the_page(client, alice, jobs):
    week, _ = jobs
    client.force_login(alice)
    rows = _csv(client.get(reverse("leaderboard-csv") + f"?week={week.label}&sort=waste"))
    assert [r["team slug"] for r in rows] == ["llm", "vision"]
    header = list(rows[0])
    assert "cost ($ this week)" in header and "waste ($ this week)" in header
    llm = rows[0]
    # LLM: 24 h + 6 h at $480/day = $600; waste $160/day x 30 h = $200.
    assert llm["cost ($ this week)"] == "600.00" and llm["waste ($ this week)"] == "200.00"
    assert rows[1]["waste kind"] == "at least"
    page = unescape(client.get(f"/leaderboard/?week={week.label}").content.decode())
    assert "$600 this week" in page and "$200 this week" in page
    month = _csv(client.get(reverse("leaderboard-csv") + "?by=month"))
    assert month == [] or "cost ($ this month)" in month[0]


def test_leaderboard_can_sort_by_waste(client, alice, jobs):
    week, _ = jobs
    client.force_login(alice)
    html = client.get(f"/leaderboard/?week={week.label}&sort=waste").content.decode()
    assert html.index('data-team="llm"') < html.index('data-team="vision"')
    assert 'aria-sort="descending"><a href="?week=' in html


def _archive(job: Job) -> None:
    t0 = job.started_at.timestamp()
    ts = np.array([t0 + 60, t0 + 120, t0 + 180])
    per_gpu = np.array([[0.5, 0.6, np.nan], [0.7, 0.8, 0.9]])
    series = SignalSeries(
        "gpu_util", "ratio", ts,
        {"mean": np.array([0.6, 0.7, 0.9]), "min": np.array([0.5, 0.6, 0.9]),
         "max": np.array([0.7, 0.8, 0.9]), "count": np.array([2.0, 2.0, 1.0])},
        gpus=(GpuKey("node-a", "0"), GpuKey("node-a", "1")), gpu_timestamps=ts, per_gpu=per_gpu,
    )  # fmt: skip
    sigs = JobSignals(ts[0], ts[-1], 60.0, ts, {"gpu_util": series})
    archive.upsert(archive.rows_for(job, sigs, {}))


def test_job_series_csv_per_signal_and_per_gpu(client, alice, jobs):
    _, (job, *_) = jobs
    _archive(job)
    client.force_login(alice)
    rows = _csv(client.get(reverse("job-series-csv", args=[job.external_id])))
    assert len(rows) == 3
    header = list(rows[0])
    assert header[0] == "time (UTC)" and "gpu_util mean (ratio)" in header
    assert "gpu_util count (GPUs reporting)" in header
    assert [r["gpu_util mean (ratio)"] for r in rows] == ["0.6", "0.7", "0.9"]
    gpus = _csv(client.get(reverse("job-series-csv", args=[job.external_id]) + "?signal=gpu_util&per_gpu=1"))
    assert list(gpus[0])[1:] == ["gpu_util node-a/0 (ratio)", "gpu_util node-a/1 (ratio)"]
    assert [r["gpu_util node-a/0 (ratio)"] for r in gpus] == ["0.5", "0.6", ""]  # no sample: empty
    assert client.get(reverse("job-series-csv", args=[job.external_id]) + "?signal=nope").status_code == 400
    page = client.get(reverse("job-detail", args=[job.external_id])).content.decode()
    assert reverse("job-series-csv", args=[job.external_id]) in page


def test_job_series_csv_exports_host_signals_with_their_units(client, alice, jobs):
    _, (job, *_) = jobs
    t0 = job.started_at.timestamp()
    ts = np.array([t0 + 60, t0 + 120])
    stats = {"mean": np.array([2.5e9, 2.0e9]), "count": np.array([2.0, 2.0])}
    sigs = JobSignals(
        ts[0],
        ts[-1],
        60.0,
        ts,
        {"host_disk_read_bytes": SignalSeries("host_disk_read_bytes", "B/s", ts, stats)},
    )
    archive.upsert(archive.rows_for(job, sigs, {}))
    client.force_login(alice)
    url = reverse("job-series-csv", args=[job.external_id]) + "?signal=host_disk_read_bytes"
    rows = _csv(client.get(url))
    header = list(rows[0])
    assert "host_disk_read_bytes mean (B/s)" in header  # reloaded with its own unit, not "ratio"
    assert "host_disk_read_bytes count (hosts reporting)" in header
    assert [r["host_disk_read_bytes mean (B/s)"] for r in rows] == ["2500000000.0", "2000000000.0"]
