"""How the job page asks the browser for its scripts on a first visit (issue 15, the cold load)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.templatetags.static import static
from django.utils import timezone

from jobs.models import Job


@pytest.fixture
def job_page(client, make_team, make_user):
    team = make_team("llm")
    client.force_login(make_user("alice", teams=[team]))
    Job.objects.create(
        external_id="77001", team=team, gpu_count=2, started_at=timezone.now() - timedelta(hours=1),
        gpus=[{"hostname": "node-a", "gpu": str(i)} for i in range(2)],
    )  # fmt: skip
    return client.get("/jobs/77001/")


@pytest.mark.django_db
def test_the_response_headers_preload_the_scripts_the_page_tags_name(job_page):
    assert job_page.status_code == 200
    plotly, script = static("vendor/plotly.min.js"), static("js/job.js")
    assert job_page["Link"] == f"<{plotly}>; rel=preload; as=script, <{script}>; rel=preload; as=script"
    html = job_page.content.decode()
    # The same URLs as the tags (a preload of another URL would be fetched twice).
    assert f'src="{plotly}"' in html and f'src="{script}"' in html


@pytest.mark.django_db
def test_plotly_runs_as_soon_as_it_arrives_and_the_page_script_after_parsing(job_page):
    html = job_page.content.decode()
    tags = {m.group(1): m.group(0) for m in re.finditer(r'<script src="[^"]*/(plotly|job)[^"]*"[^>]*>', html)}
    # async: evaluated while the rest of the page (mostly the figures' JSON) is still arriving; job.js waits
    # for it by the tag's id (static/js/job.js whenPlotly).
    assert " async" in tags["plotly"] and " defer" not in tags["plotly"]
    assert 'id="plotly-js"' in tags["plotly"]
    assert " defer" in tags["job"]


def test_the_plotly_bundle_asks_v8_to_compile_all_of_it_off_the_main_thread() -> None:
    # V8's explicit compile hint must be the script's first line (static/vendor/plotly-bundle/build.sh).
    bundle = Path(__file__).resolve().parents[1] / "static" / "vendor" / "plotly.min.js"
    with bundle.open(encoding="utf-8") as f:
        assert f.readline() == "//# allFunctionsCalledOnLoad\n"


@pytest.mark.django_db
def test_the_page_shows_no_template_comment_as_text(job_page):
    # Django's {# #} comments end at the line's end: a multi-line one is rendered as page text.
    html = job_page.content.decode()
    assert "{#" not in html and "#}" not in html and "{% comment" not in html


def test_no_template_has_a_multi_line_hash_comment() -> None:
    templates = Path(__file__).resolve().parents[1] / "templates"
    found = [
        f"{path.relative_to(templates)}:{path.read_text(encoding='utf-8')[: m.start()].count(chr(10)) + 1}"
        for path in sorted(templates.rglob("*.html"))
        for m in re.finditer(r"\{#(.*?)#\}", path.read_text(encoding="utf-8"), re.S)
        if "\n" in m.group(1)
    ]
    assert found == [], "use {% comment %} for comments over several lines: " + ", ".join(found)


@pytest.mark.django_db
def test_so_far_is_said_of_a_running_job_only(job_page, client):
    assert re.search(r"</span> GPU-h so far</p>", job_page.content.decode())
    job = Job.objects.get(external_id="77001")
    job.ended_at, job.status = job.started_at + timedelta(minutes=30), Job.Status.FINALIZED
    job.save()
    html = client.get("/jobs/77001/").content.decode()
    assert re.search(r"</span> GPU-h</p>", html) and "so far" not in html
