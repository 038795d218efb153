"""The job page's cached figures (jobs.views.job_figures: `cached_figures`, `page_figures`, `figures_json`): a
change to what they are drawn from is never answered from the cache, and the cache never lets a user see a job
outside their readable scope."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from django.urls import reverse

from jobs.intake.artifact_review import Review, review_artifact
from jobs.metrics import archive
from jobs.metrics.archive import Points
from jobs.models import Artifact, Job
from tests.conftest import clear_private_cache

T0 = 1_767_225_600.0  # a multiple of the archive's 2 h chunk
CAPTURE = "capture-rank0.pt.trace.json"


@pytest.fixture(autouse=True)
def _empty_cache():
    # This run's entries only: cache.clear() would FLUSHDB the Redis the broker and redbeat share.
    clear_private_cache()
    yield
    clear_private_cache()


def _finalized_job(make_team, slug: str = "llm", external_id: str = "fin-1", level: float = 0.5) -> Job:
    """A finalized 2-GPU job with one hour of archived GPU utilisation at `level`."""
    start = datetime.fromtimestamp(T0, tz=UTC)
    job = Job.objects.create(
        external_id=external_id, name="j", team=make_team(slug), gpu_count=2, started_at=start,
        ended_at=start + timedelta(hours=1), status=Job.Status.FINALIZED,
        data_until=start + timedelta(hours=1),
    )  # fmt: skip
    times = T0 + 30.0 * np.arange(1, 121)
    archive.upsert([Points(job.pk, "gpu_util", "mean", "", 30, times, np.full(times.size, level))])
    return job


def _capture(job: Job) -> Artifact:
    """A parsed trace whose capture window is inside the job (drawn as a dashed outline labelled with it)."""
    return Artifact.objects.create(
        job=job, kind=Artifact.Kind.KINETO, original_name=CAPTURE, sha256="a" * 64, size_bytes=10,
        status=Artifact.Status.DONE, analysis={"capture": {"start_unix": T0 + 600, "end_unix": T0 + 660}},
    )  # fmt: skip


def _util_line(body: dict) -> list:
    line = next(t for t in body["timeseries"]["data"] if t["name"] == "nvidia-smi util")
    return [y for y in line["y"] if y is not None]


@pytest.mark.django_db
def test_refinalizing_a_job_redraws_its_cached_figures(make_team, make_user, client):
    job = _finalized_job(make_team)
    client.force_login(make_user("viewer", teams=[job.team]))
    url = reverse("job-figures", args=[job.external_id])
    assert set(_util_line(client.get(url).json())) == {50.0}
    assert set(_util_line(client.get(url).json())) == {50.0}  # the same answer, now from the cache
    # A second finalize merges corrected data into the archive and saves the job.
    times = T0 + 30.0 * np.arange(1, 121)
    archive.upsert([Points(job.pk, "gpu_util", "mean", "", 30, times, np.full(times.size, 0.25))])
    job.save()
    assert set(_util_line(client.get(url).json())) == {25.0}
    page = client.get(reverse("job-detail", args=[job.external_id])).content.decode()
    assert '"y":[25.0' in page.replace(" ", "") and '"y":[50.0' not in page.replace(" ", "")


@pytest.mark.django_db
def test_excluding_an_artifact_removes_its_capture_window_from_the_cached_figures(
    make_team, make_user, client
):
    job = _finalized_job(make_team)
    user = make_user("viewer", teams=[job.team])
    client.force_login(user)
    artifact = _capture(job)
    url = reverse("job-figures", args=[job.external_id])
    page_url = reverse("job-detail", args=[job.external_id])
    assert CAPTURE in client.get(url).content.decode()
    assert CAPTURE in client.get(page_url).content.decode().split('id="job-data"')[1]
    review_artifact(artifact, Review.EXCLUDE, user)
    assert CAPTURE not in client.get(url).content.decode()
    # The page still lists the file (excluded), but its window is no longer drawn on the charts.
    assert CAPTURE not in client.get(page_url).content.decode().split('id="job-data"')[1]
    review_artifact(artifact, Review.INCLUDE, user)
    assert CAPTURE in client.get(url).content.decode()


@pytest.mark.django_db
def test_a_cached_job_is_never_answered_to_a_user_outside_its_team(make_team, make_user, client, settings):
    settings.READ_SCOPE = "team"
    job = _finalized_job(make_team, "llm")
    other = _finalized_job(make_team, "vision", external_id="fin-2", level=0.75)
    urls = [reverse(name, args=[job.external_id]) for name in ("job-detail", "job-figures")]
    client.force_login(make_user("member", teams=[job.team]))
    for url in urls:  # the member warms the page's and the refresh's cache entries
        assert client.get(url).status_code == 200
        assert client.get(url).status_code == 200
    client.logout()
    client.force_login(make_user("outsider", teams=[other.team]))
    for url in urls:
        response = client.get(url)
        assert response.status_code == 404
        assert b"nvidia-smi util" not in response.content
    # The outsider's own job is served: its figures, not the cached ones of the other job.
    own = client.get(reverse("job-figures", args=[other.external_id]))
    assert own.status_code == 200 and set(_util_line(own.json())) == {75.0}


@pytest.mark.django_db
def test_the_pages_cached_roofline_follows_the_jobs_dtype(make_team, make_user, client):
    from jobs.models import GpuModel

    job = _finalized_job(make_team)
    job.gpu_model, job.dtype = GpuModel.objects.get(name="H100 SXM"), "bf16"
    job.save()
    client.force_login(make_user("viewer", teams=[job.team]))
    url = reverse("job-detail", args=[job.external_id])

    def roofs() -> str:
        text = client.get(url).content.decode()
        section = text[text.index('id="roofline-section"') :]
        return section[: section.index("</section>")]

    assert "bf16: compute roof" in roofs()
    assert "bf16: compute roof" in roofs()  # from the cache
    job.dtype = "fp8"  # the roofs are the FP8 dense peak's now
    job.save()
    assert "fp8: compute roof" in roofs() and "bf16: compute roof" not in roofs()
