"""Pattern detectors for real exporter data: noisy, gappy (NaN = no sample), coarse (15-30 s samples).

Pure numpy. Every function treats NaN as "unknown", never as zero: autocorrelations and correlations use
only pairs where both samples exist, idle gaps need a sample that reads idle, and a stretch where the
profiling fields are blank while GPU_UTIL stays up (an Nsight capture pauses DCGM profiling) is reported
as a blank stretch so callers can exclude it instead of calling the GPU idle.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from jobs.diagnosis import thresholds as T

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
Run = tuple[int, int]  # [start, stop) sample indexes

MAD_SCALE = 1.4826  # MAD x 1.4826 estimates a normal standard deviation


# ------------------------------------------------------------------------------------------- basics


def as_float(x: npt.ArrayLike) -> FloatArray:
    """`x` as a float64 array (None -> NaN)."""
    return np.asarray(x, dtype=np.float64)


def coverage(x: npt.ArrayLike) -> float:
    """Share of finite samples (0 for an empty array)."""
    a = as_float(x)
    return float(np.isfinite(a).mean()) if a.size else 0.0


def nanquantile(x: npt.ArrayLike, q: float) -> float | None:
    """Quantile of the finite values, None when there are none."""
    a = as_float(x)
    a = a[np.isfinite(a)]
    return float(np.quantile(a, q)) if a.size else None


def _sorted_rows(matrix: npt.ArrayLike, name: str) -> tuple[FloatArray, npt.NDArray[np.intp]]:
    """A 2-D array's rows sorted (NaN last) and each row's count of non-NaN values; `name` (the caller)
    is in the error for anything but a 2-D array."""
    a = as_float(matrix)
    if a.ndim != 2:
        raise ValueError(f"{name} needs a 2-D array, got shape {a.shape}")
    a = np.sort(a, axis=1)
    return a, np.count_nonzero(~np.isnan(a), axis=1)


def row_nanquantiles(matrix: npt.ArrayLike, q: float) -> FloatArray:
    """Each row's q-quantile of its non-NaN values (NaN for a row with none): bit for bit what
    `np.nanquantile(matrix, q, axis=1)` (method "linear") gives, without its Python loop over rows.

    numpy removes a row's NaNs, takes the values at floor((n - 1) q) and the next index of the sorted row and
    interpolates with its `_lerp` (a + (b - a) t, or b - (b - a)(1 - t) when t >= 0.5); at or past the last
    index both are the row's last value and t is measured from index -1 (numpy's _get_indexes/_get_gamma).
    The same arithmetic on the same doubles gives the same result; a sort gives the order statistics its
    partition does. Per-row overhead was most of the diagnosis' CPU on a small job (#26 item 2).
    """
    a, n = _sorted_rows(matrix, "row_nanquantiles")
    rows = a.shape[0]
    if a.size == 0:
        return np.full(rows, np.nan)
    virtual = (n - 1) * np.float64(q)
    below = np.floor(virtual)
    last = virtual >= n - 1
    prev = np.where(last, n - 1, below).astype(np.intp)
    nxt = np.where(last, n - 1, below + 1).astype(np.intp)
    gamma = virtual - np.where(last, -1.0, below)
    empty = n == 0
    prev[empty] = nxt[empty] = 0
    idx = np.arange(rows)
    lo, hi = a[idx, prev], a[idx, nxt]
    diff = hi - lo
    out = lo + diff * gamma
    upper = gamma >= 0.5
    out[upper] = hi[upper] - diff[upper] * (1 - gamma[upper])
    out[empty] = np.nan
    return out


def nanmedian(x: npt.ArrayLike) -> float | None:
    """Median of the finite values, None when there are none."""
    return nanquantile(x, 0.5)


def fill_gaps(x: npt.ArrayLike) -> FloatArray:
    """Linear interpolation across NaN samples; edges hold the nearest value; all-NaN stays all-NaN."""
    a = as_float(x).copy()
    ok = np.isfinite(a)
    if ok.all() or not ok.any():
        return a
    idx = np.arange(a.size)
    a[~ok] = np.interp(idx[~ok], idx[ok], a[ok])
    return a


def rolling_median(x: npt.ArrayLike, window: int) -> FloatArray:
    """Centred rolling median over `window` samples, ignoring NaN (edges use a shrunken window)."""
    a = as_float(x)
    if a.size == 0 or window <= 1:
        return a.copy()
    half = window // 2
    padded = np.concatenate([np.full(half, np.nan), a, np.full(half, np.nan)])
    view = np.lib.stride_tricks.sliding_window_view(padded, 2 * half + 1)
    return row_nanmedians(view)


def row_nanmedians(matrix: npt.ArrayLike) -> FloatArray:
    """Each row's median of its non-NaN values (NaN for a row with none): what `np.nanmedian(matrix,
    axis=1)` gives, without its masked-array machinery (most of a rolling median's CPU, #26 item 2).

    numpy's median is the mean of the two middle values of the sorted row, (lo + hi) / 2, and for an odd
    count (x + x) / 2 = x; the same doubles give the same result. Rows must hold no infinities (numpy's
    masked median sorts them among the masked NaNs); callers pass exporter samples, which are finite or NaN.
    """
    a, n = _sorted_rows(matrix, "row_nanmedians")
    rows = a.shape[0]
    if a.size == 0:
        return np.full(rows, np.nan)
    hi = n // 2
    lo = np.where(n % 2 == 1, hi, hi - 1)
    empty = n == 0
    lo[empty] = hi[empty] = 0
    idx = np.arange(rows)
    out = (a[idx, lo] + a[idx, hi]) / 2.0
    out[empty] = np.nan
    return out


def detrend(x: npt.ArrayLike, window: int) -> FloatArray:
    """`x` minus its rolling median: removes steps and drifts slower than `window`, keeps faster cycles."""
    a = as_float(x)
    return a - rolling_median(a, window)


# --------------------------------------------------------------------------------------- periodicity


def autocorrelation(x: npt.ArrayLike, max_lag: int) -> FloatArray:
    """Autocorrelation at lags 0..max_lag from pairwise-complete samples (NaN pairs skipped).

    Normalised by the variance of all finite samples, so gaps lower the estimate's precision, not its
    scale. Lags with fewer than 3 complete pairs are NaN.
    """
    a = as_float(x)
    out = np.full(max_lag + 1, np.nan)
    ok = np.isfinite(a)
    if ok.sum() < 3:
        return out
    centred = np.where(ok, a - a[ok].mean(), 0.0)
    var = float((centred[ok] ** 2).mean())
    if var <= 0:
        return out
    for lag in range(min(max_lag, a.size - 1) + 1):
        both = ok[: a.size - lag] & ok[lag:]
        n = int(both.sum())
        if n >= 3:
            out[lag] = float((centred[: a.size - lag] * centred[lag:])[both].sum() / n / var)
    return out


@dataclass(frozen=True, slots=True)
class Periodicity:
    """A repeating pattern: its period, how strongly it repeats, and how big it is."""

    period_samples: int
    period_s: float
    acf: float  # autocorrelation at the period
    prominence: float  # rise of the autocorrelation peak above the lowest value at shorter lags
    swing: float  # peak-to-trough of the folded mean cycle, relative to the series level
    cycles: float  # how many periods the data spans
    trough_phase: int  # phase (0..period-1) of the folded cycle's minimum


def folded_cycle(x: npt.ArrayLike, period: int) -> FloatArray:
    """Mean value at each phase 0..period-1 (NaN-aware): the average shape of one cycle."""
    a = as_float(x)
    phase = np.arange(a.size) % period
    ok = np.isfinite(a)
    sums = np.bincount(phase[ok], weights=a[ok], minlength=period)
    counts = np.bincount(phase[ok], minlength=period)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def find_periodicity(
    x: npt.ArrayLike,
    step_s: float,
    *,
    min_period: int = T.PERIOD_MIN_SAMPLES,
    max_period_s: float = T.PERIOD_MAX_S,
    min_cycles: float = T.PERIOD_MIN_CYCLES,
    min_acf: float = T.PERIOD_MIN_ACF,
    min_prominence: float = T.PERIOD_MIN_PROMINENCE,
) -> Periodicity | None:
    """The shortest clear period in `x`, or None.

    The series is detrended with a rolling median four candidate periods wide (steps and drifts are not
    cycles), then a lag is a period when the autocorrelation has a local peak there that is at least
    `min_acf` and rises at least `min_prominence` above its lowest value at shorter lags. Noise on 100+
    samples keeps autocorrelations near 0 +- 0.2; a cycle dips (anti-phase) and comes back.
    """
    a = as_float(x)
    n = a.size
    if n < 8 or coverage(a) < 0.5 or step_s <= 0:
        return None
    max_period = int(min(max_period_s / step_s, n / min_cycles))
    if max_period < min_period:
        return None
    resid = detrend(a, 4 * max_period + 1)
    if not np.isfinite(resid).any() or np.nanstd(resid) <= 1e-12:
        return None
    acf = autocorrelation(resid, max_period + 1)
    for lag in range(max(min_period, 2), max_period + 1):
        value = acf[lag]
        if not np.isfinite(value) or value < min_acf:
            continue
        before = acf[lag - 1] if np.isfinite(acf[lag - 1]) else -np.inf
        after = acf[lag + 1] if lag + 1 < acf.size and np.isfinite(acf[lag + 1]) else -np.inf
        if value < before or value < after:
            continue
        shorter = acf[1:lag]
        trough = float(np.nanmin(shorter)) if np.isfinite(shorter).any() else value
        prominence = value - trough
        if prominence < min_prominence:
            continue
        cycle = folded_cycle(a, lag)
        level = nanmedian(a)
        span = float(np.nanmax(cycle) - np.nanmin(cycle)) if np.isfinite(cycle).any() else 0.0
        swing = span / abs(level) if level else math.inf
        return Periodicity(
            period_samples=lag,
            period_s=lag * step_s,
            acf=float(value),
            prominence=float(prominence),
            swing=float(swing),
            cycles=n / lag,
            trough_phase=int(np.nanargmin(cycle)),
        )
    return None


# ------------------------------------------------------------------------------------ synchronisation


@dataclass(frozen=True, slots=True)
class Synchrony:
    """How much the GPUs move together: per-GPU correlation with the mean of the others."""

    median_corr: float
    min_corr: float
    gpus: int
    per_gpu: tuple[float, ...]


def synchrony(matrix: npt.ArrayLike, *, detrend_window: int = 0) -> Synchrony | None:
    """Leave-one-out correlation of each GPU's series with its peers' mean (pairwise-complete).

    Ranks blocked in the same collective rise and fall together (correlation near 1); independent input
    pipelines or noise do not. None with fewer than two GPUs or too little data.
    """
    m = as_float(matrix)
    if m.ndim != 2 or m.shape[0] < 2 or m.shape[1] < 8:
        return None
    if detrend_window > 1:
        m = np.vstack([detrend(row, detrend_window) for row in m])
    corrs: list[float] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for g in range(m.shape[0]):
            others = np.nanmean(np.delete(m, g, axis=0), axis=0)
            c = correlation(m[g], others)
            if c is not None:
                corrs.append(c)
    if not corrs:
        return None
    arr = np.array(corrs)
    return Synchrony(float(np.median(arr)), float(arr.min()), len(corrs), tuple(round(c, 4) for c in corrs))


def correlation(a: npt.ArrayLike, b: npt.ArrayLike) -> float | None:
    """Pearson correlation over samples where both are finite; None when undefined."""
    x, y = as_float(a), as_float(b)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 5:
        return None
    x, y = x[ok] - x[ok].mean(), y[ok] - y[ok].mean()
    denom = math.sqrt(float((x * x).sum() * (y * y).sum()))
    return float((x * y).sum() / denom) if denom > 0 else None


# --------------------------------------------------------------------------------------- robust z


@dataclass(frozen=True, slots=True)
class RobustZ:
    """Robust z-scores of values against their own median and (floored) MAD spread."""

    z: FloatArray
    median: float
    spread: float


def robust_z(
    values: npt.ArrayLike, *, min_spread_rel: float = T.STRAGGLER_MIN_SPREAD_REL, min_spread_abs: float = 1e-9
) -> RobustZ | None:
    """(value - median) / max(1.4826 MAD, min_spread_rel |median|, min_spread_abs); NaN stays NaN.

    The spread floor keeps a fleet of near-identical GPUs (MAD ~ 0) from turning a 1 % difference into
    an outlier. None with fewer than three finite values.
    """
    v = as_float(values)
    ok = np.isfinite(v)
    if ok.sum() < 3:
        return None
    med = float(np.median(v[ok]))
    mad = float(np.median(np.abs(v[ok] - med))) * MAD_SCALE
    spread = max(mad, min_spread_rel * abs(med), min_spread_abs)
    return RobustZ((v - med) / spread, med, spread)


# ------------------------------------------------------------------------------------ change points


def change_points(
    x: npt.ArrayLike, *, min_size: int = 5, max_changes: int = 5, penalty: float | None = None
) -> list[int]:
    """Indexes where the mean of `x` shifts (binary segmentation, squared-error cost), NaN skipped.

    A split is kept when it lowers the cost by more than `penalty`, by default 3 sigma^2 log(n) with
    sigma estimated robustly from first differences (so noise does not split, a real level shift does).
    Returned indexes are positions in the original array where the new segment starts, sorted.
    """
    a = as_float(x)
    idx = np.flatnonzero(np.isfinite(a))
    if idx.size < 2 * min_size:
        return []
    y = a[idx]
    if penalty is None:
        diffs = np.diff(y)
        sigma = float(np.median(np.abs(diffs - np.median(diffs)))) * MAD_SCALE / math.sqrt(2.0)
        sigma = max(sigma, 1e-6 * (float(np.abs(y).max()) or 1.0))
        penalty = 3.0 * sigma * sigma * math.log(y.size)
    csum = np.concatenate([[0.0], np.cumsum(y)])
    csq = np.concatenate([[0.0], np.cumsum(y * y)])

    def cost(lo: int, hi: int) -> float:
        n = hi - lo
        s = csum[hi] - csum[lo]
        return float(csq[hi] - csq[lo] - s * s / n)

    segments: list[tuple[int, int]] = [(0, y.size)]
    found: list[int] = []
    while len(found) < max_changes:
        best: tuple[float, int, int] | None = None
        for si, (lo, hi) in enumerate(segments):
            if hi - lo < 2 * min_size:
                continue
            whole = cost(lo, hi)
            splits = np.arange(lo + min_size, hi - min_size + 1)
            n1 = splits - lo
            n2 = hi - splits
            s1 = csum[splits] - csum[lo]
            s2 = csum[hi] - csum[splits]
            q1 = csq[splits] - csq[lo]
            q2 = csq[hi] - csq[splits]
            costs = (q1 - s1 * s1 / n1) + (q2 - s2 * s2 / n2)
            k = int(np.argmin(costs))
            gain = whole - float(costs[k])
            if gain > penalty and (best is None or gain > best[0]):
                best = (gain, si, int(splits[k]))
        if best is None:
            break
        _, si, split = best
        lo, hi = segments.pop(si)
        segments += [(lo, split), (split, hi)]
        found.append(split)
    return sorted(int(idx[s]) for s in found)


# ----------------------------------------------------------------------------------- runs and gaps


def runs(mask: npt.ArrayLike, *, unknown: npt.ArrayLike | None = None, bridge: int = 0) -> list[Run]:
    """[start, stop) runs where `mask` is True.

    Samples flagged `unknown` (no data) may sit inside a run when they are at most `bridge` in a row and
    known True samples lie on both sides; they never start or end a run.
    """
    m = np.asarray(mask, dtype=bool)
    unk = np.zeros_like(m) if unknown is None else np.asarray(unknown, dtype=bool)
    out: list[Run] = []
    start: int | None = None
    last_true = -1
    for i in range(m.size):
        if m[i] and not unk[i]:
            if start is None:
                start = i
            elif i - last_true - 1 > bridge:
                out.append((start, last_true + 1))
                start = i
            last_true = i
        elif not unk[i] and start is not None:
            out.append((start, last_true + 1))
            start = None
    if start is not None:
        out.append((start, last_true + 1))
    return out


def idle_gaps(util: npt.ArrayLike, *, threshold: float = T.IDLE_UTIL_MAX, bridge: int = 0) -> list[Run]:
    """Runs of samples whose utilisation is at or below `threshold`; NaN samples are never idle."""
    u = as_float(util)
    nan = ~np.isfinite(u)
    return runs(np.where(nan, False, u <= threshold), unknown=nan, bridge=bridge)


def blank_stretches(
    profiling: Sequence[npt.ArrayLike],
    util: npt.ArrayLike,
    *,
    busy: float = T.BUSY_UTIL_MIN,
    min_len: int = 2,
) -> list[Run]:
    """Runs where every profiling series is blank while GPU_UTIL reads busy: a profiler capture, not idle.

    DCGM pauses its profiling fields while Nsight/CUPTI profile the GPU; GPU_UTIL (NVML) keeps reporting.
    """
    u = as_float(util)
    if not profiling or u.size == 0:
        return []
    blank = np.ones(u.size, dtype=bool)
    for series in profiling:
        s = as_float(series)
        if s.size != u.size:
            return []
        blank &= ~np.isfinite(s)
    hits = blank & np.isfinite(u) & (u >= busy)
    return [r for r in runs(hits) if r[1] - r[0] >= min_len]


def interval_cv(starts: Sequence[int]) -> float | None:
    """Coefficient of variation of the intervals between successive run starts (regularity); None if < 3."""
    if len(starts) < 3:
        return None
    d = np.diff(np.asarray(starts, dtype=np.float64))
    return float(d.std() / d.mean()) if d.mean() > 0 else None


def run_windows(rs: Sequence[Run], timestamps: npt.ArrayLike, step_s: float) -> list[tuple[float, float]]:
    """Runs as [start_unix, end_unix] windows (a run's end is its last sample's time + one step)."""
    ts = as_float(timestamps)
    return [(float(ts[a]), float(ts[b - 1] + step_s)) for a, b in rs if 0 <= a < b <= ts.size]


def merge_windows(
    windows: Sequence[tuple[float, float]], *, gap_s: float = 0.0, limit: int = 20
) -> list[tuple[float, float]]:
    """Sorted windows merged where they overlap or lie within `gap_s`; at most `limit` (longest kept)."""
    merged: list[tuple[float, float]] = []
    for a, b in sorted(windows):
        if merged and a <= merged[-1][1] + gap_s:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    if len(merged) > limit:
        merged = sorted(sorted(merged, key=lambda w: w[0] - w[1])[:limit])
    return merged
