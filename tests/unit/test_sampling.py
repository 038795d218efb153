"""Sampling-true statistics: time-weighted means with gaps as gaps, grid columns that never collide,
coverage, and an idle share that cannot exceed 100 %. Pure: no Django, no Prometheus.

Every expected number is derived by hand in the test's comments.
"""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest

from jobs.diagnosis import DiagnosisInput
from jobs.diagnosis.features import Features
from jobs.diagnosis.rules import idle_gpus
from jobs.metrics.prometheus import Series
from jobs.metrics.promql import Selector
from jobs.metrics.sampling import (
    COVERAGE_SHOW_BELOW,
    GAP_FACTOR,
    SampledMean,
    coverage_from_stats,
    coverage_note,
    grid_columns,
    lattice_point,
    place_on_grid,
    rate_window_s,
    step_window_s,
    time_weighted_mean,
)
from jobs.metrics.signal_queries import aggregate_query, base_vector, fetch_job_signals, per_gpu_query
from jobs.metrics.signals import (
    COUNT,
    MAX,
    MEAN,
    MIN,
    SAMPLED,
    SIGNALS,
    GpuKey,
    JobSignals,
    SignalSeries,
    grid,
)

JOB = Selector.from_labels({"hpc_job": "1"})
SCRAPE = 15.0


def _pod_with_45_percent_of_scrapes_missing() -> tuple[np.ndarray, np.ndarray]:
    """20 scrape slots at t = 15, 30, ..., 300 s (window (0, 300]); slots 6-14 (9 of 20 = 45 %) failed.

    Slots 1-5 read 10 % and slots 15-20 read 40 %: the pod was waiting, then worked.
    """
    t = SCRAPE * np.arange(1, 21)
    v = np.where(np.arange(1, 21) <= 5, 10.0, 40.0)
    keep = (np.arange(1, 21) <= 5) | (np.arange(1, 21) >= 15)
    return t[keep], v[keep]


# --------------------------------------------------------------------------------- time-weighted mean


def test_pod_missing_45_percent_of_scrapes_reads_the_mean_of_its_samples_not_the_filled_mean() -> None:
    t, v = _pod_with_45_percent_of_scrapes_missing()
    m = time_weighted_mean(v, t, GAP_FACTOR * SCRAPE, window=(0.0, 300.0))
    # Samples that exist: 5 x 10 + 6 x 40 = 290 over 11 samples of 15 s each -> 290 / 11 = 26.3636 %.
    # The last-value fill of an instant query (lookback 5 min > the 135 s hole) would give slots 6-14
    # the value 10: (14 x 10 + 6 x 40) / 20 = 380 / 20 = 19.0 %, which must not come out.
    assert m.mean == pytest.approx(290 / 11)
    assert m.mean != pytest.approx(19.0)
    # 11 samples x 15 s = 165 s of the 300 s window.
    assert m.coverage == pytest.approx(165 / 300)
    assert m.reason is None


def test_a_sample_after_a_gap_stands_for_one_interval_not_the_whole_gap() -> None:
    # Samples at 15, 30, 45 read 1; the next at 120 reads 5: 75 s > 1.5 x 15 s = 22.5 s is a gap.
    # The contiguous spacing is 15 s, so each sample stands for 15 s: (3 x 1 + 5) / 4 = 2.0.
    # Weighting the last sample by the 75 s before it would give (45 + 375) / 120 = 3.5 instead.
    m = time_weighted_mean([1, 1, 1, 5], [15, 30, 45, 120], GAP_FACTOR * SCRAPE)
    assert m.mean == pytest.approx(2.0)
    # Default window: the first sample's 15 s before it through the last sample: (0, 120] = 120 s;
    # 4 samples x 15 s = 60 s -> 0.5.
    assert m.coverage == pytest.approx(0.5)


def test_irregular_samples_are_weighted_by_the_time_back_to_the_previous_one() -> None:
    # t = 0, 10, 30 with values 1, 2, 4 and max gap 45 s: both spacings (10, 20) are contiguous, their
    # median 15 s is the first sample's interval. Weights 15, 10, 20 -> (15 + 20 + 80) / 45 = 115 / 45.
    m = time_weighted_mean([1, 2, 4], [0, 10, 30], 45.0)
    assert m.mean == pytest.approx(115 / 45)
    assert m.coverage == pytest.approx(1.0)  # window (-15, 30] = 45 s, all of it covered


def test_nan_grid_points_are_gaps_that_cover_nothing() -> None:
    # A 30 s grid of *_over_time windows: points 30 and 120 hold 0.2 and 0.6, points 60 and 90 are empty.
    # Each point stands for its 30 s window: mean (0.2 + 0.6) / 2 = 0.4, coverage 60 s of (0, 120] = 0.5.
    m = time_weighted_mean([0.2, np.nan, np.nan, 0.6], [30, 60, 90, 120], GAP_FACTOR * 30)
    assert m.mean == pytest.approx(0.4)
    assert m.coverage == pytest.approx(0.5)


def test_samples_outside_the_window_count_for_nothing() -> None:
    # Window (30, 60]: only the samples at 45 (value 3) and 60 (value 4) fall inside, 15 s each.
    m = time_weighted_mean([1, 2, 3, 4, 9], [15, 30, 45, 60, 75], GAP_FACTOR * SCRAPE, window=(30, 60))
    assert m.mean == pytest.approx(3.5)
    assert m.coverage == pytest.approx(1.0)


def test_no_samples_is_nan_with_a_reason_never_zero() -> None:
    m = time_weighted_mean([np.nan, np.nan], [30, 60], 45.0)
    assert math.isnan(m.mean) and m.coverage == 0.0
    assert m.reason == "no samples in the window"
    assert math.isnan(time_weighted_mean([], [], 45.0).mean)
    mean, coverage = m  # unpacks as the (mean, coverage) pair the KPIs expect
    assert isinstance(m, SampledMean) and coverage == 0.0 and math.isnan(mean)


def test_time_weighted_mean_rejects_mismatched_input() -> None:
    with pytest.raises(ValueError):
        time_weighted_mean([1, 2], [0], 45.0)
    with pytest.raises(ValueError):
        time_weighted_mean([1], [0], 0.0)


# ----------------------------------------------------------------------------------------- grid columns


def test_half_step_offset_rows_keep_every_sample_in_its_own_column() -> None:
    # Per-GPU rows stored at t0+15, t0+45, ..., t0+285 reloaded onto the 30 s grid t0, t0+30, ...:
    # (15 + 30k) / 30 = k + 0.5. np.rint rounds halves to even (0.5 -> 0, 1.5 -> 2, 2.5 -> 2): two
    # samples in column 2, none in column 1. The point closing each window is ceil(k + 0.5) = k + 1.
    t0 = 1_767_225_600.0
    times = t0 + 15 + 30 * np.arange(10)
    rounded = np.rint((times - t0) / 30).astype(int)
    assert len(set(rounded.tolist())) < 10  # the collision this replaces
    cols = grid_columns(times, t0, 30.0)
    np.testing.assert_array_equal(cols, np.arange(1, 11))


def test_on_grid_samples_keep_their_point_despite_float_noise() -> None:
    t0 = 1_767_225_600.0
    times = t0 + 30 * np.arange(5) + np.array([0, 1e-7, -1e-7, 0, 2e-7])
    np.testing.assert_array_equal(grid_columns(times, t0, 30.0), np.arange(5))


def test_series_finer_than_the_grid_is_averaged_per_window() -> None:
    # 15 s samples 10, 20, ..., 80 at t = 15..120 onto a 60 s grid at 0, 60, 120: window (0, 60] holds
    # 10, 20, 30, 40 -> 25; (60, 120] holds 50, 60, 70, 80 -> 65; (-60, 0] holds nothing -> NaN.
    out = place_on_grid(15 * np.arange(1, 9), 10.0 * np.arange(1, 9), 0.0, 60.0, 3)
    np.testing.assert_array_equal(np.isnan(out), [True, False, False])
    np.testing.assert_allclose(out[1:], [25.0, 65.0])


def test_series_on_grid_places_half_step_offset_points_one_per_column() -> None:
    s = Series({}, np.array([15.0, 45.0, 75.0]), np.array([1.0, 2.0, 3.0]))
    # Grid 0, 30, 60, 90: 15 -> 30, 45 -> 60, 75 -> 90; nothing closes at 0.
    out = s.on_grid(grid(0.0, 90.0, 30.0))
    np.testing.assert_array_equal(out[1:], [1.0, 2.0, 3.0])
    assert math.isnan(out[0])


def test_lattice_points_are_multiples_of_the_step_closing_the_window() -> None:
    assert lattice_point(3600.0, 120.0) == 3600.0  # already on the lattice
    assert lattice_point(3630.0, 120.0) == 3720.0  # (3600, 3720] holds it
    assert lattice_point(3600.0 + 1e-9, 120.0) == 3600.0  # float noise is not a new window


# ---------------------------------------------------------------------------------------------- windows


def test_step_windows_tile_time_on_prometheus_2_and_3() -> None:
    # Prometheus 2 selects [t - w, t]: w = 30 s would put a sample at t - 30 into two windows. One ms
    # less (timestamps are whole ms) gives [t - 29.999, t], the same samples as 3's (t - 30, t].
    assert step_window_s(30.0) == 29.999
    assert step_window_s(300.0) == 299.999
    with pytest.raises(ValueError):
        step_window_s(0.001)


def test_rate_window_is_at_least_the_step_and_two_scrapes() -> None:
    assert rate_window_s(30.0, 30.0) == 60.0  # 2 x 30 s scrapes
    assert rate_window_s(300.0, 15.0) == 300.0  # the step
    assert rate_window_s(30.0, 15.0) == 30.0  # both equal


def test_gauges_are_read_as_window_means_codes_as_window_max() -> None:
    q = base_vector(SIGNALS["gpu_util"], JOB, step_s=60.0)
    assert q.startswith("(avg_over_time(DCGM_FI_DEV_GPU_UTIL{") and "[59999ms])" in q
    assert q.endswith(") * 0.01")
    assert "max_over_time(DCGM_FI_DEV_XID_ERRORS{" in base_vector(SIGNALS["xid_errors"], JOB)
    assert "last_over_time(" in base_vector(SIGNALS["clock_throttle_reasons"], JOB)
    # No bare instant selector is left: that is what picked the last value within the 5 min lookback.
    assert re.search(r"(?<![\w(])DCGM_FI_DEV_GPU_UTIL\{", q) is None


def test_aggregate_query_adds_the_sampled_stat_scaled_by_scrape_over_step() -> None:
    q = aggregate_query(SIGNALS["sm_active"], JOB, step_s=60.0, scrape_interval_s=15.0)
    # 60 s step / 15 s scrapes = 4 samples expected per GPU: count x 0.25 = GPUs covered.
    assert "sum(count_over_time(DCGM_FI_PROF_SM_ACTIVE{" in q and ") * 0.25" in q
    assert f'"stat", "{SAMPLED}"' in q


def test_per_gpu_query_windows_follow_the_per_gpu_step() -> None:
    q = per_gpu_query(SIGNALS["sm_active"], JOB, step_s=300.0)
    assert "avg_over_time(DCGM_FI_PROF_SM_ACTIVE{" in q and "[299999ms]" in q


class _Recorder:
    """Answers like Prometheus would on any grid and records (query, start, end, step)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, float, float]] = []

    def label_values(
        self, label: str, match: object = (), start: object = None, end: object = None
    ) -> list[str]:
        return ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_VIOLATION"]

    def range(self, query: str, start: float, end: float, step: float | None = None) -> list[Series]:
        assert step is not None
        self.calls.append((query, float(start), float(end), float(step)))
        ts = grid(float(start), float(end), float(step))
        if query.startswith("avg by") or query.startswith("max by"):
            return [Series({"Hostname": "n", "gpu": "0"}, ts, np.full(ts.size, 0.5))]
        return [Series({"stat": s}, ts, np.full(ts.size, 1.0)) for s in (MEAN, MIN, MAX, COUNT)]


def test_per_gpu_grid_lies_on_multiples_of_its_step_whatever_the_start() -> None:
    # Start 3630 s (a multiple of the 30 s step, not of the 120 s per-GPU step): the per-GPU grid starts
    # at 3720, the multiple closing the window (3600, 3720] that holds the start - where the archive
    # puts it back, so rows never land half a step off on reload.
    rec = _Recorder()
    js = fetch_job_signals(rec, JOB, 3630.0, 4200.0, 30.0, keys=["gpu_util"], per_gpu_step=120.0)
    gts = js.signals["gpu_util"].gpu_timestamps
    assert gts is not None
    np.testing.assert_array_equal(gts, [3720.0, 3840.0, 3960.0, 4080.0, 4200.0])
    assert [c[1] for c in rec.calls] == [3630.0, 3720.0]


def test_rate_windows_are_at_least_two_scrapes_and_the_step() -> None:
    rec = _Recorder()
    fetch_job_signals(rec, JOB, 0.0, 600.0, 30.0, keys=["power_violation"], per_gpu_step=300.0,
                      scrape_interval_s=30.0)  # fmt: skip
    agg, per_gpu = rec.calls[0][0], rec.calls[1][0]
    assert "rate(DCGM_FI_DEV_POWER_VIOLATION{" in agg and "[60s])" in agg  # 2 x 30 s > 30 s step
    assert "[300s])" in per_gpu  # the 300 s per-GPU step > 2 x 30 s


# --------------------------------------------------------------------------------------------- coverage


def test_coverage_counts_missing_scrapes_inside_windows() -> None:
    # 2 GPUs, 4 windows. `sampled` = GPUs' worth of each window covered: 2, 1.5 (one GPU missed half its
    # scrapes), 1 (one GPU silent), none at all (no series: NaN -> 0). (2 + 1.5 + 1 + 0) / (2 x 4) = 0.5625.
    sampled = np.array([2.0, 1.5, 1.0, np.nan])
    count = np.array([2.0, 2.0, 1.0, np.nan])
    assert coverage_from_stats(sampled, count) == pytest.approx(4.5 / 8)
    # Without `sampled`, only (GPU, window) cells with a value: (2 + 2 + 1) / 8 = 0.625.
    assert coverage_from_stats(None, count) == pytest.approx(5 / 8)
    assert math.isnan(coverage_from_stats(None, None))
    assert math.isnan(coverage_from_stats(None, np.array([np.nan, np.nan])))


def test_coverage_never_exceeds_one_when_scrapes_are_faster_than_configured() -> None:
    # 1 GPU scraped every 15 s while 30 s is configured: 2 samples x 30/30 = 2.0 per window -> capped at 1.
    assert coverage_from_stats(np.array([2.0, 2.0]), np.array([1.0, 1.0])) == 1.0


def test_coverage_below_90_percent_is_noted_with_its_figure() -> None:
    assert COVERAGE_SHOW_BELOW == 0.9
    assert coverage_note(0.55) == "coverage 55 %"
    assert coverage_note(0.899) == "coverage 90 %"  # below the threshold, rounded for display
    assert coverage_note(0.9) is None and coverage_note(1.0) is None
    assert coverage_note(None) == "coverage unknown" and coverage_note(math.nan) == "coverage unknown"


def test_signal_series_and_job_signals_expose_coverage() -> None:
    ts = grid(30.0, 120.0, 30.0)
    stats = {COUNT: np.array([2.0, 2.0, 1.0, np.nan]), SAMPLED: np.array([2.0, 1.5, 1.0, np.nan])}
    js = JobSignals(30.0, 120.0, 30.0, ts, {"gpu_util": SignalSeries("gpu_util", "ratio", ts, stats)})
    assert js.signals["gpu_util"].coverage == pytest.approx(4.5 / 8)  # as derived above
    assert js.coverage("gpu_util") == pytest.approx(0.5625)
    assert js.coverage("sm_active") is None
    assert coverage_note(js.coverage("gpu_util")) == "coverage 56 %"


# ------------------------------------------------------------------------------------------- idle share


def _idle_input(util_rows: np.ndarray) -> DiagnosisInput:
    """A job whose per-GPU GPU_UTIL is `util_rows` (GPUs x points) on a 30 s grid."""
    n = util_rows.shape[1]
    ts = grid(0.0, 30.0 * (n - 1), 30.0)
    with warnings.catch_warnings():  # all-empty columns: NaN stats, as Prometheus returns nothing
        warnings.simplefilter("ignore", RuntimeWarning)
        stats = {
            MEAN: np.nanmean(util_rows, axis=0),
            MIN: np.nanmin(util_rows, axis=0),
            MAX: np.nanmax(util_rows, axis=0),
            COUNT: np.isfinite(util_rows).sum(axis=0).astype(float),
        }
    series = SignalSeries("gpu_util", "ratio", ts, stats)
    series.gpus = tuple(GpuKey("n", str(i)) for i in range(util_rows.shape[0]))
    series.gpu_timestamps, series.per_gpu = ts, util_rows
    js = JobSignals(float(ts[0]), float(ts[-1]), 30.0, ts, {"gpu_util": series})
    return DiagnosisInput(signals=js, gpu_count=util_rows.shape[0])


def _share(finding: object) -> float:
    ev = {e.label: e.value for e in finding.evidence}  # type: ignore[attr-defined]
    return float(ev["share of the job's GPU time idle"])


def test_idle_share_of_gpus_with_every_other_column_empty_is_at_most_100_percent() -> None:
    # What the rint collision left behind: 2 GPUs, 121 points of 30 s (1 h), every odd column empty,
    # every observed sample at 0 %. Columns 0, 2, ..., 120 are observed: 61 per GPU, 122 in all, all
    # idle -> 122 / 122 = 100 %. Counting the 60 bridged holes per GPU as idle gave 242 / 122 = 198 %.
    u = np.zeros((2, 121))
    u[:, 1::2] = np.nan
    f = idle_gpus.check(_idle_input(u), Features(_idle_input(u)))
    assert f is not None
    assert _share(f) == 100.0


def test_idle_share_is_idle_observed_time_over_observed_time() -> None:
    # GPU 0 idle, GPU 1 busy at 90 %, both with every odd column empty: 61 observed idle samples of
    # 122 observed -> 50.0 %; 61 x 30 s = 1830 s = 0.508 GPU-h -> 0.51. (Bridged holes: 121 / 122 = 99.2 %.)
    u = np.zeros((2, 121))
    u[1] = 0.9
    u[:, 1::2] = np.nan
    inp = _idle_input(u)
    f = idle_gpus.check(inp, Features(inp))
    assert f is not None
    assert _share(f) == 50.0
    ev = {e.label: e.value for e in f.evidence}
    assert ev["idle GPU-hours"] == 0.51
    assert 0.0 <= f.impact <= 1.0


def test_positions_on_grid_finds_each_time_and_refuses_a_time_off_the_grid_or_past_its_end() -> None:
    from jobs.metrics.sampling import positions_on_grid

    grid = np.arange(0.0, 300.0, 30.0)
    assert positions_on_grid(grid, np.array([60.0, 90.0, 270.0])).tolist() == [2, 3, 9]
    assert positions_on_grid(grid, np.array([60.0, 75.0])) is None  # 75 s is between two grid times
    assert positions_on_grid(grid, np.array([270.0, 300.0])) is None  # 300 s is past the grid's end
    assert positions_on_grid(grid, np.array([])) is None
