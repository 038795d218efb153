"""Template filters that always print a unit, and a dash for a missing number (never a fake 0)."""

from __future__ import annotations

from django import template
from django.utils.safestring import mark_safe

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
    return f"${value:,.0f}" if abs(value) >= 100 else f"${value:,.2f}"


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
