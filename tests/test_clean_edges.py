"""Clean edges (issue 15, item 6): plain 404/500, local API docs, the API root, the promote guard, retire
confirmation, "selector matched 0 GPUs" once with its PromQL, readiness over 7 days, a favicon, messages
next to their form."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from jobs.models import Baseline, Finding, Job
from tests.conftest import job_body


@pytest.fixture
def team(make_team):
    return make_team("llm", "LLM")


@pytest.fixture
def member(make_user, team):
    return make_user("alice", teams=[team])


def _job(team, external_id: str, **kw):
    now = timezone.now()
    defaults = dict(
        team=team, external_id=external_id, name=f"job-{external_id}", started_at=now - timedelta(hours=5),
        ended_at=now - timedelta(hours=1), gpu_count=8, gpu_hours=32.0, mfu=0.4, cost_usd=100.0,
        cost_per_day_usd=600.0, waste_per_day_usd=60.0, waste_lower_bound_per_day_usd=60.0,
        status=Job.Status.FINALIZED, config_fingerprint="f" * 64, model_name="llama-7b",
        last_polled_at=now - timedelta(hours=1),
    )  # fmt: skip
    defaults.update(kw)
    return Job.objects.create(**defaults)


def test_404_lists_no_routes(client, member, settings):
    settings.DEBUG = False
    client.force_login(member)
    response = client.get("/no/such/page/")
    html = response.content.decode()
    assert response.status_code == 404
    assert "Page not found" in html
    assert "URLconf" not in html and "api/v1/" not in html and "admin/" not in html


def test_500_is_plain_and_renders_without_a_request():
    html = render_to_string("500.html")
    assert "Something went wrong" in html and "Traceback" not in html and "favicon.svg" in html


def test_every_page_links_the_favicon(client, member):
    client.force_login(member)
    html = client.get("/").content.decode()
    assert re.search(r'<link rel="icon" href="/static/favicon[^"]*\.svg"', html)


def test_api_docs_are_fully_local(client, member):
    client.force_login(member)
    html = client.get(reverse("api-docs")).content.decode()
    assert not re.search(r"(src|href)=\"https?://", html), html
    assert "fonts.googleapis" not in html
    assert "api-docs" in html and "redoc.standalone.js" in html


def test_api_root_links_api_endpoints_only(client, member):
    client.force_login(member)
    body = client.get("/api/v1/").json()
    assert {"jobs", "baselines", "artifacts", "leaderboard", "schema"} <= set(body)
    for name, url in body.items():
        assert url.startswith("http://testserver/api/"), (name, url)
    assert body["jobs"] == "http://testserver/api/v1/jobs/"
    assert client.get(body["jobs"]).status_code == 200


@pytest.mark.parametrize("code", ["gpu_errors", "throttling"])
def test_promote_refuses_a_run_with_health_findings_unless_anyway_with_reason(client, member, team, code):
    job = _job(team, "p-1")
    Finding.objects.create(
        job=job, code=code, severity="critical", confidence=0.9, title="XID 79: fell off the bus",
        recommendation="dcgmi diag", waste_per_day_usd=None,
    )  # fmt: skip
    client.force_login(member)
    page = unescape(client.get(reverse("job-detail", args=[job.external_id])).content.decode())
    assert 'name="promote_anyway"' in page and 'name="reason"' in page
    url = reverse("job-promote-baseline", args=[job.external_id])
    html = unescape(client.post(url, follow=True).content.decode())
    assert "Not promoted: this run has hardware or health findings" in html
    assert not Baseline.objects.exists()
    html = unescape(client.post(url, {"reason": "no tick"}, follow=True).content.decode())
    assert not Baseline.objects.exists()
    anyway = {"promote_anyway": "1", "reason": "XID after the last step"}
    html = unescape(client.post(url, anyway, follow=True).content.decode())
    assert "Added to the llama-7b baseline" in html
    assert Baseline.objects.get().runs.get() == job


def test_info_or_other_findings_do_not_block_promote(client, member, team):
    job = _job(team, "p-2")
    Finding.objects.create(job=job, code="throttling", severity="info", confidence=0.5, title="t",
                           recommendation="r")  # fmt: skip
    Finding.objects.create(job=job, code="launch_overhead", severity="critical", confidence=0.5, title="t",
                           recommendation="r")  # fmt: skip
    client.force_login(member)
    html = unescape(client.post(reverse("job-promote-baseline", args=[job.external_id]), follow=True)
                    .content.decode())  # fmt: skip
    assert "Added to the llama-7b baseline" in html


def test_messages_are_shown_next_to_the_form_that_caused_them(client, member, team, media_root):
    job = _job(team, "u-1")
    client.force_login(member)
    response = client.post(reverse("job-artifact-upload", args=[job.external_id]), {}, follow=True)
    html = unescape(response.content.decode())
    assert "Choose a file to upload." in html
    assert html.index("Choose a file to upload.") > html.index('id="artifacts"')
    assert html.count("Choose a file to upload.") == 1  # not at the page top as well


def test_retire_asks_for_confirmation_in_the_form(client, member, team):
    job = _job(team, "r-1")
    client.force_login(member)
    client.post(reverse("job-promote-baseline", args=[job.external_id]))
    html = client.get(reverse("baseline-list")).content.decode()
    assert 'name="confirm" value="yes" required' in html


@pytest.mark.prometheus
def test_selector_matching_no_gpu_is_one_ingestion_error_with_the_promql(
    prometheus_server, catalog, team, member, client
):
    from jobs.intake.registry import register_job
    from jobs.metrics.prometheus import PrometheusClient
    from jobs.pipeline import poll as pipeline

    start = timezone.now() - timedelta(hours=1)
    body = job_body("nogpu-1", started_at=start, gpus=[{"hostname": "nowhere-99", "gpu": "0"}])
    body.update(team=team, gpu_count=1)
    job = register_job(body).job
    job = pipeline.poll_job(job, PrometheusClient(prometheus_server.url, retries=0))
    reasons = set(job.missing_reasons.values())
    assert len(reasons) == 1
    (reason,) = reasons
    assert reason.startswith("selector matched 0 GPUs") and "nowhere-99" in reason and "DCGM_FI_" in reason
    client.force_login(member)
    page = unescape(client.get(reverse("job-detail", args=["nogpu-1"])).content.decode())
    assert "Ingestion: selector matched 0 GPUs" in page and "nowhere-99" in page
    assert "not shown (signals not collected)" not in page  # no list of 30 missing lines
    ready_section = page[page.index('id="readiness"') :]
    assert "<table" not in ready_section and "selector matched 0 GPUs" in ready_section
    ready = unescape(client.get(reverse("cluster-readiness")).content.decode())
    assert "Selector matched 0 GPUs" in ready and "nowhere-99" in ready
    assert 'id="missing-fields"' not in ready  # no "missing field" rows for it


def test_readiness_covers_the_jobs_of_the_last_7_days(client, member, team):
    now = timezone.now()
    _job(team, "recent-1", ended_at=now - timedelta(days=2), started_at=now - timedelta(days=3),
         missing_signals=["sm_active"], missing_reasons={"sm_active": "off"})  # fmt: skip
    _job(team, "old-1", ended_at=now - timedelta(days=10), started_at=now - timedelta(days=11),
         missing_signals=["sm_active"], missing_reasons={"sm_active": "off"})  # fmt: skip
    client.force_login(member)
    html = unescape(client.get(reverse("cluster-readiness")).content.decode())
    row = html[html.index("DCGM_FI_PROF_SM_ACTIVE") :]
    row = row[: row.index("</tr>")]
    assert "job-recent-1" in row and "job-old-1" not in row
    assert "1 job in the last 7 days (0 running)" in html


@pytest.mark.django_db
def test_api_docs_title_operations_in_words_and_link_back(client, member):
    """Issue 28 item 10: "efficiency API (1)", operationIds as titles, no way back to the site."""
    from jobs.api.schema import summary_of

    client.force_login(member)
    html = client.get(reverse("api-docs")).content.decode()
    assert 'href="/"' in html and "← efficiency" in html
    schema = client.get(reverse("api-schema"), HTTP_ACCEPT="application/json").json()
    assert schema["info"]["version"] == "v1"
    operations = [op for ops in schema["paths"].values() for op in ops.values() if isinstance(op, dict)]
    assert operations and all(op.get("summary") for op in operations)
    assert not any(op["summary"] == op.get("operationId") for op in operations)
    assert summary_of("jobs_artifacts_create", "") == "Create jobs artifacts"
    assert summary_of("x_list", "Register or update a job.\n\nMore text.") == "Register or update a job"
