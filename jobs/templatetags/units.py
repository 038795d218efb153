"""Template filters that always print a unit, and a dash for a missing number (never a fake 0)."""

from __future__ import annotations

from django import template
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from jobs.evaluation.costs import Amount, format_usd

register = template.Library()

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
