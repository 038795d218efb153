"""The vendored partial plotly.js bundle (static/vendor/plotly.min.js) draws every figure the pages build."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENTRY = REPO / "static" / "vendor" / "plotly-bundle" / "entry.js"
BUNDLE = REPO / "static" / "vendor" / "plotly.min.js"
# "type" values in jobs/charts/ that are not trace types: axis types and shape types.
_NOT_TRACES = {"linear", "log", "date", "category", "multicategory", "rect", "line", "circle", "path"}


def _chart_trace_types() -> set[str]:
    found: set[str] = set()
    for path in (REPO / "jobs" / "charts").glob("*.py"):
        found |= set(re.findall(r"\"type\": \"(\w+)\"", path.read_text()))
    return found - _NOT_TRACES


def test_every_trace_type_the_charts_build_is_registered_in_the_bundle_entry() -> None:
    registered = {"scatter"} | set(re.findall(r"require\('plotly\.js/lib/(\w+)'\)", ENTRY.read_text()))
    registered.discard("core")
    traces = _chart_trace_types()
    assert traces >= {"scatter", "heatmap", "bar", "icicle"}  # what jobs/charts/ draws today
    assert traces <= registered, f"add {sorted(traces - registered)} to {ENTRY} and run `make plotly-bundle`"


def test_vendored_bundle_is_the_plotly_js_version_of_the_pinned_python_package_and_partial() -> None:
    head = BUNDLE.read_text(encoding="utf-8")[:400]
    version = re.search(r"plotly\.js v(\d+\.\d+\.\d+) partial bundle", head)
    assert version, head[:200]
    lock = (REPO / "static" / "vendor" / "plotly-bundle" / "package-lock.json").read_text()
    assert f'"node_modules/plotly.js": {{\n      "version": "{version[1]}"' in lock
    # plotly 7.1.0 (pyproject.toml) ships plotly.js 4.1.1: the figures' schema is that version's.
    assert version[1] == "4.1.1"
    # The full bundle is 4.8 MB; the partial one must stay well under half of it.
    assert 1_000_000 < BUNDLE.stat().st_size < 2_000_000
    assert (REPO / "static" / "vendor" / "LICENSE.plotly.txt").read_text().startswith("MIT License")
