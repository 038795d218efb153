"""Cost, waste and energy (jobs/evaluation/costs.py)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from jobs.evaluation import costs

T0 = datetime(2026, 3, 1, 0, 0, tzinfo=UTC)


def test_cost_per_day_is_gpus_times_price_times_24() -> None:
    # 256 H100 at AWS on-demand: "tens of thousands of USD a day" (formulas.md).
    assert costs.cost_per_day(256, 6.88) == pytest.approx(256 * 6.88 * 24)
    assert 10_000 < costs.cost_per_day(256, 6.88) < 100_000


def test_waste_per_day_scales_with_shortfall_against_reference() -> None:
    assert costs.waste_per_day(1000.0, mfu=0.30, reference_mfu=0.45) == pytest.approx(
        1000 * (1 - 0.30 / 0.45)
    )


def test_waste_per_day_uses_default_target_of_45_percent() -> None:
    assert costs.DEFAULT_REFERENCE_MFU == 0.45
    assert costs.waste_per_day(900.0, mfu=0.225) == pytest.approx(450.0)


@pytest.mark.parametrize("mfu", [0.45, 0.5, 0.9, 1.3])
def test_waste_is_never_negative_when_job_beats_reference(mfu: float) -> None:
    assert costs.waste_per_day(1000.0, mfu=mfu, reference_mfu=0.45) == 0.0


def test_waste_rejects_zero_reference_and_negative_inputs() -> None:
    with pytest.raises(ValueError, match="reference_mfu must be positive"):
        costs.waste_per_day(100.0, 0.3, 0.0)
    with pytest.raises(ValueError, match="mfu must not be negative"):
        costs.waste_per_day(100.0, -0.1)
    with pytest.raises(ValueError, match="daily_cost must not be negative"):
        costs.waste_per_day(-1.0, 0.1)


def test_window_cost_splits_at_mid_job_price_change() -> None:
    prices = [(T0 - timedelta(days=30), 4.0), (T0 + timedelta(hours=10), 2.0)]
    result = costs.window_cost(prices, T0, T0 + timedelta(hours=24), gpus=8)
    assert result.usd == pytest.approx(8 * (10 * 4.0 + 14 * 2.0))
    assert result.gpu_hours == pytest.approx(8 * 24)
    assert [segment.usd_per_gpu_hour for segment in result.segments] == [4.0, 2.0]
    assert result.segments[0].end == result.segments[1].start == T0 + timedelta(hours=10)


def test_window_cost_ignores_price_order_and_prices_outside_window() -> None:
    prices = [
        (T0 + timedelta(days=5), 9.0),
        (T0 + timedelta(hours=1), 3.0),
        (T0 - timedelta(days=1), 1.0),
        (T0 - timedelta(days=10), 100.0),
    ]
    result = costs.window_cost(prices, T0, T0 + timedelta(hours=3), gpus=2)
    assert result.usd == pytest.approx(2 * (1 * 1.0 + 2 * 3.0))
    assert len(result.segments) == 2


def test_window_cost_accepts_dates_as_midnight_in_window_timezone() -> None:
    prices = [(date(2026, 2, 1), 6.88), (date(2026, 3, 2), 5.0)]
    result = costs.window_cost(prices, T0 + timedelta(hours=12), T0 + timedelta(hours=36), gpus=1)
    assert result.usd == pytest.approx(12 * 6.88 + 12 * 5.0)


def test_window_cost_without_price_at_start_raises_instead_of_guessing() -> None:
    with pytest.raises(ValueError, match="no price in effect"):
        costs.window_cost([(T0 + timedelta(hours=1), 2.0)], T0, T0 + timedelta(hours=2), gpus=1)
    with pytest.raises(ValueError, match="no prices"):
        costs.window_cost([], T0, T0 + timedelta(hours=2), gpus=1)


def test_window_cost_rejects_two_prices_at_same_instant() -> None:
    with pytest.raises(ValueError, match="same time"):
        costs.window_cost([(T0, 1.0), (T0, 2.0)], T0, T0 + timedelta(hours=1), gpus=1)


def test_empty_window_costs_nothing() -> None:
    result = costs.window_cost([(T0, 3.0)], T0, T0, gpus=4)
    assert result.usd == 0.0 and result.segments == ()


def test_book_cost_charges_the_earliest_price_for_hours_before_the_book_starts() -> None:
    # Book: $2 from T0 + 4 h, $3 from T0 + 6 h. Over [T0, T0 + 8 h) on 2 GPUs: the first 4 h take the
    # earliest price too, so 2 x (6 h x 2 + 2 h x 3) = $36; window_cost alone refuses that window.
    book = [(T0 + timedelta(hours=6), 3.0), (T0 + timedelta(hours=4), 2.0)]
    result = costs.book_cost(book, T0, T0 + timedelta(hours=8), gpus=2)
    assert result.usd == pytest.approx(36.0) and result.gpu_hours == pytest.approx(16.0)
    assert [s.usd_per_gpu_hour for s in result.segments] == [2.0, 3.0]
    # A window after the book starts is window_cost's answer unchanged.
    later = costs.book_cost(book, T0 + timedelta(hours=5), T0 + timedelta(hours=7), gpus=1)
    assert later == costs.window_cost(book, T0 + timedelta(hours=5), T0 + timedelta(hours=7), gpus=1)
    with pytest.raises(ValueError, match="no prices given"):
        costs.book_cost([], T0, T0 + timedelta(hours=1), gpus=1)


def test_waste_share_is_the_share_of_spend_wasted_and_none_for_a_zero_rate() -> None:
    assert costs.waste_share(128.0, 384.0) == pytest.approx(1 / 3)
    assert costs.waste_share(0.0, 0.0) is None
    with pytest.raises(ValueError, match="must not be negative"):
        costs.waste_share(-1.0, 10.0)


def test_energy_from_power_trapezoid() -> None:
    samples = [(0.0, 100.0), (30.0, 200.0), (60.0, 200.0)]
    estimate = costs.energy_kwh_from_power(samples)
    joules = 0.5 * (100 + 200) * 30 + 200 * 30
    assert estimate.kwh == pytest.approx(joules / 3.6e6)
    assert estimate.covered_s == 60 and estimate.gaps_skipped == 0 and estimate.samples_used == 3


def test_energy_from_power_does_not_bridge_long_gaps() -> None:
    samples = [(0.0, 700.0), (30.0, 700.0), (30.0 + 3600.0, 700.0), (3660.0, 700.0)]
    estimate = costs.energy_kwh_from_power(samples, max_gap_s=120)
    assert estimate.kwh == pytest.approx(700 * 60 / 3.6e6)
    assert estimate.gaps_skipped == 1
    assert estimate.covered_s == 60


def test_energy_from_power_skips_missing_values_and_sorts_datetimes() -> None:
    samples = [(T0 + timedelta(seconds=60), 400.0), (T0, 400.0), (T0 + timedelta(seconds=30), None)]
    estimate = costs.energy_kwh_from_power(samples)
    assert estimate.kwh == 0.0 and estimate.covered_s == 0


def test_energy_from_power_rejects_naive_datetimes_and_negative_power() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        costs.energy_kwh_from_power([(datetime(2026, 1, 1), 1.0)])
    with pytest.raises(ValueError, match="power"):
        costs.energy_kwh_from_power([(0.0, -5.0)])


def test_energy_cost_at_price_per_kwh() -> None:
    assert costs.energy_cost(12.5, 0.2) == pytest.approx(2.5)
