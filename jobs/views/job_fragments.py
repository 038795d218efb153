"""Parts of the job page that read the same for every viewer, rendered once and kept as HTML in the cache.

A fragment is keyed by a digest of the data it is drawn from (content-addressed), not by the events that
change that data: whatever changes the data (a poll, a re-finalize, a change of dtype or GPU model, an
artifact's exclusion) changes the key, so no invalidation can be forgotten, and an identical fragment is
shared by every job page view until then. A fragment must not contain anything that depends on the
request: no user, no CSRF token, no messages (tests/test_job_page_fragments.py checks the roofline's).

Why: the roofline section's per-GPU table is one row per GPU with three unit filters each; on a 256-GPU
job it was about a third of the page's rendering time (benchmarks/pages.py, issue 26 item 4)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from django.core.cache import cache
from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe

from jobs.outputs.roofline import page_lines as roofline_page_lines
from jobs.views.page_json import dumps

#: As long as the whole-job figures (jobs.views.job_figures.FIGURES_CACHE_S): the key changes with the data
#: anyway; the expiry only bounds what a deleted job's fragments leave behind.
FRAGMENT_CACHE_S = 600

#: Bump when a fragment's template or the code that fills it changes: entries of the old layout are then
#: never served by a newly deployed process.
LAYOUT_VERSION = 1


def cached_fragment(name: str, data: Any, render: Callable[[], str]) -> SafeString:
    """The HTML `render()` returns for `data`, from the cache when the same data was rendered before.
    `data` must hold everything the fragment shows (it is serialised with orjson for the key)."""
    digest = hashlib.sha256(dumps(data)).hexdigest()
    key = f"job-fragment:{name}:{LAYOUT_VERSION}:{digest}"
    html = cache.get(key)
    if html is None:
        html = str(render())
        cache.set(key, html, FRAGMENT_CACHE_S)
    return mark_safe(html)  # rendered by our template, which escaped every value


def roofline_section(roofline: dict[str, Any]) -> SafeString:
    """The page's roofline section (templates/jobs/job_roofline.html) for `job_roofline_data`'s result:
    the roofs, the job's placement, the per-GPU table and the caveats."""
    summary = roofline["summary"]
    has_figure = roofline["figure"] is not None

    def render() -> str:
        context = {"r": summary, "l": roofline_page_lines(summary), "has_roofline_figure": has_figure}
        return render_to_string("jobs/job_roofline.html", context)

    return cached_fragment("roofline", {"summary": summary, "figure": has_figure}, render)
