"""Team numbers for several periods at once (the leaderboard's period, the one before, and eight weeks of
trend) in one SQL aggregation.

The rules are jobs.leaderboard's (team_rows): a job counts in a period with the part of its window inside
the period; GPU hours = hours inside x GPUs; cost and waste = the job's $/day ÷ 24 x hours inside; MFU is
weighted by GPU hours (never an average of job ratios); a running job runs until now. tests/test_pages.py
checks that both give the same numbers. Doing all periods in one pass matters at 100k jobs: each
separate aggregation scans the overlapping jobs again. Each job is joined only with the periods it
overlaps, so the work grows with job-periods, not jobs x periods.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from jobs.leaderboard import Period, TeamRow, iso_week
from jobs.models import Job, Team

_SQL = """
WITH j AS (
    SELECT team_id, mfu, gpu_count, cost_per_day_usd, waste_per_day_usd, started_at,
           COALESCE(ended_at, %(now)s) AS stop
    FROM {jobs}
    WHERE started_at < %(last)s AND started_at < %(now)s AND (ended_at IS NULL OR ended_at > %(first)s)
),
p (i, ps, pe) AS (VALUES {periods}),
o AS (
    SELECT j.team_id, p.i, j.mfu, j.gpu_count, j.cost_per_day_usd, j.waste_per_day_usd,
           EXTRACT(EPOCH FROM LEAST(j.stop, p.pe) - GREATEST(j.started_at, p.ps))::float8 / 3600.0 AS h
    FROM j JOIN p ON j.started_at < p.pe AND j.stop > p.ps
)
SELECT o.team_id, t.slug, t.name, o.i, COUNT(*),
       SUM(o.h * o.gpu_count),
       SUM(COALESCE(o.cost_per_day_usd, 0) / 24.0 * o.h),
       SUM(COALESCE(o.waste_per_day_usd, 0) / 24.0 * o.h),
       SUM(o.mfu * o.gpu_count * o.h) FILTER (WHERE o.mfu IS NOT NULL),
       SUM(o.gpu_count * o.h) FILTER (WHERE o.mfu IS NOT NULL)
FROM o JOIN {teams} t ON t.id = o.team_id
GROUP BY o.team_id, t.slug, t.name, o.i
"""
# An earlier form with generate_series() per job made the planner overestimate rows a thousandfold and
# spend most of a second JIT-compiling a 20 ms query; a join on the overlap condition estimates well.


def last_weeks(until: Period, weeks: int = 8) -> list[Period]:
    """The `weeks` ISO weeks ending with the one containing the last day of `until`, oldest first."""
    last = iso_week((until.end - timedelta(days=1)).date())
    periods = [last]
    for _ in range(weeks - 1):
        periods.append(periods[-1].previous())
    return periods[::-1]


def period_rows(periods: list[Period], now: datetime | None = None) -> list[dict[int, TeamRow]]:
    """For each period (any mix of weeks and months), team id -> TeamRow, as jobs.leaderboard.team_rows
    computes it; one query."""
    if not periods:
        return []
    now = now or timezone.now()
    params: dict[str, object] = {
        "now": now,
        "first": min(p.start for p in periods),
        "last": max(p.end for p in periods),
    }
    values = []
    for i, p in enumerate(periods):
        params[f"s{i}"], params[f"e{i}"] = p.start, p.end
        values.append(f"({i}, %(s{i})s::timestamptz, %(e{i})s::timestamptz)")
    sql = _SQL.format(
        jobs=connection.ops.quote_name(Job._meta.db_table),
        teams=connection.ops.quote_name(Team._meta.db_table),
        periods=", ".join(values),
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    out: list[dict[int, TeamRow]] = [{} for _ in periods]
    for team_id, slug, name, i, jobs, gpu_h, cost, waste, mfu_num, mfu_den in rows:
        out[i][team_id] = TeamRow(
            team_id=team_id,
            team_slug=slug,
            team_name=name,
            jobs=jobs,
            gpu_hours=gpu_h or 0.0,
            cost_usd=cost or 0.0,
            waste_usd=waste or 0.0,
            weighted_mfu=(mfu_num / mfu_den) if mfu_den else None,
        )
    return out


def mfu_trend(rows: list[dict[int, TeamRow]], team_id: int) -> list[float | None]:
    """One team's weighted MFU across the periods of `period_rows`' result."""
    return [(r[team_id].weighted_mfu if team_id in r else None) for r in rows]
