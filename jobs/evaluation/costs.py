"""Cost, waste and energy of GPU jobs (definitions from ``reference/formulas.md``). Pure Python, no Django.

- cost per day  = GPUs x price per GPU-hour x 24
- waste per day, split by what each part needs (``split_waste``):
  * idle waste       = cost per day x share of the job's observed GPU-time at ~0 % utilisation
                       (needs utilisation and a price, no MFU);
  * efficiency waste = cost per day x max(0, 1 - MFU / reference MFU) (needs MFU);
  * total            = max(idle, efficiency) when MFU is known; unknown (None) otherwise, with the idle
                       waste as a stated lower bound. Never 0 for "unknown".
- the cost of a window follows the dated price book: the window is split wherever the price changes
  (``window_cost``); hours before the book's first entry are charged that earliest price (``book_cost``,
  the one rule behind a job's total cost and its cost inside any period).
- share of spend wasted = waste per day / cost per day (``waste_share``): it does not depend on the price,
  so a period's waste is that share of the period's dated cost.
- energy from the DCGM TOTAL_ENERGY_CONSUMPTION counter (mJ) or by integrating POWER_USAGE (W).
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, time

from jobs.evaluation.checks import non_negative as _non_negative
from jobs.evaluation.checks import number as _number
from jobs.evaluation.checks import positive as _positive

HOURS_PER_DAY = 24.0
SECONDS_PER_HOUR = 3600.0
# The organisation's target MFU when a model/config has no healthy baseline (formulas.md: default 45 %).
DEFAULT_REFERENCE_MFU = 0.45
# 1 kWh = 3.6e6 J. The energy counter (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ) reaches the evaluation
# already in J: its increase() is scaled by 1e-3 in jobs.metrics.signals and read by jobs.metrics.ingest.
J_PER_KWH = 3.6e6
# dcgm-exporter is usually scraped every 15-30 s. A hole longer than 2 minutes means the exporter or the
# node was down: we do not know the power then, and a straight line across it would invent energy.
DEFAULT_MAX_POWER_GAP_S = 120.0


@dataclass(frozen=True)
class CostSegment:
    """Part of a window billed at one price."""

    start: datetime
    end: datetime
    usd_per_gpu_hour: float
    gpu_hours: float
    usd: float


@dataclass(frozen=True)
class WindowCost:
    """Cost of ``gpus`` GPUs over [start, end] under a dated price list."""

    usd: float
    gpu_hours: float
    segments: tuple[CostSegment, ...]


@dataclass(frozen=True)
class EnergyEstimate:
    """Energy integrated from a power series, with how much of the span it actually covers."""

    kwh: float
    covered_s: float
    gaps_skipped: int
    samples_used: int


# --------------------------------------------------------------------------------------------- helpers


def _window(start: datetime, end: datetime) -> float:
    """Length of [start, end] in seconds; rejects reversed windows and naive/aware mixes."""
    if not isinstance(start, datetime) or not isinstance(end, datetime):
        raise ValueError("start and end must be datetimes")
    if (start.tzinfo is None) != (end.tzinfo is None):
        raise ValueError("start and end must both be timezone-aware or both naive")
    seconds = (end - start).total_seconds()
    if seconds < 0:
        raise ValueError(f"end ({end.isoformat()}) is before start ({start.isoformat()})")
    return seconds


def _as_datetime(value: datetime | date, like: datetime) -> datetime:
    # A price book date means "from midnight that day", in the window's timezone so the two compare.
    if isinstance(value, datetime):
        if (value.tzinfo is None) != (like.tzinfo is None):
            raise ValueError("price effective_from and the window must both be timezone-aware or both naive")
        return value
    if isinstance(value, date):
        return datetime.combine(value, time.min, tzinfo=like.tzinfo)
    raise ValueError(f"effective_from must be a date or datetime, got {value!r}")


# -------------------------------------------------------------------------------------------- cost


def cost_per_day(gpus: float, usd_per_gpu_hour: float) -> float:
    """USD per day for ``gpus`` GPUs at ``usd_per_gpu_hour``: GPUs x price x 24."""
    return _non_negative("gpus", gpus) * _non_negative("usd_per_gpu_hour", usd_per_gpu_hour) * HOURS_PER_DAY


def waste_per_day(daily_cost: float, mfu: float, reference_mfu: float = DEFAULT_REFERENCE_MFU) -> float:
    """USD per day lost to inefficiency: cost x max(0, 1 - MFU / reference MFU); never negative.

    A job better than its reference wastes nothing (it does not earn credit against other jobs).
    """
    cost = _non_negative("daily_cost", daily_cost)
    value = _non_negative("mfu", mfu)
    reference = _positive("reference_mfu", reference_mfu)
    return cost * max(0.0, 1.0 - value / reference)


def format_usd(value: float) -> str:
    """Dollars as every channel prints them: whole dollars from $100 up, cents below ($12,346; $48.00)."""
    return f"${value:,.0f}" if abs(value) >= 100 else f"${value:,.2f}"


@dataclass(frozen=True)
class Amount:
    """A dollar figure as every channel shows it: exact, a stated lower bound, or unknown with a reason.

    `usd` None = unknown; `lower_bound` True = "at least `usd`" (some parts could not be computed).
    """

    usd: float | None
    lower_bound: bool = False
    reason: str = ""

    @classmethod
    def of(cls, total: float | None, floor: float | None, reason: str) -> Amount:
        """The total when known, else the lower bound flagged as such, else unknown."""
        if total is not None:
            return cls(total)
        return cls(floor, lower_bound=floor is not None, reason=reason or "not computable")

    def text(self, unit: str = "") -> str:
        """Plain text: "$1,234", "at least $12.50 (reason)", "unknown (reason)"."""
        if self.usd is None:
            return f"unknown ({self.reason})" if self.reason else "unknown"
        value = format_usd(self.usd)
        if self.lower_bound:
            return f"at least {value}{unit} ({self.reason})"
        return value + unit


#: Why a job's cost (and so its waste) is unknown: the evaluation found no price in the book.
NO_PRICE_REASON = "no price for the job's GPU model and tier"

#: Why a dated cost that is not $0 has no known waste when the job's stored cost rate is $0/day.
ZERO_RATE_REASON = "the job was priced at $0/day when evaluated, so the share of its spend wasted is unknown"


def waste_of_cost(per_day: Amount, cost_per_day: float | None, cost: float | None) -> Amount:
    """The waste of a dated cost (a job's total `Job.cost_usd`, or its cost inside a period): the share of
    its spend wasted (`waste_share` of its stored waste and cost rates) x that cost. The one rule for a
    job's total waste (of `Job.cost_usd`: templatetags.units.job_waste_total) and a period's
    (jobs.evaluation.totals.waste_inside, the leaderboard's SQL), so the periods covering a run add up to
    the job's total even when the price changed during it.

    Keeps the rate's kind: a lower bound ("at least" the idle waste) stays one with its reason; an unknown
    rate stays unknown with its reason; an unknown cost makes the waste unknown for want of a price
    (`NO_PRICE_REASON`); a $0/day rate gives no share, which is harmless only for a $0 cost."""
    if per_day.usd is None:
        return Amount(None, reason=per_day.reason)
    if cost is None or cost_per_day is None:
        return Amount(None, reason=NO_PRICE_REASON)
    share = waste_share(per_day.usd, cost_per_day)
    if share is None:
        if cost != 0:
            return Amount(None, reason=ZERO_RATE_REASON)
        share = 0.0
    return Amount(share * cost, per_day.lower_bound, per_day.reason)


@dataclass(frozen=True)
class Waste:
    """A job's waste per day split by what each part needs; None = cannot be computed (see `reason`).

    `total_per_day` is None when MFU is unknown; `lower_bound_per_day` is then the idle waste (what is
    certainly lost), and `reason` says what is missing. Every channel (page, leaderboard, email, API,
    /metrics) shows `total_per_day` when known, else "at least `lower_bound_per_day`" with `reason`.
    """

    total_per_day: float | None
    lower_bound_per_day: float | None
    idle_per_day: float | None
    efficiency_per_day: float | None
    reason: str = ""

    @property
    def known(self) -> bool:
        """True when the total is computed (not only bounded)."""
        return self.total_per_day is not None


def split_waste(
    daily_cost: float | None,
    *,
    mfu: float | None,
    reference_mfu: float,
    idle_share: float | None,
    mfu_missing_reason: str = "MFU unknown",
) -> Waste:
    """The job's waste per day: idle part, efficiency part and their total (see the module docstring).

    Why the total is max(idle, efficiency) and not their sum: idle GPUs do no model FLOPs, so MFU already
    counts them. With a share i of GPU-time idle and the busy GPUs at MFU m, the job's MFU is (1 - i)·m and
    the efficiency loss 1 - (1 - i)·m / ref >= i exactly when m <= ref: the efficiency waste then contains
    the idle waste. Only when the busy GPUs beat the reference is idle time the larger (and real) loss.
    """
    if daily_cost is None:
        return Waste(None, None, None, None, NO_PRICE_REASON)
    cost = _non_negative("daily_cost", daily_cost)
    idle = None
    if idle_share is not None:
        share = _non_negative("idle_share", idle_share)
        if share > 1.0 + 1e-9:
            raise ValueError(f"idle_share must be at most 1, got {idle_share!r}")
        idle = cost * min(share, 1.0)
    if mfu is None:
        reason = mfu_missing_reason
        if idle is None:
            reason += "; utilisation unknown, so not even the idle part is known"
        return Waste(None, idle, idle, None, reason)
    efficiency = waste_per_day(cost, mfu, reference_mfu)
    total = max(efficiency, idle) if idle is not None else efficiency
    return Waste(total, total, idle, efficiency, "")


def window_cost(
    prices: Iterable[tuple[datetime | date, float]], start: datetime, end: datetime, gpus: float
) -> WindowCost:
    """Cost of ``gpus`` GPUs over [start, end] when the price changes during the window.

    ``prices`` is a list of (effective_from, usd_per_gpu_hour); each price holds until the next one. The
    window is split at every change inside it. A window that starts before the first price raises
    ValueError: guessing a price would put a wrong dollar figure on the page.
    """
    count = _non_negative("gpus", gpus)
    _window(start, end)
    entries: list[tuple[datetime, float]] = []
    for effective_from, price in prices:
        entries.append((_as_datetime(effective_from, start), _non_negative("usd_per_gpu_hour", price)))
    if not entries:
        raise ValueError("no prices given")
    entries.sort(key=lambda entry: entry[0])
    for (first, _), (second, _) in itertools.pairwise(entries):
        if first == second:
            raise ValueError(f"two prices take effect at the same time ({first.isoformat()})")
    if entries[0][0] > start:
        raise ValueError(
            f"no price in effect at the window start {start.isoformat()} "
            f"(first price from {entries[0][0].isoformat()})"
        )

    segments: list[CostSegment] = []
    for index, (effective_from, price) in enumerate(entries):
        effective_to = entries[index + 1][0] if index + 1 < len(entries) else None
        seg_start = max(start, effective_from)
        seg_end = end if effective_to is None else min(end, effective_to)
        if seg_end <= seg_start:
            continue
        hours = count * (seg_end - seg_start).total_seconds() / SECONDS_PER_HOUR
        segments.append(CostSegment(seg_start, seg_end, price, hours, hours * price))
    return WindowCost(
        usd=sum(segment.usd for segment in segments),
        gpu_hours=sum(segment.gpu_hours for segment in segments),
        segments=tuple(segments),
    )


def book_cost(
    prices: Iterable[tuple[datetime | date, float]], start: datetime, end: datetime, gpus: float
) -> WindowCost:
    """Cost of ``gpus`` GPUs over [start, end] under the dated price book, where the book's earliest price
    also covers the hours before it starts: the one rule for a job's total cost (jobs.evaluation.kpis,
    which notes when it applied) and for its cost inside a period (jobs.evaluation.totals, the leaderboard's
    SQL). Charging the earliest known price rather than nothing keeps a job that predates the book from
    looking free; `window_cost` alone refuses such a window. Raises ValueError on an empty book.
    """
    _window(start, end)
    entries = sorted(((_as_datetime(when, start), price) for when, price in prices), key=lambda e: e[0])
    if not entries:
        raise ValueError("no prices given")
    if entries[0][0] > start:
        entries[0] = (start, entries[0][1])
    return window_cost(entries, start, end, gpus)


def waste_share(waste_usd_per_day: float, cost_usd_per_day: float) -> float | None:
    """The share of a job's spend that is wasted: its stored waste $/day / its stored cost $/day. Both
    rates are the same price x GPU-equivalents x 24 times a price-free factor (`split_waste`), so the share
    holds under any price and turns a dated cost into a dated waste. None when the cost rate is 0: the
    evaluation priced the job at $0 (a $0 price or no GPU-equivalents) and 0/0 says nothing about the share.
    """
    waste = _non_negative("waste_usd_per_day", waste_usd_per_day)
    cost = _non_negative("cost_usd_per_day", cost_usd_per_day)
    if cost == 0:
        return None
    return waste / cost


# ------------------------------------------------------------------------------------------ energy


def _seconds(timestamp: datetime | float) -> float:
    if isinstance(timestamp, datetime):
        if timestamp.tzinfo is None:
            raise ValueError("power sample timestamps must be timezone-aware datetimes or epoch seconds")
        return timestamp.timestamp()
    return _number("timestamp", timestamp)


def energy_kwh_from_power(
    samples: Iterable[tuple[datetime | float, float | None]],
    max_gap_s: float = DEFAULT_MAX_POWER_GAP_S,
) -> EnergyEstimate:
    """kWh from power samples (W) by the trapezoid rule, without bridging gaps longer than ``max_gap_s``.

    A missing power value (None or NaN) also breaks the series: both intervals touching it are skipped.
    Timestamps are epoch seconds or timezone-aware datetimes; samples need not be sorted.
    """
    gap_limit = _positive("max_gap_s", max_gap_s)
    points: list[tuple[float, float | None]] = []
    for timestamp, watts in samples:
        if watts is None or (isinstance(watts, numbers.Real) and math.isnan(watts)):
            points.append((_seconds(timestamp), None))
        else:
            points.append((_seconds(timestamp), _non_negative("power (W)", watts)))
    points.sort(key=lambda point: point[0])

    joules = 0.0
    covered = 0.0
    gaps = 0
    used: set[int] = set()
    for index in range(1, len(points)):
        t0, w0 = points[index - 1]
        t1, w1 = points[index]
        if w0 is None or w1 is None:
            continue
        width = t1 - t0
        if width > gap_limit:
            gaps += 1
            continue
        joules += 0.5 * (w0 + w1) * width
        covered += width
        used.update((index - 1, index))
    return EnergyEstimate(
        kwh=joules / J_PER_KWH, covered_s=covered, gaps_skipped=gaps, samples_used=len(used)
    )


def energy_cost(kwh: float, usd_per_kwh: float) -> float:
    """USD for ``kwh`` of energy at ``usd_per_kwh``."""
    return _non_negative("kwh", kwh) * _non_negative("usd_per_kwh", usd_per_kwh)
