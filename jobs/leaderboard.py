"""Team leaderboard: GPU-hour-weighted MFU, GPU hours, cost and waste per team over a period, in SQL.

Each job contributes only the part of its window that falls inside the period, so a job that spans two
weeks is split between them; MFU is weighted by GPU hours (never an average of job ratios).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from django.db.models import Case, Count, DurationField, ExpressionWrapper, F, FloatField, Q, Sum, Value, When
from django.db.models.functions import Coalesce, Extract, Greatest, Least
from django.utils import timezone

from jobs.models import Job


@dataclass(frozen=True)
class Period:
    """A half-open time range [start, end) with a label (an ISO week or a month)."""

    start: datetime
    end: datetime
    label: str

    def previous(self) -> Period:
        """The period of the same kind just before this one."""
        if self.label.count("-W") == 1:
            return iso_week(self.start.date() - timedelta(days=7))
        first = (self.start.date().replace(day=1) - timedelta(days=1)).replace(day=1)
        return month(first)


def _utc(d: date) -> datetime:
    return datetime.combine(d, time.min, tzinfo=UTC)


def iso_week(day: date) -> Period:
    """The ISO week (Monday 00:00 UTC to the next Monday) containing `day`."""
    monday = day - timedelta(days=day.weekday())
    year, week, _ = monday.isocalendar()
    return Period(_utc(monday), _utc(monday + timedelta(days=7)), f"{year}-W{week:02d}")


def parse_iso_week(label: str) -> Period:
    """'2026-W47' -> that week; raises ValueError with the expected format otherwise."""
    try:
        year_s, week_s = label.split("-W")
        monday = date.fromisocalendar(int(year_s), int(week_s), 1)
    except ValueError:
        raise ValueError(f"{label!r} is not an ISO week like 2026-W47") from None
    return iso_week(monday)


def month(day: date) -> Period:
    """The calendar month containing `day` (UTC)."""
    first = day.replace(day=1)
    nxt = (first + timedelta(days=32)).replace(day=1)
    return Period(_utc(first), _utc(nxt), f"{first:%Y-%m}")


@dataclass(frozen=True)
class TeamRow:
    """One team's numbers over a period."""

    team_id: int
    team_slug: str
    team_name: str
    jobs: int
    gpu_hours: float
    cost_usd: float
    waste_usd: float
    weighted_mfu: float | None

    @property
    def waste_share(self) -> float | None:
        """Waste as a fraction of cost."""
        return self.waste_usd / self.cost_usd if self.cost_usd else None


def _overlap_jobs(period: Period, now: datetime | None = None):
    now = now or timezone.now()
    end = Least(Coalesce(F("ended_at"), Value(now)), Value(period.end))
    start = Greatest(F("started_at"), Value(period.start))
    overlap = ExpressionWrapper(end - start, output_field=DurationField())
    hours = ExpressionWrapper(Extract(overlap, "epoch") / 3600.0, output_field=FloatField())
    return (
        Job.objects.filter(started_at__lt=period.end)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=period.start))
        .filter(started_at__lt=now)
        .annotate(overlap_h=hours)
        .annotate(gpu_h=ExpressionWrapper(F("overlap_h") * F("gpu_count"), output_field=FloatField()))
    )


def team_rows(period: Period, now: datetime | None = None) -> list[TeamRow]:
    """Per team: jobs, GPU hours, cost and waste inside the period, and GPU-hour-weighted MFU."""
    qs = (
        _overlap_jobs(period, now)
        .values("team_id", "team__slug", "team__name")
        .annotate(
            n=Count("id"),
            gpu_hours=Sum("gpu_h"),
            cost=Sum(
                ExpressionWrapper(
                    Coalesce(F("cost_per_day_usd"), 0.0) / 24.0 * F("overlap_h"), output_field=FloatField()
                )
            ),
            waste=Sum(
                ExpressionWrapper(
                    Coalesce(F("waste_per_day_usd"), 0.0) / 24.0 * F("overlap_h"), output_field=FloatField()
                )
            ),
            mfu_num=Sum(
                Case(
                    When(mfu__isnull=False, then=F("mfu") * F("gpu_h")),
                    default=None,
                    output_field=FloatField(),
                )
            ),
            mfu_den=Sum(
                Case(When(mfu__isnull=False, then=F("gpu_h")), default=None, output_field=FloatField())
            ),
        )
        .order_by("team__name")
    )
    rows = [
        TeamRow(
            team_id=r["team_id"],
            team_slug=r["team__slug"],
            team_name=r["team__name"],
            jobs=r["n"],
            gpu_hours=r["gpu_hours"] or 0.0,
            cost_usd=r["cost"] or 0.0,
            waste_usd=r["waste"] or 0.0,
            weighted_mfu=(r["mfu_num"] / r["mfu_den"]) if r["mfu_den"] else None,
        )
        for r in qs
    ]
    return sorted(rows, key=lambda r: (-(r.weighted_mfu if r.weighted_mfu is not None else -1), r.team_name))


def worst_jobs(
    period: Period, limit: int = 10, team_id: int | None = None, now: datetime | None = None
) -> list[Job]:
    """Jobs that wasted the most dollars inside the period."""
    qs = _overlap_jobs(period, now).select_related("team", "gpu_model")
    if team_id is not None:
        qs = qs.filter(team_id=team_id)
    qs = qs.annotate(
        waste_in_period=ExpressionWrapper(
            Coalesce(F("waste_per_day_usd"), 0.0) / 24.0 * F("overlap_h"), output_field=FloatField()
        )
    )
    return list(qs.filter(waste_in_period__gt=0).order_by("-waste_in_period")[:limit])
