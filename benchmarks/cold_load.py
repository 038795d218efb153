"""Cold first load of a 256-GPU x 7-day job page in headless Chromium, served as deployed (and as `make
demo` now runs it): DEBUG=false, WhiteNoise's compressed manifest storage, a threaded WSGI server.

Usage (from the repository root, services started with `.ci/services start`):

    .venv/bin/python benchmarks/cold_load.py [--runs 5]

Creates a private database (TEST_DATABASE_NAME, default `bench_cold_load`) with the finalized 256-GPU job of
benchmarks/pages.py, collects the static files into a temporary STATIC_ROOT, and opens the job page in a
fresh browser context each run (empty cache, like a first visit): the time from navigation to the charts
drawn (`body[data-charts-ready]`), and the bytes transferred. Target (issue 15): under 1.5 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TEST_DATABASE_NAME", "bench_cold_load")
os.environ["DEBUG"] = "false"
os.environ.setdefault("SECRET_KEY", "bench-" + "x" * 50)
os.environ.setdefault("SECURE_SSL_REDIRECT", "false")
os.environ.setdefault("SESSION_COOKIE_SECURE", "false")
os.environ.setdefault("CSRF_COOKIE_SECURE", "false")
os.environ.setdefault("SECURE_HSTS_SECONDS", "0")

from benchmarks.pages import _fill_series, _make_job  # noqa: E402  (sets Django up)

CHROMIUM = os.environ.get("CHROMIUM_BIN", "/usr/bin/chromium")

# Marks on the browser clock: when window.Plotly is assigned (the bundle parsed and evaluated), when the page
# sets body[data-first-chart] (the time series, the first chart, drawn) and body[data-charts-ready] (all).
# Installed before any page script runs; changes nothing on the page.
_MARKS_JS = """
(() => {
  Object.defineProperty(window, "Plotly", {
    configurable: true,
    set(v) {
      window.__plotlyAt = performance.now();
      Object.defineProperty(window, "Plotly", {value: v, writable: true, configurable: true});
    },
    get() { return undefined; },
  });
  new MutationObserver((_, obs) => {
    const b = document.body;
    if (b && b.hasAttribute("data-first-chart") && !window.__firstChartAt) {
      window.__firstChartAt = performance.now();
    }
    if (b && b.hasAttribute("data-charts-ready")) {
      window.__chartsReadyAt = performance.now();
      window.__firstChartAt = window.__firstChartAt || window.__chartsReadyAt;
      obs.disconnect();
    }
  }).observe(document, {
    attributes: true, subtree: true, attributeFilter: ["data-first-chart", "data-charts-ready"],
  });
})();
"""


def _print_profile(profile: dict[str, Any], top: int = 18) -> None:
    """Self time per function (and per script) of a CDP CPU profile, largest first."""
    nodes = {n["id"]: n for n in profile["nodes"]}
    deltas = profile.get("timeDeltas", [])
    self_us: dict[int, float] = {}
    for node_id, dt in zip(profile.get("samples", []), [*deltas[1:], 0], strict=False):
        self_us[node_id] = self_us.get(node_id, 0.0) + dt
    by_fn: dict[str, float] = {}
    by_url: dict[str, float] = {}
    for node_id, us in self_us.items():
        frame = nodes[node_id]["callFrame"]
        url = frame.get("url", "").rsplit("/", 1)[-1] or "(native)"
        name = f"{frame.get('functionName') or '(anonymous)'} {url}:{frame.get('lineNumber', 0)}"
        by_fn[name] = by_fn.get(name, 0.0) + us
        by_url[url] = by_url.get(url, 0.0) + us
    print("    CPU profile, self time by script: " + ", ".join(
        f"{u} {t / 1000:.0f} ms" for u, t in sorted(by_url.items(), key=lambda kv: -kv[1])[:8]
    ))  # fmt: skip
    for name, us in sorted(by_fn.items(), key=lambda kv: -kv[1])[:top]:
        print(f"      {us / 1000:7.0f} ms  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--save-html", type=Path, help="write the last run's job page HTML here")
    parser.add_argument(
        "--profile", action="store_true", help="CPU-profile the last run, print top functions"
    )
    args = parser.parse_args()

    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.testcases import LiveServerThread
    from django.test.utils import setup_test_environment
    from playwright.sync_api import sync_playwright

    from jobs.metrics.signals import SIGNALS
    from jobs.models import GpuModel, Membership, Team

    setup_test_environment()
    settings.DEBUG = False
    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
    static_root = Path(tempfile.mkdtemp(prefix="cold-load-static-"))
    settings.STATIC_ROOT = static_root
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }
    t0 = time.perf_counter()
    call_command("collectstatic", "--noinput", verbosity=0)
    print(f"collectstatic (gzip) into {static_root}: {time.perf_counter() - t0:.0f} s")
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    server = None
    try:
        team = Team.objects.create(slug="llm", name="LLM")
        user = get_user_model().objects.create_user("bench", password="x")
        Membership.objects.create(team=team, user=user)
        gpu = GpuModel.objects.get(name="H100 SXM")
        t0 = time.perf_counter()
        job = _make_job(team, gpu, "big-finished", running=False)
        n = _fill_series(job, 300, 1800, list(SIGNALS), list(SIGNALS))
        print(f"filled finalized 256-GPU 7-day job: {n:,} archive rows in {time.perf_counter() - t0:.0f} s")
        client = Client()
        client.force_login(user)
        session = client.cookies[settings.SESSION_COOKIE_NAME].value

        # The WSGI app as deployed: WhiteNoise (in the middleware) serves the static files, no test handler.
        server = LiveServerThread("127.0.0.1", lambda handler: handler, connections_override={})
        server.daemon = True
        server.start()
        server.is_ready.wait()
        if server.error:
            raise server.error
        base = f"http://127.0.0.1:{server.port}"
        url = f"{base}/jobs/{job.external_id}/"
        times: list[float] = []
        firsts: list[float] = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"])
            for run in range(args.runs + 1):  # the first run warms the server process, not the browser
                context = browser.new_context(viewport={"width": 1366, "height": 768})
                context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session, "url": base}])
                context.add_init_script(_MARKS_JS)
                page = context.new_page()
                cdp = context.new_cdp_session(page)
                cdp.send("Performance.enable")
                profiling = args.profile and run == args.runs
                if profiling:
                    cdp.send("Profiler.enable")
                    cdp.send("Profiler.setSamplingInterval", {"interval": 200})
                    cdp.send("Profiler.start")
                sizes: dict[str, int] = {}
                page.on(
                    "response",
                    lambda r, sizes=sizes: sizes.__setitem__(
                        r.url, int(r.headers.get("content-length") or 0)
                    ),
                )
                t0 = time.perf_counter()
                page.goto(url)
                page.wait_for_selector("body[data-charts-ready]", timeout=60_000)
                elapsed = time.perf_counter() - t0
                nav = page.evaluate(
                    "(() => { const n = performance.getEntriesByType('navigation')[0];"
                    " const p = performance.getEntriesByType('resource')"
                    ".find(r => r.name.includes('plotly'));"
                    " const d = document.getElementById('job-data');"
                    " return [n.responseEnd, n.domContentLoadedEventEnd, p ? p.responseEnd : 0,"
                    " window.__chartsReadyAt || performance.now(), window.__plotlyAt || 0,"
                    " d ? d.textContent.length : 0, n.decodedBodySize, window.__firstChartAt || 0]; })()"
                )
                metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
                if profiling:
                    _print_profile(cdp.send("Profiler.stop")["profile"])
                if args.save_html and run == args.runs:
                    args.save_html.write_text(page.content())
                plotly = next((u for u in sizes if "plotly" in u), "")
                if run:
                    times.append(elapsed)
                    firsts.append(nav[7] / 1000)
                label = "warm-up" if run == 0 else f"run {run}"
                print(
                    f"{label}: {elapsed * 1000:.0f} ms to charts drawn; {sum(sizes.values()) / 1e6:.2f} MB "
                    f"transferred in {len(sizes)} responses (plotly {sizes.get(plotly, 0) / 1e6:.2f} MB); "
                    f"HTML received {nav[0]:.0f} ms, plotly received {nav[2]:.0f} ms, plotly evaluated "
                    f"{nav[4]:.0f} ms, DOMContentLoaded {nav[1]:.0f} ms, time series (first chart) drawn by "
                    f"{nav[7]:.0f} ms, all charts drawn by {nav[3]:.0f} ms "
                    f"(browser clock)\n    HTML {nav[6] / 1e6:.2f} MB decoded, of it figure JSON "
                    f"{nav[5] / 1e6:.2f} MB; main thread: script {metrics['ScriptDuration'] * 1000:.0f} ms, "
                    f"layout {metrics['LayoutDuration'] * 1000:.0f} ms, style "
                    f"{metrics['RecalcStyleDuration'] * 1000:.0f} ms, all tasks "
                    f"{metrics['TaskDuration'] * 1000:.0f} ms"
                )
                context.close()
            browser.close()
        p50 = statistics.median(times)
        print(f"\ncold first load, job page 256 GPUs x 7 days: all charts drawn p50 {p50 * 1000:.0f} ms, max "
              f"{max(times) * 1000:.0f} ms over {len(times)} fresh contexts (target < 1500 ms: "
              f"{'met' if max(times) < 1.5 else 'NOT met'}); time series (first chart) drawn p50 "
              f"{statistics.median(firsts) * 1000:.0f} ms, max {max(firsts) * 1000:.0f} ms (browser clock, "
              f"from navigation start); load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    finally:
        if server is not None:
            server.terminate()
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
