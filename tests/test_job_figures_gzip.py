"""The whole-job figures answer (the job page's one-minute refresh, jobs.views.job_figures.whole_job_response)
is gzip-compressed for a client that accepts it, decodes to the same JSON as the plain answer, and follows a
change of the figures like the plain one."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from django.test import Client
from django.urls import reverse

from jobs.metrics import archive
from jobs.metrics.archive import Points
from jobs.models import Job
from tests.conftest import clear_private_cache

T0 = 1_767_225_600.0  # a multiple of the archive's 2 h chunk


@pytest.fixture(autouse=True)
def _empty_cache() -> Iterator[None]:
    # This run's entries only: cache.clear() would FLUSHDB the Redis the broker and redbeat share.
    clear_private_cache()
    yield
    clear_private_cache()


def _archive(job: Job, level: float) -> None:
    times = T0 + 30.0 * np.arange(1, 121)
    archive.upsert([Points(job.pk, "gpu_util", "mean", "", 30, times, np.full(times.size, level))])


@pytest.fixture
def job(make_team: Any) -> Job:
    start = datetime.fromtimestamp(T0, tz=UTC)
    job = Job.objects.create(
        external_id="gz-1", name="j", team=make_team("llm"), gpu_count=2, started_at=start,
        ended_at=start + timedelta(hours=1), status=Job.Status.FINALIZED,
        data_until=start + timedelta(hours=1),
    )  # fmt: skip
    _archive(job, 0.5)
    return job


def _util(body: dict[str, Any]) -> set[float]:
    line = next(t for t in body["timeseries"]["data"] if t["name"] == "nvidia-smi util")
    return {y for y in line["y"] if y is not None}


@pytest.mark.django_db
def test_a_client_that_accepts_gzip_gets_the_same_json_compressed(
    job: Job, make_user: Any, client: Client
) -> None:
    client.force_login(make_user("viewer", teams=[job.team]))
    url = reverse("job-figures", args=[job.external_id])
    plain = client.get(url)
    assert "Content-Encoding" not in plain.headers and "Accept-Encoding" in plain.headers["Vary"]
    for _ in range(2):  # compressed, then the compressed answer from the cache
        packed = client.get(url, headers={"accept-encoding": "gzip, deflate, br"})
        assert packed.headers["Content-Encoding"] == "gzip" and "Accept-Encoding" in packed.headers["Vary"]
        assert packed.headers["Cache-Control"] == "no-store"
        assert len(packed.content) < len(plain.content) / 2
        assert gzip.decompress(packed.content) == plain.content
    assert _util(json.loads(plain.content)) == {50.0}
    # A client naming other encodings only gets the plain answer.
    assert client.get(url, headers={"accept-encoding": "br"}).content == plain.content


@pytest.mark.django_db
def test_the_compressed_answer_follows_a_change_of_the_figures(
    job: Job, make_user: Any, client: Client
) -> None:
    client.force_login(make_user("viewer", teams=[job.team]))
    url = reverse("job-figures", args=[job.external_id])
    gz = {"accept-encoding": "gzip"}
    assert _util(json.loads(gzip.decompress(client.get(url, headers=gz).content))) == {50.0}
    _archive(job, 0.25)  # a re-finalize merges corrected data and saves the job
    job.save()
    assert _util(json.loads(gzip.decompress(client.get(url, headers=gz).content))) == {25.0}
    # The status part is in the compressed answer too: a changed status is never answered from the cache.
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, ended_at=None)
    body = json.loads(gzip.decompress(client.get(url, headers=gz).content))
    assert body["status"] == "running" and body["running"] is True
