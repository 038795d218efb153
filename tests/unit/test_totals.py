"""jobs.evaluation.totals: GPU-hours, cost and waste inside a window and MFU across jobs, defined once.

Expected values by hand from the definitions: hours inside = overlap of [started, stopped) and the window;
GPU-hours = hours x GPU-equivalents; cost = GPU-equivalents x the dated price x hours, split at each price
change; waste = (stored waste / stored cost per day) x that cost; MFU weighted by peak-equivalent hours.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs.evaluation.costs import Amount, waste_of_cost
from jobs.evaluation.totals import (
    JobRates,
    cost_inside,
    gpu_hours_inside,
    hours_inside,
    waste_inside,
    weighted_mfu,
)

T0 = datetime(2026, 11, 30, tzinfo=UTC)
H = timedelta(hours=1)
# $240/day for 8 GPU-equivalents: 240 / (8 x 24) = $1.25 per GPU-hour, in force since long before T0.
BOOK = ((T0 - 1000 * H, 1.25),)


def _job(**kw: object) -> JobRates:
    fields: dict[str, object] = {
        "started": T0, "stopped": T0 + 30 * H, "gpu_equivalents": 8.0, "peak_equivalents": 8.0,
        "cost_per_day_usd": 240.0, "waste_per_day_usd": 48.0, "waste_lower_bound_per_day_usd": 24.0,
        "mfu": 0.4, "prices": BOOK,
    }  # fmt: skip
    fields.update(kw)
    return JobRates(**fields)  # type: ignore[arg-type]


def test_hours_inside_is_the_overlap_and_zero_outside() -> None:
    assert hours_inside(T0, T0 + 30 * H, T0 + 24 * H, T0 + 48 * H) == pytest.approx(6.0)
    assert hours_inside(T0, T0 + 30 * H, T0 - 24 * H, T0 + 48 * H) == pytest.approx(30.0)
    assert hours_inside(T0, T0 + 30 * H, T0 + 30 * H, T0 + 48 * H) == 0.0  # half-open: touching is outside
    assert hours_inside(T0, T0 + 2 * H + timedelta(minutes=30), T0, T0 + 48 * H) == pytest.approx(2.5)


def test_hours_inside_refuses_a_reversed_window_and_naive_times() -> None:
    with pytest.raises(ValueError, match="before it starts"):
        hours_inside(T0, T0 + H, T0, T0 - timedelta(seconds=1))
    with pytest.raises(ValueError, match="timezone-aware"):
        hours_inside(T0, T0 + H, T0, datetime(2026, 12, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        hours_inside(T0, "2026-12-01", T0, T0 + H)  # type: ignore[arg-type]


def test_gpu_hours_are_gpu_equivalents_not_the_gpu_count() -> None:
    # 8 GPUs time-sliced at half: 4 GPU-equivalents x 6 h inside = 24 GPU-hours (not 48).
    assert gpu_hours_inside(_job(gpu_equivalents=4.0), T0 + 24 * H, T0 + 48 * H) == pytest.approx(24.0)
    with pytest.raises(ValueError, match="gpu_equivalents must not be negative"):
        gpu_hours_inside(_job(gpu_equivalents=-1.0), T0, T0 + H)


def test_cost_inside_with_one_price_is_the_daily_rate_over_the_hours_and_unknown_without_a_price() -> None:
    assert cost_inside(_job(), T0 + 24 * H, T0 + 48 * H) == pytest.approx(240.0 / 24 * 6)
    assert cost_inside(_job(cost_per_day_usd=None), T0, T0 + 48 * H) is None  # no price when evaluated
    assert cost_inside(_job(prices=()), T0, T0 + 48 * H) is None  # no book for its GPU model and tier
    assert cost_inside(_job(), T0 + 40 * H, T0 + 48 * H) == 0.0


def test_cost_inside_follows_the_dated_book_split_at_each_price_change() -> None:
    # $1.25 until T0 + 10 h, then $2.00: a window [T0 + 6 h, T0 + 14 h) of 8 GPU-equivalents costs
    # 8 x (4 h x 1.25 + 4 h x 2.00) = 8 x 13 = $104, whatever the stored (latest) rate says.
    job = _job(prices=((T0 + 10 * H, 2.0), (T0 - 1000 * H, 1.25)), cost_per_day_usd=8 * 2.0 * 24)
    assert cost_inside(job, T0 + 6 * H, T0 + 14 * H) == pytest.approx(104.0)
    # The window is clipped to the run first: [T0 + 20 h, T0 + 30 h) of it, all at $2.00 = 8 x 10 x 2.
    assert cost_inside(job, T0 + 20 * H, T0 + 99 * H) == pytest.approx(160.0)


def test_hours_before_the_book_starts_are_charged_its_earliest_price() -> None:
    # The book starts at T0 + 12 h at $1.50; the run starts at T0: its first 12 h cost $1.50 too.
    job = _job(prices=((T0 + 12 * H, 1.5), (T0 + 24 * H, 3.0)))
    assert cost_inside(job, T0, T0 + 12 * H) == pytest.approx(8 * 12 * 1.5)
    assert cost_inside(job, T0, T0 + 30 * H) == pytest.approx(8 * (24 * 1.5 + 6 * 3.0))


def test_waste_inside_is_the_waste_share_of_the_dated_cost() -> None:
    # Share wasted: 48 / 240 = 20 %, its lower bound 24 / 240 = 10 %, at any price. Over [T0 + 6, T0 + 14)
    # with the price change above the cost is $104, so the waste is $20.80, "at least" $10.40 without MFU.
    book = ((T0 - 1000 * H, 1.25), (T0 + 10 * H, 2.0))
    assert waste_inside(_job(prices=book), T0 + 6 * H, T0 + 14 * H).usd == pytest.approx(20.8)
    bounded = waste_inside(_job(prices=book, waste_per_day_usd=None), T0 + 6 * H, T0 + 14 * H, "MFU unknown")
    assert bounded.usd == pytest.approx(10.4) and bounded.lower_bound and bounded.reason == "MFU unknown"
    assert waste_inside(_job(prices=()), T0, T0 + H, "no price").usd is None


def test_a_zero_cost_rate_gives_no_waste_share_so_waste_is_zero_only_where_the_cost_is() -> None:
    # Priced at $0 when evaluated (the latest price is $0): 0/0 says nothing about the share wasted.
    free = _job(cost_per_day_usd=0.0, waste_per_day_usd=0.0, prices=((T0 - 1000 * H, 0.0),))
    assert waste_inside(free, T0, T0 + 24 * H) == Amount(0.0)
    crossed = _job(
        cost_per_day_usd=0.0, waste_per_day_usd=0.0, prices=((T0 - 1000 * H, 1.0), (T0 + 10 * H, 0.0))
    )
    assert cost_inside(crossed, T0, T0 + 24 * H) == pytest.approx(80.0)
    unknown = waste_inside(crossed, T0, T0 + 24 * H)
    assert unknown.usd is None and "$0/day" in unknown.reason
    assert waste_inside(crossed, T0 + 12 * H, T0 + 24 * H) == Amount(0.0)  # only $0 hours inside


def test_waste_inside_is_exact_at_least_or_unknown() -> None:
    assert waste_inside(_job(), T0, T0 + 24 * H) == Amount(48.0)
    bounded = waste_inside(_job(waste_per_day_usd=None), T0, T0 + 12 * H, reason="MFU unknown")
    assert bounded == Amount(12.0, lower_bound=True, reason="MFU unknown")
    unknown = waste_inside(_job(waste_per_day_usd=None, waste_lower_bound_per_day_usd=None), T0, T0 + H, "x")
    assert unknown.usd is None and unknown.reason == "x"


def test_a_jobs_total_waste_is_its_waste_inside_its_whole_run() -> None:
    job = _job()
    whole = waste_inside(job, job.started, job.stopped)
    stored_total_cost = cost_inside(
        job, job.started, job.stopped
    )  # the book's cost of the run, as kpis stores it
    assert waste_of_cost(Amount(48.0), job.cost_per_day_usd, stored_total_cost) == whole


def test_weighted_mfu_weights_by_peak_equivalent_hours_and_skips_unknown_mfu() -> None:
    # 0.5 over 30 GPU-hours and 0.1 over 10: (15 + 1) / 40 = 0.4, not the mean of ratios 0.3.
    assert weighted_mfu([(0.5, 30.0), (0.1, 10.0), (None, 1000.0)]) == pytest.approx(0.4)
    assert weighted_mfu([(None, 10.0)]) is None
    assert weighted_mfu([(0.5, 0.0)]) is None
    assert weighted_mfu([]) is None
    with pytest.raises(ValueError, match="must not be negative"):
        weighted_mfu([(0.5, -1.0)])


def test_adjacent_periods_costs_add_up_to_the_price_books_cost_of_the_run_across_a_price_change() -> None:
    # 4 GPU-equivalents; the book: $6.88/GPU-h from T0 + 2 h (so the first 2 h use it too), $4.00 from
    # T0 + 20 h. Split at T0 + 24 h, the two windows' costs add up to the book's cost of the whole 30 h run
    # as the job's own total is computed (costs.book_cost): 4 x (20 x 6.88 + 10 x 4.00) = 710.40.
    from jobs.evaluation.costs import book_cost, cost_per_day

    book = ((T0 + 2 * H, 6.88), (T0 + 20 * H, 4.0))
    job = _job(gpu_equivalents=4.0, cost_per_day_usd=cost_per_day(4.0, 4.0), prices=book)
    first = cost_inside(job, T0 - 48 * H, T0 + 24 * H)
    second = cost_inside(job, T0 + 24 * H, T0 + 96 * H)
    assert first is not None and second is not None
    whole = book_cost(book, job.started, job.stopped, 4.0)
    assert whole.usd == pytest.approx(710.40)
    assert first + second == pytest.approx(whole.usd)
    assert second == pytest.approx(4 * 6 * 4.0)
    assert gpu_hours_inside(job, T0 - 48 * H, T0 + 96 * H) == pytest.approx(whole.gpu_hours)
