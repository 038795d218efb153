"""Unit helpers shared by the trace analyses: results carry units in their key names."""

from __future__ import annotations

NS_PER_US = 1_000
NS_PER_MS = 1_000_000


def ms(ns: float | int) -> float:
    """Nanoseconds to milliseconds, rounded for display."""
    return round(float(ns) / NS_PER_MS, 6)


def pct(part: float | int, whole: float | int) -> float | None:
    """`part` as a percentage of `whole` (None when whole is 0)."""
    return round(100.0 * float(part) / float(whole), 4) if whole else None
