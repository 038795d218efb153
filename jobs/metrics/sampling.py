"""Sampling-true statistics: which window a value stands for, where it lands on a grid, and how much
of the time the samples cover.

Pure (numpy only, no Django). The chain of windows behind a DCGM value is described in the project's shared
reference (../shared/reference/sampling.md, beside the repository); this module fixes the conventions the
service uses on top of it:

- A grid point `t` on a grid of step `s` stands for the window (t - s, t]: what
  `avg_over_time(x[s])` evaluated at `t` averages (Prometheus range selectors end at the evaluation
  time). A timestamp therefore belongs to the grid point that *closes* its window (`grid_columns`).
- A gap longer than GAP_FACTOR x the sampling interval is a gap: no value, never the last one.
- Means are time-weighted over the samples that exist, and always come with their coverage (the share
  of the window the samples stand for); a coverage below COVERAGE_SHOW_BELOW is shown beside the figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

GAP_FACTOR = 1.5
"""A gap longer than 1.5x the sampling interval is a gap (the efficiency issue's rule): one late
scrape (jitter) is still contiguous, one missed scrape (2x) is not."""

COVERAGE_SHOW_BELOW = 0.9
"""Coverage below this is shown beside the aggregate it qualifies (the efficiency issue's rule)."""

DEFAULT_SCRAPE_INTERVAL_S = 30.0
"""Prometheus scrape interval assumed for dcgm-exporter targets. The shipped Prometheus configuration
(efficiency/deploy/prometheus.yml) scrapes every 30 s, which is also dcgm-exporter's default collect
interval (30000 ms, `dcgm-exporter --help`, sampling.md); Prometheus' own global default is 1 m and its
examples use 15 s (sampling.md), so deployments that differ must say so (PROMETHEUS_SCRAPE_INTERVAL_S)."""

PROMETHEUS_RESOLUTION_S = 0.001
"""Prometheus stores timestamps in integer milliseconds (prometheus.md)."""

_EPS = 1e-6  # in units of one step: float noise of ms timestamps divided by a step, far below one ms


class SampledMean(NamedTuple):
    """A time-weighted mean and the share of its window the samples cover (both NaN-safe).

    `mean` is NaN exactly when `coverage` is 0: there is no sample to average (see `reason`).
    """

    mean: float
    coverage: float

    @property
    def reason(self) -> str | None:
        """Why `mean` is NaN, or None when it is a number."""
        return "no samples in the window" if math.isnan(self.mean) else None


def step_window_s(step_s: float) -> float:
    """The range-selector length that makes consecutive grid windows tile time without overlap.

    Prometheus 3 selects (t - w, t] but Prometheus 2 (the Debian package this project tests against,
    2.42) selects the closed [t - w, t]: with w = step a sample exactly on a grid point would be
    averaged into two windows. One millisecond less gives (t - step, t] on both, because timestamps are
    whole milliseconds; on Prometheus 3 it drops only samples at exactly t - step + 1 ms.
    """
    if not step_s > PROMETHEUS_RESOLUTION_S or not math.isfinite(step_s):
        raise ValueError(f"step must be longer than {PROMETHEUS_RESOLUTION_S} s, got {step_s}")
    return round(step_s - PROMETHEUS_RESOLUTION_S, 3)


def rate_window_s(step_s: float, scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S) -> float:
    """The window of `rate()` for a counter read at `step_s`: at least the step (no increase between two
    grid points is skipped) and at least two scrape intervals (rate() needs two samples in its window).

    Unlike a gauge's last value, a counter's rate across a short gap is exact: the increase over the gap
    is known from the samples on both sides, so a window wider than the step fills nothing in.
    """
    if not (step_s > 0 and scrape_interval_s > 0):
        raise ValueError("step and scrape interval must be positive")
    return float(max(step_s, 2.0 * scrape_interval_s))


def lattice_point(t: float, step_s: float) -> float:
    """The multiple of `step_s` (on the Unix clock) whose window (p - step, p] holds `t`.

    Grids that start at such points are aligned by construction: any two grids of one step share their
    points, whichever window each was read for.
    """
    return math.ceil(t / step_s - _EPS) * step_s


def grid_columns(times: npt.ArrayLike, origin: npt.ArrayLike, step_s: npt.ArrayLike) -> np.ndarray:
    """Column of each timestamp on the grid origin + k*step: the point closing the window that holds it.

    A sample exactly on a grid point (up to float noise) keeps that point. An off-grid sample goes to the
    next point, never to the nearest: rounding a half-step offset (`np.rint`, which rounds .5 to even)
    sends two consecutive samples to one column and leaves the next column empty, while with the
    ceiling samples one step apart always land in consecutive columns. Columns may fall outside
    [0, size); callers drop those. `origin` and `step_s` may be arrays, one per timestamp (`place_rows`).
    """
    t = np.asarray(times, dtype=np.float64)
    return np.ceil((t - np.asarray(origin)) / np.asarray(step_s) - _EPS).astype(np.int64)


def place_on_grid(
    times: npt.ArrayLike, values: npt.ArrayLike, origin: float, step_s: float, size: int
) -> np.ndarray:
    """`values` on the grid origin + k*step (k < size): NaN where no sample falls, NaN values ignored.

    Two samples in one column (a series finer than the grid) are averaged, the mean of the column's
    window over the samples inside it, as `avg_over_time` would give; the last one winning would make
    the result depend on the order rows were read in.
    """
    v = np.asarray(values, dtype=np.float64)
    cols = grid_columns(times, origin, step_s)
    ok = (cols >= 0) & (cols < size) & np.isfinite(v)
    sums = np.bincount(cols[ok], weights=v[ok], minlength=size)[:size]
    counts = np.bincount(cols[ok], minlength=size)[:size]
    out = np.full(size, np.nan)
    np.divide(sums, counts, out=out, where=counts > 0)
    return out


def grid_frame(grid: npt.ArrayLike) -> tuple[float, float]:
    """(origin, step) of a regular grid as `place_on_grid` takes them: its first point and the distance
    to the second; a one-point grid's step is one millisecond (it keeps only values within that
    millisecond), an empty grid's origin 0."""
    g = np.asarray(grid)
    origin = float(g[0]) if g.size else 0.0
    return origin, float(g[1] - g[0]) if g.size > 1 else PROMETHEUS_RESOLUTION_S


def place_rows(
    times: Sequence[np.ndarray],
    values: Sequence[np.ndarray],
    origins: npt.ArrayLike,
    steps: npt.ArrayLike,
    sizes: npt.ArrayLike,
) -> np.ndarray:
    """Many `place_on_grid` calls in one vectorised pass, the rows laid end to end in one array.

    Row i is `place_on_grid(times[i], values[i], origins[i], steps[i], sizes[i])` and starts at
    `sum(sizes[:i])`. The same arithmetic per sample (each sample's column from its own row's origin and
    step), and each cell sums the same samples in the same order (`np.bincount` adds in input order), so
    every value is bit-for-bit the one the row's own call gives. Why: the poll cycle places tens of
    thousands of short series per cycle, where numpy's per-call overhead, not the arithmetic, was the cost.
    """
    n = len(times)
    if len(values) != n:
        raise ValueError(f"times and values differ in rows: {n} != {len(values)}")
    o = np.asarray(origins, dtype=np.float64).reshape(-1)
    s = np.asarray(steps, dtype=np.float64).reshape(-1)
    z = np.asarray(sizes, dtype=np.int64).reshape(-1)
    if not o.size == s.size == z.size == n:
        raise ValueError("origins, steps and sizes need one entry per row")
    if (z < 0).any():
        raise ValueError("row sizes must not be negative")
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(z, out=starts[1:])
    total = int(starts[-1])
    out = np.full(total, np.nan)
    if n == 0 or total == 0:
        return out
    lengths = np.fromiter(map(len, times), dtype=np.int64, count=n)
    if not np.array_equal(lengths, np.fromiter(map(len, values), dtype=np.int64, count=n)):
        raise ValueError("a row's times and values differ in length")
    if not lengths.any():
        return out
    row = np.repeat(np.arange(n), lengths)
    t = np.concatenate(times).astype(np.float64, copy=False)
    v = np.concatenate(values).astype(np.float64, copy=False)
    cols = grid_columns(t, o[row], s[row])
    ok = (cols >= 0) & (cols < z[row]) & np.isfinite(v)
    cells = (starts[:-1][row] + cols)[ok]
    sums = np.bincount(cells, weights=v[ok], minlength=total)
    counts = np.bincount(cells, minlength=total)
    np.divide(sums, counts, out=out, where=counts > 0)
    return out


def rows_on_grids(
    times: Sequence[np.ndarray], values: Sequence[np.ndarray], grids: Sequence[np.ndarray]
) -> list[np.ndarray]:
    """Each row (times[i], values[i]) on its grid as `Series.on_grid` places one series (`place_on_grid`
    from the grid's first point and step; a one-point grid keeps only values within its millisecond), in
    one `place_rows` pass: the same values bit for bit, each row a view of one shared array."""
    n = len(grids)
    frames = [grid_frame(g) for g in grids]
    sizes = np.fromiter(map(len, grids), dtype=np.int64, count=n)
    origins = [f[0] for f in frames]
    steps = [f[1] for f in frames]
    flat = place_rows(times, values, origins, steps, sizes)
    bounds = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    edges = bounds.tolist()
    return [flat[edges[i] : edges[i + 1]] for i in range(n)]


def time_weighted_mean(
    values: npt.ArrayLike,
    timestamps: npt.ArrayLike,
    max_gap_s: float,
    *,
    window: tuple[float, float] | None = None,
) -> SampledMean:
    """Mean of `values` weighted by the time each sample stands for, and the share of the window covered.

    A sample at t_i stands for the time back to the previous timestamp, (t_{i-1}, t_i], when that is at
    most `max_gap_s` away (the convention of NVML's "percent of the last sample period" and of
    `avg_over_time` grid points); after a longer gap, and for the first sample, it stands for one
    sampling interval only, so the gap stays a gap instead of being filled by a neighbour. The interval
    is the median spacing of contiguous samples (max_gap_s / GAP_FACTOR when none are contiguous).
    NaN values are samples that do not exist (a grid point without data): they cover nothing.

    For raw scrapes pass max_gap_s = GAP_FACTOR x the scrape interval; for a grid of `*_over_time`
    windows, GAP_FACTOR x the step (each point stands for its whole window). `window` (start, end]
    defaults to the first sample's interval through the last timestamp.
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    t = np.asarray(timestamps, dtype=np.float64).ravel()
    if v.shape != t.shape:
        raise ValueError(f"values and timestamps differ in length: {v.size} != {t.size}")
    if not max_gap_s > 0:
        raise ValueError(f"max_gap_s must be positive, got {max_gap_s}")
    if t.size == 0:
        return SampledMean(math.nan, 0.0)
    order = np.argsort(t, kind="stable")
    t, v = t[order], v[order]
    dt = np.diff(t)
    contiguous = dt[(dt > 0) & (dt <= max_gap_s)]
    interval = float(np.median(contiguous)) if contiguous.size else max_gap_s / GAP_FACTOR
    held = np.full(t.size, interval)
    held[1:] = np.where(dt <= max_gap_s, dt, interval)
    lo, hi = (float(t[0] - held[0]), float(t[-1])) if window is None else map(float, window)
    if not hi > lo:
        raise ValueError(f"window must have positive length, got ({lo}, {hi}]")
    # Each sample's interval clipped to the window: samples outside it count for nothing.
    weight = np.clip(np.minimum(t, hi) - np.maximum(t - held, lo), 0.0, None)
    weight = np.where(np.isfinite(v), weight, 0.0)
    total = float(weight.sum())
    coverage = min(1.0, total / (hi - lo))
    if total <= 0.0:
        return SampledMean(math.nan, 0.0)
    return SampledMean(float(np.dot(weight, np.where(np.isfinite(v), v, 0.0)) / total), coverage)


def coverage_from_stats(sampled: np.ndarray | None, count: np.ndarray | None) -> float:
    """Share of a signal's GPU-time with samples, from the per-window stats of `aggregate_query`.

    `sampled[k]` is the number of samples of all GPUs in window k times (scrape interval / step), i.e.
    how many GPUs' worth of that window the samples cover; `count[k]` is how many GPUs reported in it.
    The job's GPUs are those that ever reported (max of `count`): a GPU missing for half the job halves
    its share. Without `sampled` (archives written before it existed, simulated inputs) the coverage falls
    back to the share of (GPU, window) cells with a value, which cannot see missing scrapes inside a
    window. NaN when no GPU ever reported (nothing to relate the samples to).
    """
    if count is None:
        return math.nan
    c = np.asarray(count, dtype=np.float64)
    finite = np.isfinite(c)
    if c.size == 0 or not finite.any() or not np.nanmax(c) > 0:
        return math.nan
    gpus = float(np.nanmax(c))
    if sampled is not None and np.asarray(sampled).size == c.size:
        s = np.asarray(sampled, dtype=np.float64)
        # A window with no sample is missing from the result: zero coverage, not unknown.
        got = float(np.where(np.isfinite(s), s, 0.0).sum())
    else:
        got = float(np.where(finite, c, 0.0).sum())
    # More samples than the scrape interval predicts (a faster scrape than configured) cannot cover more
    # than the whole window.
    return min(1.0, got / (gpus * c.size))


def coverage_note(coverage: float | None) -> str | None:
    """Text to show beside an aggregate whose coverage is below COVERAGE_SHOW_BELOW, else None.

    Unknown coverage (None/NaN) is said, not hidden: the figure beside it rests on an unknown share.
    """
    if coverage is None or math.isnan(coverage):
        return "coverage unknown"
    if coverage < COVERAGE_SHOW_BELOW:
        return f"coverage {100 * coverage:.0f} %"
    return None


def positions_on_grid(grid_ts: np.ndarray, want: np.ndarray) -> np.ndarray | None:
    """Indexes of the times `want` in `grid_ts` (both sorted grids), or None when some time is not on it."""
    idx = np.searchsorted(grid_ts, want)
    if want.size == 0 or idx[-1] >= grid_ts.size or not np.array_equal(grid_ts[idx], want):
        return None
    return idx
