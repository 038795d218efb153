"""The comparison page: two runs side by side (/jobs/compare/?a=<before>&b=<after>). Login required (the
middleware), read rules as for job pages (jobs.access.permissions: another team's job is not found)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from jobs import charts
from jobs.outputs.compare_data import CompareError, build, get_pair
from jobs.views.page_json import json_script


@require_GET
def job_compare(request: HttpRequest) -> HttpResponse:
    """A (before) against B (after): config diff, KPIs with their significance, findings diff, signals on
    one relative time axis, per-GPU means, trace diff. Without ids: the form to pick two runs; a missing or
    repeated id: 400; an unknown id: 404, each with the reason on the page."""
    a_id, b_id = request.GET.get("a", ""), request.GET.get("b", "")
    context: dict[str, object] = {"a_id": a_id, "b_id": b_id}
    if not a_id and not b_id:
        return render(request, "jobs/compare.html", context)
    try:
        a, b = get_pair(a_id, b_id, request.user)
    except CompareError as exc:
        return render(request, "jobs/compare.html", context | {"error": exc.message}, status=exc.status)
    built = build(a, b, points=charts.DEFAULT_POINTS)
    page_data = {"comparison": built.comparison, "figures": built.figures}
    query = urlencode({"a": a.external_id, "b": b.external_id})
    context |= {
        "a": a,
        "b": b,
        "c": built.comparison,
        "figures": built.figures,
        "page_json": json_script(page_data, "compare-data"),
        "api_url": reverse("api-job-compare") + "?" + query,
        "swap_url": reverse("job-compare") + "?" + urlencode({"a": b.external_id, "b": a.external_id}),
    }
    return render(request, "jobs/compare.html", context)
