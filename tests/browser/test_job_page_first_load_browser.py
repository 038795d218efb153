"""The job page's first draw in headless Chromium (issue 15, the cold load): the heatmap's colour scale drawn
in HTML (plotly's colour bar is not drawn), and the charts drawn whichever of plotly.js (async) and job.js
(deferred) runs first. Screenshots: test-artifacts/screenshots/."""

from __future__ import annotations

import pytest

from tests.browser import data
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.prometheus]
db = pytest.mark.django_db(transaction=True)


@pytest.fixture
def job(prom, sims, member):
    job = data.register(sims["7001"], member.teams.get(), ended=True)
    return data.ingest(job, prom.url, ended=True)


@db
def test_the_heatmap_colour_scale_is_html_with_the_figure_limits(watched, live_server, member, job):
    log_in(watched, live_server.url, member.username)
    page = watched.page
    page.goto(f"{live_server.url}/jobs/{job.external_id}/")
    page.wait_for_selector("body[data-charts-ready]")
    zmin, zmax = page.evaluate("(() => { const t = document.getElementById('heatmap').data[0];"
                               " return [t.zmin, t.zmax]; })()")  # fmt: skip
    assert page.locator("#heatmap .colorbar").count() == 0  # plotly drew none
    scale = page.locator(".html-scale")
    assert scale.count() == 1
    # Labels every 10 points (20 above a 50-point span) from the lowest multiple at or above zmin to zmax.
    step = 10 if zmax - zmin <= 50 else 20
    expected = [str(v) for v in range(-(-zmin // step) * step, zmax + 1, step)]
    labels = scale.locator("span").all_inner_texts()
    assert labels[:-1] == expected and labels[-1] == "SM active, %"
    assert (
        scale.get_attribute("aria-label") == f"Colour scale of SM active, %: darkest {zmin}, lightest {zmax}"
    )
    # Beside the plot, inside the figure: right of the plot area, within the heatmap's box.
    box = page.evaluate("""(() => {
        const el = document.getElementById('heatmap'), s = el._fullLayout._size;
        const r = el.getBoundingClientRect();
        const b = document.querySelector('.html-scale').getBoundingClientRect();
        return [r.left + s.l + s.w, r.right, b.left, b.right, r.top + s.t, b.top, s.h, b.height]; })()""")
    plot_right, div_right, left, right, plot_top, top, plot_h, height = box
    assert plot_right <= left and right <= div_right
    assert top == pytest.approx(plot_top, abs=1) and height == pytest.approx(plot_h, abs=1)
    watched.shot("heatmap-html-colour-scale", selector="#heatmap")
    watched.assert_clean()


@db
def test_the_charts_are_drawn_when_plotly_arrives_after_the_page_script(watched, live_server, member, job):
    log_in(watched, live_server.url, member.username)
    page = watched.page
    held = []
    # plotly.js (and its preload) answered only later; a hashed name as deployed, a plain one in tests.
    page.route("**/vendor/plotly.min*.js", lambda route: held.append(route))
    # DOMContentLoaded: the page is parsed and the deferred job.js has run; the async plotly.js has not.
    page.goto(f"{live_server.url}/jobs/{job.external_id}/", wait_until="domcontentloaded")
    assert held
    assert page.evaluate("window.Plotly === undefined && !document.body.hasAttribute('data-first-chart')")
    for route in held:
        route.continue_()
    page.wait_for_selector("body[data-charts-ready]")
    assert page.locator("#timeseries .scatterlayer .trace").count() >= 8
    assert page.locator(".html-legend").count() >= 8 and page.locator(".html-scale").count() == 1
    watched.assert_clean()
