"""jobs.evaluation.costs behaviours that the mutation benchmark (benchmarks/mutation.py) found untested.

Expected values are derived in the comments from the module's definitions: cost/day = GPUs × $/GPU-h × 24,
waste = cost/day × max(idle share, 1 − MFU ÷ reference), energy by the trapezoid rule without bridging
gaps longer than max_gap_s (1 kWh = 3.6e6 J).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from jobs.evaluation.costs import (
    Amount,
    cost_per_day,
    energy_kwh_from_power,
    split_waste,
)

T0 = datetime(2026, 11, 30, tzinfo=UTC)


def test_a_bool_or_a_numeric_string_is_not_a_gpu_count() -> None:
    # True would silently count as 1 GPU and "2" as 2: both are bugs upstream, refused.
    with pytest.raises(ValueError):
        cost_per_day(True, 2.0)
    with pytest.raises(ValueError):
        cost_per_day("2", 2.0)  # type: ignore[arg-type]


def test_a_missing_power_sample_skips_only_its_two_intervals() -> None:
    # 100 W over 0-10 s = 1000 J; 10-20 and 20-30 touch the missing sample; 200 W over 30-40 s = 2000 J.
    # 3000 J = 3000 / 3.6e6 kWh, 20 s covered, samples 0, 1, 3, 4 used.
    est = energy_kwh_from_power([(0.0, 100.0), (10.0, 100.0), (20.0, None), (30.0, 200.0), (40.0, 200.0)])
    assert est.kwh == pytest.approx(3000.0 / 3.6e6)
    assert est.covered_s == pytest.approx(20.0)
    assert est.samples_used == 4


def test_an_interval_exactly_as_long_as_the_gap_limit_is_bridged() -> None:
    # "Longer than max_gap_s" is a gap; 120 s at 100 W with the 120 s default is 12,000 J.
    est = energy_kwh_from_power([(0.0, 100.0), (120.0, 100.0)])
    assert est.kwh == pytest.approx(12_000.0 / 3.6e6)
    assert est.gaps_skipped == 0


def test_every_skipped_gap_is_counted() -> None:
    # Two 200 s holes (> 120 s): two gaps, no energy.
    est = energy_kwh_from_power([(0.0, 100.0), (200.0, 100.0), (400.0, 100.0)])
    assert est.gaps_skipped == 2
    assert est.kwh == 0.0


def test_an_idle_share_of_exactly_one_is_the_whole_cost() -> None:
    # All GPU-time idle: idle waste = $384/day × 1 = $384 (the total is unknown without MFU).
    waste = split_waste(384.0, mfu=None, reference_mfu=0.45, idle_share=1.0)
    assert waste.idle_per_day == pytest.approx(384.0)
    assert waste.lower_bound_per_day == pytest.approx(384.0)


def test_an_idle_share_a_rounding_error_above_one_is_clamped_to_the_cost() -> None:
    # Shares up to 1 + 1e-9 are accepted as float noise and clamped: idle waste is exactly cost × 1.
    waste = split_waste(100.0, mfu=None, reference_mfu=0.45, idle_share=1.0 + 5e-10)
    assert waste.idle_per_day == 100.0


def test_unknown_mfu_and_utilisation_say_so_in_the_reason() -> None:
    # Default reason "MFU unknown", plus why not even the idle part is known.
    waste = split_waste(100.0, mfu=None, reference_mfu=0.45, idle_share=None)
    assert waste.reason == "MFU unknown; utilisation unknown, so not even the idle part is known"
    assert waste.lower_bound_per_day is None


def test_no_price_is_the_stated_reason() -> None:
    waste = split_waste(None, mfu=0.3, reference_mfu=0.45, idle_share=0.1)
    assert waste.reason == "no price for the job's GPU model and tier"


def test_a_known_waste_has_an_empty_reason() -> None:
    # cost 384, MFU 0.30 of 0.45: efficiency = 384 × (1 − 2/3) = 128 > idle 384 × 0.1 = 38.4.
    waste = split_waste(384.0, mfu=0.30, reference_mfu=0.45, idle_share=0.1)
    assert waste.total_per_day == pytest.approx(128.0)
    assert waste.reason == ""


def test_an_amount_with_neither_total_nor_floor_is_not_computable() -> None:
    amount = Amount.of(None, None, "")
    assert amount.reason == "not computable"
    assert amount.text() == "unknown (not computable)"


def test_an_unknown_amount_without_reason_reads_unknown() -> None:
    assert Amount(None).text() == "unknown"


def test_amounts_from_100_dollars_are_shown_without_cents() -> None:
    assert Amount(100.0).text() == "$100"
    assert Amount(100.4).text() == "$100"
    assert Amount(99.5).text() == "$99.50"
