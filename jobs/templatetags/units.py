"""Template filters that always print a unit, and a dash for a missing number (never a fake 0)."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from jobs.evaluation.costs import NO_PRICE_REASON, Amount, format_usd, waste_of_cost
from jobs.outputs.numbers import format_number

register = template.Library()

#: The words every dollar figure carries, on every page and in CSV headers: one table, so a "$" is never
#: shown without saying whether it is a total, a rate or a period's sum.
MONEY_UNITS = {
    "total": " total",
    "day": "/day",
    "week": " this week",
    "month": " this month",
    "period": " in the period",
}

_MISSING = mark_safe('<span class="na" title="not available">—</span>')


@register.filter
def pct(value: float | None, digits: int = 1) -> str:
    """A ratio 0-1 as a percentage: 0.4623 -> '46.2 %'."""
    if value is None:
        return _MISSING
    return f"{value * 100:.{digits}f} %"


@register.filter
def usd(value: float | None) -> str:
    """Dollars with thousands separators: 12345.6 -> '$12,346'."""
    if value is None:
        return _MISSING
    return format_usd(value)


@register.filter
def num(value: float | None, digits: int = 1) -> str:
    """A number with thousands separators, or a dash."""
    if value is None:
        return _MISSING
    return f"{value:,.{digits}f}"


@register.filter
def measure(value: float | None) -> str:
    """A measured number as every page writes it (jobs.outputs.numbers.format_number): 7,140, 3.21, 8,942."""
    return format_number(value)


@register.filter
def measure_delta(value: float | None) -> str:
    """A change (B − A) as every page writes it: +7,060, −2.5, ±0."""
    return format_number(value, signed=True)


@register.filter
def signed_usd(value: float | None) -> str:
    """A change in dollars with its sign: +$120, -$40 (typographic minus)."""
    if value is None:
        return _MISSING
    sign = "+" if value >= 0 else "\u2212"
    return f"{sign}${abs(value):,.0f}"


@register.filter
def amount(value: Amount | None, unit: str = "") -> str:
    """A jobs.evaluation.costs.Amount: '$1,234', 'at least $12.50' (reason on hover and for screen
    readers), or
    'unknown' with its reason; `unit` is appended to the number ('/day')."""
    if value is None:
        return _MISSING
    if value.usd is None:
        return format_html(
            '<span class="na unknown" title="{}">unknown</span>', value.reason or "not computable"
        )
    number = format_usd(value.usd)
    if value.lower_bound:
        return format_html(
            '<span class="lower-bound" title="{}">at least {}{}'
            '<span class="visually-hidden"> ({})</span></span>',
            value.reason,
            number,
            unit,
            value.reason,
        )
    return f"{number}{unit}"


@register.filter
def finding_usd(value: float | None) -> str:
    """A finding's $/day, or 'impact unknown' when the job's waste could not be computed (never $0.00)."""
    if value is None:
        return mark_safe(
            '<span class="na unknown" title="the job\'s waste is unknown (no MFU), so this cause\'s dollars '
            'are too">impact unknown</span>'
        )
    return f"{usd(value)}/day"


def money_unit(unit: str) -> str:
    """The suffix of a unit name ('total' -> ' total', 'day' -> '/day'); an unknown name is a bug."""
    try:
        return MONEY_UNITS[unit]
    except KeyError:
        raise ValueError(f"unknown money unit {unit!r}; one of {', '.join(MONEY_UNITS)}") from None


@register.filter
def money(value: Amount | float | None, unit: str) -> str:
    """A dollar figure with its unit in the words used everywhere: '$1,234 total', '$48.00/day',
    '$90.68 this week', 'at least $12.50/day' (reason on hover), 'unknown' (reason), or a dash."""
    suffix = money_unit(unit)
    if value is None:
        return _MISSING
    if not isinstance(value, Amount):
        value = Amount(float(value))
    return amount(value, suffix)


@register.simple_tag
def money_header(label: str, unit: str) -> str:
    """A column heading with its unit: 'Cost ($ total)', 'Waste ($/day)', 'Waste ($ this week)'."""
    return f"{label} (${money_unit(unit)})"


@register.filter
def job_cost_total(job: Any) -> Amount:
    """The job's stored total cost (so far while it runs), or unknown without a price."""
    if job.cost_usd is None:
        return Amount(None, reason=NO_PRICE_REASON)
    return Amount(job.cost_usd)


@register.filter
def job_waste_total(job: Any) -> Amount:
    """The job's total waste: the share of its spend wasted × its stored total cost from the dated price
    book (jobs.evaluation.costs.waste_of_cost, as a period's waste); unknown without a price."""
    return waste_of_cost(job.waste_amount, job.cost_per_day_usd, job.cost_usd)
