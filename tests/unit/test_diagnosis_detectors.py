"""Detectors for noisy, gappy exporter data: periodicity, synchrony, robust z, change points, gaps."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from jobs.diagnosis import detectors as D

RNG = np.random.default_rng(7)


def stall_series(n: int = 160, every: int = 4, noise: float = 0.03) -> np.ndarray:
    """Utilisation ~1 with a drop to ~0 every `every` samples (an input stall on the sample grid)."""
    k = np.arange(n)
    x = np.where(k % every == every - 1, 0.02, 1.0)
    return np.clip(x + noise * RNG.standard_normal(n), 0, 1)


def sawtooth(n: int = 200, period: int = 8, noise: float = 0.03) -> np.ndarray:
    """SM activity ramping up over a period and dropping: ranks waiting in a collective each period."""
    k = np.arange(n)
    return 0.2 + 0.65 * (k % period) / period + noise * RNG.standard_normal(n)


def with_gaps(x: np.ndarray, fraction: float, seed: int = 1) -> np.ndarray:
    """`x` with a random share of samples missing (NaN)."""
    y = x.astype(float).copy()
    y[np.random.default_rng(seed).random(y.shape) < fraction] = np.nan
    return y


# ---------------------------------------------------------------------------------------- basics


def test_fill_gaps_interpolates_and_keeps_all_nan():
    assert D.fill_gaps([1.0, np.nan, 3.0]).tolist() == [1.0, 2.0, 3.0]
    assert D.fill_gaps([np.nan, 2.0, np.nan]).tolist() == [2.0, 2.0, 2.0]
    assert np.isnan(D.fill_gaps([np.nan, np.nan])).all()


def test_rolling_median_ignores_nan_and_detrend_removes_a_step():
    x = np.r_[np.zeros(50), np.ones(50)]
    x[10] = np.nan
    med = D.rolling_median(x, 9)
    assert med[20] == 0.0 and med[80] == 1.0 and np.isfinite(med[10])
    resid = D.detrend(x, 9)
    assert np.nanmax(np.abs(resid[:45])) == 0.0


def test_quantiles_and_coverage_skip_missing():
    assert D.nanmedian([1.0, np.nan, 3.0]) == 2.0
    assert D.nanmedian([np.nan]) is None
    assert D.coverage([1.0, np.nan, np.nan, 4.0]) == 0.5
    assert D.coverage([]) == 0.0


# ----------------------------------------------------------------------------------- periodicity


def test_autocorrelation_of_a_cycle_peaks_at_its_period_even_with_gaps():
    acf = D.autocorrelation(with_gaps(sawtooth(), 0.2), 12)
    assert acf[0] == pytest.approx(1.0)
    assert acf[8] > 0.8 and acf[4] < -0.5


def test_stall_every_four_samples_is_found():
    p = D.find_periodicity(stall_series(), 30.0)
    assert p is not None and p.period_samples == 4 and p.period_s == 120.0
    assert p.acf > 0.8 and p.swing > 0.9 and p.cycles == 40
    assert p.trough_phase == 3


def test_sawtooth_is_found_with_noise_and_missing_samples():
    p = D.find_periodicity(with_gaps(sawtooth(noise=0.08), 0.2), 30.0)
    assert p is not None and p.period_samples == 8
    assert p.swing > 0.5


def test_noise_a_step_and_a_drift_are_not_periodic():
    assert D.find_periodicity(0.9 + 0.05 * RNG.standard_normal(300), 30.0) is None
    step = np.r_[np.ones(40), 0.75 * np.ones(160)] + 0.02 * RNG.standard_normal(200)
    assert D.find_periodicity(step, 30.0) is None
    drift = np.linspace(0.5, 1.0, 200) + 0.02 * RNG.standard_normal(200)
    assert D.find_periodicity(drift, 30.0) is None


def test_periodicity_needs_enough_data_and_cycles():
    assert D.find_periodicity(stall_series(n=6), 30.0) is None
    assert D.find_periodicity(np.full(100, np.nan), 30.0) is None
    # Period 8 in 20 samples is fewer than four cycles.
    assert D.find_periodicity(sawtooth(n=20), 30.0) is None


def test_folded_cycle_averages_each_phase():
    cycle = D.folded_cycle([0.0, 1.0, 2.0, 0.0, np.nan, 2.0], 3)
    assert cycle.tolist() == [0.0, 1.0, 2.0]


# -------------------------------------------------------------------------------- synchronisation


def test_gpus_in_lock_step_are_synchronised_and_independent_ones_are_not():
    base = sawtooth(noise=0.0)
    together = np.vstack([base + 0.03 * RNG.standard_normal(base.size) for _ in range(8)])
    sync = D.synchrony(with_gaps(together, 0.1))
    assert sync is not None and sync.median_corr > 0.9 and sync.gpus == 8
    apart = np.vstack([np.roll(base, 3 * g) + 0.03 * RNG.standard_normal(base.size) for g in range(8)])
    loose = D.synchrony(apart)
    assert loose is not None and loose.median_corr < 0.5


def test_synchrony_needs_two_gpus_and_correlation_handles_constants():
    assert D.synchrony(np.ones((1, 50))) is None
    assert D.correlation(np.ones(10), np.arange(10.0)) is None
    assert D.correlation(
        [1.0, 2.0, np.nan, 4.0, 5.0, 6.0], [2.0, 4.0, 1.0, 8.0, 10.0, 12.0]
    ) == pytest.approx(1.0)


# -------------------------------------------------------------------------------------- robust z


def test_robust_z_flags_the_outlier_and_floors_the_spread():
    rz = D.robust_z([1.0, 1.01, 0.99, 1.0, 0.6, np.nan])
    assert rz is not None and rz.median == 1.0
    assert rz.z[4] < -10 and abs(rz.z[0]) < 1 and np.isnan(rz.z[5])
    # Identical GPUs: MAD 0, the floor (3 % of the median) keeps a 1 % difference ordinary.
    flat = D.robust_z([1.0, 1.0, 1.0, 1.0, 0.99])
    assert flat is not None and flat.spread == pytest.approx(0.03) and flat.z[4] > -1
    assert D.robust_z([1.0, np.nan, 2.0]) is None


# ----------------------------------------------------------------------------------- change points


def test_change_point_finds_a_level_shift_despite_gaps_and_noise():
    x = np.r_[np.full(60, 0.45), np.full(60, 0.30)] + 0.01 * RNG.standard_normal(120)
    cps = D.change_points(with_gaps(x, 0.15))
    assert len(cps) == 1 and abs(cps[0] - 60) <= 2


def test_no_change_point_in_noise_or_short_series():
    assert D.change_points(0.45 + 0.01 * RNG.standard_normal(200)) == []
    assert D.change_points([1.0, 2.0, 3.0]) == []


def test_two_shifts_are_both_found():
    x = np.r_[np.ones(50), np.zeros(50), np.ones(50)] + 0.02 * RNG.standard_normal(150)
    assert [round(c, -1) for c in D.change_points(x)] == [50, 100]


# ------------------------------------------------------------------------------------ runs and gaps


def test_runs_bridge_short_unknown_stretches_only():
    mask = np.array([1, 1, 0, 0, 1, 0, 1, 1], dtype=bool)
    unknown = np.array([0, 0, 1, 0, 0, 1, 0, 0], dtype=bool)
    assert D.runs(mask) == [(0, 2), (4, 5), (6, 8)]
    assert D.runs(mask, unknown=unknown, bridge=1) == [(0, 2), (4, 8)]


def test_missing_samples_are_never_idle():
    util = np.array([1.0, 0.0, 0.0, np.nan, np.nan, 0.0, 1.0, np.nan, np.nan])
    assert D.idle_gaps(util) == [(1, 3), (5, 6)]
    assert D.idle_gaps(util, bridge=2) == [(1, 6)]


def test_blank_profiling_while_util_is_up_is_a_capture_not_idle():
    util = np.ones(20)
    util[15:] = 0.0
    sm = np.full(20, 0.9)
    tensor = np.full(20, 0.5)
    sm[5:12] = tensor[5:12] = np.nan  # Nsight capture: DCGM profiling paused
    sm[15:] = tensor[15:] = np.nan  # blank and idle: not a capture
    assert D.blank_stretches([sm, tensor], util) == [(5, 12)]
    assert D.idle_gaps(util) == [(15, 20)]
    assert D.blank_stretches([], util) == []


def test_regularity_and_windows():
    assert D.interval_cv([0, 4, 8, 12]) == 0.0
    assert D.interval_cv([0, 1]) is None
    ts = 1000.0 + 30.0 * np.arange(10)
    assert D.run_windows([(2, 4)], ts, 30.0) == [(1060.0, 1120.0)]
    assert D.merge_windows([(0, 10), (15, 20), (100, 110)], gap_s=5) == [(0, 20), (100, 110)]
    many = [(i * 100.0, i * 100.0 + i) for i in range(30)]
    assert len(D.merge_windows(many, limit=5)) == 5


def test_row_nanquantiles_equal_numpys_nanquantile_along_rows_bit_for_bit():
    rng = np.random.default_rng(7)
    for trial in range(300):
        rows, cols = int(rng.integers(1, 12)), int(rng.integers(1, 80))
        m = rng.normal(size=(rows, cols)) * [1.0, 1e-3, 1e6][trial % 3] + 0.5
        m[rng.random((rows, cols)) < rng.random()] = np.nan
        if trial % 5 == 0:
            m[0] = np.nan  # a GPU never busy
        for q in (0.0, 0.05, 0.25, 1 / 3, 0.5, 0.95, 1.0):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                want = np.nanquantile(m, q, axis=1)
            assert np.array_equal(D.row_nanquantiles(m, q), want, equal_nan=True), (trial, q)


def test_row_nanquantiles_of_no_columns_are_nan_and_a_vector_is_refused():
    assert np.isnan(D.row_nanquantiles(np.zeros((3, 0)), 0.5)).all()
    assert D.row_nanquantiles(np.zeros((0, 4)), 0.5).shape == (0,)
    with pytest.raises(ValueError, match="2-D"):
        D.row_nanquantiles(np.zeros(4), 0.5)


def test_row_nanmedians_equal_numpys_nanmedian_along_rows_bit_for_bit():
    rng = np.random.default_rng(11)
    for trial in range(200):
        rows, cols = int(rng.integers(1, 200)), int(rng.integers(1, 70))
        m = rng.normal(size=(rows, cols)) * [1.0, 1e-3, 1e6][trial % 3] + 0.5
        m[rng.random((rows, cols)) < rng.random()] = np.nan
        if trial % 5 == 0:
            m[-1] = np.nan  # an all-NaN window
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = np.nanmedian(m, axis=1)
        assert np.array_equal(D.row_nanmedians(m), want, equal_nan=True), trial


def test_a_rolling_median_of_an_all_nan_stretch_is_nan_and_of_no_columns_is_nan():
    x = np.array([1.0, np.nan, np.nan, np.nan, np.nan, np.nan, 3.0])
    got = D.rolling_median(x, 3)
    assert got[0] == 1.0 and np.isnan(got[2:5]).all() and got[-1] == 3.0
    assert np.isnan(D.row_nanmedians(np.zeros((2, 0)))).all()
