"""Issue 25: a running job's one-minute refresh (figures.json) redraws the roofline: the page sends the
stamp of the roofline it drew, and the answer carries the figure only when the job's roofline changed
since (a poll archived new activities), never a megabyte of unchanged figure every minute."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from django.test import Client

from jobs.metrics import archive
from jobs.metrics.archive import Points
from jobs.models import GpuModel, Job
from jobs.views.page_json import figure_stamp, roofline_update

STEP = 30
T0 = 1_780_000_000 // 7200 * 7200


def _archive(job: Job, times: np.ndarray, tensor: tuple[float, float], dram: tuple[float, float]) -> None:
    rows = []
    for key, (a, b) in (("tensor_active", tensor), ("dram_active", dram)):
        rows.append(Points(job.pk, key, "mean", "", STEP, times, np.full(times.size, (a + b) / 2)))
        rows.append(Points(job.pk, key, "gpu", "node-a/0", STEP, times, np.full(times.size, a)))
        rows.append(Points(job.pk, key, "gpu", "node-a/1", STEP, times, np.full(times.size, b)))
    archive.upsert(rows)
    job.data_until = archive.utc(float(times[-1]))
    job.last_polled_at = job.data_until
    job.save()


def _page_data(html: str) -> dict[str, Any]:
    match = re.search(r'<script id="job-data" type="application/json">(.*?)</script>', html, re.S)
    assert match
    data: dict[str, Any] = json.loads(match.group(1))
    return data


def _gpu_points(figure: dict[str, Any]) -> list[float]:
    gpus = next(t for t in figure["data"] if t["name"] == "each GPU (time-mean)")
    return sorted(round(y, 1) for y in gpus["y"])


def test_the_update_carries_a_figure_only_when_its_stamp_differs() -> None:
    fig = {"data": [{"x": [1.0], "y": [2.0]}], "layout": {}}
    stamp = figure_stamp(fig)
    assert len(stamp) == 16 and figure_stamp(None) == ""
    assert roofline_update(fig, stamp) is None
    assert roofline_update(fig, "") == {"stamp": stamp, "figure": fig}
    moved = {"data": [{"x": [1.0], "y": [3.0]}], "layout": {}}
    assert roofline_update(moved, stamp) == {"stamp": figure_stamp(moved), "figure": moved}
    assert roofline_update(None, stamp) == {"stamp": "", "figure": None}  # gone: the page clears it
    assert roofline_update(None, "") is None


@pytest.mark.django_db
def test_a_running_jobs_refresh_sends_the_roofline_when_a_poll_changed_it(
    client: Client, make_team: Any, make_user: Any, catalog: Any
) -> None:
    team = make_team("llm")
    client.force_login(make_user("alice", teams=[team]))
    start = datetime.fromtimestamp(T0, tz=UTC)
    job = Job.objects.create(
        external_id="roof-live", name="r", team=team, gpu_count=2, dtype="bf16", status=Job.Status.RUNNING,
        gpu_model=GpuModel.objects.get(name="H100 SXM"), started_at=start,
    )  # fmt: skip
    first = T0 + STEP * np.arange(1, 121, dtype=float)  # the first hour
    _archive(job, first, tensor=(0.6, 0.05), dram=(0.2, 0.7))
    page = _page_data(client.get(f"/jobs/{job.external_id}/").content.decode())
    stamp = page["roofline_stamp"]
    assert stamp == figure_stamp(page["roofline"]) and stamp
    assert _gpu_points(page["roofline"]) == [49.5, 593.7]  # TFLOP/s: 0.05 and 0.6 x 989.5
    url = f"/jobs/{job.external_id}/figures.json"
    # Nothing new: the refresh carries no roofline (the page keeps the one it drew).
    unchanged = client.get(url, {"roofline": stamp}).json()
    assert "roofline" not in unchanged and "timeseries" in unchanged
    # The next poll: GPU 1 now runs its tensor pipe at 0.3 for an hour (time-mean 0.175 over two hours).
    later = first[-1] + STEP * np.arange(1, 121, dtype=float)
    _archive(job, later, tensor=(0.6, 0.3), dram=(0.2, 0.7))
    changed = client.get(url, {"roofline": stamp}).json()
    assert changed["roofline"]["stamp"] != stamp
    assert changed["roofline"]["stamp"] == figure_stamp(changed["roofline"]["figure"])
    assert _gpu_points(changed["roofline"]["figure"]) == [173.2, 593.7]  # 0.175 x 989.5
    # With the new stamp, the refresh after it carries nothing again; a page without one gets the figure.
    assert "roofline" not in client.get(url, {"roofline": changed["roofline"]["stamp"]}).json()
    assert client.get(url, {"only": "status"}).json()["roofline"]["stamp"] == changed["roofline"]["stamp"]
