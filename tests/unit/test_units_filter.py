"""The money filter: every dollar figure carries its unit in the same words, unknown is never $0."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.template import Context, Template

from jobs.evaluation.costs import Amount, waste_of_cost
from jobs.evaluation.schema import Evaluation
from jobs.templatetags.units import (
    job_cost_total,
    job_waste_total,
    money,
    money_header,
    money_unit,
)


@pytest.mark.parametrize(
    ("unit", "text"),
    [
        ("total", "$1,235 total"),
        ("day", "$1,235/day"),
        ("week", "$1,235 this week"),
        ("month", "$1,235 this month"),
    ],
)
def test_money_prints_the_unit_in_the_same_words(unit: str, text: str) -> None:
    assert money(Amount(1234.6), unit) == text
    assert money(1234.6, unit) == text  # a plain float reads the same


def test_money_cents_below_100_dollars() -> None:
    assert money(Amount(48.0), "day") == "$48.00/day"
    assert money(0.0, "month") == "$0.00 this month"  # a true zero stays a zero


def test_money_lower_bound_says_at_least_with_the_reason() -> None:
    html = str(money(Amount(12.5, lower_bound=True, reason="MFU unknown"), "day"))
    assert "at least $12.50/day" in html
    assert 'title="MFU unknown"' in html


def test_money_unknown_is_never_zero() -> None:
    html = str(money(Amount(None, reason="no price"), "total"))
    assert "unknown" in html and "$0" not in html and 'title="no price"' in html
    assert "—" in str(money(None, "total"))


def test_money_escapes_the_reason() -> None:
    html = str(money(Amount(None, reason='<script>"x"</script>'), "day"))
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_unknown_unit_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown money unit"):
        money_unit("fortnight")
    with pytest.raises(ValueError):
        money(Amount(1.0), "hour")


def test_headers_name_the_unit() -> None:
    assert money_header("Cost", "total") == "Cost ($ total)"
    assert money_header("Waste", "day") == "Waste ($/day)"
    assert money_header("Waste", "week") == "Waste ($ this week)"
    assert money_header("Cost", "month") == "Cost ($ this month)"


def test_in_a_template() -> None:
    out = Template('{% load units %}{{ a|money:"week" }} | {% money_header "Cost" "week" %}').render(
        Context({"a": Amount(90.68)})
    )
    assert out == "$90.68 this week | Cost ($ this week)"


# A two-hour job on 8 GPUs: its evaluation stored duration 2 h = 7,200 s = 1/12 day (and 16 GPU-h).
def _job(duration_s: float | None = 7200.0, **kw: object) -> SimpleNamespace:
    base: dict[str, object] = {
        "gpu_hours": 16.0,
        "gpu_count": 8,
        "cost_usd": 64.0,  # $4/GPU-h x 8 GPUs x 2 h
        "cost_per_day_usd": 768.0,  # $4/GPU-h x 8 GPUs x 24 h
        "waste_per_day_usd": 240.0,
        "waste_lower_bound_per_day_usd": 240.0,
        "waste_unknown_reason": "",
    }
    base.update(kw)
    job = SimpleNamespace(**base)
    gpu_hours = base["gpu_hours"]
    job.evaluated = (
        None
        if duration_s is None
        else Evaluation(duration_s=duration_s, gpu_hours=float(gpu_hours) if gpu_hours is not None else 0.0)
    )
    job.waste_amount = Amount.of(
        job.waste_per_day_usd, job.waste_lower_bound_per_day_usd, job.waste_unknown_reason
    )
    return job


def test_job_totals_from_the_stored_columns() -> None:
    job = _job()
    assert job_cost_total(job) == Amount(64.0)
    # $240/day × 1/12 day = $20 of waste in total.
    total = job_waste_total(job)
    assert total.usd == pytest.approx(20.0) and not total.lower_bound
    assert money(total, "total") == "$20.00 total"


def test_job_totals_unknown_stay_unknown() -> None:
    no_price = _job(
        cost_usd=None,
        waste_per_day_usd=None,
        waste_lower_bound_per_day_usd=None,
        waste_unknown_reason="no price for the job's GPU model and tier",
    )
    assert job_cost_total(no_price).usd is None
    assert job_waste_total(no_price).usd is None
    assert job_waste_total(no_price).reason == "no price for the job's GPU model and tier"
    not_evaluated = _job(duration_s=None, gpu_hours=None, cost_usd=None, cost_per_day_usd=None,
                         waste_per_day_usd=None, waste_lower_bound_per_day_usd=None)  # fmt: skip
    assert job_waste_total(not_evaluated).usd is None
    # A rate without a stored total cost (no price in the book for the job's hours) is no total either.
    assert job_waste_total(_job(cost_usd=None)).usd is None
    assert job_waste_total(_job(cost_usd=None)).reason == "no price for the job's GPU model and tier"


def test_the_total_on_shared_gpus_uses_the_stored_duration_not_gpu_hours_over_gpus() -> None:
    # Issue 25: 8 time-sliced GPUs at 4 GPU-equivalents (share 0.5) for a day. GPU-hours are charged per
    # share: 4 x 24 h = 96 GPU-h; waste/day (already per share) $182.94. Over one day the total is $182.94;
    # 96 GPU-h / 8 GPUs = 12 h rebuilt the duration as half a day and showed $91.47.
    shared = _job(duration_s=86_400.0, gpu_hours=96.0, gpu_count=8, waste_per_day_usd=182.94,
                  waste_lower_bound_per_day_usd=182.94, cost_usd=731.76, cost_per_day_usd=731.76)  # fmt: skip
    total = job_waste_total(shared)
    assert total.usd == pytest.approx(182.94)
    assert money(total, "total") == "$183 total"  # format_usd: whole dollars from $100


def test_job_waste_total_keeps_the_lower_bound() -> None:
    # MFU unknown: only the idle part, $120/day, is known; over 1/12 day that is at least $10.
    job = _job(
        waste_per_day_usd=None, waste_lower_bound_per_day_usd=120.0, waste_unknown_reason="MFU unknown"
    )
    total = job_waste_total(job)
    assert total.usd == pytest.approx(10.0) and total.lower_bound and total.reason == "MFU unknown"


def test_total_waste_is_the_wasted_share_of_the_stored_cost_and_unknown_without_one() -> None:
    assert waste_of_cost(Amount(100.0), 400.0, 1200.0).usd == pytest.approx(300.0)  # 25 % of $1,200
    assert waste_of_cost(Amount(100.0), None, None).usd is None  # no price: no cost, no waste
    assert waste_of_cost(Amount(100.0), 400.0, None).usd is None
    bound = waste_of_cost(Amount(40.0, lower_bound=True, reason="MFU unknown"), 400.0, 1200.0)
    assert (bound.usd, bound.lower_bound, bound.reason) == (pytest.approx(120.0), True, "MFU unknown")
    assert waste_of_cost(Amount(None, reason="MFU unknown"), 400.0, 1200.0).reason == "MFU unknown"
    # Priced at $0/day: nothing spent is nothing wasted; a cost that is not $0 has no known share.
    assert waste_of_cost(Amount(0.0), 0.0, 0.0).usd == 0.0
    assert waste_of_cost(Amount(0.0), 0.0, 5.0).usd is None


def test_job_waste_total_follows_the_dated_cost_when_the_price_changed_during_the_run() -> None:
    # Two hours on 8 GPUs at $4/GPU-h, then the price fell to $2 for the last hour: the evaluation stored
    # cost_usd = 8 x (4 + 2) = $48 and today's rate 8 x 2 x 24 = $384/day; waste $120/day is 31.25 % of
    # that. The waste total is 31.25 % of the $48 actually spent ($15), not $120/day x 1/12 day ($10).
    job = _job(
        cost_usd=48.0, cost_per_day_usd=384.0, waste_per_day_usd=120.0, waste_lower_bound_per_day_usd=120.0
    )
    assert job_waste_total(job).usd == pytest.approx(15.0)
