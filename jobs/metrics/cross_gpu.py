"""Cross-GPU statistics of a signal computed here from one per-series read, exactly as PromQL computes them.

Why: `signal_queries.aggregate_query` asks Prometheus for `avg(base) or min(base) or max(base) or
count(base) or sampled` and PromQL evaluates `base` (the per-GPU value of each step) once per branch, so a
finalize read every raw sample five times: 41.5 of Prometheus' 51.4 CPU-s for a 256-GPU x 3-day job
(#26 item 6). Reading `base` once, one series per GPU, and aggregating here reads each raw sample once
(`signal_queries.fetch_job_signals(stats_here=True)`; the coverage's sample count stays one cheap
server-side `sum(count_over_time)`).

The result is the one Prometheus returns, not an approximation of it. The rules are those of Prometheus
2.42's `aggregation()` (promql/engine.go, the version this project tests against):

- avg: the first series' value, then for the n-th series `mean += v/n - mean/n` (an infinite mean is kept
  when the next value is finite or the same infinity), in the order of the input vector. That order is the
  series' label order (`promql_order`) when `base` is a function of a selector, so the mean is then
  bit-identical; when `base` is a binary expression (a unit scale such as GPU_UTIL's `* 0.01`, a throttle
  bit's `floor(x / b) % 2`) Prometheus 2.42 assembles its input from a Go map, in no fixed order, and its own
  answers differ from run to run in the last bits: this one is then one of those orders (within ~1e-15).
- min / max: the first value, replaced by a smaller (larger) one or whenever the kept one is NaN: NaN only
  when every value is.
- count: the number of series with a point at that step (a NaN value counts).
- nonzero (`count(base != 0) or vector(0)`): series whose value is not 0 (NaN != 0 holds), 0 where none.
- a throttle bit (`avg(floor(base / bit) % 2)`): the avg above of `fmod(floor(v / bit), 2)` (Go's
  math.Mod is C's fmod).

Pure: numpy only, no Django, no HTTP.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from jobs.metrics.sampling import grid_frame, place_on_grid
from jobs.metrics.signals import COUNT, MAX, MEAN, MIN, NONZERO, THROTTLE_BITS, Signal

#: A range query's points lie on its grid (start + k*step, in whole ms); a point farther than this from
#: every grid point is not an answer to the grid it is placed on.
_ON_GRID_S = 0.0005


class RangeSeries(Protocol):
    """One series of a range query's answer (`jobs.metrics.prometheus.Series` satisfies it)."""

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def timestamps(self) -> np.ndarray: ...

    @property
    def values(self) -> np.ndarray: ...


def promql_order(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """Sort key of a label set in Prometheus' order (labels.Compare: the (name, value) pairs sorted by name,
    compared pair by pair, a prefix first). Go compares strings bytewise, which for UTF-8 is code point
    order, as Python's."""
    return tuple(sorted(labels.items()))


def on_grid_matrix(series: Sequence[RangeSeries], ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The series of one range query as (values, present), each `len(series) x len(ts)`, rows in
    `promql_order`. `present` marks the points the answer holds (a NaN value is a point), `values` is NaN
    elsewhere. Raises ValueError for a point that is not on the grid `ts` (not an answer to that grid)."""
    ordered = sorted(series, key=lambda s: promql_order(s.labels))
    values = np.full((len(ordered), ts.size), np.nan)
    present = np.zeros((len(ordered), ts.size), dtype=bool)
    if not ordered or ts.size == 0:
        return values, present
    t0 = float(ts[0])
    step = float(ts[1] - ts[0]) if ts.size > 1 else 1.0
    # Every point in one pass (a 256-GPU answer holds 256 series): row and column of each.
    times = np.concatenate([np.asarray(s.timestamps, dtype=np.float64) for s in ordered])
    rows = np.repeat(np.arange(len(ordered)), [len(s.timestamps) for s in ordered])
    cols = np.rint((times - t0) / step).astype(np.int64)
    wrong = (cols < 0) | (cols >= ts.size) | (np.abs(t0 + cols * step - times) > _ON_GRID_S)
    if wrong.any():
        bad = times[wrong][0]
        raise ValueError(f"point at {bad} is not on the grid {t0} + k * {step} (k < {ts.size})")
    values[rows, cols] = np.concatenate([np.asarray(s.values, dtype=np.float64) for s in ordered])
    present[rows, cols] = True
    return values, present


def promql_avg(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    """PromQL's `avg` over the rows at each column (see the module docstring); NaN where no row is present.

    Columns where every row has a finite value (nearly all of a healthy job's) take the same steps with
    the count known per row; the others go through the general rules."""
    dense = present.all(axis=0) & np.isfinite(values).all(axis=0)
    if values.shape[0] == 0 or not dense.any():
        return _promql_avg_general(values, present)
    out = np.empty(values.shape[1])
    v = values[:, dense]
    mean = v[0].copy()
    for i in range(1, v.shape[0]):
        n = float(i + 1)
        mean += v[i] / n - mean / n  # engine.go: mean += v/n - mean/n (the right side first)
    out[dense] = mean
    if not dense.all():
        out[~dense] = _promql_avg_general(values[:, ~dense], present[:, ~dense])
    return out


#: Up to this many columns the general rules run per column on Python floats (the same IEEE doubles): a
#: few columns with a missed scrape would otherwise cost a dozen numpy calls per row each.
_FEW_COLUMNS = 8


def _avg_of(column: list[float], have: list[bool]) -> float:
    """engine.go's avg of one column's present values, in order."""
    mean, n = math.nan, 0
    for v, ok in zip(column, have, strict=True):
        if not ok:
            continue
        n += 1
        if n == 1:
            mean = v
            continue
        if math.isinf(mean) and (
            (math.isinf(v) and (mean > 0) == (v > 0)) or (not math.isinf(v) and not math.isnan(v))
        ):
            continue
        mean += v / n - mean / n
    return mean


def _promql_avg_general(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    """`promql_avg` for any column: absent rows, NaN and infinite values."""
    if values.shape[1] <= _FEW_COLUMNS:
        pairs = zip(values.T.tolist(), present.T.tolist(), strict=True)
        return np.array([_avg_of(c, h) for c, h in pairs], dtype=np.float64)
    cols = values.shape[1]
    mean = np.full(cols, np.nan)
    n = np.zeros(cols)
    with np.errstate(invalid="ignore"):
        for row, have in zip(values, present, strict=True):
            first = have & (n == 0)
            n = n + have
            mean = np.where(first, row, mean)
            # engine.go: an infinite mean stays when the value is finite or the same infinity.
            keep = np.isinf(mean) & (
                (np.isinf(row) & ((mean > 0) == (row > 0))) | (~np.isinf(row) & ~np.isnan(row))
            )
            step = have & ~first & ~keep
            safe = np.where(n > 0, n, 1.0)
            mean = np.where(step, mean + (row / safe - mean / safe), mean)
    return mean


def _promql_extreme(values: np.ndarray, present: np.ndarray, *, smallest: bool) -> np.ndarray:
    """PromQL's `min` (`smallest`) or `max`: the first value, replaced by a smaller (larger) one, or any
    value while the kept one is NaN. Columns where every row has a value that is not NaN reduce in one
    call: the same extreme whatever the order (of -0 and +0, equal, either may be kept; `place_on_grid`
    writes both as +0)."""
    dense = present.all(axis=0) & ~np.isnan(values).any(axis=0)
    if values.shape[0] and dense.any():
        out = (np.minimum if smallest else np.maximum).reduce(values, axis=0)
        if not dense.all():
            out[~dense] = _promql_extreme_general(values[:, ~dense], present[:, ~dense], smallest=smallest)
        return out
    return _promql_extreme_general(values, present, smallest=smallest)


def _extreme_of(column: list[float], have: list[bool], smallest: bool) -> float:
    """engine.go's min (`smallest`) or max of one column's present values, in order."""
    out, seen = math.nan, False
    for v, ok in zip(column, have, strict=True):
        if ok and (not seen or (out > v if smallest else out < v) or math.isnan(out)):
            out = v
        seen = seen or ok
    return out


def _promql_extreme_general(values: np.ndarray, present: np.ndarray, *, smallest: bool) -> np.ndarray:
    """`_promql_extreme` for any column, row by row as engine.go does it."""
    if values.shape[1] <= _FEW_COLUMNS:
        pairs = zip(values.T.tolist(), present.T.tolist(), strict=True)
        return np.array([_extreme_of(c, h, smallest) for c, h in pairs], dtype=np.float64)
    cols = values.shape[1]
    out = np.full(cols, np.nan)
    seen = np.zeros(cols, dtype=bool)
    with np.errstate(invalid="ignore"):
        for row, have in zip(values, present, strict=True):
            better = (out > row) if smallest else (out < row)
            take = have & (~seen | better | np.isnan(out))
            out = np.where(take, row, out)
            seen |= have
    return out


def promql_min(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    """PromQL's `min` over the rows at each column; NaN where no row is present or every value is NaN."""
    return _promql_extreme(values, present, smallest=True)


def promql_max(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    """PromQL's `max` over the rows at each column; NaN where no row is present or every value is NaN."""
    return _promql_extreme(values, present, smallest=False)


def promql_count(present: np.ndarray) -> np.ndarray:
    """PromQL's `count`: rows present at each column, NaN (no point) where none is."""
    n = present.sum(axis=0).astype(np.float64)
    return np.where(n > 0, n, np.nan)


def cross_gpu_stats(signal: Signal, values: np.ndarray, present: np.ndarray) -> dict[str, np.ndarray]:
    """The stats `signal.stats` names, as `aggregate_query` asks Prometheus for them (SAMPLED apart: it needs
    the raw samples' count), from the per-series matrix of `base` (`on_grid_matrix`)."""
    if values.shape != present.shape or values.ndim != 2:
        raise ValueError(f"values {values.shape} and present {present.shape} must be one 2-D shape")
    out: dict[str, np.ndarray] = {}
    for stat in signal.stats:
        if stat == MEAN:
            out[MEAN] = promql_avg(values, present)
        elif stat == MIN:
            out[MIN] = promql_min(values, present)
        elif stat == MAX:
            out[MAX] = promql_max(values, present)
        elif stat == COUNT:
            out[COUNT] = promql_count(present)
        elif stat == NONZERO:
            with np.errstate(invalid="ignore"):
                hits = present & (values != 0)
            out[NONZERO] = hits.sum(axis=0).astype(np.float64)  # `or vector(0)`: 0, never missing
        elif stat in THROTTLE_BITS:
            with np.errstate(invalid="ignore", divide="ignore"):
                bits = np.fmod(np.floor(values / THROTTLE_BITS[stat]), 2.0)
            out[stat] = promql_avg(bits, present)
        else:
            raise ValueError(f"{signal.key}: no rule for stat {stat!r}")
    return out


def stats_from_rows(signal: Signal, series: Sequence[Any], ts: np.ndarray) -> dict[str, np.ndarray]:
    """`cross_gpu_stats` of a per-series range answer, each stat then placed on `ts` as
    `signal_queries.stats_from_series` places Prometheus' stat series (`sampling.place_on_grid`: a NaN or
    infinite value is no value), so both store the same. With no point at all, only NONZERO (its
    `or vector(0)` answers at every step): Prometheus' answer then holds no other stat's series."""
    values, present = on_grid_matrix(series, ts)
    stats = cross_gpu_stats(signal, values, present)
    if not present.any():
        stats = {k: v for k, v in stats.items() if k == NONZERO}
    origin, step = grid_frame(ts)
    return {k: place_on_grid(ts, v, origin, step, ts.size) for k, v in stats.items()}
