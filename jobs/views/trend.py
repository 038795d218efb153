"""Per-team GPU-hour-weighted MFU for each of the last N ISO weeks, in one SQL aggregation (sparklines).

Same rule as jobs.leaderboard: a job counts in a week with the GPU hours of its window inside that week,
and MFU is weighted by those GPU hours (never an average of job ratios).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Case, DurationField, ExpressionWrapper, F, FloatField, Q, Sum, Value, When
from django.db.models.functions import Coalesce, Extract, Greatest, Least
from django.utils import timezone

from jobs.leaderboard import Period, iso_week
from jobs.models import Job


def last_weeks(until: Period, weeks: int = 8) -> list[Period]:
    """The `weeks` ISO weeks ending with the one containing the last day of `until`, oldest first."""
    last = iso_week((until.end - timedelta(days=1)).date())
    periods = [last]
    for _ in range(weeks - 1):
        periods.append(periods[-1].previous())
    return periods[::-1]


def weekly_mfu(periods: list[Period], now: datetime | None = None) -> dict[int, list[float | None]]:
    """team id -> GPU-hour-weighted MFU per period (None where the team had no job with an MFU)."""
    if not periods:
        return {}
    now = now or timezone.now()
    first, last = periods[0].start, periods[-1].end
    end_of_job = Coalesce(F("ended_at"), Value(now))
    aggregates = {}
    for i, p in enumerate(periods):
        overlap = ExpressionWrapper(
            Least(end_of_job, Value(p.end)) - Greatest(F("started_at"), Value(p.start)),
            output_field=DurationField(),
        )
        gpu_h = ExpressionWrapper(
            Greatest(Extract(overlap, "epoch"), Value(0.0)) / 3600.0 * F("gpu_count"),
            output_field=FloatField(),
        )
        aggregates[f"num{i}"] = Sum(
            Case(When(mfu__isnull=False, then=F("mfu") * gpu_h), output_field=FloatField())
        )
        aggregates[f"den{i}"] = Sum(Case(When(mfu__isnull=False, then=gpu_h), output_field=FloatField()))
    rows = (
        Job.objects.filter(started_at__lt=min(last, now))
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=first))
        .values("team_id")
        .annotate(**aggregates)
        .order_by()
    )
    out: dict[int, list[float | None]] = {}
    for row in rows:
        out[row["team_id"]] = [
            (row[f"num{i}"] / row[f"den{i}"]) if row[f"den{i}"] else None for i in range(len(periods))
        ]
    return out
