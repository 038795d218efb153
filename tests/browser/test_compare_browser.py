"""The comparison page in headless Chromium: both runs drawn on one shared relative-time axis, the per-GPU
plot, no console error and no CSP violation; the job page's "Compare with…" link leads there."""

from __future__ import annotations

import pytest

from tests.browser.conftest import LAPTOP, log_in
from tests.test_compare import finding, make_run

pytestmark = [pytest.mark.browser]
db = pytest.mark.django_db(transaction=True)


@pytest.fixture
def member(catalog, make_team, make_user):
    return make_user("alice", teams=[make_team("llm", "LLM fine-tuning")])


@pytest.fixture
def pair(member):
    team = member.teams.get()
    a = make_run(team, "lora-run1", mfu=0.33, tps=16000.0, sm=0.40, waste=1500.0, seed=1, straggler=True)
    b = make_run(team, "lora-run2", mfu=0.68, tps=33000.0, sm=0.80, waste=300.0, seed=2, offset_h=2)
    finding(a, "data_pipeline_stall", 1100.0, "Input stall <b>x</b>")
    return a, b


@db
def test_the_compare_page_draws_both_runs_on_one_axis(watched, live_server, member, pair):
    a, b = pair
    log_in(watched, live_server.url, member.username)
    page = watched.page
    page.goto(f"{live_server.url}/jobs/{b.external_id}/")
    page.locator("#compare a", has_text="previous run with this config").click()
    page.wait_for_selector("body[data-charts-ready]")
    page.wait_for_selector("#overlay .main-svg")
    assert f"a={a.external_id}" in page.url and f"b={b.external_id}" in page.url
    # Every subplot with data draws A and B; the MFU subplot's two lines share the one x axis.
    runs = page.evaluate(
        """() => document.getElementById('overlay').data
              .filter(t => t.meta && t.meta.key === 'mfu').map(t => [t.meta.run, t.xaxis, t.x[0]])"""
    )
    assert runs == [["a", "x", 0], ["b", "x", 0]]
    assert page.locator("#overlay .scatterlayer .trace").count() >= 10
    x_axis = page.evaluate("document.getElementById('overlay')._fullLayout.xaxis.title.text")
    assert x_axis == "hours since the run started"
    assert page.evaluate("document.getElementById('per-gpu-plot').data.length") == 2
    # The page's numbers; escaped finding title.
    assert page.locator('tr[data-kpi="mfu"] td[data-side="delta"] .v').inner_text() == "+35.0 pts"
    assert (
        page.locator('tr[data-finding="data_pipeline_stall"] th')
        .inner_text()
        .startswith("Input stall <b>x</b>")
    )
    watched.shot("compare-page")
    assert page.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"]
    watched.assert_clean()


@db
def test_a_bad_id_shows_the_reason_without_errors(watched, live_server, member, pair):
    a, _ = pair
    log_in(watched, live_server.url, member.username)
    page = watched.page
    response = page.goto(f"{live_server.url}/jobs/compare/?a={a.external_id}&b=missing-run")
    assert response is not None and response.status == 404
    assert page.locator("#compare-error").inner_text() == "no job with external id 'missing-run'"
    # A 404 is reported on the console by the browser itself; nothing else may be.
    assert all("404" in e for e in watched.console_errors)
    assert watched.page_errors == [] and watched.csp_violations() == []
