"""List pages: jobs, team leaderboard, teams, baselines, GPU catalog and price book, cluster readiness."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, Exists, OuterRef, Prefetch, Q
from django.db.models.functions import Lower
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from jobs.access.permissions import (
    can_set_budget,
    can_write_team,
    readable_jobs,
    readable_team_ids,
    readable_team_or_404,
    scope_to_teams,
    writable_team_ids,
)
from jobs.charts import sparkline_points
from jobs.evaluation import baselines as baseline_ops
from jobs.evaluation.baseline_stats import MetricStats, decode_stats
from jobs.evaluation.catalog import DTYPES
from jobs.evaluation.costs import Amount
from jobs.evaluation.kpis import CONVENTION_LABELS
from jobs.metrics import engine_signals
from jobs.metrics.signals import SIGNALS, readiness
from jobs.models import Baseline, Finding, GpuModel, Job, PriceEntry, PromotionOverride, Team
from jobs.models.jobs import FINDING_RANK_ORDER, REMAINDER_CODE
from jobs.outputs.budget import budget_use, month_end_projection
from jobs.outputs.leaderboard import (
    Period,
    iso_week,
    last_weeks,
    mfu_trend,
    month,
    parse_iso_week,
    parse_month,
    period_rows,
    worst_jobs,
)
from jobs.runtime.health import engine_source, node_exporter_source, run_checks
from jobs.views.filters import BaselineFilterSet, filters_query, job_filterset
from jobs.views.job_summary import no_gpus_matched

# What the list shows; the JSON columns (summary, config, GPU list) stay in the database.
_LIST_FIELDS = (
    "external_id", "name", "owner", "model_name", "gpu_count", "gpu_model_name", "status", "started_at",
    "ended_at", "mfu", "sm_active_mean", "gpu_hours", "cost_usd", "waste_per_day_usd",
    "waste_lower_bound_per_day_usd", "waste_unknown_reason",
    "team__name", "team__slug", "gpu_model__name",
    # The total waste is the wasted share of the stored cost (templatetags.units.job_waste_total).
    "cost_per_day_usd",
)  # fmt: skip

log = logging.getLogger(__name__)


@login_not_required
@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Database, Redis and Prometheus reachability: 200 when all answer, 503 otherwise."""
    result = run_checks()
    return JsonResponse(result, status=200 if result["ok"] else 503)


@dataclass
class JobFilter:
    """The job list's filters as read from the query string (`jobs.views.filters.JobFilterSet`, shared by
    the page, its CSV export and the API)."""

    queryset: Any
    filters: dict[str, str]
    sort: str
    errors: list[str]

    @property
    def query(self) -> str:
        """The filters as a query string (without the sort), for links that keep them."""
        return filters_query(self.filters)


def filter_jobs(request: HttpRequest) -> JobFilter:
    """The jobs the list shows for the request's query string (`JobFilterSet`), only the list's columns."""
    found = job_filterset(
        request, readable_jobs(request.user, Job.objects.select_related("team", "gpu_model"))
    )
    return JobFilter(found.qs.only(*_LIST_FIELDS), found.shown(), found.ordering, found.problems())


@require_GET
def job_list(request: HttpRequest) -> HttpResponse:
    """All jobs, searchable and filterable (see `filter_jobs`); sortable by start, MFU and waste."""
    found = filter_jobs(request)
    page = Paginator(found.queryset, 50).get_page(request.GET.get("page"))
    query = found.query
    sort = found.sort
    context = {
        "page": page,
        "filters": found.filters,
        "sort": sort,
        "errors": found.errors,
        "teams": scope_to_teams(Team.objects.order_by("name"), request.user, "id"),
        # EXISTS probes the job table's gpu_model index instead of joining every job.
        "gpu_models": GpuModel.objects.filter(
            Exists(readable_jobs(request.user).filter(gpu_model=OuterRef("pk")))
        ).order_by("name"),
        "models": readable_jobs(request.user)
        .exclude(model_name="")
        .order_by("model_name")
        .values_list("model_name", flat=True)
        .distinct(),
        "statuses": Job.Status.choices,
        "filter_query": query,
        "csv_query": urlencode({**{k: v for k, v in found.filters.items() if v}, "sort": sort}),
        "sort_links": {name: _sort_link(sort, name) for name in ("started", "mfu", "waste")},
    }
    return render(request, "jobs/job_list.html", context, status=400 if found.errors else 200)


def _sort_link(current: str, name: str) -> dict[str, str]:
    """Next sort for a column header (descending first) and its aria-sort state."""
    if current == f"-{name}":
        return {"next": name, "aria": "descending"}
    if current == name:
        return {"next": f"-{name}", "aria": "ascending"}
    return {"next": f"-{name}", "aria": "none"}


def _period_from(request: HttpRequest) -> tuple[Period, list[str]]:
    errors: list[str] = []
    if week := request.GET.get("week"):
        try:
            return parse_iso_week(week), errors
        except ValueError as exc:
            errors.append(str(exc))
    if month_s := request.GET.get("month"):
        try:
            return parse_month(month_s), errors
        except ValueError as exc:
            errors.append(str(exc))
    if request.GET.get("by") == "month":
        return month(timezone.now().date()), errors
    return iso_week(timezone.now().date()), errors


@dataclass
class LeaderRow:
    """One team on the leaderboard with its change against the previous period and its 8-week trend."""

    row: Any
    before: Any
    trend: list[float | None]
    spark: list[str]
    #: Whether the viewer may open the team's page (read policy); other teams are aggregates only.
    readable: bool = True

    @property
    def mfu_delta_pp(self) -> float | None:
        """Change of weighted MFU in percentage points."""
        if self.before is None or self.before.weighted_mfu is None or self.row.weighted_mfu is None:
            return None
        return (self.row.weighted_mfu - self.before.weighted_mfu) * 100

    @property
    def waste_delta(self) -> float | None:
        """Change of waste in USD; None when either period's waste is only a lower bound."""
        if self.before is None or self.row.waste_usd is None or self.before.waste_usd is None:
            return None
        return self.row.waste_usd - self.before.waste_usd

    @property
    def cost_delta(self) -> float | None:
        """Change of cost in USD."""
        return None if self.before is None else self.row.cost_usd - self.before.cost_usd

    @property
    def gpu_hours_delta(self) -> float | None:
        """Change of GPU hours."""
        return None if self.before is None else self.row.gpu_hours - self.before.gpu_hours

    @property
    def mfu_delta_text(self) -> str:
        """'+2.1 pp' / '−0.4 pp' against the previous period, or why there is none."""
        delta = self.mfu_delta_pp
        return "no earlier MFU" if delta is None else f"{'+' if delta >= 0 else '−'}{abs(delta):.1f} pp"

    @property
    def gpu_hours_delta_text(self) -> str:
        """'+120 GPU-h' / '−40 GPU-h' against the previous period."""
        delta = self.gpu_hours_delta
        return "new this period" if delta is None else f"{'+' if delta >= 0 else '−'}{abs(delta):,.0f} GPU-h"

    @property
    def trend_text(self) -> str:
        """The trend for screen readers."""
        return ", ".join("no data" if v is None else f"{v * 100:.0f} %" for v in self.trend)


_LEADER_SORTS: dict[str, Any] = {
    "mfu": lambda r: -(r.row.weighted_mfu if r.row.weighted_mfu is not None else -1),
    "waste": lambda r: -r.row.waste_lower_bound_usd,
    "cost": lambda r: -r.row.cost_usd,
    "gpu_hours": lambda r: -r.row.gpu_hours,
    "team": lambda r: r.row.team_name.lower(),
}


@require_GET
def leaderboard(request: HttpRequest) -> HttpResponse:
    """Teams ranked by GPU-hour-weighted MFU over a week or month, with change vs the previous period,
    an 8-week MFU sparkline and the most wasteful jobs (3 queries besides the session)."""
    context = leaderboard_context(request)
    # Other teams are aggregates only: the worst jobs are those of teams the viewer may read.
    worst = worst_jobs(context["period"], limit=10, scope=lambda qs: readable_jobs(request.user, qs))
    _attach_main_finding(worst)
    context["worst"] = worst
    return render(request, "jobs/leaderboard.html", context, status=400 if context["errors"] else 200)


def leaderboard_context(request: HttpRequest) -> dict[str, Any]:
    """The leaderboard's period and sorted team table (shared by the page and its CSV export)."""
    period, errors = _period_from(request)
    by = "month" if "-W" not in period.label else "week"
    previous = period.previous()
    weeks = last_weeks(period)
    # The week view's period and the one before are the trend's last two weeks: one aggregation for all.
    periods = weeks if by == "week" else [*weeks, previous, period]
    rows = period_rows(periods)
    current, before = rows[-1], rows[-2]
    trend_rows = rows[: len(weeks)]
    table = []
    readable = readable_team_ids(request.user)
    for r in current.values():
        trend = mfu_trend(trend_rows, r.team_id)
        table.append(
            LeaderRow(
                r,
                before.get(r.team_id),
                trend,
                sparkline_points(trend, vmax=1.0),
                readable=readable is None or r.team_id in readable,
            )
        )
    sort = request.GET.get("sort", "mfu")
    sort = sort if sort in _LEADER_SORTS else "mfu"
    table.sort(key=lambda item: (_LEADER_SORTS[sort](item), item.row.team_name.lower()))
    return {
        "period": period,
        "previous": previous,
        # No link into the future: the period after the current one has no data yet.
        "next": (iso_week(period.end.date()) if by == "week" else month(period.end.date()))
        if period.end <= timezone.now()
        else None,
        "by": by,
        "table": table,
        "sort": sort,
        "weeks": weeks,
        "errors": errors,
        "mfu_convention": CONVENTION_LABELS[settings.MFU_FLOPS_CONVENTION],
        "fallbacks": sum(r.jobs_mfu_fallback for r in current.values()),
        "low_coverage": sum(r.jobs_low_coverage for r in current.values()),
    }


def _attach_main_finding(jobs: list[Job]) -> None:
    """Set `main_finding` on each job, in one query: its top specific finding in the page's order
    (`FINDING_RANK_ORDER`); the unexplained remainder is never a job's main finding."""
    by_job: dict[int, Finding] = {}
    for f in (
        Finding.objects.filter(job__in=[j.pk for j in jobs])
        .exclude(code=REMAINDER_CODE)
        .order_by("job_id", *FINDING_RANK_ORDER)
    ):
        by_job.setdefault(f.job_id, f)
    for job in jobs:
        job.main_finding = by_job.get(job.pk)  # type: ignore[attr-defined]


@require_GET
def team_list(request: HttpRequest) -> HttpResponse:
    """Teams with their members and job counts."""
    teams = Team.objects.annotate(
        n_jobs=Count("jobs", distinct=True),
        n_running=Count("jobs", filter=Q(jobs__status=Job.Status.RUNNING), distinct=True),
        n_members=Count("memberships", distinct=True),
    ).order_by("name")
    # Every team's counts are aggregates; only readable teams' pages are linked (read policy).
    context = {"teams": teams, "readable": readable_team_ids(request.user)}
    return render(request, "jobs/team_list.html", context)


@require_GET
def team_detail(request: HttpRequest, slug: str) -> HttpResponse:
    """One team: this week's numbers and trend, members, worst and recent jobs, baselines."""
    team = readable_team_or_404(request.user, slug)
    period = iso_week(timezone.now().date())
    weeks = last_weeks(period)
    rows = period_rows(weeks)
    row = rows[-1].get(team.pk)
    trend = mfu_trend(rows, team.pk)
    worst = worst_jobs(period, limit=5, team_id=team.pk)
    _attach_main_finding(worst)
    this_month = month(timezone.now().date())
    month_row = period_rows([this_month])[0].get(team.pk)
    context = {
        "team": team,
        "month": this_month,
        "month_row": month_row,
        # $ per calendar month against the month's spend as period_rows defines it (no job: $0 spent).
        "budget": budget_use(month_row.cost if month_row else Amount(0.0), team.monthly_budget_usd),
        "projection": month_end_projection(
            month_row.cost if month_row else Amount(0.0),
            list(team.jobs.filter(status=Job.Status.RUNNING).values_list("cost_per_day_usd", flat=True)),
            (this_month.end - timezone.now()).total_seconds(),
            team.monthly_budget_usd,
        )
        if team.monthly_budget_usd is not None
        else None,
        "members": team.memberships.select_related("user").order_by("user__username"),
        "period": period,
        "row": row,
        "trend": LeaderRow(row, None, trend, sparkline_points(trend, vmax=1.0)),
        "weeks": weeks,
        "worst": worst,
        "jobs": team.jobs.select_related("gpu_model").order_by("-started_at")[:25],
        "baselines": team.baselines.filter(retired_at__isnull=True)
        .annotate(n_runs=Count("runs", distinct=True), n_overrides=Count("overrides", distinct=True))
        .order_by("model_name"),
        "report_week": period.previous().label,
        "can_set_budget": can_set_budget(request.user, team),
        "budget_form": TeamBudgetForm(instance=team),
    }
    return render(request, "jobs/team_detail.html", context)


class TeamBudgetForm(forms.ModelForm):
    """The team's monthly budget, US dollars per calendar month (UTC); empty clears it."""

    class Meta:
        model = Team
        fields = ["monthly_budget_usd"]
        labels = {"monthly_budget_usd": "Budget, $ per calendar month"}


@require_POST
def team_budget(request: HttpRequest, slug: str) -> HttpResponse:
    """Set or clear the team's monthly budget (its leads and staff); the message shows next to the form."""
    team = readable_team_or_404(request.user, slug)
    if not can_set_budget(request.user, team):
        raise PermissionDenied("only the team's leads and staff can set its monthly budget")
    before = team.monthly_budget_usd
    form = TeamBudgetForm(request.POST, instance=team)
    if form.is_valid():
        budget = form.cleaned_data["monthly_budget_usd"]
        team.save(update_fields=["monthly_budget_usd"])
        log.info("team %s: monthly budget %s -> %s by %s", team.slug, before, budget, request.user)
        text = "Budget cleared."
        if budget is not None:
            text = f"Budget set to ${budget:,.2f} per calendar month."  # as stored, to the cent
        messages.success(request, text, extra_tags="at-budget")
    else:
        problems = "; ".join(str(m) for errors in form.errors.values() for m in errors)
        messages.error(request, f"Budget not saved: {problems}", extra_tags="at-budget")
    return HttpResponseRedirect(reverse("team-detail", args=[team.slug]) + "#budget")


# What the baselines page shows of a PromotionOverride (the job's JSON columns stay in the database).
_OVERRIDE_FIELDS = (
    "baseline_id", "reason", "finding_codes", "created_at", "user__username", "job__external_id", "job__name",
)  # fmt: skip


@require_GET
def baseline_list(request: HttpRequest) -> HttpResponse:
    """Active (and optionally retired) baselines with their robust statistics; retire for team members."""
    qs = scope_to_teams(
        Baseline.objects.select_related("team")
        .prefetch_related(
            Prefetch("runs", queryset=Job.objects.only("id", "external_id", "name").order_by("started_at")),
            # Runs promoted "anyway" despite hardware/health findings: shown with who and why.
            Prefetch(
                "overrides",
                queryset=PromotionOverride.objects.select_related("user", "job").only(*_OVERRIDE_FIELDS),
            ),
        )
        .order_by("model_name", "-created_at"),
        request.user,
    )
    found = BaselineFilterSet(request.GET, queryset=qs, request=request)
    show_retired = found.shows_retired
    qs = found.qs
    writable = writable_team_ids(request.user)
    rows = [
        {
            "baseline": b,
            "stats": _metric_stats(b),
            "can_retire": b.retired_at is None and (writable is None or b.team_id in writable),
        }
        for b in qs
    ]
    context = {"rows": rows, "show_retired": show_retired, "metrics": baseline_ops.METRICS}
    return render(request, "jobs/baseline_list.html", context)


@require_POST
def baseline_retire(request: HttpRequest, pk: int) -> HttpResponse:
    """Retire a baseline (members of its team and staff)."""
    baseline = get_object_or_404(scope_to_teams(Baseline.objects.select_related("team"), request.user), pk=pk)
    if not can_write_team(request.user, baseline.team):
        raise PermissionDenied("Only members of the baseline's team can retire it.")
    if request.POST.get("confirm") != "yes":
        messages.error(
            request,
            f"The {baseline.model_name} baseline was not retired: tick the confirmation next to Retire.",
        )
        return HttpResponseRedirect(reverse("baseline-list"))
    baseline_ops.retire(baseline)
    messages.success(request, f"Retired the {baseline.model_name} baseline [{baseline.fingerprint[:8]}].")
    return HttpResponseRedirect(reverse("baseline-list"))


@require_GET
def gpu_catalog(request: HttpRequest) -> HttpResponse:
    """The GPU catalog (dense peaks per dtype, specs) and the dated price book; read-only, edited in admin."""
    now = timezone.now()
    gpus = list(
        GpuModel.objects.prefetch_related(
            Prefetch("prices", queryset=PriceEntry.objects.order_by("tier", "-effective_from"))
        ).order_by("vendor", "name")
    )
    dtypes = sorted({d for g in gpus for d in (g.peak_tflops or {})}, key=_dtype_order)
    rows = []
    for g in gpus:
        current: dict[str, PriceEntry] = {}
        for p in g.prices.all():
            if p.effective_from <= now and p.tier not in current:
                current[p.tier] = p
        rows.append(
            {
                "gpu": g,
                "peaks": [(g.peak_tflops or {}).get(d) for d in dtypes],
                "prices": list(g.prices.all()),
                "current": {p.pk for p in current.values()},
            }
        )
    return render(request, "jobs/catalog.html", {"rows": rows, "dtypes": dtypes, "now": now})


def _dtype_order(dtype: str) -> tuple[int, str]:
    # The catalog's one dtype table sets the column order; a key an admin typed outside it goes last.
    return (DTYPES.index(dtype) if dtype in DTYPES else len(DTYPES), dtype)


def _metric_stats(baseline: Baseline) -> list[tuple[baseline_ops.Metric, MetricStats]]:
    """(metric, its stored summary) per baseline metric; a metric the stats lack reads as all unknown."""
    stats = decode_stats(baseline.stats)
    return [(m, stats.get(m.key) or MetricStats()) for m in baseline_ops.METRICS]


READINESS_DAYS = 7


def _engine_line(polled: list[Job]) -> dict[str, Any]:
    """The serving engines' readiness line, with the polled serving jobs that read no engine FLOPs."""
    serving = [j for j in polled if j.kind == Job.Kind.INFERENCE]
    without = [j.external_id for j in serving if "engine_flops" in (j.missing_signals or [])]
    return engine_signals.with_serving_jobs(engine_source(), [j.external_id for j in serving], without)


@require_GET
def cluster_readiness(request: HttpRequest) -> HttpResponse:
    """Which DCGM fields are missing for which jobs of the last 7 days (running, or ended inside them), what
    each absence hides and how to enable it; jobs whose selector matched no GPU are listed apart."""
    since = timezone.now() - timedelta(days=READINESS_DAYS)
    recent = list(
        readable_jobs(request.user)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gte=since))
        .select_related("team")
        .only(
            "external_id",
            "name",
            "status",
            "ended_at",
            "team__name",
            "team__slug",
            "missing_signals",
            "missing_reasons",
            "last_polled_at",
            "ingest_error",
            "kind",
        )
        .order_by(Lower("external_id"))
    )
    polled_all = [j for j in recent if j.last_polled_at is not None]
    no_gpus = [(j, reason) for j in polled_all if (reason := no_gpus_matched(j))]
    unmatched = {j.pk for j, _ in no_gpus}
    polled = [j for j in polled_all if j.pk not in unmatched]
    missing_by: dict[str, list[Job]] = defaultdict(list)
    for job in polled:
        for key in job.missing_signals or []:
            missing_by[key].append(job)
    lines = readiness(k for k in SIGNALS if k not in missing_by)
    fields: list[dict[str, Any]] = [
        {
            "line": line,
            "jobs": missing_by[line.key],
            "share": len(missing_by[line.key]) / len(polled) if polled else None,
        }
        for line in lines
        if not line.present
    ]
    fields.sort(key=lambda f: (-len(f["jobs"]), f["line"].key))
    running = [j for j in recent if j.ended_at is None]
    context = {
        "fields": fields,
        "present": [line for line in lines if line.present],
        "days": READINESS_DAYS,
        "jobs": len(recent),
        "running": len(running),
        "polled": len(polled),
        "no_gpus": no_gpus,
        "never_polled": [j for j in recent if j.last_polled_at is None],
        "stale": [j for j in running if j.ingest_error],
        # The optional sources beside dcgm-exporter, each configured or not, seen or not, with the reason.
        "sources": [node_exporter_source(), _engine_line(polled)],
    }
    return render(request, "jobs/readiness.html", context)
