"""Input checks shared by the pure evaluation modules (costs, flops): a clear ValueError naming the
argument instead of a NaN or a negative dollar figure travelling on. Pure: no Django."""

from __future__ import annotations

import math
import numbers


def number(name: str, value: object) -> float:
    """`value` as a finite float; bool is refused (an int subclass: True as a count is a bug upstream)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    result = float(value)
    if not math.isfinite(result):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return result


def non_negative(name: str, value: object) -> float:
    """A finite number >= 0."""
    result = number(name, value)
    if result < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    return result


def positive(name: str, value: object) -> float:
    """A finite number > 0."""
    result = number(name, value)
    if result <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return result
