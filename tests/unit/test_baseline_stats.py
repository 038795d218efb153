"""Baseline.stats decoded through jobs.evaluation.baseline_stats (lenient, typed)."""

from __future__ import annotations

import math

from jobs.evaluation.baseline_stats import MetricStats, decode_stats, encode_stats
from jobs.evaluation.robust import summarize


def test_stored_stats_round_trip_through_the_summary_stats_for_writes() -> None:
    summary = summarize([0.40, 0.42, 0.45, None, math.nan])
    stored = encode_stats({"mfu": summary})
    assert stored["mfu"]["n"] == 3 and set(stored["mfu"]) == {"median", "mad", "iqr", "n", "min", "max"}
    assert decode_stats(stored)["mfu"].summary() == summary


def test_junk_entries_and_values_read_as_unknown_and_unknown_keys_are_ignored() -> None:
    stats = decode_stats(
        {
            "mfu": {"median": "broken", "mad": True, "n": 2, "p90": 0.5},
            "other": 3,
            "step_time_ms": {"median": 120},
        }
    )
    assert set(stats) == {"mfu", "step_time_ms"}
    assert stats["mfu"] == MetricStats(n=2)
    assert stats["mfu"].summary() is None  # no median, no band
    assert stats["step_time_ms"].median == 120.0
    assert decode_stats(None) == {} and decode_stats([1]) == {}


def test_a_summary_without_a_stored_count_uses_the_callers_stand_in() -> None:
    stats = MetricStats(median=0.5, mad=0.01)
    summary = stats.summary(n_unknown=1)
    assert summary is not None and summary.n == 1 and summary.median == 0.5 and summary.iqr is None
    plain = stats.summary()
    assert plain is not None and plain.n == 0
