"""The job page's json_script element built from cached, already serialised figure members."""

from __future__ import annotations

import json
import re

from jobs.views.page_json import dumps, escape_script_json, json_script, page_json


def _element_json(html: str) -> str:
    match = re.fullmatch(r'<script id="job-data" type="application/json">(.*)</script>', html, re.S)
    assert match, html
    return match.group(1)


def test_spliced_page_json_is_the_same_object_and_escaping_as_json_script() -> None:
    figures = {
        "timeseries": {"data": [{"name": "</script><!-- & >", "y": [1.5, None]}], "layout": {}},
        "heatmap": {"data": [{"type": "heatmap", "z": [[0.1]]}]},
    }
    page = {"refresh_url": "/jobs/a&b/figures.json", "finding_bands": [{"code": "<x>"}], "running": True}
    members = escape_script_json(dumps(figures).decode()[1:-1])
    spliced = _element_json(str(page_json(page, members, "job-data")))
    reference = _element_json(str(json_script(page | figures, "job-data")))
    # Nothing in user data can close the element or open a comment, exactly as json_script escapes it.
    assert "<" not in spliced and ">" not in spliced and "&" not in spliced
    assert json.loads(spliced) == json.loads(reference) == page | figures
