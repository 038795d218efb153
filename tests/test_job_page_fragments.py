"""The job page's cached HTML fragments (jobs.views.job_fragments): rendered once per distinct data, the same
for every viewer, never holding anything of the request, rendered again when the data they show changes."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from django.test import Client
from django.urls import reverse

from jobs.metrics import archive
from jobs.metrics.archive import Points
from jobs.models import GpuModel, Job
from jobs.views.job_fragments import cached_fragment
from tests.conftest import clear_private_cache

T0 = 1_767_225_600.0  # a multiple of the archive's 2 h chunk


@pytest.fixture(autouse=True)
def _empty_cache() -> Iterator[None]:
    # This run's entries only: cache.clear() would FLUSHDB the Redis the broker and redbeat share.
    clear_private_cache()
    yield
    clear_private_cache()


def _job(make_team: Any) -> Job:
    """A finalized 2-GPU H100 job, bf16, with an hour of tensor and DRAM activity per GPU (a roofline)."""
    start = datetime.fromtimestamp(T0, tz=UTC)
    job = Job.objects.create(
        external_id="frag-1", name="j", team=make_team("llm"), gpu_count=2, started_at=start,
        ended_at=start + timedelta(hours=1), status=Job.Status.FINALIZED,
        data_until=start + timedelta(hours=1),
        gpu_model=GpuModel.objects.get(name="H100 SXM"), dtype="bf16", mfu=0.25,
    )  # fmt: skip
    times = T0 + 30.0 * np.arange(1, 121)
    rows = []
    for signal, levels in (("tensor_active", (0.6, 0.05)), ("dram_active", (0.2, 0.7))):
        rows.append(Points(job.pk, signal, "mean", "", 30, times, np.full(times.size, sum(levels) / 2)))
        for gpu, level in enumerate(levels):
            rows.append(Points(job.pk, signal, "gpu", f"node-a/{gpu}", 30, times, np.full(times.size, level)))
    archive.upsert(rows)
    return job


def _roofline_section(html: str) -> str:
    start = html.index('<section aria-labelledby="roofline-h"')
    return html[start : html.index("</section>", start) + len("</section>")]


@pytest.mark.django_db
def test_a_fragment_is_rendered_once_per_distinct_data_and_again_when_the_data_changes() -> None:
    calls: list[str] = []

    def render(text: str) -> Callable[[], str]:
        def go() -> str:
            calls.append(text)
            return f"<p>{text}</p>"

        return go

    assert cached_fragment("probe", {"v": 1}, render("one")) == "<p>one</p>"
    assert cached_fragment("probe", {"v": 1}, render("not rendered")) == "<p>one</p>"  # from the cache
    assert cached_fragment("probe", {"v": 2}, render("two")) == "<p>two</p>"
    # Another fragment's name never answers with this one's HTML, even for equal data.
    assert cached_fragment("other", {"v": 1}, render("other")) == "<p>other</p>"
    assert calls == ["one", "two", "other"]


@pytest.mark.django_db
def test_the_roofline_section_is_the_same_html_for_every_viewer_and_holds_nothing_of_the_request(
    make_team: Any, make_user: Any, client: Client
) -> None:
    job = _job(make_team)
    url = reverse("job-detail", args=[job.external_id])
    sections = []
    for user in (make_user("writer", teams=[job.team]), make_user("staff", staff=True)):
        client.force_login(user)
        html = client.get(url).content.decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
        assert token is not None  # the page around it does carry the viewer's CSRF token
        section = _roofline_section(html)
        assert token.group(1) not in section and user.username not in section
        sections.append(section)
    assert sections[0] == sections[1]
    assert "bf16: compute roof" in sections[0] and 'id="roofline-gpus"' in sections[0]
    assert "node-a/0" in sections[0] and "node-a/1" in sections[0]


@pytest.mark.django_db
def test_the_cached_roofline_section_follows_the_jobs_mfu_even_without_a_save(
    make_team: Any, make_user: Any, client: Client
) -> None:
    job = _job(make_team)
    client.force_login(make_user("viewer", teams=[job.team]))
    url = reverse("job-detail", args=[job.external_id])
    before = _roofline_section(client.get(url).content.decode())
    assert before == _roofline_section(client.get(url).content.decode())  # the cached one: the same HTML
    # A queryset update leaves updated_at as it was; the section still follows the data it shows.
    Job.objects.filter(pk=job.pk).update(mfu=0.01)
    after = _roofline_section(client.get(url).content.decode())
    assert after != before
