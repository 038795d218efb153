"""Alert state for pages whose views belong to others: the job page's alert block and the job list's
open-alert marks, computed here so the views stay as they are."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django import template
from django.db.models import Count

from jobs.diagnosis.base import finding_name
from jobs.models import AlertIncident, Finding, Job

register = template.Library()
RECENT = 5


#: What the job page's alert block shows of an incident (its evidence JSON is for messages, not the page).
_BLOCK_FIELDS = ("id", "rule", "job", "started_at", "resolved_at", "finding", "finding_code", "title",
                 "resolve_reason")  # fmt: skip


@register.inclusion_tag("jobs/alerts_job_block.html")
def job_alerts(job: Job, findings: Mapping[int, Finding] | None = None) -> dict[str, Any]:
    """The job's open incidents and its last few resolved ones (one query). `findings`: the job's findings
    by id as the page already read them; an incident's finding is taken from there rather than joined
    again, and read only when it is not among them (created after the page read its findings)."""
    rows = list(AlertIncident.objects.filter(job=job).only(*_BLOCK_FIELDS).order_by("-started_at")[:50])
    known = findings or {}
    missing = {i.finding_id for i in rows if i.finding_id is not None and i.finding_id not in known}
    loaded = {**known, **(Finding.objects.in_bulk(missing) if missing else {})}
    cache_finding = AlertIncident.finding.field.set_cached_value
    for incident in rows:
        if incident.finding_id is not None:
            # A finding deleted since the incident row was read shows as none, as the join showed it.
            cache_finding(incident, loaded.get(incident.finding_id))
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


#: Why an alert of a rule that has no finding of its own shows none.
_NO_FINDING: dict[str, str] = {
    AlertIncident.Rule.INGESTION_STALE: (
        "no finding: this alert is about the job's data not arriving, not about how the job uses its GPUs"
    ),
    AlertIncident.Rule.WASTE: "no single finding: the job's total waste; the job's findings name its causes",
}


@register.filter
def incident_finding_note(incident: AlertIncident) -> str:
    """For an incident shown without a linked finding, why: its rule has no finding of its own, or the
    job's diagnosis has (had) no finding of that kind, named in words rather than by its code."""
    if incident.finding_id is not None:
        return ""
    if incident.finding_code:
        name = finding_name(incident.finding_code)
        return (
            f"no “{name}” finding on the job now: the alert judged the last minutes, the diagnosis judges "
            "the job's whole window at its own resolution, and it did not find (or no longer finds) the "
            "pattern there"
        )
    return _NO_FINDING.get(str(incident.rule), "no finding is linked to this alert")


@register.filter
def rule_names(rules: Iterable[str]) -> str:
    """Alert rule codes as people read them ("GPUs idle, Throttling"), not as stored ("gpus_idle")."""
    labels = dict(AlertIncident.Rule.choices)
    return ", ".join(str(labels.get(r, r.replace("_", " "))) for r in rules)
