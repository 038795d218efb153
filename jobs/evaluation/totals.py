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
* cost and waste inside = the job's stored rate in $/day / 24 x hours inside (`costs.spread`, which the
  job page's total waste uses too: `costs.total_waste`). The rate is the one
  the evaluation stored (cost: GPU-equivalents x the price in effect at the job's last evaluation x 24;
  waste: `costs.split_waste`). The job's own total cost follows the dated price book instead
  (`costs.window_cost`, stored as `Job.cost_usd`); the two agree unless the price changed during the job.
* a waste that is unknown (no MFU) contributes its stated lower bound (the idle waste) and keeps the
  "at least" mark; a cost that is unknown (no price) contributes nothing and is counted apart.
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
from datetime import datetime

from jobs.evaluation.checks import non_negative as _non_negative
from jobs.evaluation.costs import SECONDS_PER_HOUR, Amount, spread


@dataclass(frozen=True)
class JobRates:
    """What a job's stored evaluation says, as the totals read it (columns of `Job`).

    `stopped` is the job's end, or now while it runs. Rates in $/day; None = unknown.
    """

    started: datetime
    stopped: datetime
    gpu_equivalents: float
    peak_equivalents: float
    cost_per_day_usd: float | None
    waste_per_day_usd: float | None
    waste_lower_bound_per_day_usd: float | None
    mfu: float | None


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
    """The job's cost inside the window in USD; None without a price."""
    if job.cost_per_day_usd is None:
        return None
    return spread(job.cost_per_day_usd, hours_inside(job.started, job.stopped, start, end))


def waste_inside(job: JobRates, start: datetime, end: datetime, reason: str = "") -> Amount:
    """The job's waste inside the window: exact, "at least" its idle waste when MFU is unknown (`reason`
    says why), or unknown when not even the idle part is known."""
    hours = hours_inside(job.started, job.stopped, start, end)
    if job.waste_per_day_usd is not None:
        return Amount(spread(job.waste_per_day_usd, hours))
    if job.waste_lower_bound_per_day_usd is not None:
        return Amount(spread(job.waste_lower_bound_per_day_usd, hours), lower_bound=True, reason=reason)
    return Amount(None, reason=reason)


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
