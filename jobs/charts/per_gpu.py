"""Per-GPU views of one signal on the job page: the heatmap (one row per GPU over time), its colour range,
the peers' band that tells a straggler from a healthy GPU a point below the median, and the per-GPU table."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from jobs.charts.common import FONT, escape
from jobs.charts.timeseries import HEATMAP_COLUMNS, TICKS_UNMEASURED, _window_slice, ms
from jobs.metrics.downsample import bucket_mean
from jobs.metrics.signals import SignalSeries


@dataclass(frozen=True, slots=True)
class GpuOutlier:
    """A GPU whose time-mean is low against its peers (a straggler candidate)."""

    gpu: str
    mean: float
    median: float
    below_band: bool


def _uniform_buckets(
    ts: np.ndarray, matrix: np.ndarray, columns: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """Equal-width time buckets over a regular sample grid: (brick centres in Unix s, bucket means) of at most
    `columns` buckets of k = ceil(n / columns) samples each. The last bucket is padded with NaN (its mean is
    of the samples it has) so that every brick spans k steps. None when the timestamps are not a regular grid.

    Why: plotly.js draws a heatmap whose bricks are evenly spaced as one small image (a pixel per cell) that
    the browser scales (image-rendering: pixelated); uneven bricks (buckets of 1 and 2 samples) are painted
    with a fillRect per cell into a full-size canvas and encoded as PNG: 1.35 s instead of 0.17 s for
    256 GPUs x 300 columns in headless Chromium on the 2-core dev machine (benchmarks/cold_load.py)."""
    n = ts.size
    if n < 2 or columns < 1:
        return None
    steps = np.diff(ts)
    step = float(np.median(steps))
    if not step > 0 or float(np.max(np.abs(steps - step))) > step / 100:
        return None
    k = -(-n // columns)
    buckets = -(-n // k)
    padded = np.full((matrix.shape[0], buckets * k), np.nan)
    padded[:, :n] = matrix
    edges, means = bucket_mean(padded, buckets)
    return ts[0] + (edges + (k - 1) / 2.0) * step, means


def heatmap_figure(
    series: SignalSeries | None,
    label: str,
    *,
    columns: int = HEATMAP_COLUMNS,
    window: tuple[float, float] | None = None,
    x_range: Sequence[int] | None = None,
) -> dict[str, Any] | None:
    """GPU x time heatmap of a ratio signal in %, bucket-averaged to `columns` columns (None without
        per-GPU data). Rows are GPUs in host/index order so a node's GPUs sit together. `x_range` (Unix ms)
    starts it on the time series' range so both line up."""
    if series is None or series.per_gpu is None or series.gpu_timestamps is None or not series.gpus:
        return None
    ts, matrix = series.gpu_timestamps, series.per_gpu
    if window is not None:
        part = _window_slice(ts, window)
        ts, matrix = ts[part], matrix[:, part]
    filled = np.flatnonzero(~np.isnan(matrix).all(axis=0)) if ts.size else np.empty(0, dtype=np.int64)
    if filled.size == 0:
        return None
    # Chunks are aligned to the clock: drop empty columns before the first and after the last sample.
    ts, matrix = ts[filled[0] : filled[-1] + 1], matrix[:, filled[0] : filled[-1] + 1]
    uniform = _uniform_buckets(ts, matrix, columns)
    if uniform is not None:
        centres, means = uniform
    else:  # not a regular grid: each brick at its own bucket's centre (correct, but drawn cell by cell)
        edges, means = bucket_mean(matrix, columns)
        ends = np.append(edges[1:], ts.size)
        centres = (ts[edges] + ts[ends - 1]) / 2.0
    gpus = [escape(g) for g in series.gpus]
    z = np.round(means * 100.0)
    rows = [[None if v != v else int(v) for v in row] for row in z.tolist()]
    zmin, zmax = colour_range(z)
    height = int(min(900, max(220, 90 + 6 * len(gpus))))
    return {
        "data": [{
            "type": "heatmap", "x": ms(centres), "y": gpus, "z": rows, "zmin": zmin, "zmax": zmax,
            "colorscale": "Cividis", "hoverongaps": False, "xgap": 0, "ygap": 0,
            "colorbar": {"title": {"text": f"{label}, %", "side": "right"}, "thickness": 12},
            "hovertemplate": f"%{{y}}<br>%{{x|%Y-%m-%d %H:%M}} UTC<br>{label}: %{{z}} %<extra></extra>",
        }],
        "layout": {
            "height": height, "margin": {"l": 110, "r": 16, "t": 10, "b": 40}, "font": FONT,
            "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff", "dragmode": "zoom",
            "xaxis": {"type": "date", "hoverformat": "%Y-%m-%d %H:%M UTC", **TICKS_UNMEASURED,
                      **({"range": list(x_range)} if x_range else {})},
            "yaxis": {"type": "category", "autorange": "reversed", "fixedrange": True,
                      "title": {"text": "GPU (host/index)"}, **TICKS_UNMEASURED},
        },
    }  # fmt: skip


def colour_range(z: np.ndarray) -> tuple[int, int]:
    """Colour scale limits (in %) from the 1st to the 99th percentile, widened to multiples of 10 and at
    least 20 points wide: GPUs that differ by a few points must look different, and the colour bar shows
    the limits so nobody reads the darkest colour as 0 %."""
    values = z[~np.isnan(z)]
    if values.size == 0:
        return 0, 100
    lo = max(0, int(np.floor(np.percentile(values, 1) / 10) * 10))
    hi = min(100, int(np.ceil(np.percentile(values, 99) / 10) * 10))
    while hi - lo < 20:
        lo, hi = max(0, lo - 10), min(100, hi + 10)
    return lo, hi


def _peer_band(means: np.ndarray) -> tuple[float, float] | None:
    """(median, lower edge) of the peers' band of per-GPU time-means: median - max(5 points, 3 x scaled
    MAD). None with fewer than 3 GPUs with samples: no peers to compare."""
    ok = ~np.isnan(means)
    if ok.sum() < 3:
        return None
    med = float(np.median(means[ok]))
    mad = 1.4826 * float(np.median(np.abs(means[ok] - med)))
    return med, med - max(0.05, 3 * mad)


def _gpu_means(series: SignalSeries | None) -> np.ndarray | None:
    if series is None or series.per_gpu is None or len(series.gpus) < 3:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN row is a GPU without samples
        return np.nanmean(series.per_gpu, axis=1)


def gpu_outliers(series: SignalSeries | None, limit: int = 3) -> list[GpuOutlier]:
    """The `limit` GPUs with the lowest time-mean, each flagged when it sits below the peers' band
    (`_peer_band`). Empty with fewer than 3 GPUs: no peers to compare."""
    means = _gpu_means(series)
    band = _peer_band(means) if means is not None else None
    if series is None or means is None or band is None:
        return []
    med, cutoff = band
    ok = ~np.isnan(means)
    order = [int(i) for i in np.argsort(np.where(ok, means, np.inf))[:limit] if ok[i]]
    return [GpuOutlier(str(series.gpus[i]), float(means[i]), med, bool(means[i] < cutoff)) for i in order]


@dataclass(frozen=True)
class GpuRow:
    """One GPU in the job page's per-GPU table: its time-mean, lowest and highest sample of the signal."""

    gpu: str
    mean: float | None
    low: float | None
    high: float | None
    below_band: bool


@dataclass(frozen=True)
class GpuTable:
    """The per-GPU table (as jobstats shows one): every GPU when there are few, else the ones below the
    peers' band and the lowest and highest few, with how many sit within the band."""

    rows: list[GpuRow]
    median: float | None
    band_low: float | None
    shown_all: bool
    within: int
    below: int


def gpu_table(series: SignalSeries | None, max_rows: int = 32, ends: int = 3) -> GpuTable | None:
    """Per-GPU time-mean, min and max of `series`, sorted from the lowest mean; GPUs below the peers' band
    (`_peer_band`: never a healthy GPU a fraction of a point under the median) flagged. More than
    `max_rows` GPUs: the flagged ones plus the `ends` lowest and highest. None without per-GPU data."""
    if series is None or series.per_gpu is None or not len(series.gpus):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.nanmean(series.per_gpu, axis=1)
        lows = np.nanmin(series.per_gpu, axis=1)
        highs = np.nanmax(series.per_gpu, axis=1)
    band = _peer_band(means) if len(series.gpus) >= 3 else None
    cutoff = band[1] if band else None

    def value(x: float) -> float | None:
        return None if np.isnan(x) else float(x)

    rows = [
        GpuRow(
            str(g),
            value(m),
            value(lo),
            value(hi),
            bool(cutoff is not None and not np.isnan(m) and m < cutoff),
        )
        for g, m, lo, hi in zip(series.gpus, means, lows, highs, strict=True)
    ]
    rows.sort(key=lambda r: (r.mean is None, r.mean if r.mean is not None else 0.0, r.gpu))
    below = sum(r.below_band for r in rows)
    within = sum(1 for r in rows if r.mean is not None and not r.below_band) if band else 0
    shown_all = len(rows) <= max_rows
    if not shown_all:
        keep = (
            {id(r) for r in rows if r.below_band}
            | {id(r) for r in rows[:ends]}
            | {id(r) for r in rows[-ends:]}
        )
        rows = [r for r in rows if id(r) in keep]
    return GpuTable(rows, band[0] if band else None, cutoff, shown_all, within, below)
