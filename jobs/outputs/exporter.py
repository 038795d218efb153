"""/metrics: per-job MFU, cost, waste and finding counts in Prometheus text format, for Grafana users.

Only running jobs and jobs that ended in the last week are exported, so the number of series stays
bounded however long the job history grows.

Labels: every series carries `job_id` (the scheduler's id; not `job`, which is Prometheus' own target
label and would be renamed `exported_job` on scrape) and `team`, which never change during a job. What
does change or only describes the job (`status`, `model`, `gpu_model`, `name`) is on one info metric,
`efficiency_job_info{...} 1`, joined in queries with `* on (job_id) group_left (status) efficiency_job_info`:
a job finishing does not start new series. The dashboard and rules in efficiency/deploy/ read these names.
"""

from __future__ import annotations

import hmac
from collections import Counter
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from jobs.evaluation.kpis import CONVENTION_LABELS
from jobs.models import Finding, Job

RECENT = timedelta(days=7)
INFO = "efficiency_job_info"
_GAUGES = (
    ("efficiency_job_mfu_ratio", "mfu", "Model FLOPs utilization of the job ({convention}), 0-1."),
    ("efficiency_job_hfu_ratio", "hfu", "Hardware FLOPs utilization incl. recomputation, 0-1."),
    ("efficiency_job_tokens_per_second", "tokens_per_second", "Training throughput of the whole job."),
    ("efficiency_job_sm_active_ratio", "sm_active_mean", "Mean DCGM SM active over the job's GPUs, 0-1."),
    ("efficiency_job_cost_usd_per_day", "cost_per_day_usd", "GPUs x USD per GPU-hour x 24 (price book)."),
    (
        "efficiency_job_waste_usd_per_day",
        "waste_per_day_usd",
        "Total waste: cost/day x max(idle share, 1 - MFU / reference MFU); absent when MFU is unknown.",
    ),
    (
        "efficiency_job_waste_lower_bound_usd_per_day",
        "waste_lower_bound_per_day_usd",
        "What is certainly wasted, USD/day: the total when known, else the idle part.",
    ),
    (
        "efficiency_job_idle_waste_usd_per_day",
        "idle_waste_per_day_usd",
        "cost/day x share of observed GPU time at ~0 % GPU_UTIL (needs no MFU).",
    ),
    (
        "efficiency_job_waste_known",
        "waste_known",
        "1 when the total waste is computed, 0 when only its lower bound is known (MFU or price missing).",
    ),
    (
        "efficiency_job_mfu_fallback",
        "mfu_fallback",
        "1 when the job's MFU used 6N because its shape lacks what the organisation's convention needs.",
    ),
    ("efficiency_job_gpus", "gpu_count", "GPUs allocated to the job."),
)


def _value(job: Job, field: str) -> float | None:
    if field == "waste_known":
        return None if job.cost_per_day_usd is None else float(job.waste_per_day_usd is not None)
    if field == "mfu_fallback":
        return None if job.mfu is None else float(job.mfu_fallback)
    value = getattr(job, field)
    return None if value is None else float(value)


def escape(value: str) -> str:
    """A label value escaped for the text exposition format."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render() -> str:
    """The exposition text."""
    since = timezone.now() - RECENT
    jobs = list(
        Job.objects.filter(Q(ended_at__isnull=True) | Q(ended_at__gte=since))
        .select_related("team", "gpu_model")
        .order_by("external_id")
    )
    labels = {j.pk: f'job_id="{escape(j.external_id)}",team="{escape(j.team.slug)}"' for j in jobs}
    lines: list[str] = [
        f"# HELP {INFO} The job's descriptive labels (status, model, GPU model, name); value 1.",
        f"# TYPE {INFO} gauge",
    ]
    for j in jobs:
        lines.append(
            f'{INFO}{{{labels[j.pk]},status="{j.status}",model="{escape(j.model_name)}",'
            f'gpu_model="{escape(j.gpu_model.name if j.gpu_model else "unknown")}",'
            f'name="{escape(j.name)}"}} 1'
        )
    convention = CONVENTION_LABELS[settings.MFU_FLOPS_CONVENTION]
    for name, field, help_text in _GAUGES:
        lines += [f"# HELP {name} {help_text.format(convention=convention)}", f"# TYPE {name} gauge"]
        for job in jobs:
            value = _value(job, field)
            if value is not None:
                lines.append(f"{name}{{{labels[job.pk]}}} {float(value):.6g}")
    counts = Counter(
        Finding.objects.filter(job_id__in=labels).values_list("job_id", "code", "severity").iterator()
    )
    lines += [
        "# HELP efficiency_job_findings Open diagnosis findings of the job by code and severity.",
        "# TYPE efficiency_job_findings gauge",
    ]
    for (job_id, code, severity), n in sorted(counts.items()):
        lines.append(
            f'efficiency_job_findings{{{labels[job_id]},code="{escape(code)}",severity="{severity}"}} {n}'
        )
    return "\n".join(lines) + "\n"


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape endpoint; with METRICS_TOKEN set, requires `Authorization: Bearer <token>`."""
    token = settings.METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            return HttpResponse("a bearer token is required\n", status=401, content_type="text/plain")
    return HttpResponse(render(), content_type="text/plain; version=0.0.4; charset=utf-8")
