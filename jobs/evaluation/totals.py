"""A job's GPU-hours, cost and waste inside a window, and MFU across jobs: each defined once. Pure Python.

Every channel that sums jobs over a period (leaderboard page, team page, weekly email, API, CSV, the worst
jobs list) and the job page's totals use these definitions. The leaderboard computes them in SQL for speed
(jobs/outputs/leaderboard.py); tests/test_definitions_once.py checks its expressions equal these on sample
jobs, so the SQL is a fast copy of this module, not a second definition.

* hours inside = the part of the job's run [started, stopped) inside the window [start, end), in hours; a
  running job runs until now (the caller passes now as `stopped`).
* GPU-hours = hours inside x the GPU-equivalents its stored evaluation charged it for (GPUs x its share on
  time-sliced or MIG GPUs, `Evaluation.sharing.gpu_equivalents`; its GPU count when the GPUs were its own).
  Never the raw GPU count of a shared job: that would charge a shared GPU once per job on it.
* cost inside = the dated price book of the job's GPU model and tier over the part of its run inside the
  window, x its GPU-equivalents, split at every price change (`costs.book_cost`: each price holds from its
  `effective_from` until the next; hours before the book's first entry are charged that earliest price).
  This is the same definition as the job's own total cost (`Job.cost_usd`, jobs.evaluation.kpis), so the
  costs of adjacent periods covering a job's run add up to its total, and a price change moves a period's
  cost only for the hours after it.
* waste inside = the job's waste share x its cost inside, where the share is the stored waste $/day /
  the stored cost $/day (`costs.waste_share`: the share of spend wasted, which does not depend on the
  price); the "at least" lower bound (the idle waste, when MFU is unknown) is its share x the cost inside
  the same way (`costs.waste_of_cost`, which the job's total waste uses too, of `Job.cost_usd`). Over a
  window with one price this is the stored rate / 24 x hours.
* a cost is unknown (None; counted apart, never $0) when the evaluation found no price (stored cost rate
  None) or the book has no entry for the job's GPU model and tier; its waste is then unknown too. A waste
  that is unknown (no MFU) contributes its stated lower bound and keeps the "at least" mark. A stored cost
  rate of $0/day gives no share (0/0): the waste inside is $0 when the dated cost inside is $0 too (nothing
  was spent) and unknown otherwise (a price change to or from $0 while the job ran).
* MFU across jobs (a team's MFU) is weighted by peak-equivalent GPU-hours: sum(MFU x peak-equivalents x
  hours) / sum(peak-equivalents x hours) over the jobs that have an MFU. Decision (issue 27): GPU-hours, not
  peak FLOP capacity. Each job's MFU is already a share of its own GPUs' dense peak, so weighting by its
  GPU-hours says "what share of the peak did the team's GPU time reach", and one hour on an A100 counts as
  much as one on an H100: a team is not judged almost only by its fastest GPUs. It also needs nothing but
  the stored MFU and hours, so the SQL computes it exactly. The capacity-weighted copies were deleted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime

from jobs.evaluation.checks import non_negative as _non_negative
from jobs.evaluation.costs import SECONDS_PER_HOUR, Amount, book_cost, waste_of_cost


@dataclass(frozen=True)
class JobRates:
    """What a job's stored evaluation says, as the totals read it (columns of `Job`).

    `stopped` is the job's end, or now while it runs. Rates in $/day; None = unknown. `prices` is the dated
    price book of the job's GPU model and tier, (effective_from, USD per GPU-hour) in any order
    (jobs.evaluation.load.prices_for); empty when the book has none.
    """

    started: datetime
    stopped: datetime
    gpu_equivalents: float
    peak_equivalents: float
    cost_per_day_usd: float | None
    waste_per_day_usd: float | None
    waste_lower_bound_per_day_usd: float | None
    mfu: float | None
    prices: tuple[tuple[datetime | date, float], ...]


def hours_inside(started: datetime, stopped: datetime, start: datetime, end: datetime) -> float:
    """Hours of [started, stopped) inside [start, end); 0 when they do not overlap."""
    for value in (started, stopped, start, end):
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise ValueError(f"hours_inside needs timezone-aware datetimes, got {value!r}")
    if end < start:
        raise ValueError(f"the window ends ({end.isoformat()}) before it starts ({start.isoformat()})")
    seconds = (min(stopped, end) - max(started, start)).total_seconds()
    return max(seconds, 0.0) / SECONDS_PER_HOUR


def gpu_hours(gpu_equivalents: float, hours: float) -> float:
    """GPU-hours charged: GPU-equivalents x hours (a job's whole run in its evaluation, or a window)."""
    return _non_negative("gpu_equivalents", gpu_equivalents) * _non_negative("hours", hours)


def gpu_hours_inside(job: JobRates, start: datetime, end: datetime) -> float:
    """GPU-hours the job is charged inside the window: hours inside x its GPU-equivalents."""
    return gpu_hours(job.gpu_equivalents, hours_inside(job.started, job.stopped, start, end))


def cost_inside(job: JobRates, start: datetime, end: datetime) -> float | None:
    """The job's cost inside the window in USD, from the dated price book (see the module docstring);
    None when it is unknown (no price when evaluated, or no book for its GPU model and tier)."""
    hours = hours_inside(job.started, job.stopped, start, end)
    if job.cost_per_day_usd is None or not job.prices:
        return None
    if hours == 0:
        return 0.0
    return book_cost(job.prices, max(job.started, start), min(job.stopped, end), job.gpu_equivalents).usd


def waste_inside(job: JobRates, start: datetime, end: datetime, reason: str = "") -> Amount:
    """The job's waste inside the window: `costs.waste_of_cost` of its cost inside (the share of its spend
    wasted x that cost): exact; "at least" its idle waste's share when MFU is unknown (`reason` says why);
    unknown when the cost is, when not even the idle part is known, or when a $0/day cost rate gives no
    share for a cost that is not $0."""
    exact = job.waste_per_day_usd is not None
    rate = job.waste_per_day_usd if exact else job.waste_lower_bound_per_day_usd
    per_day = Amount(rate, lower_bound=not exact and rate is not None, reason="" if exact else reason)
    return waste_of_cost(per_day, job.cost_per_day_usd, cost_inside(job, start, end))


def weighted_mfu(items: Iterable[tuple[float | None, float]]) -> float | None:
    """MFU across jobs from (MFU, peak-equivalent GPU-hours) pairs, weighted by those hours (see the module
    docstring for why GPU-hours and not capacity). Jobs without an MFU are left out; None when no job
    with an MFU has any hours."""
    numerator = denominator = 0.0
    for mfu, hours in items:
        if mfu is None:
            continue
        weight = _non_negative("peak-equivalent GPU-hours", hours)
        numerator += _non_negative("mfu", mfu) * weight
        denominator += weight
    return numerator / denominator if denominator > 0 else None
