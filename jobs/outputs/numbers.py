"""One way to write a measured number on every page: thousands separators, about three significant digits,
whole numbers as whole numbers, never scientific notation ("1e+03 ms"), a typographic minus for a change.
Pure (no Django): the `measure` and `measure_delta` template filters and the pages' own strings call it."""

from __future__ import annotations

import math

MISSING = "—"
MINUS = "\u2212"


def format_number(value: float | int | None, *, signed: bool = False, digits: int = 3) -> str:
    """`value` for a reader: 7,140 (a count), 8,942 (not 8941.800), 3.21, 0.0452, 1,000 (not 1e+03).

    Integral values are written whole with separators; others with `digits` significant digits (at least
    the units digit of numbers >= 10^digits, so 8941.8 is 8,942). `signed` writes "+" or a minus for a change.
    None, NaN and infinities are unknown: a dash."""
    if value is None or isinstance(value, bool):
        return MISSING
    v = float(value)
    if not math.isfinite(v):
        return MISSING
    sign = ""
    if signed:
        sign = "+" if v > 0 else MINUS if v < 0 else "±"
    elif v < 0:
        sign = MINUS
    a = abs(v)
    if a == 0:
        return "0" if not signed else "±0"
    if abs(a - round(a)) < 1e-9 * max(1.0, a) or a >= 10 ** (digits - 1):
        return f"{sign}{round(a):,}"
    decimals = max(0, digits - 1 - math.floor(math.log10(a)))
    text = f"{a:,.{decimals}f}".rstrip("0").rstrip(".")
    return f"{sign}{text}"
