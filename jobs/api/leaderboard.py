"""GET /api/v1/leaderboard/: the leaderboard page's numbers as JSON (same aggregation,
jobs.outputs.leaderboard)."""

from __future__ import annotations

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
from jobs.outputs.leaderboard import Period, TeamRow, iso_week, month, parse_iso_week, parse_month, team_rows

_ROW_FIELDS: dict[str, serializers.Field] = {
    "team": serializers.CharField(),
    "team_name": serializers.CharField(),
    "jobs": serializers.IntegerField(),
    "gpu_hours": serializers.FloatField(help_text="GPUs × hours inside the period"),
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


def row_json(row: TeamRow) -> dict[str, Any]:
    """One team row; unknown totals are null next to their lower bound and reason (never 0)."""
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
        """The period's rows, exactly as the leaderboard page and the weekly email compute them."""
        period = _period(request.query_params)
        return Response(
            {
                "period": period.label,
                "start": period.start,
                "end": period.end,
                "mfu_convention": CONVENTION_LABELS[settings.MFU_FLOPS_CONVENTION],
                "teams": [row_json(r) for r in team_rows(period)],
            }
        )
