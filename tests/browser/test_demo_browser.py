"""The demo as a visitor first sees it, in headless Chromium (issue 28 items 3, 5 and 6).

The demo's own path: `jobs.demo` plans the jobs, simulates their dcgm-exporter data, backfills it into a
real Prometheus, registers them as the scheduler would and runs `loader.finish` (ingest, traces). Item 3's
test also runs the simulated exporter in the live server and a Prometheus that scrapes it, as `make demo`
does. Screenshots: test-artifacts/screenshots/item{3,5,6}-*.png.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import LAPTOP, Watched

pytestmark = [pytest.mark.browser, pytest.mark.prometheus]
db = pytest.mark.django_db(transaction=True)

#: The README's compare links of the seed cases: (before, after, their workloads' step times in s).
README_PAIRS = (
    ("demo-seed1-run1", "demo-seed1-run2", 2.0, 0.97),
    ("demo-seed1-run2", "demo-seed1-run3", 0.97, 0.78),
    ("demo-seed2", "demo-seed2-run2", 1.5, 1.05),
)


def _now() -> datetime:
    return datetime.now(UTC).replace(second=0, microsecond=0)


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, list[Any], list[Any], datetime]]:
    """A real Prometheus holding the demo's seed runs, as `load_demo` backfills them."""
    from jobs.demo import cluster, loader
    from tests.prom_server import PrometheusProcess, prometheus_binary

    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (Debian package 'prometheus')")
    now = _now()
    planned = [d for d in cluster.plan(now) if d.batch is not None]
    results = [cluster.simulate_job(d, now) for d in planned]
    tsdb = tmp_path_factory.mktemp("demo-seeds") / "tsdb"
    loader.backfill_results(results, tsdb)
    with PrometheusProcess(tsdb) as server:
        yield server, planned, results, now


def _load(
    settings: Any, tmp_path: Path, prom_url: str, planned: list[Any], results: list[Any], now: datetime
) -> None:
    from jobs.demo import cluster, loader

    settings.PROMETHEUS_URL = prom_url
    settings.MEDIA_ROOT = str(tmp_path / "media")
    teams = cluster.ensure_people()
    for d, result in zip(planned, results, strict=True):
        cluster.register(d, result, teams, now)
    loader.finish(wait_live_s=0)


def _number(text: str) -> float:
    """The number a cell shows ("2,000 ms", "1,001 tokens/s")."""
    return float(text.split()[0].replace(",", ""))


def _log_in(watched: Watched, base: str) -> None:
    from jobs.demo import cluster

    page = watched.page
    page.goto(f"{base}/login/")
    page.get_by_label("User name").fill("demo")
    page.get_by_label("Password").fill(cluster.DEMO_PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base}/")


@db
def test_every_readme_compare_link_shows_a_trace_diff_with_the_seeds_step_times(
    watched, live_server, settings, tmp_path, seeds
):
    server, planned, results, now = seeds
    _load(settings, tmp_path, server.url, planned, results, now)
    _log_in(watched, live_server.url)
    page = watched.page
    for a_id, b_id, step_a, step_b in README_PAIRS:
        page.goto(f"{live_server.url}/jobs/compare/?a={a_id}&b={b_id}")
        page.wait_for_selector("body[data-charts-ready]")
        name = "seed1" if a_id == "demo-seed1-run1" else "seed1-run3" if b_id.endswith("run3") else "seed2"
        watched.shot(f"item5-compare-{name}-after", full_page=False, selector="#kpis")
        watched.shot(f"item5-compare-{name}-traces-after", full_page=False, selector="#trace-diff")
        step = page.locator('tr[data-kpi="step_time_ms"]')
        assert _number(step.locator('td[data-side="a"] .v').inner_text()) == pytest.approx(step_a * 1000)
        assert _number(step.locator('td[data-side="b"] .v').inner_text()) == pytest.approx(step_b * 1000)
        traces = page.locator("#trace-diff")
        assert "no trace of the same kind" not in traces.inner_text()
        assert traces.locator("table").count() >= 5
        # Tokens/s per GPU change as the step time does: the batch is the same before and after.
        tps = page.locator('tr[data-kpi="tokens_per_second_per_gpu"]')
        a = _number(tps.locator('td[data-side="a"] .v').inner_text())
        b = _number(tps.locator('td[data-side="b"] .v').inner_text())
        assert b / a == pytest.approx(step_a / step_b, rel=0.03), (a_id, a, b)
    assert page.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"]
    watched.assert_clean()


@db
def test_the_trace_card_and_the_findings_agree_on_one_page(watched, live_server, settings, tmp_path, seeds):
    """Issue 28 item 6: the trace card's idle share is the findings' (of the step, said so), a
    communication-bound trace's host wait is not "100 %" of a 0.2 % idle, and energy is written as on the
    compare page."""
    server, planned, results, now = seeds
    _load(settings, tmp_path, server.url, planned, results, now)
    _log_in(watched, live_server.url)
    page = watched.page
    page.goto(f"{live_server.url}/jobs/demo-seed1-run1/")
    page.wait_for_selector("body[data-charts-ready]")
    watched.shot("item6-job-seed1-findings-after", full_page=False, selector="#findings")
    watched.shot("item6-job-seed1-trace-card-after", full_page=False, selector="#artifacts")
    card = page.locator("#artifacts dl.facts").first.inner_text()
    assert "70 % of the step" in card and "the findings' definition" in card and "57.1" not in card
    findings = page.locator("#findings").inner_text()
    assert "70" in findings and "% of step" in findings
    energy = page.locator('[data-kpi="energy"]').inner_text()
    assert "." in energy, energy  # 1.84, not a whole "2"
    page.goto(f"{live_server.url}/jobs/demo-seed2/")
    page.wait_for_selector("body[data-charts-ready]")
    watched.shot("item6-job-seed2-trace-card-after", full_page=False, selector="#artifacts")
    card = page.locator("#artifacts dl.facts").first.inner_text()
    assert "Idle waiting for the host" not in card or "100" not in card
    assert "33.3 % of the step" in card  # the exposed all-reduce is communication, not idle
    page.goto(f"{live_server.url}/jobs/compare/?a=demo-seed1-run1&b=demo-seed1-run2")
    page.wait_for_selector("body[data-charts-ready]")
    row = page.locator('tr[data-kpi="energy_kwh"]')
    assert row.locator('td[data-side="verdict"]').inner_text().startswith("not judged")
    assert "price" not in row.inner_text()
    watched.assert_clean()


@contextmanager
def _prometheus_scraping(tsdb: Path, target: str, workdir: Path) -> Iterator[str]:
    """Prometheus over `tsdb` scraping the simulated exporter at `target` every second, as the demo's
    Prometheus scrapes the web server (.ci/services: 15 s there; 1 s here to keep the test short)."""
    from tests.prom_server import free_port, prometheus_binary

    binary = prometheus_binary()
    if binary is None:
        pytest.skip("prometheus is not installed (Debian package 'prometheus')")
    config = workdir / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: dcgm-exporter-simulated\n"
        f"    honor_labels: true\n    static_configs:\n      - targets: ['{target}']\n"
        "    metrics_path: /simulated/dcgm-exporter/metrics\n"
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (workdir / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tsdb}", "--log.level=warn",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=10y"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1.0) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        else:
            raise AssertionError((workdir / "prometheus.log").read_text()[-2000:])
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@db
def test_the_demo_opens_without_stale_alerts(watched, live_server, settings, tmp_path):
    """Issue 28 item 3. `load` wrote the running job's data 12 minutes before `finish` polls (a first
    `make demo` on a busy machine: backfill, Prometheus restart). `finish` waits until Prometheus has
    scraped the simulated exporter (served by the web server, started before it) and its first poll reads
    current data: no "Ingestion stale" alert, and Prometheus holds data of the job newer than `finish`'s
    start (before, `finish` polled before the web server, hence the exporter, had started)."""
    from jobs.demo import cluster, loader
    from jobs.demo.live import LIVE_SPECS_FILE
    from jobs.metrics.prometheus import PrometheusClient
    from jobs.models import AlertIncident, Job

    now = _now()
    live = next(d for d in cluster.plan(now) if d.spec.job_id == "demo-4900")
    result = cluster.simulate_job(live, now - timedelta(minutes=12))
    tsdb = tmp_path / "tsdb"
    loader.backfill_results([result], tsdb)
    state = tmp_path / "state"
    state.mkdir()
    spec = asdict(live.spec) | {"disabled": sorted(live.spec.disabled)}
    (state / LIVE_SPECS_FILE).write_text(json.dumps([spec]))
    settings.DEMO_STATE_DIR = str(state)
    settings.MEDIA_ROOT = str(tmp_path / "media")
    with _prometheus_scraping(tsdb, live_server.url.removeprefix("http://"), tmp_path) as url:
        settings.PROMETHEUS_URL = url
        teams = cluster.ensure_people()
        cluster.register(live, result, teams, now)
        lines: list[str] = []
        began = time.time()
        report = loader.finish(lines.append, wait_live_s=120.0)
        newest = loader.live_data_until(PrometheusClient(url), ["demo-4900"])
    job = Job.objects.get(external_id="demo-4900")
    open_rules = set(
        AlertIncident.objects.filter(job=job, resolved_at__isnull=True).values_list("rule", flat=True)
    )
    _log_in(watched, live_server.url)
    page = watched.page
    page.goto(f"{live_server.url}/teams/{job.team.slug}/alerts/")
    watched.shot("item3-team-alerts-after")
    page.goto(f"{live_server.url}/jobs/{job.external_id}/")
    watched.shot("item3-job-after", full_page=False)
    assert report["live_caught_up"], lines
    assert newest["demo-4900"] >= began  # scraped from the exporter after `finish` began
    assert "ingestion_stale" not in open_rules and not job.ingest_error
    assert job.data_until is not None
    assert (datetime.now(UTC) - job.data_until).total_seconds() < settings.ALERT_STALE_MINUTES * 60
    assert (
        page.locator("text=Ingestion stale").count() == 0 and page.locator("text=No new metrics").count() == 0
    )
    watched.assert_clean()


@db
def test_the_demo_model_server_shows_the_engines_mfu_and_serving_advice(
    watched, live_server, settings, tmp_path, catalog
):
    """Issue 25 follow-up: the demo's model server (vLLM, kind inference, registered by its pod) as a visitor
    sees it: the MFU card says the engine's own FLOPs are shown with the forward-FLOPs MFU kept beside it,
    the findings give the serving advice and no input stall, and the page loads cleanly."""
    from jobs.demo import cluster, loader
    from jobs.models import Job
    from tests.prom_server import PrometheusProcess, prometheus_binary

    now = _now() - timedelta(minutes=1)
    demo = next(d for d in cluster.plan(now) if d.spec.job_id == cluster.SERVING_JOB)
    result = cluster.simulate_job(demo, now)
    engines = cluster.engine_series(demo, now)
    assert engines is not None
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (Debian package 'prometheus')")
    loader.backfill_results([result], tmp_path / "tsdb", engines={cluster.SERVING_JOB: engines})
    with PrometheusProcess(tmp_path / "tsdb") as server:
        settings.PROMETHEUS_URL = server.url
        settings.PROMETHEUS_SCRAPE_INTERVAL_S = 30.0
        settings.MEDIA_ROOT = str(tmp_path / "media")
        cluster.register(demo, result, cluster.ensure_people(), now)
        report = loader.finish(wait_live_s=0)
        job = Job.objects.get(external_id=cluster.SERVING_JOB)
        assert job.evaluation["mfu_source"] == "engine", (report, job.evaluation.get("notes"))
        _log_in(watched, live_server.url)
        page = watched.page
        page.goto(f"{live_server.url}/jobs/{job.external_id}/")
        page.wait_for_selector("body[data-charts-ready]")
        watched.shot("demo-serving-job", full_page=False)
        watched.shot("demo-serving-findings", full_page=False, selector="#findings")
        text = page.locator("body").inner_text()
        assert "engine-reported FLOPs (vLLM/SGLang estimated_flops_per_gpu_total)" in text
        assert "kept as a cross-check" in text
        findings = page.locator("#findings").inner_text()
        assert "Right-size" in findings and "batch requests" in findings
        assert not job.findings.filter(code__in=["data_pipeline_stall", "launch_overhead"]).exists()
        assert page.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"]
        watched.assert_clean()
