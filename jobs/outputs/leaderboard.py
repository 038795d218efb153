"""Team leaderboard: GPU-hour-weighted MFU, GPU hours, cost and waste per team over periods, in SQL.

The one aggregation every channel reads (leaderboard page, team page, weekly email, API). Its rules:

* a job counts in a period with the part of its window inside it (a running job runs until now), so a job
  that spans two weeks is split between them; GPU hours = hours inside × the GPU-equivalents its stored
  evaluation charged it for (GPUs × its share on time-sliced or MIG GPUs; the GPU count when they were its
  own), as its cost and GPU-hours are: never the raw GPU count of a shared job;
* cost = the dated price book of the job's GPU model and tier (its `price_tier`, else the default tier)
  over the hours inside, × its GPU-equivalents, split at each price change, the earliest price covering
  the hours before the book starts: the definition of the job's own total cost, so adjacent periods add up
  to it (jobs.evaluation.totals.cost_inside); waste = the job's waste share (stored waste ÷ stored cost,
  per day) × that cost (totals.waste_inside). Unknown is never 0: a job without a price (none when it was
  evaluated, or no book for its model and tier) adds no cost and is counted in `jobs_cost_unknown`; a job
  whose waste is unknown (no MFU) adds its stated lower bound (the idle waste) and is counted in
  `jobs_waste_unknown`, so the team's waste is "at least" a sum;
* jobs whose GPU utilisation samples cover less than 90 % of their window (or unknown) are counted in
  `jobs_low_coverage`: their idle share and means rest on part of the window;
* MFU is weighted by GPU hours (never an average of job ratios) over the jobs that have one, all computed
  with the organisation's one FLOPs convention (a job's MFU is against its peak-equivalents, so that is its
  weight); jobs that had to fall back to 6N are counted.

All periods (a week, the one before, eight weeks of trend) are done in one SQL pass: each separate
aggregation scans the overlapping jobs again, which matters at 100k jobs. Each job is joined only with the
periods it overlaps, so the work grows with job-periods, not jobs × periods.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import DurationField, ExpressionWrapper, F, FloatField, Q, QuerySet, Value
from django.db.models.expressions import CombinedExpression, RawSQL
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast, Coalesce, Extract, Greatest, Least, NullIf
from django.utils import timezone

from jobs.evaluation.costs import Amount
from jobs.metrics.sampling import COVERAGE_SHOW_BELOW
from jobs.models import Job, PriceEntry, Team


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


# Periods users may ask for: wide enough for any real data, narrow enough that the previous and next
# period (and the 8-week trend) never leave the dates Python can represent.
MIN_YEAR, MAX_YEAR = 2000, 2100
_WEEK_RE = re.compile(r"(\d{4})-W(\d{2})")
_MONTH_RE = re.compile(r"(\d{4})-(\d{2})")


def parse_iso_week(label: str) -> Period:
    """'2026-W47' -> that week (years 2000-2100); raises ValueError with the expected format otherwise."""
    found = _WEEK_RE.fullmatch(label.strip()) if isinstance(label, str) else None
    try:
        if found is None:
            raise ValueError(label)
        year, week = int(found.group(1)), int(found.group(2))
        if not MIN_YEAR <= year <= MAX_YEAR:
            raise ValueError(label)
        monday = date.fromisocalendar(year, week, 1)
    except ValueError:
        raise ValueError(
            f"{label!r} is not an ISO week like 2026-W47 (years {MIN_YEAR}-{MAX_YEAR})"
        ) from None
    return iso_week(monday)


def parse_month(label: str) -> Period:
    """'2026-11' -> that calendar month (years 2000-2100); raises ValueError naming the format otherwise."""
    found = _MONTH_RE.fullmatch(label.strip()) if isinstance(label, str) else None
    try:
        if found is None:
            raise ValueError(label)
        year, mon = int(found.group(1)), int(found.group(2))
        if not MIN_YEAR <= year <= MAX_YEAR:
            raise ValueError(label)
        first = date(year, mon, 1)
    except ValueError:
        raise ValueError(f"{label!r} is not a month like 2026-11 (years {MIN_YEAR}-{MAX_YEAR})") from None
    return month(first)


def month(day: date) -> Period:
    """The calendar month containing `day` (UTC)."""
    first = day.replace(day=1)
    nxt = (first + timedelta(days=32)).replace(day=1)
    return Period(_utc(first), _utc(nxt), f"{first:%Y-%m}")


@dataclass(frozen=True)
class TeamRow:
    """One team's numbers over a period; dollar sums hold only the parts that could be computed."""

    team_id: int
    team_slug: str
    team_name: str
    jobs: int
    gpu_hours: float
    cost_usd: float
    waste_lower_bound_usd: float
    weighted_mfu: float | None
    jobs_cost_unknown: int = 0
    jobs_waste_unknown: int = 0
    jobs_mfu_unknown: int = 0
    jobs_mfu_fallback: int = 0
    #: Jobs whose GPU_UTIL samples cover less than 90 % of their window, or whose coverage is unknown.
    jobs_low_coverage: int = 0
    #: Priced jobs whose stored cost rate is $0/day but whose dated cost inside the period is not: their
    #: share of spend wasted is unknown (jobs.evaluation.totals.waste_inside).
    jobs_waste_share_unknown: int = 0

    @property
    def waste_usd(self) -> float | None:
        """Waste in USD inside the period; None when any job's waste is unknown (see `waste`)."""
        return None if self.jobs_waste_unknown else self.waste_lower_bound_usd

    @property
    def waste(self) -> Amount:
        """The waste as shown everywhere: exact, or "at least" with how many jobs are unknown and why."""
        if not self.jobs_waste_unknown:
            return Amount(self.waste_lower_bound_usd)
        return Amount(self.waste_lower_bound_usd, lower_bound=True, reason=self.waste_unknown_reason)

    @property
    def waste_unknown_reason(self) -> str:
        """'waste unknown for 41 of 143 jobs: MFU unknown for 41' (empty when all are known)."""
        if not self.jobs_waste_unknown:
            return ""
        parts = []
        no_mfu = self.jobs_waste_unknown - self.jobs_cost_unknown - self.jobs_waste_share_unknown
        if no_mfu > 0:
            parts.append(f"MFU unknown for {no_mfu}")
        if self.jobs_cost_unknown:
            parts.append(f"no price for {self.jobs_cost_unknown}")
        if self.jobs_waste_share_unknown:
            parts.append(f"priced at $0/day when evaluated for {self.jobs_waste_share_unknown}")
        return f"waste unknown for {self.jobs_waste_unknown} of {self.jobs} jobs: {', '.join(parts)}"

    @property
    def cost(self) -> Amount:
        """The cost, "at least" when some jobs have no price."""
        if not self.jobs_cost_unknown:
            return Amount(self.cost_usd)
        reason = f"no price for {self.jobs_cost_unknown} of {self.jobs} jobs"
        return Amount(self.cost_usd, lower_bound=True, reason=reason)

    @property
    def waste_share(self) -> float | None:
        """Waste as a fraction of cost (a lower bound when the waste is)."""
        return self.waste_lower_bound_usd / self.cost_usd if self.cost_usd else None


# The dated price book as intervals [pf, pt): each price from its effective_from until the next one of the
# same GPU model and tier, the first stretched back to -infinity (costs.book_cost: the earliest price covers
# the hours before the book starts). A job's dated cost over [lo, hi) is the sum over the intervals that
# overlap it of GPU-equivalents x price x the overlap's hours (costs.window_cost's segments).
_PRICE_INTERVALS = """
    SELECT gpu_model_id, tier, usd_per_gpu_hour::float8 AS usd,
           CASE WHEN ROW_NUMBER() OVER w = 1 THEN '-infinity'::timestamptz ELSE effective_from END AS pf,
           COALESCE(LEAD(effective_from) OVER w, 'infinity'::timestamptz) AS pt
    FROM {prices}
    WINDOW w AS (PARTITION BY gpu_model_id, tier ORDER BY effective_from)
"""

_SQL = """
WITH j AS (
    SELECT team_id, gpu_model_id, COALESCE(NULLIF(price_tier, ''), %(tier)s) AS tier, mfu, mfu_fallback,
           util_coverage, cost_per_day_usd, COALESCE(waste_per_day_usd, waste_lower_bound_per_day_usd) AS wr,
           waste_per_day_usd IS NULL AS waste_bound, started_at, COALESCE(ended_at, %(now)s) AS stop,
           COALESCE((evaluation->'sharing'->>'gpu_equivalents')::float8, gpu_count) AS gpu_count,
           COALESCE((evaluation->'sharing'->>'peak_equivalents')::float8,
                    (evaluation->'sharing'->>'gpu_equivalents')::float8, gpu_count) AS peak_count
    FROM {jobs}
    WHERE started_at < %(last)s AND started_at < %(now)s AND (ended_at IS NULL OR ended_at > %(first)s)
),
p (i, ps, pe) AS (VALUES {periods}),
pr AS ({intervals}),
o AS (
    SELECT j.*, p.i, GREATEST(j.started_at, p.ps) AS lo, LEAST(j.stop, p.pe) AS hi
    FROM j JOIN p ON j.started_at < p.pe AND j.stop > p.ps
),
-- One row per job, period and price interval overlapping the job's hours inside the period (one row with
-- no price when it has none: no rate stored, or no book for its model and tier). `first` marks the row of
-- the interval holding the overlap's start, so per-job figures are counted once.
s AS (
    SELECT o.team_id, o.i, o.mfu, o.mfu_fallback, o.util_coverage, o.cost_per_day_usd, o.wr, o.waste_bound,
           o.gpu_count, o.peak_count, pr.usd IS NULL AS unpriced, (pr.pf IS NULL OR pr.pf <= o.lo) AS first,
           date_part('epoch', o.hi - o.lo) / 3600.0 AS h,
           pr.usd * o.gpu_count
               * date_part('epoch', LEAST(o.hi, pr.pt) - GREATEST(o.lo, pr.pf)) / 3600.0 AS cost,
           -- A $0/day rate has no waste share: unknown when any hour inside was priced above $0.
           CASE WHEN pr.usd IS NOT NULL AND o.cost_per_day_usd = 0 AND o.wr IS NOT NULL AND o.gpu_count > 0
                THEN EXISTS (SELECT 1 FROM pr AS q WHERE q.gpu_model_id = o.gpu_model_id AND q.tier = o.tier
                             AND q.usd > 0 AND q.pf < o.hi AND q.pt > o.lo)
                ELSE false END AS share_unknown
    FROM o LEFT JOIN pr ON o.cost_per_day_usd IS NOT NULL AND pr.gpu_model_id = o.gpu_model_id
                           AND pr.tier = o.tier AND pr.pf < o.hi AND pr.pt > o.lo
)
SELECT s.team_id, t.slug, t.name, s.i, COUNT(*) FILTER (WHERE s.first),
       SUM(s.h * s.gpu_count) FILTER (WHERE s.first),
       SUM(s.cost),
       -- totals.waste_inside: the waste share (stored waste or its lower bound / stored cost, per day) x
       -- the dated cost, summed per price interval (the share is the job's own, so the sum is the same).
       SUM(s.wr / s.cost_per_day_usd * s.cost) FILTER (WHERE s.cost_per_day_usd > 0),
       SUM(s.mfu * s.peak_count * s.h) FILTER (WHERE s.first AND s.mfu IS NOT NULL),
       SUM(s.peak_count * s.h) FILTER (WHERE s.first AND s.mfu IS NOT NULL),
       COUNT(*) FILTER (WHERE s.first AND s.unpriced),
       COUNT(*) FILTER (WHERE s.first AND (s.unpriced OR s.wr IS NULL OR s.waste_bound OR s.share_unknown)),
       COUNT(*) FILTER (WHERE s.first AND s.mfu IS NULL),
       COUNT(*) FILTER (WHERE s.first AND s.mfu IS NOT NULL AND s.mfu_fallback),
       COUNT(*) FILTER (WHERE s.first AND (s.util_coverage IS NULL OR s.util_coverage < %(coverage)s)),
       COUNT(*) FILTER (WHERE s.first AND s.share_unknown)
FROM s JOIN {teams} t ON t.id = s.team_id
GROUP BY s.team_id, t.slug, t.name, s.i
"""
# An earlier form with generate_series() per job made the planner overestimate rows a thousandfold and
# spend most of a second JIT-compiling a 20 ms query; a join on the overlap condition estimates well.
# date_part('epoch', ...) is float8; EXTRACT returns numeric since PostgreSQL 14, slower per row. The price
# intervals are joined into the same pass (not a second grouped pass over job-periods): one pass kept the
# query near its cost before the book was joined (README, Scaling).


def _price_intervals() -> str:
    return _PRICE_INTERVALS.format(prices=connection.ops.quote_name(PriceEntry._meta.db_table))


def period_rows(periods: list[Period], now: datetime | None = None) -> list[dict[int, TeamRow]]:
    """For each period (any mix of weeks and months), team id -> TeamRow; one query for all of them."""
    if not periods:
        return []
    now = now or timezone.now()
    params: dict[str, datetime | float | str] = {
        "coverage": COVERAGE_SHOW_BELOW,
        "tier": settings.DEFAULT_PRICE_TIER,
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
        intervals=_price_intervals(),
        periods=", ".join(values),
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    out: list[dict[int, TeamRow]] = [{} for _ in periods]
    for (
        team_id, slug, name, i, jobs, gpu_h, cost, waste, mfu_num, mfu_den,
        cost_unknown, waste_unknown, mfu_unknown, fallback, low_coverage, share_unknown,
    ) in rows:  # fmt: skip
        out[i][team_id] = TeamRow(
            team_id=team_id,
            team_slug=slug,
            team_name=name,
            jobs=jobs,
            gpu_hours=gpu_h or 0.0,
            cost_usd=cost or 0.0,
            waste_lower_bound_usd=waste or 0.0,
            weighted_mfu=(mfu_num / mfu_den) if mfu_den else None,
            jobs_cost_unknown=cost_unknown,
            jobs_waste_unknown=waste_unknown,
            jobs_mfu_unknown=mfu_unknown,
            jobs_mfu_fallback=fallback,
            jobs_low_coverage=low_coverage,
            jobs_waste_share_unknown=share_unknown,
        )
    return out


def team_rows(period: Period, now: datetime | None = None) -> list[TeamRow]:
    """Per team, ranked by weighted MFU (unknown last): the period's row of `period_rows`."""
    rows = list(period_rows([period], now)[0].values())
    return sorted(rows, key=lambda r: (-(r.weighted_mfu if r.weighted_mfu is not None else -1), r.team_name))


def last_weeks(until: Period, weeks: int = 8) -> list[Period]:
    """The `weeks` ISO weeks ending with the one containing the last day of `until`, oldest first."""
    last = iso_week((until.end - timedelta(days=1)).date())
    periods = [last]
    for _ in range(weeks - 1):
        periods.append(periods[-1].previous())
    return periods[::-1]


def mfu_trend(rows: list[dict[int, TeamRow]], team_id: int) -> list[float | None]:
    """One team's weighted MFU across the periods of `period_rows`' result."""
    return [(r[team_id].weighted_mfu if team_id in r else None) for r in rows]


def gpu_equivalents() -> Coalesce:
    """A job's GPU-equivalents as its stored evaluation charged them (Evaluation.sharing.gpu_equivalents),
    else its GPU count: the GPUs were its own."""
    shared = KeyTextTransform("gpu_equivalents", KeyTransform("sharing", "evaluation"))
    return Coalesce(Cast(shared, FloatField()), Cast(F("gpu_count"), FloatField()), output_field=FloatField())


def _overlap_jobs(period: Period, now: datetime | None = None) -> QuerySet[Job]:
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
        .annotate(gpu_h=ExpressionWrapper(F("overlap_h") * gpu_equivalents(), output_field=FloatField()))
    )


def _dated_cost(period: Period, now: datetime | None) -> CombinedExpression:
    """A job's cost inside the period from the dated price book (jobs.evaluation.totals.cost_inside), as a
    correlated subquery on the job's row: NULL without a book for its GPU model and tier."""
    now = now or timezone.now()
    job = connection.ops.quote_name(Job._meta.db_table)
    lo, hi = f"GREATEST({job}.started_at, %s)", f"LEAST(COALESCE({job}.ended_at, %s), %s)"
    sql = (
        f"(SELECT SUM(pr.usd * date_part('epoch', LEAST({hi}, pr.pt) - GREATEST({lo}, pr.pf)) / 3600.0)"
        f" FROM ({_price_intervals()}) pr WHERE pr.gpu_model_id = {job}.gpu_model_id"
        f" AND pr.tier = COALESCE(NULLIF({job}.price_tier, ''), %s) AND pr.pf < {hi} AND pr.pt > {lo})"
    )
    bounds = (now, period.end, period.start)
    params = (*bounds, settings.DEFAULT_PRICE_TIER, *bounds)
    return RawSQL(sql, params, output_field=FloatField()) * gpu_equivalents()


def worst_jobs(
    period: Period,
    limit: int = 10,
    team_id: int | None = None,
    now: datetime | None = None,
    scope: Callable[[QuerySet[Job]], QuerySet[Job]] | None = None,
) -> list[Job]:
    """Jobs that wasted the most dollars inside the period (`waste_in_period`, USD), of one team
    (`team_id`) or all; `scope` narrows the jobs first (the viewer's read policy, jobs.access.permissions).

    A job with unknown waste ranks by its lower bound (the idle waste); `waste_in_period_is_lower_bound`
    says so, and `waste_in_period_amount` is the figure as every channel shows it.
    """
    qs = _overlap_jobs(period, now).select_related("team", "gpu_model")
    if team_id is not None:
        qs = qs.filter(team_id=team_id)
    if scope is not None:
        qs = scope(qs)
    # jobs.evaluation.totals.waste_inside, as period_rows computes it: the waste share (stored waste, or its
    # lower bound, / stored cost per day) x the dated cost inside the period. NULL (not listed) when the
    # cost is unknown or the rate is $0/day (no share; such a job's waste is $0 or unknown, never ranked).
    share = Coalesce(F("waste_per_day_usd"), F("waste_lower_bound_per_day_usd")) / NullIf(
        F("cost_per_day_usd"), Value(0.0)
    )
    qs = qs.annotate(
        waste_in_period=ExpressionWrapper(share * _dated_cost(period, now), output_field=FloatField())
    )
    # Only jobs with a positive waste share can rank (cheap column tests); the dated cost is a subquery per
    # job, so it is computed once, in the ORDER BY, and the few listed rows without a positive figure (no
    # book, a $0 cost), which sort last, are dropped here rather than filtered (and recomputed) in SQL.
    ranked = (
        qs.filter(cost_per_day_usd__gt=0)
        .filter(
            Q(waste_per_day_usd__gt=0)
            | Q(waste_per_day_usd__isnull=True, waste_lower_bound_per_day_usd__gt=0)
        )
        .order_by(F("waste_in_period").desc(nulls_last=True), "external_id")[:limit]
    )
    jobs: list[Job] = [job for job in ranked if (job.waste_in_period or 0.0) > 0]
    for job in jobs:
        bound = job.waste_per_day_usd is None
        job.waste_in_period_is_lower_bound = bound  # type: ignore[attr-defined]
        job.waste_in_period_amount = Amount(  # type: ignore[attr-defined]
            job.waste_in_period,  # type: ignore[attr-defined]
            lower_bound=bound,
            reason=job.waste_unknown_reason if bound else "",
        )
    return jobs
