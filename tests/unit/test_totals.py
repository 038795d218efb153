"""jobs.evaluation.totals: GPU-hours, cost and waste inside a window and MFU across jobs, defined once.

Expected values by hand from the definitions: hours inside = overlap of [started, stopped) and the window;
GPU-hours = hours x GPU-equivalents; dollars = $/day / 24 x hours; MFU weighted by peak-equivalent hours.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs.evaluation.costs import Amount, spread, total_waste
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


def _job(**kw: object) -> JobRates:
    fields: dict[str, object] = {
        "started": T0, "stopped": T0 + 30 * H, "gpu_equivalents": 8.0, "peak_equivalents": 8.0,
        "cost_per_day_usd": 240.0, "waste_per_day_usd": 48.0, "waste_lower_bound_per_day_usd": 24.0,
        "mfu": 0.4,
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


def test_cost_inside_spreads_the_daily_rate_and_is_unknown_without_a_price() -> None:
    assert cost_inside(_job(), T0 + 24 * H, T0 + 48 * H) == pytest.approx(240.0 / 24 * 6)
    assert cost_inside(_job(cost_per_day_usd=None), T0, T0 + 48 * H) is None
    assert cost_inside(_job(), T0 + 40 * H, T0 + 48 * H) == 0.0


def test_waste_inside_is_exact_at_least_or_unknown() -> None:
    assert waste_inside(_job(), T0, T0 + 24 * H) == Amount(48.0)
    bounded = waste_inside(_job(waste_per_day_usd=None), T0, T0 + 12 * H, reason="MFU unknown")
    assert bounded == Amount(12.0, lower_bound=True, reason="MFU unknown")
    unknown = waste_inside(_job(waste_per_day_usd=None, waste_lower_bound_per_day_usd=None), T0, T0 + H, "x")
    assert unknown.usd is None and unknown.reason == "x"


def test_spread_is_the_rate_over_hours_and_refuses_nonsense() -> None:
    assert spread(48.0, 36.0) == pytest.approx(72.0)
    with pytest.raises(ValueError, match="hours must not be negative"):
        spread(48.0, -1.0)
    with pytest.raises(ValueError, match="finite"):
        spread(float("nan"), 1.0)


def test_a_jobs_total_waste_is_its_waste_inside_its_whole_run() -> None:
    job = _job()
    whole = waste_inside(job, job.started, job.stopped)
    assert total_waste(Amount(48.0), 30 * 3600.0) == whole == Amount(60.0)


def test_weighted_mfu_weights_by_peak_equivalent_hours_and_skips_unknown_mfu() -> None:
    # 0.5 over 30 GPU-hours and 0.1 over 10: (15 + 1) / 40 = 0.4, not the mean of ratios 0.3.
    assert weighted_mfu([(0.5, 30.0), (0.1, 10.0), (None, 1000.0)]) == pytest.approx(0.4)
    assert weighted_mfu([(None, 10.0)]) is None
    assert weighted_mfu([(0.5, 0.0)]) is None
    assert weighted_mfu([]) is None
    with pytest.raises(ValueError, match="must not be negative"):
        weighted_mfu([(0.5, -1.0)])


def test_with_one_price_the_periods_costs_add_up_to_the_price_books_cost_of_the_run() -> None:
    # 4 GPU-equivalents at $6.88/GPU-h: $/day = 4 x 6.88 x 24 = 660.48. Split at T0 + 24 h, the two
    # windows' costs add up to the dated price book's cost of the whole 30 h run: 4 x 30 x 6.88 = 825.60.
    from jobs.evaluation.costs import cost_per_day, window_cost

    job = _job(gpu_equivalents=4.0, cost_per_day_usd=cost_per_day(4.0, 6.88))
    first = cost_inside(job, T0 - 48 * H, T0 + 24 * H)
    second = cost_inside(job, T0 + 24 * H, T0 + 96 * H)
    assert first is not None and second is not None
    book = window_cost([(T0, 6.88)], job.started, job.stopped, 4.0)
    assert book.usd == pytest.approx(825.60)
    assert first + second == pytest.approx(book.usd)
    assert gpu_hours_inside(job, T0 - 48 * H, T0 + 96 * H) == pytest.approx(book.gpu_hours)
