"""Downsampling for charts: LTTB for the line, min/max envelopes so short spikes survive, bucket means for
heatmaps. Pure numpy: no Django.

A 7-day job sampled every 30 s has 20,160 points per series; a chart is about 1,000 pixels wide. Plotting
every point costs megabytes and draws nothing more. Largest-Triangle-Three-Buckets (Steinarsson 2013) keeps
the visual shape, but a one-sample spike (an idle step, a clock dip) can still fall between the points it
keeps; the per-bucket min/max envelope drawn behind the line keeps every extreme visible.

Missing samples are NaN and stay missing: a bucket with no sample at all becomes a gap (NaN), never a 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Candidate points per LTTB bucket handled in one vectorised block; bounds memory to ~block x k x k floats.
_BLOCK_ELEMENTS = 2_000_000
# Long series are first reduced to the min and max of points x MINMAX_RATIO / 2 buckets (MinMaxLTTB).
MINMAX_RATIO = 4
#: Stat names of a pre-downsampled series' per-window extremes (the lowest and highest fine mean inside each
#: coarse window; written by jobs.metrics.archive with its tiers): the envelope drawn from a coarse level
#: comes from them, so the short dips its means average away stay visible.
MEAN_LOW, MEAN_HIGH = "mean_low", "mean_high"


@dataclass(frozen=True, slots=True)
class Envelope:
    """Per-bucket extremes: bucket centre times, and the min and max of the samples in each bucket."""

    x: np.ndarray
    low: np.ndarray
    high: np.ndarray


def _bucket_edges(n: int, buckets: int) -> np.ndarray:
    """Start indexes of `buckets` equal-count buckets over n points (sizes differ by at most one)."""
    return np.floor(np.arange(buckets) * (n / buckets)).astype(np.int64)


def lttb(x: np.ndarray, y: np.ndarray, threshold: int) -> tuple[np.ndarray, np.ndarray]:
    """Largest-Triangle-Three-Buckets: `threshold` points of (x, y) that keep the line's visual shape.

    Exact LTTB (first and last points kept; in each bucket the point forming the largest triangle with the
    point chosen in the previous bucket and the mean of the next bucket). The sequential dependency on the
    previous choice is resolved by computing, per bucket, the best point for every possible previous choice
    (vectorised), then following the chain. NaN samples are never chosen; a bucket of only NaN yields a gap
    (its middle x with y NaN). Returns copies; inputs with at most `threshold` points come back unchanged.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n = x.size
    if x.shape != y.shape:
        raise ValueError("x and y must have the same length")
    if threshold < 3:
        raise ValueError("threshold must be at least 3")
    if n <= threshold:
        return x.copy(), y.copy()

    inner = threshold - 2
    x0 = x[0]
    x = x - x0  # unix seconds ~1.7e9: work relative to the first point to keep products well-conditioned
    # Buckets over points 1..n-2; first and last points are their own buckets.
    edges = 1 + _bucket_edges(n - 2, inner)
    ends = np.append(edges[1:], n - 1)
    sizes = ends - edges
    k = int(sizes.max())
    # Padded (inner, k) views of candidate points; padding is masked out.
    idx = edges[:, None] + np.arange(k)[None, :]
    valid = idx < ends[:, None]
    idx = np.where(valid, idx, ends[:, None] - 1)
    bx, by = x[idx], y[idx]
    ok = valid & ~np.isnan(by)
    has = ok.any(axis=1)

    # Mean of each bucket (NaN-aware), used as the third triangle vertex for the bucket before it.
    with np.errstate(invalid="ignore", divide="ignore"):
        cnt = ok.sum(axis=1)
        mean_x = np.where(valid, bx, 0.0).sum(axis=1) / sizes
        mean_y = np.where(ok, by, 0.0).sum(axis=1) / np.maximum(cnt, 1)
    mean_y = np.where(has, mean_y, np.nan)
    # Next-bucket vertex: the following bucket's mean, the last point after the last bucket. An empty next
    # bucket (a gap) falls back to this bucket's own mean so the choice measures deviation from flat.
    cx = np.append(mean_x[1:], x[-1])
    cy = np.append(mean_y[1:], y[-1])
    cy = np.where(np.isnan(cy), mean_y, cy)

    # Previous-bucket candidates: the first point for bucket 0, the padded points of bucket i-1 otherwise.
    prev_x = np.empty((inner, k))
    prev_y = np.empty((inner, k))
    prev_x[0], prev_y[0] = x[0], y[0]
    prev_x[1:], prev_y[1:] = bx[:-1], by[:-1]
    # After a gap (or a NaN first point) the chain restarts from a virtual point level with this bucket.
    fallback = np.where(np.isnan(mean_y), 0.0, mean_y)
    prev_y = np.where(np.isnan(prev_y), fallback[:, None], prev_y)

    # area(p) = |(ax - cx)(py - ay) - (ax - px)(cy - ay)| = |u*py + v*px + w| with u, v, w fixed by the
    # previous choice a: one batched matrix product gives every (previous choice, candidate) pair.
    u = prev_x - cx[:, None]
    v = cy[:, None] - prev_y
    w = -u * prev_y - v * prev_x
    coef = np.stack((u, v, w), axis=2)  # (inner, k, 3)
    pts = np.stack((by, bx, np.ones_like(bx)), axis=1)  # (inner, 3, k)
    penalty = np.where(ok, 0.0, -np.inf)[:, None, :]
    best = np.zeros((inner, k), dtype=np.int64)  # best[i, j]: choice in bucket i if bucket i-1 chose j
    block = max(1, _BLOCK_ELEMENTS // (k * k))
    for lo in range(0, inner, block):
        hi = min(inner, lo + block)
        area = np.abs(np.matmul(coef[lo:hi], pts[lo:hi]))
        area += penalty[lo:hi]
        best[lo:hi] = area.argmax(axis=2)

    chosen = np.empty(inner, dtype=np.int64)
    best_l = best.tolist()
    j = 0
    for i in range(inner):
        j = best_l[i][j]
        chosen[i] = j
    rows = np.arange(inner)
    out_x = bx[rows, chosen]
    out_y = by[rows, chosen]
    # All-NaN buckets: a gap placed mid-bucket.
    out_x = np.where(has, out_x, mean_x)
    out_y = np.where(has, out_y, np.nan)
    out_x = np.concatenate(([x[0]], out_x, [x[-1]])) + x0
    return out_x, np.concatenate(([y[0]], out_y, [y[-1]]))


def minmax_preselect(x: np.ndarray, y: np.ndarray, buckets: int) -> np.ndarray:
    """Indexes of the min and max point of each of `buckets` equal-count buckets, in order (first and last
    points included). NaN samples are skipped unless a bucket has nothing else."""
    n = x.size
    edges = _bucket_edges(n, buckets)
    ends = np.append(edges[1:], n)
    k = int((ends - edges).max())
    idx = edges[:, None] + np.arange(k)[None, :]
    valid = idx < ends[:, None]
    idx = np.where(valid, idx, ends[:, None] - 1)
    v = y[idx]
    lo = np.where(valid & ~np.isnan(v), v, np.inf).argmin(axis=1)
    hi = np.where(valid & ~np.isnan(v), v, -np.inf).argmax(axis=1)
    rows = np.arange(len(edges))
    picked = np.concatenate(([0], idx[rows, lo], idx[rows, hi], [n - 1]))
    return np.unique(picked)


def envelope(x: np.ndarray, y: np.ndarray, buckets: int) -> Envelope:
    """Min and max of y in `buckets` equal-count buckets (NaN ignored; an all-NaN bucket stays NaN)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n = x.size
    if n == 0:
        empty = np.empty(0)
        return Envelope(empty, empty, empty)
    buckets = max(1, min(buckets, n))
    edges = _bucket_edges(n, buckets)
    ends = np.append(edges[1:], n)
    with np.errstate(invalid="ignore"):
        low = np.fmin.reduceat(y, edges)
        high = np.fmax.reduceat(y, edges)
    centre = (x[edges] + x[ends - 1]) / 2.0
    return Envelope(centre, low, high)


def envelope_between(x: np.ndarray, low: np.ndarray, high: np.ndarray, buckets: int) -> Envelope:
    """The envelope of a pre-downsampled series: per bucket, the least of `low` and the most of `high`
    (each window's own extremes), NaN ignored; an all-NaN bucket stays NaN."""
    lows = envelope(x, low, buckets)
    highs = envelope(x, high, buckets)
    return Envelope(lows.x, lows.low, highs.high)


def bucket_mean(matrix: np.ndarray, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """Column-bucket means of a (rows, n) matrix, NaN ignored: returns (start index of each bucket, means).

    Used for heatmaps (GPU x time): a straggler is a row persistently lower than its peers, which a mean
    keeps; a bucket where a GPU has no sample stays NaN.
    """
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError("matrix must be 2-D")
    n = m.shape[1]
    if n == 0:
        return np.empty(0, dtype=np.int64), m.copy()
    buckets = max(1, min(buckets, n))
    edges = _bucket_edges(n, buckets)
    if buckets == n:
        return edges, m.copy()
    present = ~np.isnan(m)
    sums = np.add.reduceat(np.where(present, m, 0.0), edges, axis=1)
    counts = np.add.reduceat(present.astype(np.float64), edges, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / counts, np.nan)
    return edges, means


def downsample_line(
    x: np.ndarray, y: np.ndarray, points: int
) -> tuple[np.ndarray, np.ndarray, Envelope | None]:
    """A line within `points` points plus, when it had to be thinned, the min/max envelope (points/2
    buckets) that keeps what the thinning dropped. Unthinned lines need no envelope: returns None."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.size <= points:
        return x, y, None
    if x.size > points * MINMAX_RATIO:
        # MinMaxLTTB (Van Der Donckt et al. 2023): LTTB over per-bucket extremes picks almost the same
        # points as LTTB over everything, at a fraction of the cost for long series.
        keep = minmax_preselect(x, y, points * MINMAX_RATIO // 2)
        lx, ly = lttb(x[keep], y[keep], points)
    else:
        lx, ly = lttb(x, y, points)
    return lx, ly, envelope(x, y, max(1, points // 2))
