"""Screenshots of a running `make demo` in headless Chromium: job list, a job page, team page, leaderboard,
alerts, baselines, the seed cases' compare pages, into test-artifacts/demo/. Not a test (pytest does not
collect it); run after `make demo`:

    .venv/bin/python tests/browser/demo_screenshots.py [--base http://127.0.0.1:8000] [--out DIR]

Logs in as the demo user, waits for each page's charts where it has them, and fails on a page that does not
answer 200 or that asks another host for anything (the pages must work offline).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CHROMIUM_BIN", "/usr/bin/chromium")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="http://127.0.0.1:8000")
    parser.add_argument("--out", type=Path, default=REPO / "test-artifacts" / "demo")
    parser.add_argument("--user", default="demo")
    parser.add_argument("--password", default="demo-password")
    parser.add_argument("--team", help="the team (slug) whose page and alerts to show; default the first")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    host = urlparse(args.base).netloc
    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"])
        page = browser.new_page(viewport={"width": 1366, "height": 900})
        foreign: list[str] = []
        page.on(
            "request", lambda r: foreign.append(r.url) if urlparse(r.url).netloc not in (host, "") else None
        )
        page.goto(f"{args.base}/login/")
        page.fill("input[name=username]", args.user)
        page.fill("input[name=password]", args.password)
        page.click("form button[type=submit]")
        page.wait_for_load_state("networkidle")
        page.goto(f"{args.base}/")
        job_href = page.eval_on_selector("table a[href^='/jobs/']", "a => a.getAttribute('href')")
        if args.team:
            team_href = f"/teams/{args.team}/"
        else:
            page.goto(f"{args.base}/teams/")
            team_href = page.eval_on_selector("table a[href^='/teams/']", "a => a.getAttribute('href')")
        shots = [
            ("job-list", "/", None),
            ("job-page", job_href, "body[data-charts-ready]"),
            ("team-page", team_href, None),
            ("leaderboard", "/leaderboard/", None),
            ("alerts", team_href.rstrip("/") + "/alerts/", None),
            ("my-alerts", "/alerts/mine/", None),
            ("baselines", "/baselines/", None),
            # The README's compare links of the seed case studies (before -> after, each with a trace).
            (
                "compare-seed1-run1-run2",
                "/jobs/compare/?a=demo-seed1-run1&b=demo-seed1-run2",
                "body[data-charts-ready]",
            ),
            (
                "compare-seed1-run2-run3",
                "/jobs/compare/?a=demo-seed1-run2&b=demo-seed1-run3",
                "body[data-charts-ready]",
            ),
            ("compare-seed2", "/jobs/compare/?a=demo-seed2&b=demo-seed2-run2", "body[data-charts-ready]"),
            ("job-seed1-run1", "/jobs/demo-seed1-run1/", "body[data-charts-ready]"),
            # The model server: engine-reported MFU beside the forward-FLOPs MFU, serving advice (#25).
            ("job-serving", "/jobs/demo-4903/", "body[data-charts-ready]"),
            ("readiness", "/readiness/", None),
        ]
        for name, path, ready in shots:
            t0 = time.perf_counter()
            response = page.goto(f"{args.base}{path}")
            status = response.status if response else 0
            if ready:
                page.wait_for_selector(ready, timeout=60_000)
            page.wait_for_load_state("networkidle")
            elapsed = time.perf_counter() - t0
            page.screenshot(path=str(args.out / f"{name}.png"), full_page=True)
            print(f"{name:24s} {path:56s} HTTP {status} in {elapsed * 1000:.0f} ms -> {args.out / name}.png")
            if status != 200:
                problems.append(f"{path}: HTTP {status}")
        browser.close()
    problems += [f"request to another host: {u}" for u in foreign]
    for p in problems:
        print("PROBLEM:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
