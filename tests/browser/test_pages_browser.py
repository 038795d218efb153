"""The pages in headless Chromium: log in, the job page's plots render with no console error and no CSP
violation, a finding zooms every plot (mouse and keyboard), an uploaded artifact shows its analysis, the
leaderboard sorts, and the pages fit a laptop screen. Screenshots: test-artifacts/screenshots/."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jobs.models import Finding, GpuModel, Job
from tests.browser import data
from tests.browser.conftest import LAPTOP, log_in

pytestmark = [pytest.mark.browser, pytest.mark.prometheus]
# live_server needs committed data; the `catalog` fixture puts the seeded GPU catalog back.
db = pytest.mark.django_db(transaction=True)


@pytest.fixture
def job(prom, sims, member):
    job = data.register(sims["7001"], member.teams.get(), ended=True)
    job = data.ingest(job, prom.url, ended=True)
    data.add_findings(job)
    return job


def x_range(page, element_id: str) -> list[float]:
    """The current x-axis range of a plot, in ms since the epoch."""
    return page.evaluate(
        """(id) => {
            const r = document.getElementById(id)._fullLayout.xaxis.range;
            return r.map(v => typeof v === "number" ? v : Date.parse(String(v).replace(" ", "T") + "Z"));
        }""",
        element_id,
    )


def open_job(watched, live_server, job) -> None:
    page = watched.page
    page.goto(f"{live_server.url}/jobs/{job.external_id}/")
    page.wait_for_selector("body[data-charts-ready]")
    page.wait_for_selector("#timeseries .main-svg")
    page.wait_for_selector("#heatmap .main-svg")


@db
def test_job_page_renders_its_plots_without_errors(watched, live_server, member, job):
    log_in(watched, live_server.url, member.username)
    open_job(watched, live_server, job)
    page = watched.page
    # Every subplot drew its lines, the heatmap its 16 GPU rows.
    assert page.locator("#timeseries .scatterlayer .trace").count() >= 8
    assert page.evaluate("document.getElementById('heatmap').data[0].y.length") == 16
    # The finding windows are shaded on the chart.
    assert page.evaluate("document.getElementById('timeseries').layout.shapes.length") >= 3
    # The roofline (#25 item 6): both roofs, the job over time, its 16 GPUs and its mean, on log axes.
    page.wait_for_selector("#roofline .main-svg")
    assert page.evaluate("document.getElementById('roofline')._fullLayout.xaxis.type") == "log"
    assert page.evaluate("document.getElementById('roofline').data.length") == 5
    assert page.evaluate("document.getElementById('roofline').data[3].x.length") == 16
    # One GPU over time (#28 item 9): choosing a GPU draws its heatmap row against the median row.
    page.wait_for_selector("#gpu-line-tools:not([hidden])")
    assert page.locator("#gpu-line-select option").count() == 17  # 16 GPUs and the prompt
    page.select_option("#gpu-line-select", index=6)
    page.wait_for_selector("#gpu-line .main-svg")
    assert page.evaluate("document.getElementById('gpu-line').data.length") == 2
    assert page.evaluate("document.getElementById('gpu-line').data[0].name") == page.evaluate(
        "document.getElementById('heatmap').data[0].y[5]"
    )
    watched.shot("job-page")
    watched.shot("job-page-top", full_page=False)
    # Fits a laptop screen: no horizontal scrolling.
    assert page.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"]
    watched.assert_clean()


@db
def test_clicking_a_finding_zooms_every_plot(watched, live_server, member, job):
    log_in(watched, live_server.url, member.username)
    open_job(watched, live_server, job)
    page = watched.page
    before = x_range(page, "timeseries")
    throttling = Finding.objects.get(job=job, code="throttling")
    start, end = (t * 1000 for t in throttling.windows[0])

    page.locator("#finding-throttling button.zoom").click()
    page.wait_for_function(
        "(b) => { const r = document.getElementById('timeseries')._fullLayout.xaxis.range;"
        " return Date.parse(String(r[0]).replace(' ', 'T') + 'Z') > b; }",
        arg=before[0],
    )
    zoomed = x_range(page, "timeseries")
    assert zoomed != before
    assert before[0] < zoomed[0] <= start and end <= zoomed[1] < before[1]
    assert x_range(page, "heatmap") == pytest.approx(zoomed, abs=1000)
    assert page.locator("#finding-throttling button.zoom").get_attribute("aria-pressed") == "true"
    page.wait_for_selector("#zoom-status:has-text('full detail')")
    watched.shot("job-page-zoomed-to-finding", full_page=False)
    watched.shot("heatmap-zoomed", selector="#heatmap")

    # Keyboard: Tab to the other finding's button and press Enter.
    other = Finding.objects.get(job=job, code="communication_wait")
    page.locator("#finding-communication_wait button.zoom").focus()
    page.keyboard.press("Enter")
    first = other.windows[0][0] * 1000
    page.wait_for_function(
        "(t) => { const r = document.getElementById('timeseries')._fullLayout.xaxis.range;"
        " return Date.parse(String(r[0]).replace(' ', 'T') + 'Z') <= t; }",
        arg=first,
    )
    assert x_range(page, "timeseries")[0] <= first

    page.get_by_role("button", name="Show the whole job").click()
    page.wait_for_function(
        "(b) => { const r = document.getElementById('timeseries')._fullLayout.xaxis.range;"
        " return Math.abs(Date.parse(String(r[0]).replace(' ', 'T') + 'Z') - b) < 2000; }",
        arg=before[0],
    )
    watched.assert_clean()


@db
def test_a_running_job_refreshes_without_reloading(watched, live_server, member, prom, sims):
    job = data.register(sims["7002"], member.teams.get(), ended=False)
    job = data.ingest(job, prom.url, ended=False, hours=1)
    log_in(watched, live_server.url, member.username)
    open_job(watched, live_server, job)
    page = watched.page
    page.evaluate("window.__sameDocument = true")
    end_before = x_range(page, "timeseries")[1]
    # A poll at 01:00 settles data up to now minus the ingestion lag (2 scrape intervals of 30 s): 00:59.
    assert page.locator('[data-field="data_until"]').inner_text() == "2026-01-01 00:59"
    data.ingest(job, prom.url, ended=False, hours=2)  # the next minute's poll, one hour later
    page.evaluate("window.jobPage.refresh()")
    page.wait_for_function(
        "document.querySelector('[data-field=\"data_until\"]').textContent === '2026-01-01 01:59'"
    )
    end_after = page.evaluate("Math.max(...document.getElementById('timeseries').data.flatMap(t => t.x))")
    assert end_after >= end_before + 50 * 60 * 1000
    assert page.evaluate("window.__sameDocument") is True  # no reload happened
    # The heatmap falls back to nvidia-smi util: this job has no SM_ACTIVE.
    assert page.get_by_text("Per GPU: nvidia-smi util over time").is_visible()
    watched.shot("job-page-running-no-sm-active")
    watched.assert_clean()


@db
def test_uploading_an_artifact_shows_its_analysis(
    watched, live_server, member, job, monkeypatch, settings, tmp_path
):
    artifacts = pytest.importorskip(
        "jobs.intake.artifacts", reason="jobs/intake/artifacts.py (the artifact store) is absent"
    )
    from tests.conftest import sample_path

    path = sample_path("pyspy/pyspy_bpe_tokenizer.speedscope.json")
    settings.MEDIA_ROOT = str(tmp_path / "media")
    # No Celery worker in the test: parse right after the upload commits, in the server thread.
    monkeypatch.setattr(artifacts, "_enqueue", lambda pk: artifacts.parse_artifact(pk))
    log_in(watched, live_server.url, member.username)
    open_job(watched, live_server, job)
    page = watched.page
    page.get_by_label("File").set_input_files(str(path))
    page.get_by_label("Rank").fill("0")
    page.get_by_role("button", name="Upload and analyse").click()
    page.wait_for_selector(".messages li.success")
    page.wait_for_selector("[data-figure$='-icicle'] .main-svg")
    assert page.locator("[data-figure$='-icicle'][data-plotted] .main-svg").first.is_visible()
    assert page.get_by_text("Hottest Python frames").is_visible()
    page.locator("#artifacts").scroll_into_view_if_needed()
    watched.shot("job-page-artifact")
    watched.shot("artifact-analysis", selector="#artifacts")
    watched.assert_clean()


@db
def test_leaderboard_sorts(watched, live_server, member):
    team = member.teams.get()
    vision = type(team).objects.create(slug="vision", name="Vision")
    # On H100s: period cost and waste come from the GPU model's dated price book (jobs.evaluation.totals).
    h100 = GpuModel.objects.get(name="H100 SXM")
    for i in range(12):
        start = data.START - timedelta(days=3) + timedelta(hours=7 * i)
        Job.objects.create(
            external_id=f"lb{i}", name=f"job {i}", team=team if i % 3 else vision, model_name="llama-7b",
            gpu_model=h100, gpu_count=8 * (1 + i % 4), started_at=start, ended_at=start + timedelta(hours=6),
            status=Job.Status.FINALIZED, mfu=0.15 + 0.03 * i, cost_per_day_usd=2000.0,
            waste_per_day_usd=900.0 - 60 * i,
        )  # fmt: skip
    log_in(watched, live_server.url, member.username)
    page = watched.page
    page.goto(f"{live_server.url}/leaderboard/?week=2026-W01")
    page.get_by_role("link", name="Team", exact=True).click()
    page.wait_for_url("**sort=team**")
    teams = page.locator("#leaderboard tbody tr").evaluate_all("rows => rows.map(r => r.dataset.team)")
    assert teams == ["llm", "vision"]
    page.get_by_role("link", name="Waste ($ this week)").click()
    page.wait_for_url("**sort=waste**")
    waste = page.locator("#leaderboard tbody tr td:nth-child(7)").evaluate_all(
        "cells => cells.map(c => Number(c.firstChild.textContent.replace(/[$,]/g, '')))"
    )
    assert waste == sorted(waste, reverse=True) and len(waste) == 2
    assert page.locator("#leaderboard th[aria-sort='descending']").inner_text().startswith("Waste")
    assert page.locator("svg.spark polyline").count() >= 2
    assert page.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"]
    watched.shot("leaderboard")
    watched.assert_clean()


@db
def test_other_pages_fit_a_laptop_and_are_clean(watched, live_server, member, job):
    log_in(watched, live_server.url, member.username)
    page = watched.page
    page.set_viewport_size({"width": 1024, "height": 768})  # a small laptop
    open_job(watched, live_server, job)
    assert page.evaluate("document.documentElement.scrollWidth") <= 1024
    watched.shot("job-page-1024", full_page=False)
    page.set_viewport_size(LAPTOP)
    for name, path in (
        ("job-list", "/"),
        ("team", "/teams/llm/"),
        ("baselines", "/baselines/"),
        ("catalog", "/catalog/"),
        ("readiness", "/readiness/"),
    ):
        page.goto(live_server.url + path)
        assert page.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"], name
        watched.shot(name)
    watched.assert_clean()
