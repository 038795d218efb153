"""Baseline.stats as a typed structure: metric key -> robust summary of the baseline's runs (msgspec).

Written by jobs.evaluation.baselines.stats_for (jobs.evaluation.robust.summarize per metric) and read by
the reference MFU, the baseline comparison, the baseline_regression rule and the baselines page. The
stored JSON keeps its shape (no migration); decoding is lenient as for artifact analyses
(jobs.profiling.schema.common.lenient): an entry that is not a mapping is dropped, a number that is
missing, non-finite or of another type reads as None, unknown keys are ignored.

Units are the metric's own (jobs.evaluation.baselines.METRICS): MFU and activity as fractions, tokens/s
per GPU, step time in ms; `mad` is the scaled MAD (x 1.4826, comparable to a standard deviation).

Pure: no Django.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from jobs.evaluation.robust import Summary
from jobs.profiling.schema.common import Num, lenient


class MetricStats(msgspec.Struct, frozen=True, kw_only=True):
    """The robust summary of one metric over the baseline's runs; None = unknown, n None = not stored."""

    median: Num | None = None
    mad: Num | None = None
    iqr: Num | None = None
    n: int | None = None
    min: Num | None = None
    max: Num | None = None

    def summary(self, *, n_unknown: int = 0) -> Summary | None:
        """As a robust.Summary, or None without a median. `n_unknown` stands in for a count not stored."""
        if self.median is None:
            return None
        n = self.n if self.n is not None else n_unknown
        return Summary(median=self.median, mad=self.mad, iqr=self.iqr, n=n, min=self.min, max=self.max)


def decode_stats(payload: Any) -> dict[str, MetricStats]:
    """Baseline.stats as stored -> metric key -> MetricStats ({} for anything that is not a mapping)."""
    if not isinstance(payload, Mapping):
        return {}
    return {
        key: lenient(entry, MetricStats)
        for key, entry in payload.items()
        if isinstance(key, str) and isinstance(entry, Mapping)
    }


def encode_stats(summaries: Mapping[str, Summary]) -> dict[str, dict[str, Any]]:
    """Baseline.stats to store from robust summaries per metric key (the shape decode_stats reads)."""
    return {
        key: msgspec.to_builtins(
            MetricStats(median=s.median, mad=s.mad, iqr=s.iqr, n=s.n, min=s.min, max=s.max)
        )
        for key, s in summaries.items()
    }
