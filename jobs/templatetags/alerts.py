"""Alert state for pages whose views belong to others: the job page's alert block and the job list's
open-alert marks, computed here so the views stay as they are."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import template
from django.db.models import Count

from jobs.models import AlertIncident, Job

register = template.Library()
RECENT = 5


@register.inclusion_tag("jobs/alerts_job_block.html")
def job_alerts(job: Job) -> dict[str, Any]:
    """The job's open incidents and its last few resolved ones (one query)."""
    rows = list(AlertIncident.objects.filter(job=job).select_related("finding").order_by("-started_at")[:50])
    return {
        "job": job,
        "open": [i for i in rows if i.resolved_at is None],
        "resolved": [i for i in rows if i.resolved_at is not None][:RECENT],
    }


@register.simple_tag
def open_alert_counts(jobs: Iterable[Job]) -> dict[int, int]:
    """{job id: number of open incidents} for the jobs of a list page (one query for the page)."""
    ids = [j.pk for j in jobs]
    rows = (
        AlertIncident.objects.filter(job_id__in=ids, resolved_at__isnull=True)
        .values("job_id")
        .annotate(n=Count("id"))
    )
    return {r["job_id"]: r["n"] for r in rows}


@register.filter
def alert_count(counts: dict[int, int] | None, job: Job) -> int:
    return (counts or {}).get(job.pk, 0)
