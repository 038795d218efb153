"""Issue 15 in headless Chromium: the time range lives in the URL (presets, zoom, reload, finding bands
redrawn at every zoom), search and "my jobs", CSV downloads that parse and match the page, no request
leaves our host from any page, a plain 404, the promote guard with its message next to the form.
Screenshots: test-artifacts/screenshots/ux-*.png."""

from __future__ import annotations

import csv
import io
import re
from urllib.parse import parse_qs, urlparse

import pytest

from tests.browser import data
from tests.browser.conftest import log_in
from tests.browser.test_pages_browser import open_job, x_range

pytestmark = [pytest.mark.browser, pytest.mark.prometheus]
db = pytest.mark.django_db(transaction=True)


@pytest.fixture
def job(prom, sims, member):
    job = data.register(sims["7001"], member.teams.get(), ended=True)
    job = data.ingest(job, prom.url, ended=True)
    data.add_findings(job)
    return job


def _query(page) -> dict[str, list[str]]:
    return parse_qs(urlparse(page.url).query)


def _bands(page) -> int:
    return page.evaluate(
        "(document.getElementById('timeseries').layout.shapes || [])"
        ".filter(s => String(s.name || '').startsWith('finding:')).length"
    )


def _wait_range_start(page, near_ms: float) -> None:
    page.wait_for_function(
        "(t) => { const r = document.getElementById('timeseries')._fullLayout.xaxis.range;"
        " return Math.abs(Date.parse(String(r[0]).replace(' ', 'T') + 'Z') - t) < 2000; }",
        arg=near_ms,
    )


@db
def test_time_range_lives_in_the_url_and_zoom_keeps_the_bands(watched, live_server, member, job):
    log_in(watched, live_server.url, member.username)
    open_job(watched, live_server, job)
    page = watched.page
    whole = x_range(page, "timeseries")

    # A preset: the last hour of the job, written to the address.
    page.get_by_role("button", name="Last 1 h").click()
    _wait_range_start(page, whole[1] - 3600e3)
    assert _query(page)["last"] == ["1h"]

    # Drag-zoom across the middle of the top panel: the address gets from/to, the bands are redrawn.
    box = page.locator("#timeseries .nsewdrag").first.bounding_box()
    page.get_by_role("button", name="Show the whole job").click()
    _wait_range_start(page, whole[0])
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.30, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.45, y, steps=8)
    page.mouse.move(box["x"] + box["width"] * 0.60, y, steps=8)
    page.mouse.up()
    page.wait_for_function("new URL(location.href).searchParams.get('from') !== null")
    zoomed = x_range(page, "timeseries")
    assert whole[0] < zoomed[0] < zoomed[1] < whole[1]
    page.wait_for_selector("#zoom-status:has-text('full detail')")
    assert _bands(page) >= 1, "finding bands are drawn after a drag-zoom"
    q = _query(page)
    watched.shot("ux-job-zoomed", full_page=False)

    # Reload: the same window comes back from the address.
    page.reload()
    page.wait_for_selector("body[data-charts-ready]")
    assert x_range(page, "timeseries") == pytest.approx(zoomed, abs=2000)
    assert _query(page) == q
    assert _bands(page) >= 1
    # 24-hour UTC as its label says, never the browser's "12:08:00 AM" (issue 28 item 10).
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}", page.locator("#range-from").input_value())

    # A finding's window: ?finding=CODE, and a reload opens on it.
    page.locator("#finding-throttling button.zoom").click()
    page.wait_for_function("new URL(location.href).searchParams.get('finding') === 'throttling'")
    finding_range = x_range(page, "timeseries")
    page.reload()
    page.wait_for_selector("body[data-charts-ready]")
    assert x_range(page, "timeseries") == pytest.approx(finding_range, abs=2000)

    # Double-click: the whole job, the address cleared, and the status says so (not "zoomed").
    page.locator("#timeseries .nsewdrag").first.dblclick()
    _wait_range_start(page, whole[0])
    page.wait_for_selector("#zoom-status:has-text('whole job')")
    assert not {"from", "to", "last", "finding"} & set(_query(page))
    assert _bands(page) >= 1

    # A custom range typed into the picker.
    start = whole[0] + 1800e3
    page.locator("#range-from").fill(_local(start))
    page.locator("#range-to").fill(_local(start + 1800e3))
    page.get_by_role("button", name="Show range").click()
    _wait_range_start(page, start)
    assert _query(page)["from"] == [_local(start) + "Z"]
    watched.assert_clean()


def _visible(page, group: str) -> list[bool]:
    return page.evaluate(
        "(g) => document.getElementById('timeseries').data.filter(t => t.legendgroup === g)"
        ".map(t => t.visible !== false && t.visible !== 'legendonly')",
        group,
    )


@db
def test_legends_are_html_and_a_click_hides_a_line_across_zooms(watched, live_server, member, job):
    log_in(watched, live_server.url, member.username)
    open_job(watched, live_server, job)
    page = watched.page
    # One legend per subplot (plotly's own are off: they were a fifth of the first draw), with its title.
    assert page.evaluate("document.getElementById('timeseries')._fullLayout.showlegend") is False
    legends = page.locator("#charts .html-legend")
    rows = page.evaluate(
        "Object.keys(document.getElementById('timeseries').layout).filter(k => /^legend\\d*$/.test(k)).length"
    )
    assert legends.count() == rows >= 5
    assert "Utilisation" in legends.first.inner_text()
    sm = page.locator("#charts .html-legend button", has_text="SM active")
    group = sm.get_attribute("data-group")
    assert all(_visible(page, group)) and len(_visible(page, group)) == 2  # the line and its range band
    sm.click()
    page.wait_for_function(
        "(g) => document.getElementById('timeseries').data.filter(t => t.legendgroup === g)"
        ".every(t => t.visible === false)",
        arg=group,
    )
    assert sm.get_attribute("aria-pressed") == "false"
    # A zoom into detail redraws the figure from the server: the line stays hidden.
    page.get_by_role("button", name="Last 1 h").click()
    page.wait_for_selector("#zoom-status:has-text('full detail')")
    assert _visible(page, group) and not any(_visible(page, group))
    page.locator("#charts .html-legend button", has_text="SM active").click()
    page.wait_for_function(
        "(g) => document.getElementById('timeseries').data.filter(t => t.legendgroup === g)"
        ".every(t => t.visible !== false)",
        arg=group,
    )
    watched.assert_clean()


def _local(ms: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")


@db
def test_search_my_jobs_and_csv_match_the_page(watched, live_server, member, job, prom, sims):
    other = data.register(sims["7002"], member.teams.get(), ended=True, owner="bob")
    data.ingest(other, prom.url, ended=True)
    log_in(watched, live_server.url, member.username)
    page = watched.page
    page.goto(f"{live_server.url}/")
    page.get_by_label("Search").fill("7001")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**q=7001**")
    assert page.locator("#jobs tbody tr").count() == 1
    page.get_by_label("Search").fill("")
    page.get_by_label("My jobs").check()
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**mine=1**")
    names = page.locator("#jobs tbody tr td:first-child a").all_inner_texts()
    assert names == [job.name]  # alice's job only, not bob's
    watched.shot("ux-job-list-mine", full_page=False)

    with page.expect_download() as info:
        page.locator("#jobs-csv").click()
    rows = _read_csv(info.value.path())
    assert [r["job id"] for r in rows] == [job.external_id]
    cells = page.locator("#jobs tbody tr").first.locator("td")
    cost_cell = page.locator("#jobs tbody tr td[data-col='cost-total']").first.inner_text()
    waste_cell = page.locator("#jobs tbody tr td[data-col='waste-total']").first.inner_text()
    assert cells.count() == 11
    assert cost_cell == _page_money(rows[0]["cost ($ total)"]) + " total"
    assert waste_cell.endswith(_page_money(rows[0]["waste ($ total)"]) + " total")

    page.goto(f"{live_server.url}/leaderboard/?by=month")
    with page.expect_download() as info:
        page.locator("#leaderboard-csv").click()
    board = _read_csv(info.value.path())
    shown = page.locator("#leaderboard tbody tr").evaluate_all("rows => rows.map(r => r.dataset.team)")
    assert [r["team slug"] for r in board] == [s for s in shown if s]
    watched.assert_clean()


def _read_csv(path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(io.StringIO(f.read())))


def _page_money(cell: str) -> str:
    """A CSV dollar cell as the page prints it (jobs.evaluation.costs.format_usd)."""
    value = float(cell)
    return f"${value:,.0f}" if abs(value) >= 100 else f"${value:,.2f}"


@db
def test_no_page_requests_another_host(watched, live_server, member, job):
    log_in(watched, live_server.url, member.username)
    page = watched.page
    seen: list[str] = []
    page.on("request", lambda r: seen.append(r.url))
    for path in (
        "/", f"/jobs/{job.external_id}/", "/leaderboard/", "/teams/", "/teams/llm/", "/baselines/",
        "/catalog/", "/readiness/", "/api/docs/", "/no/such/page/",
    ):  # fmt: skip
        page.goto(f"{live_server.url}{path}")
        page.wait_for_load_state("networkidle")
    page.goto(f"{live_server.url}/api/docs/")
    page.wait_for_selector("redoc .menu-content, [role=navigation], h1", timeout=30_000)
    page.wait_for_timeout(500)
    foreign = [u for u in seen if not (u.startswith(live_server.url) or u.startswith(("data:", "blob:")))]
    assert foreign == [], foreign
    watched.shot("ux-api-docs", full_page=False)


@db
def test_404_lists_no_routes(watched, live_server, member):
    log_in(watched, live_server.url, member.username)
    page = watched.page
    response = page.goto(f"{live_server.url}/no/such/page/")
    assert response.status == 404
    text = page.locator("body").inner_text()
    assert "Page not found" in text and "URLconf" not in text and "api/v1/" not in text
    watched.shot("ux-404", full_page=False)


@db
def test_promote_guard_and_its_message_next_to_the_form(watched, live_server, member, job):
    log_in(watched, live_server.url, member.username)
    open_job(watched, live_server, job)
    page = watched.page
    assert page.locator("#promote-guard").is_visible()  # the throttling warning is named
    page.get_by_role("button", name="Promote this run to baseline").click()
    page.wait_for_selector("#baseline-messages")
    message = page.locator("#baseline-messages")
    assert "hardware or health findings" in message.inner_text()
    assert message.is_visible() and _in_viewport(page, "#baseline-messages")
    watched.shot("ux-promote-refused", full_page=False)
    page.get_by_role("checkbox", name="Promote anyway").check()
    page.locator("#promote-reason").fill("throttled 30 min of 3 h; clocks fine otherwise")
    page.get_by_role("button", name="Promote this run to baseline").click()
    page.wait_for_selector("#baseline-messages:has-text('Added to the')")
    assert _in_viewport(page, "#baseline-messages")
    watched.assert_clean()


def _in_viewport(page, selector: str) -> bool:
    return page.evaluate(
        "(s) => { const r = document.querySelector(s).getBoundingClientRect();"
        " return r.top >= 0 && r.bottom <= window.innerHeight; }",
        selector,
    )


@db
def test_phone_dark_mode_and_keyboard_zoom(browser, live_server, member, job):
    from tests.browser.conftest import _CSP_LISTENER, Watched

    context = browser.new_context(viewport={"width": 390, "height": 844}, color_scheme="dark")
    context.add_init_script(_CSP_LISTENER)
    try:
        watched = Watched(context.new_page())
        page = watched.page
        page.set_default_timeout(20_000)
        log_in(watched, live_server.url, member.username)
        # The job's name stays in view on a 390 px screen even when the table scrolls sideways.
        page.locator(".table-wrap").first.evaluate("el => el.scrollLeft = 400")
        name = page.locator("#jobs tbody tr td:first-child a").first.bounding_box()
        assert name is not None and name["x"] >= 0 and name["x"] + 20 <= 390
        bg = page.evaluate("getComputedStyle(document.documentElement).backgroundColor")
        assert bg == "rgb(13, 17, 23)", bg  # dark mode follows the system setting
        watched.shot("ux-phone-dark-job-list", full_page=False)
        # Keyboard: Tab to the chart, "+" zooms in and writes the range to the address.
        open_job(watched, live_server, job)
        whole = x_range(page, "timeseries")
        page.locator("#timeseries").focus()
        page.keyboard.press("+")
        page.wait_for_function("new URL(location.href).searchParams.get('from') !== null")
        zoomed = x_range(page, "timeseries")
        assert zoomed[1] - zoomed[0] == pytest.approx((whole[1] - whole[0]) / 2, rel=0.02)
        page.keyboard.press("0")
        page.wait_for_selector("#zoom-status:has-text('whole job')")
        watched.shot("ux-phone-dark-job", full_page=False)
        watched.assert_clean()
    finally:
        context.close()
