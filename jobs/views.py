"""Server-rendered pages. Login is required everywhere (see efficiency.middleware)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.decorators import login_not_required
from django.core.paginator import Paginator
from django.db.models import Count, F, Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.utils.dateparse import parse_date
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from jobs.health import run_checks
from jobs.leaderboard import Period, iso_week, month, parse_iso_week, team_rows, worst_jobs
from jobs.models import Baseline, GpuModel, Job, Team
from jobs.summary import job_summary, summary_queryset

_SORTS = {
    "mfu": "mfu",
    "-mfu": "-mfu",
    "waste": "waste_per_day_usd",
    "-waste": "-waste_per_day_usd",
    "started": "started_at",
    "-started": "-started_at",
}


@login_not_required
@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Database, Redis and Prometheus reachability: 200 when all answer, 503 otherwise."""
    result = run_checks()
    return JsonResponse(result, status=200 if result["ok"] else 503)


def job_list(request: HttpRequest) -> HttpResponse:
    """All jobs, filterable by team, owner, model, GPU model, status and time; sortable by MFU and waste."""
    params = request.GET
    qs = Job.objects.select_related("team", "gpu_model")
    filters = {
        "team": params.get("team", ""),
        "owner": params.get("owner", ""),
        "model": params.get("model", ""),
        "gpu": params.get("gpu", ""),
        "status": params.get("status", ""),
        "since": params.get("since", ""),
        "until": params.get("until", ""),
    }
    if filters["team"]:
        qs = qs.filter(team__slug=filters["team"])
    if filters["owner"]:
        qs = qs.filter(owner=filters["owner"])
    if filters["model"]:
        qs = qs.filter(model_name=filters["model"])
    if filters["gpu"]:
        qs = qs.filter(gpu_model__name=filters["gpu"])
    if filters["status"] in Job.Status.values:
        qs = qs.filter(status=filters["status"])
    errors = []
    for key, lookup in (("since", "started_at__gte"), ("until", "started_at__lt")):
        if filters[key]:
            day = parse_date(filters[key])
            if day is None:
                errors.append(f"'{filters[key]}' is not a date (YYYY-MM-DD); the {key} filter was ignored.")
            else:
                when = datetime.combine(day, datetime.min.time(), tzinfo=timezone.get_current_timezone())
                qs = qs.filter(**{lookup: when})
    sort = params.get("sort", "-started")
    order = _SORTS.get(sort, "-started_at")
    field = order.lstrip("-")
    ordered = F(field).desc(nulls_last=True) if order.startswith("-") else F(field).asc(nulls_last=True)
    qs = qs.order_by(ordered, "-started_at")
    page = Paginator(qs, 50).get_page(params.get("page"))
    context = {
        "page": page,
        "filters": filters,
        "sort": sort,
        "errors": errors,
        "teams": Team.objects.order_by("name"),
        "gpu_models": GpuModel.objects.filter(jobs__isnull=False).distinct().order_by("name"),
        "models": Job.objects.order_by("model_name").values_list("model_name", flat=True).distinct(),
        "statuses": Job.Status.choices,
    }
    return render(request, "jobs/job_list.html", context)


def job_detail(request: HttpRequest, external_id: str) -> HttpResponse:
    """The job page: config, KPIs with definitions, findings ranked by $/day, artifacts, readiness."""
    job = get_object_or_404(summary_queryset(), external_id=external_id)
    summary = job_summary(job)
    return render(request, "jobs/job_detail.html", {"job": job, "summary": summary})


def _period_from(request: HttpRequest) -> tuple[Period, list[str]]:
    errors: list[str] = []
    if week := request.GET.get("week"):
        try:
            return parse_iso_week(week), errors
        except ValueError as exc:
            errors.append(str(exc))
    if month_s := request.GET.get("month"):
        try:
            return month(datetime.strptime(month_s, "%Y-%m").date()), errors
        except ValueError:
            errors.append(f"{month_s!r} is not a month like 2026-11")
    if request.GET.get("by") == "month":
        return month(timezone.now().date()), errors
    return iso_week(timezone.now().date()), errors


def leaderboard(request: HttpRequest) -> HttpResponse:
    """Teams ranked by GPU-hour-weighted MFU over a week or month, with change vs the previous period."""
    period, errors = _period_from(request)
    previous = period.previous()
    rows = team_rows(period)
    before = {r.team_id: r for r in team_rows(previous)}
    sort = request.GET.get("sort", "mfu")
    keys: dict[str, Any] = {
        "mfu": lambda r: -(r.weighted_mfu if r.weighted_mfu is not None else -1),
        "waste": lambda r: -r.waste_usd,
        "cost": lambda r: -r.cost_usd,
        "gpu_hours": lambda r: -r.gpu_hours,
        "team": lambda r: r.team_name.lower(),
    }
    rows.sort(key=keys.get(sort, keys["mfu"]))
    table = [
        {"row": r, "delta": (r.waste_usd - before[r.team_id].waste_usd) if r.team_id in before else None}
        for r in rows
    ]
    context = {
        "period": period,
        "previous": previous,
        "next": (iso_week(period.end.date()) if "-W" in period.label else month(period.end.date())),
        "by": "month" if "-W" not in period.label else "week",
        "table": table,
        "sort": sort,
        "worst": worst_jobs(period, limit=10),
        "errors": errors,
    }
    return render(request, "jobs/leaderboard.html", context)


def team_list(request: HttpRequest) -> HttpResponse:
    """Teams with their members and job counts."""
    teams = Team.objects.annotate(
        n_jobs=Count("jobs", distinct=True),
        n_running=Count("jobs", filter=Q(jobs__status=Job.Status.RUNNING), distinct=True),
        n_members=Count("memberships", distinct=True),
    ).order_by("name")
    return render(request, "jobs/team_list.html", {"teams": teams})


def team_detail(request: HttpRequest, slug: str) -> HttpResponse:
    """One team: members, this week's numbers, recent jobs, baselines."""
    team = get_object_or_404(Team, slug=slug)
    period = iso_week(timezone.now().date())
    row = next((r for r in team_rows(period) if r.team_id == team.pk), None)
    context = {
        "team": team,
        "members": team.memberships.select_related("user").order_by("user__username"),
        "period": period,
        "row": row,
        "jobs": team.jobs.select_related("gpu_model").order_by("-started_at")[:25],
        "baselines": team.baselines.filter(retired_at__isnull=True).order_by("model_name"),
        "since": timezone.now() - timedelta(days=7),
    }
    return render(request, "jobs/team_detail.html", context)


def baseline_list(request: HttpRequest) -> HttpResponse:
    """Active (and optionally retired) baselines with their robust statistics."""
    show_retired = request.GET.get("retired") == "1"
    qs = (
        Baseline.objects.select_related("team").prefetch_related("runs").order_by("model_name", "-created_at")
    )
    if not show_retired:
        qs = qs.filter(retired_at__isnull=True)
    return render(request, "jobs/baseline_list.html", {"baselines": qs, "show_retired": show_retired})
