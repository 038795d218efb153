"""`{% compare_candidates job as runs %}`: the runs a job page offers to compare with (previous and next
run of the same config fingerprint or model, the baseline's runs), each as before/after ids."""

from __future__ import annotations

from typing import Any

from django import template
from django.urls import reverse
from django.utils.http import urlencode

from jobs.access.permissions import readable_jobs, readable_team_ids
from jobs.models import Baseline, Job

register = template.Library()
BASELINE_RUNS = 5
#: The Job fields a candidate link uses (template: name, external_id, started_at; matching: the rest).
_LINK_FIELDS = ("id", "external_id", "name", "team_id", "started_at", "config_fingerprint", "model_name")


def _link(job: Job, other: Job, label: str) -> dict[str, Any]:
    before, after = (other, job) if other.started_at <= job.started_at else (job, other)
    return {
        "label": label,
        "other": other,
        "url": reverse("job-compare") + "?" + urlencode({"a": before.external_id, "b": after.external_id}),
    }


@register.simple_tag(takes_context=True)
def compare_candidates(
    context: template.Context, job: Job, baseline: Baseline | str | None = None
) -> list[dict[str, Any]]:
    """Previous / next run with the same config fingerprint, else of the same model; the runs of
    `baseline` (the page's already-loaded active baseline, runs prefetched). Earlier run first (A = before).
    One query: the four neighbours are read in one UNION. Only runs the viewer may read are offered (read
    policy: another team's run is neither named nor linked)."""
    request = context.get("request")
    user = getattr(request, "user", None)
    # Only what the links show and the matching needs: four unioned copies of every Job column cost more
    # to compile and fetch than the page's other queries together.
    others = readable_jobs(user, Job.objects.exclude(pk=job.pk)).only(*_LINK_FIELDS)
    parts = []
    for field, value in (("config_fingerprint", job.config_fingerprint), ("model_name", job.model_name)):
        if not value:
            continue
        same = others.filter(**{field: value})
        parts.append(same.filter(started_at__lte=job.started_at).order_by("-started_at")[:1])
        parts.append(same.filter(started_at__gt=job.started_at).order_by("started_at")[:1])
    neighbours = list(parts[0].union(*parts[1:], all=True)) if parts else []
    out: list[dict[str, Any]] = []
    seen = {job.pk}
    for field, value, what in (
        ("config_fingerprint", job.config_fingerprint, "with this config"),
        ("model_name", job.model_name, f"of {job.model_name}"),
    ):
        if not value:
            continue
        same_runs = [o for o in neighbours if getattr(o, field) == value]
        earlier = max((o for o in same_runs if o.started_at <= job.started_at), key=lambda o: o.started_at,
                      default=None)  # fmt: skip
        later = min((o for o in same_runs if o.started_at > job.started_at), key=lambda o: o.started_at,
                    default=None)  # fmt: skip
        for other, when in ((earlier, "previous run"), (later, "next run")):
            if other is not None and other.pk not in seen:
                seen.add(other.pk)
                out.append(_link(job, other, f"{when} {what}"))
    if isinstance(baseline, Baseline):  # the template passes "" when the job has no baseline
        readable = readable_team_ids(user)
        runs = [
            r for r in baseline.runs.all() if r.pk not in seen and (readable is None or r.team_id in readable)
        ]
        for run in sorted(runs, key=lambda r: r.started_at, reverse=True)[:BASELINE_RUNS]:
            seen.add(run.pk)
            out.append(_link(job, run, "baseline run"))
    return out
