"""The job page's body kept per version of what it shows and per viewer's rights (jobs.views.job_page_cache):
never answered to a viewer who may not read the job or see its parts, never holding anything of a request,
and rendered again whenever a row it shows changes, however it was written."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from jobs.models import (
    AlertIncident,
    Artifact,
    Baseline,
    Finding,
    GpuModel,
    Job,
    PromotionOverride,
    Team,
)
from jobs.views import job_page_cache

pytestmark = pytest.mark.django_db
FP = "f" * 64
TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


@pytest.fixture(autouse=True)
def _no_bodies() -> Iterator[None]:
    job_page_cache.bodies().clear()
    yield
    job_page_cache.bodies().clear()


@pytest.fixture
def llm(make_team: Any) -> Team:
    return make_team("llm")


@pytest.fixture
def job(llm: Team) -> Job:
    now = timezone.now()
    return Job.objects.create(
        external_id="body-1", name="the body job", team=llm, gpu_count=8, started_at=now - timedelta(hours=3),
        ended_at=now - timedelta(hours=1), status=Job.Status.FINALIZED, data_until=now - timedelta(hours=1),
        last_polled_at=now, config_fingerprint=FP, model_name="llama-7b", gpu_model_name="Mystery X1",
    )  # fmt: skip


def page(client: Client, job: Job) -> str:
    response = client.get(f"/jobs/{job.external_id}/")
    assert response.status_code == 200
    return response.content.decode()


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def renders(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The external ids of the bodies rendered from now on (a view answered from memory renders none)."""
    from jobs.views import job as job_views

    calls: list[str] = []
    real = job_views.render_body

    def counted(job: Job, **kwargs: Any) -> Any:
        calls.append(job.external_id)
        return real(job, **kwargs)

    monkeypatch.setattr(job_views, "render_body", counted)
    return calls


def test_a_kept_body_is_never_answered_to_a_user_outside_the_jobs_team(
    job: Job, llm: Team, make_user: Any, make_team: Any, settings: Any
) -> None:
    settings.READ_SCOPE = "team"  # the deployed default: a member reads only their teams' jobs
    member = logged_in(make_user("alice", teams=[llm]))
    assert "the body job" in page(member, job)
    assert len(job_page_cache.bodies()) == 1
    outsider = logged_in(make_user("mallory", teams=[make_team("other")]))
    response = outsider.get(f"/jobs/{job.external_id}/")
    assert response.status_code == 404 and b"the body job" not in response.content


def test_a_reader_who_may_not_write_never_gets_a_writers_body(
    job: Job, llm: Team, make_user: Any, make_team: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.READ_SCOPE = "all"  # every user reads every team's jobs; only members write
    calls = renders(monkeypatch)
    writer = logged_in(make_user("alice", teams=[llm]))
    reader = logged_in(make_user("bob", teams=[make_team("other")]))
    for _ in range(2):  # both orders: the writer's body kept first, then the reader's
        assert 'id="artifact-file"' in page(writer, job)
        html = page(reader, job)
        assert 'id="artifact-file"' not in html and "Members of LLM can upload" in html
        assert len(TOKEN.findall(html)) == 1  # the log-out form's only: no form of the job's
    assert calls == ["body-1", "body-1"]  # one body per set of rights, each rendered once


def test_only_staff_see_the_catalog_link_of_an_unknown_gpu_model(job: Job, llm: Team, make_user: Any) -> None:
    member = page(logged_in(make_user("alice", teams=[llm])), job)
    staff = page(logged_in(make_user("root", staff=True)), job)
    assert "Mystery X1" in member and "/admin/jobs/gpumodel/add/" not in member
    assert "/admin/jobs/gpumodel/add/" in staff
    assert "/admin/jobs/gpumodel/add/" not in page(logged_in(make_user("carol", teams=[llm])), job)


def test_each_view_carries_its_own_csrf_token_and_the_kept_body_none(
    job: Job, llm: Team, make_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = renders(monkeypatch)
    alice, bob = make_user("alice", teams=[llm]), make_user("bob", teams=[llm])
    first, second = logged_in(alice), logged_in(bob)
    html_a, html_b = page(first, job), page(second, job)
    assert calls == ["body-1"]  # bob's view came from alice's body: same rights
    # Every form of a view carries a token of that view's session (masked anew each time it is asked for).
    tokens_a, tokens_b = set(TOKEN.findall(html_a)), set(TOKEN.findall(html_b))
    assert len(tokens_a) >= 2 and len(tokens_b) >= 2 and not tokens_a & tokens_b
    assert "alice" in html_a and "alice" not in html_b  # the user menu is each viewer's
    kept = b"".join(
        p for p in next(iter(job_page_cache.bodies()._entries.values()))[0].parts if isinstance(p, bytes)
    )
    assert (
        b"alice" not in kept
        and b"bob" not in kept
        and not any(t.encode() in kept for t in tokens_a | tokens_b)
    )
    # The token filled in is one the CSRF check accepts: the page's own form posts through.
    csrf_client = Client(enforce_csrf_checks=True)
    csrf_client.force_login(bob)
    html = page(csrf_client, job)
    response = csrf_client.post(
        f"/jobs/{job.external_id}/promote/", {"csrfmiddlewaretoken": TOKEN.findall(html)[0]}
    )
    assert response.status_code == 302  # not 403: the token matched the session's


def test_a_view_with_messages_is_rendered_with_them_and_not_kept(
    job: Job, llm: Team, make_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = logged_in(make_user("alice", teams=[llm]))
    page(client, job)
    calls = renders(monkeypatch)
    client.post(f"/jobs/{job.external_id}/artifacts/", {})  # no file: a message placed at the upload form
    html = page(client, job)
    assert calls == ["body-1"] and "Choose a file to upload." in html
    assert "Choose a file to upload." not in page(client, job)  # shown once, then the kept body again
    assert calls == ["body-1"]


def _writes(job: Job, llm: Team, make_user: Any) -> list[tuple[str, Callable[[], None], str]]:
    """(what, a write that bypasses model saves where it can, text the page then shows)."""
    uploader = make_user("uploader", teams=[llm])
    artifact = Artifact.objects.create(
        job=job,
        kind=Artifact.Kind.PYSPY_RAW,
        original_name="a.txt",
        sha256="1" * 64,
        size_bytes=3,
        uploaded_by=uploader,
    )
    finding = Finding.objects.create(job=job, code="throttling", severity="warning", confidence=0.9,
                                     title="Clocks throttled", recommendation="cool it")  # fmt: skip
    baseline = Baseline.objects.create(fingerprint=FP, model_name="llama-7b", team=llm)
    other = Job.objects.create(external_id="run-0", name="older run", team=llm, gpu_count=8,
                               started_at=job.started_at - timedelta(days=1))  # fmt: skip
    now = timezone.now()
    return [
        ("job row", lambda: Job.objects.filter(pk=job.pk).update(name="renamed job"), "renamed job"),
        ("team row", lambda: Team.objects.filter(pk=llm.pk).update(name="Large Models"), "Large Models"),
        (
            "GPU model",
            lambda: Job.objects.filter(pk=job.pk).update(gpu_model=GpuModel.objects.get(name="H100 SXM")),
            "H100 SXM",
        ),
        (
            "GPU model row",
            lambda: GpuModel.objects.filter(name="H100 SXM").update(name="H100 SXM (rev 2)"),
            "H100 SXM (rev 2)",
        ),
        (
            "finding",
            lambda: Finding.objects.filter(pk=finding.pk).update(title="Clocks capped"),
            "Clocks capped",
        ),
        ("artifact", lambda: Artifact.objects.filter(pk=artifact.pk).update(original_name="b.txt"), "b.txt"),
        (
            "artifact's uploader",
            lambda: get_user_model().objects.filter(pk=uploader.pk).update(username="renamed-uploader"),
            "renamed-uploader",
        ),
        (
            "alert incident",
            lambda: AlertIncident.objects.create(
                rule=AlertIncident.Rule.choices[0][0],
                job=job,
                team=llm,
                started_at=now,
                opened_at=now,
                last_seen_at=now,
                title="idle for an hour",
            ),
            "idle for an hour",
        ),
        ("baseline runs", lambda: baseline.runs.add(job, other), "over 2 healthy runs"),
        (
            "promotion override",
            lambda: PromotionOverride.objects.create(baseline=baseline, job=other, reason="known noisy node"),
            "known noisy node",
        ),
        (
            "baseline's run renamed",
            lambda: Job.objects.filter(pk=other.pk).update(name="oldest run"),
            "oldest run",
        ),
    ]


def test_every_kind_of_row_the_body_shows_changes_it_even_written_without_a_save(
    job: Job, llm: Team, make_user: Any, catalog: Any
) -> None:
    client = logged_in(make_user("alice", teams=[llm]))
    for what, write, shown in _writes(job, llm, make_user):
        before = page(client, job)
        assert shown not in before, what
        write()
        assert shown in page(client, job), what


def test_a_changed_setting_or_template_file_forgets_the_kept_bodies(
    job: Job, llm: Team, make_user: Any, settings: Any
) -> None:
    from pathlib import Path

    from django.utils.autoreload import file_changed

    client = logged_in(make_user("alice", teams=[llm]))
    assert 'id="grafana-link"' not in page(client, job) and len(job_page_cache.bodies()) == 1
    settings.GRAFANA_URL = "https://grafana.example.com"  # printed in the body: the kept one is forgotten
    assert len(job_page_cache.bodies()) == 0
    assert 'id="grafana-link"' in page(client, job) and len(job_page_cache.bodies()) == 1
    # The development server reloads a changed template in place (no new process): the bodies go too.
    results = file_changed.send(sender=None, file_path=Path("templates/jobs/_job_body.html"))
    assert len(job_page_cache.bodies()) == 0
    assert dict(results)[job_page_cache._forget_bodies] is None  # None: the reload goes on


def test_the_whole_job_figures_answer_is_kept_per_stamp_and_never_answered_outside_the_team(
    job: Job, llm: Team, make_user: Any, make_team: Any, settings: Any, django_assert_num_queries: Any
) -> None:
    import gzip
    import json

    settings.READ_SCOPE = "team"
    client = logged_in(make_user("alice", teams=[llm]))
    url = f"/jobs/{job.external_id}/figures.json"
    gz = {"accept-encoding": "gzip"}
    plain, packed = client.get(url).content, client.get(url, headers=gz).content
    assert len(job_page_cache.bodies()) == 2  # one answer per encoding
    # Kept: the session (cache), the user, the job's view columns with its stamp; nothing else is read.
    with django_assert_num_queries(2):
        again = client.get(url, headers=gz)
    assert again.content == packed and again.headers["Content-Encoding"] == "gzip"
    assert again.headers["Cache-Control"] == "no-store" and "Accept-Encoding" in again.headers["Vary"]
    assert gzip.decompress(packed) == plain == client.get(url).content
    # A write the answer shows, without a save, is answered at once.
    Job.objects.filter(pk=job.pk).update(gpu_util_mean=0.11)
    assert json.loads(client.get(url).content)["ratios"]["gpu_util"] == 0.11
    # Another team's member gets the 404 before any kept answer is looked up.
    outsider = logged_in(make_user("mallory", teams=[make_team("other")]))
    assert outsider.get(url).status_code == 404 and outsider.get(url, headers=gz).status_code == 404
    # Zooms, the status-only refresh and a roofline stamp the page never sends are answered, not kept.
    kept = len(job_page_cache.bodies())
    start = job.started_at.timestamp()
    for params in ({"only": "status"}, {"start": start, "end": start + 600}, {"roofline": "x" * 100}):
        assert client.get(url, params).status_code == 200
    assert len(job_page_cache.bodies()) == kept
