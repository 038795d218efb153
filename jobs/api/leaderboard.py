"""GET /api/v1/leaderboard/: the leaderboard page's numbers as JSON (same aggregation,
jobs.outputs.leaderboard)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.evaluation.kpis import CONVENTION_LABELS
from jobs.models import Team
from jobs.outputs.budget import budget_use
from jobs.outputs.leaderboard import Period, TeamRow, iso_week, month, parse_iso_week, parse_month, team_rows

_ROW_FIELDS: dict[str, serializers.Field] = {
    "team": serializers.CharField(),
    "team_name": serializers.CharField(),
    "jobs": serializers.IntegerField(),
    "gpu_hours": serializers.FloatField(
        help_text="GPU-equivalents × hours inside the period (a shared or MIG GPU is split between its jobs, "
        "not counted once per job; jobs.evaluation.totals.gpu_hours_inside)"
    ),
    "weighted_mfu": serializers.FloatField(allow_null=True, help_text="GPU-hour-weighted MFU, 0-1"),
    "cost_usd": serializers.FloatField(help_text="USD inside the period, jobs with a price"),
    "cost_is_lower_bound": serializers.BooleanField(),
    "waste_usd": serializers.FloatField(allow_null=True, help_text="null if any waste is unknown"),
    "waste_lower_bound_usd": serializers.FloatField(help_text="what is certainly wasted, USD"),
    "waste_unknown_reason": serializers.CharField(allow_null=True),
    "jobs_waste_unknown": serializers.IntegerField(),
    "jobs_cost_unknown": serializers.IntegerField(),
    "jobs_mfu_unknown": serializers.IntegerField(),
    "jobs_mfu_fallback": serializers.IntegerField(help_text="jobs whose MFU used 6N (shape missing)"),
    "jobs_low_coverage": serializers.IntegerField(
        help_text="jobs with GPU_UTIL samples for < 90 % of their window (or unknown coverage)"
    ),
    "monthly_budget_usd": serializers.FloatField(
        allow_null=True, help_text="the team's budget, USD per calendar month (UTC); null: none set"
    ),
    "budget_used_share": serializers.FloatField(
        allow_null=True,
        help_text="period=month only: cost_usd / monthly_budget_usd (a lower bound when cost_is_lower_bound);"
        " null for a week, without a budget or with a $0 budget",
    ),
}
_RESPONSE = inline_serializer(
    "Leaderboard",
    fields={
        "period": serializers.CharField(),
        "start": serializers.DateTimeField(),
        "end": serializers.DateTimeField(),
        "mfu_convention": serializers.CharField(),
        "teams": inline_serializer("LeaderboardRow", fields=_ROW_FIELDS, many=True),
    },
)


def _period(params: Any) -> Period:
    kind = params.get("period", "week")
    if kind == "week":
        label = params.get("week")
        try:
            return parse_iso_week(label) if label else iso_week(timezone.now().date())
        except ValueError as exc:
            raise ValidationError({"week": str(exc)}) from None
    if kind == "month":
        label = params.get("month")
        if not label:
            return month(timezone.now().date())
        try:
            return parse_month(label)
        except ValueError as exc:
            raise ValidationError({"month": str(exc)}) from None
    raise ValidationError({"period": "period must be 'week' or 'month'"})


def row_json(row: TeamRow, budget_usd: Decimal | None = None, is_month: bool = False) -> dict[str, Any]:
    """One team row; unknown totals are null next to their lower bound and reason (never 0). The budget's
    share is the month's cost over the team's monthly budget (jobs.outputs.budget), for a month only."""
    use = budget_use(row.cost, budget_usd) if is_month else None
    return {
        "team": row.team_slug,
        "team_name": row.team_name,
        "jobs": row.jobs,
        "gpu_hours": row.gpu_hours,
        "weighted_mfu": row.weighted_mfu,
        "cost_usd": row.cost_usd,
        "cost_is_lower_bound": row.jobs_cost_unknown > 0,
        "waste_usd": row.waste_usd,
        "waste_lower_bound_usd": row.waste_lower_bound_usd,
        "waste_unknown_reason": row.waste_unknown_reason or None,
        "jobs_waste_unknown": row.jobs_waste_unknown,
        "jobs_cost_unknown": row.jobs_cost_unknown,
        "jobs_mfu_unknown": row.jobs_mfu_unknown,
        "jobs_mfu_fallback": row.jobs_mfu_fallback,
        "jobs_low_coverage": row.jobs_low_coverage,
        "monthly_budget_usd": float(budget_usd) if budget_usd is not None else None,
        "budget_used_share": use.share if use is not None else None,
    }


class LeaderboardView(APIView):
    """Teams ranked by GPU-hour-weighted MFU over an ISO week or a calendar month (UTC)."""

    permission_classes = [IsAuthenticated]

    @extend_schema(
        parameters=[
            OpenApiParameter("period", str, enum=["week", "month"], description="default week"),
            OpenApiParameter("week", str, description="ISO week like 2026-W49 (default: this week)"),
            OpenApiParameter("month", str, description="month like 2026-11 (default: this month)"),
        ],
        responses={200: _RESPONSE},
    )
    def get(self, request: Request) -> Response:
        """The period's rows, exactly as the leaderboard page and the weekly email compute them, with each
        team's monthly budget (and, for a month, the share of it used)."""
        period = _period(request.query_params)
        rows = team_rows(period)
        budgets = dict(
            Team.objects.filter(pk__in=[r.team_id for r in rows]).values_list("pk", "monthly_budget_usd")
        )
        is_month = "-W" not in period.label
        return Response(
            {
                "period": period.label,
                "start": period.start,
                "end": period.end,
                "mfu_convention": CONVENTION_LABELS[settings.MFU_FLOPS_CONVENTION],
                "teams": [row_json(r, budgets.get(r.team_id), is_month) for r in rows],
            }
        )
