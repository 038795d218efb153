"""The per-GPU heatmap's bricks are evenly spaced in time on a regular sample grid, so plotly.js draws it as
one small image scaled by the browser (jobs.charts.timeseries._uniform_buckets; benchmarks/cold_load.py)."""

from __future__ import annotations

import numpy as np
import pytest

from jobs import charts
from jobs.charts.per_gpu import _uniform_buckets
from jobs.metrics.signals import GpuKey, SignalSeries


def _series(ts: np.ndarray, per_gpu: np.ndarray) -> SignalSeries:
    series = SignalSeries("sm_active", "", ts, {"mean": per_gpu.mean(axis=0)})
    series.gpus = tuple(GpuKey("node-000", str(i)) for i in range(per_gpu.shape[0]))
    series.gpu_timestamps = ts
    series.per_gpu = per_gpu
    return series


def test_uniform_buckets_are_k_samples_wide_and_the_last_one_averages_what_it_has():
    # 7 samples every 60 s, at most 3 columns: k = ceil(7 / 3) = 3 samples per brick, ceil(7 / 3) = 3 bricks
    # (samples 0-2, 3-5, 6 + two NaN of padding). Centres: t0 + (0 + 1) x 60, t0 + (3 + 1) x 60, t0 + 7 x 60.
    ts = 1000.0 + 60.0 * np.arange(7)
    matrix = np.array([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]])
    got = _uniform_buckets(ts, matrix, 3)
    assert got is not None
    centres, means = got
    assert centres.tolist() == [1060.0, 1240.0, 1420.0]
    assert means.tolist() == [[2.0, 5.0, 7.0]]  # (1+2+3)/3, (4+5+6)/3, 7 alone


def test_uniform_buckets_refuse_an_irregular_grid():
    ts = np.array([0.0, 60.0, 120.0, 300.0])
    assert _uniform_buckets(ts, np.ones((1, 4)), 2) is None


def test_heatmap_of_a_week_at_30_min_has_evenly_spaced_bricks_within_the_column_budget():
    # 336 samples (7 days x 48 per day) every 1800 s, at most 300 columns: k = ceil(336 / 300) = 2, so
    # 168 bricks of one hour, the first centred at t0 + 900 s.
    t0 = 1.7e9
    ts = t0 + 1800.0 * np.arange(336)
    per_gpu = 0.5 + 0.01 * np.arange(16 * 336).reshape(16, 336) % 0.3
    fig = charts.heatmap_figure(_series(ts, per_gpu), "SM active", columns=300)
    assert fig is not None
    x = fig["data"][0]["x"]
    assert len(x) == 168 and x[0] == round((t0 + 900.0) * 1000)
    assert set(np.diff(x).tolist()) == {3_600_000}
    assert len(fig["data"][0]["z"]) == 16 and len(fig["data"][0]["z"][0]) == 168


def test_heatmap_of_an_irregular_grid_keeps_each_buckets_own_centre():
    ts = np.array([0.0, 60.0, 120.0, 300.0, 360.0, 600.0]) + 1.7e9
    fig = charts.heatmap_figure(_series(ts, np.full((2, 6), 0.5)), "SM active", columns=3)
    assert fig is not None
    # Buckets of 2 samples: centres (0+60)/2 = 30, (120+300)/2 = 210, (360+600)/2 = 480 s after t0.
    assert np.diff(fig["data"][0]["x"]).tolist() == pytest.approx([180_000, 270_000])
    assert fig["data"][0]["x"][0] == round((1.7e9 + 30.0) * 1000)
