"""Cross-GPU stats computed here (jobs.metrics.cross_gpu) follow PromQL's aggregation rules, NaN and
infinities included, and place a per-series answer on its grid in Prometheus' label order. Pure: no Django,
no Prometheus (tests/test_cross_gpu_prometheus.py checks the same against a real one).

The avg values below were read from Prometheus 2.42 (`avg(label_replace(vector(v1), "x", "0", "", "") or
...)`, an instant query: the input vector is in the `or` chain's order); they differ from sum / n in the
last bit, which is what the incremental mean reproduces.
"""

from __future__ import annotations

import numpy as np
import pytest

from jobs.metrics.cross_gpu import (
    cross_gpu_stats,
    on_grid_matrix,
    promql_avg,
    promql_count,
    promql_max,
    promql_min,
    promql_order,
    stats_from_rows,
)
from jobs.metrics.prometheus import Series
from jobs.metrics.signals import COUNT, MAX, MEAN, MIN, NONZERO, SIGNALS, THROTTLE_BITS

T0 = 1_767_225_600.0
NAN, INF = np.nan, np.inf


def _col(*values: float) -> tuple[np.ndarray, np.ndarray]:
    """One column (one step) of len(values) series, every series present."""
    v = np.array(values, dtype=np.float64).reshape(-1, 1)
    return v, np.ones_like(v, dtype=bool)


def _same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape and a.tobytes() == np.asarray(b, dtype=np.float64).tobytes()


@pytest.mark.parametrize(
    ("values", "prometheus", "sum_over_n"),
    [
        ((0.1, 0.7, 0.3), 0.3666666666666667, 0.36666666666666664),
        ((0.3, 0.1, 0.7, 0.2), 0.32499999999999996, 0.325),
        ((0.1, 0.7, 0.2), 0.33333333333333337, 0.3333333333333333),
    ],
)
def test_avg_is_prometheus_incremental_mean_not_sum_over_n(
    values: tuple[float, ...], prometheus: float, sum_over_n: float
) -> None:
    # Answers of Prometheus 2.42 to avg() of these values in this order (see the module docstring).
    assert promql_avg(*_col(*values))[0] == prometheus
    assert float(np.sum(values) / len(values)) == sum_over_n != prometheus


def test_avg_skips_absent_series_and_propagates_nan() -> None:
    values = np.array([[1.0, NAN, 5.0], [3.0, 2.0, NAN]])
    present = np.array([[True, False, True], [True, True, True]])
    out = promql_avg(values, present)
    assert out[0] == 2.0 and out[1] == 2.0  # column 1: the first series is absent, not NaN
    assert np.isnan(out[2])  # a NaN value is a point: avg of (5, NaN) is NaN
    assert np.isnan(promql_avg(np.full((2, 1), NAN), np.zeros((2, 1), dtype=bool)))[0]  # no series: no point


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ((INF, 1.0), INF),  # an infinite mean stays when a finite value follows
        ((1.0, INF), INF),
        ((INF, INF), INF),  # the same infinity: kept
        ((INF, -INF), NAN),  # opposite infinities: inf + (-inf/2 - inf/2) is NaN
        ((-INF, 2.0, 3.0), -INF),
        ((INF, NAN), NAN),  # NaN is neither finite nor an infinity: the update runs and gives NaN
    ],
)
def test_avg_follows_prometheus_rules_for_infinities(values: tuple[float, ...], expected: float) -> None:
    got = promql_avg(*_col(*values))[0]
    assert (np.isnan(got) and np.isnan(expected)) or got == expected


def test_min_and_max_skip_nan_unless_every_value_is_nan() -> None:
    values = np.array([[NAN, 4.0, NAN], [2.0, NAN, NAN], [7.0, 1.0, NAN]])
    present = np.ones_like(values, dtype=bool)
    _same(promql_min(values, present), np.array([2.0, 1.0, NAN]))
    _same(promql_max(values, present), np.array([7.0, 4.0, NAN]))
    present[2, 0] = False  # an absent series is not a value
    assert promql_max(values, present)[0] == 2.0


def test_count_counts_points_nan_included_and_is_missing_where_none() -> None:
    values = np.array([[NAN, 1.0, NAN], [0.0, NAN, NAN]])
    present = np.array([[True, True, False], [True, False, False]])
    _same(promql_count(present), np.array([2.0, 1.0, NAN]))
    assert values.shape == present.shape


def test_code_signal_nonzero_counts_nan_and_is_zero_not_missing_where_none() -> None:
    xid = SIGNALS["xid_errors"]
    values = np.array([[0.0, 79.0, NAN, 0.0], [NAN, 0.0, 0.0, 0.0]])
    present = np.array([[True, True, False, False], [True, True, True, False]])
    stats = cross_gpu_stats(xid, values, present)
    assert set(stats) == set(xid.stats) == {MAX, NONZERO, COUNT}
    # NaN != 0 holds in PromQL (Go): a NaN code counts as non-zero; `or vector(0)` answers 0 at every step.
    _same(stats[NONZERO], np.array([1.0, 1.0, 0.0, 0.0]))
    _same(stats[MAX], np.array([0.0, 79.0, 0.0, NAN]))
    _same(stats[COUNT], np.array([2.0, 2.0, 1.0, NAN]))


def test_throttle_bits_are_shares_of_gpus_with_the_bit_set() -> None:
    reasons = SIGNALS["clock_throttle_reasons"]
    sw_power, hw_thermal, idle = THROTTLE_BITS["sw_power_cap"], THROTTLE_BITS["hw_thermal"], 0x1
    values = np.array([[sw_power | hw_thermal], [sw_power | idle], [0.0], [hw_thermal]], dtype=np.float64)
    stats = cross_gpu_stats(reasons, values, np.ones_like(values, dtype=bool))
    assert set(stats) == set(reasons.stats)
    assert stats["sw_power_cap"][0] == 0.5 and stats["hw_thermal"][0] == 0.5
    assert stats["hw_slowdown"][0] == 0.0 and stats[COUNT][0] == 4.0


def test_gauge_stats_are_mean_min_max_count() -> None:
    util = SIGNALS["gpu_util"]
    stats = cross_gpu_stats(util, *_col(0.25, 0.75, 0.5))
    assert set(stats) == {MEAN, MIN, MAX, COUNT}
    assert (stats[MEAN][0], stats[MIN][0], stats[MAX][0], stats[COUNT][0]) == (0.5, 0.25, 0.75, 3.0)


def test_rows_are_placed_on_the_grid_in_prometheus_label_order() -> None:
    ts = T0 + 120.0 * np.arange(4)
    b = Series({"Hostname": "node-b", "gpu": "0"}, ts[[1, 3]], np.array([2.0, 4.0]))
    a1 = Series({"Hostname": "node-a", "gpu": "1"}, ts[:2], np.array([NAN, 1.0]))
    a0 = Series({"Hostname": "node-a", "gpu": "0", "UUID": "GPU-1"}, ts[2:], np.array([3.0, 5.0]))
    values, present = on_grid_matrix([b, a1, a0], ts)
    # Sorted as Prometheus compares label sets, pair by pair: on node-a the second pairs differ, and
    # ("UUID", ...) < ("gpu", ...) ("U" < "g"), so GPU 0 with its UUID label comes before GPU 1.
    assert [promql_order(s.labels) for s in (a0, a1, b)] == sorted(
        promql_order(s.labels) for s in (b, a1, a0)
    )
    _same(values[0], np.array([NAN, NAN, 3.0, 5.0]))
    _same(values[1], np.array([NAN, 1.0, NAN, NAN]))
    np.testing.assert_array_equal(present[1], [True, True, False, False])  # its NaN is a point
    _same(values[2], np.array([NAN, 2.0, NAN, 4.0]))


def test_a_point_off_the_grid_is_refused() -> None:
    ts = T0 + 120.0 * np.arange(4)
    with pytest.raises(ValueError, match="not on the grid"):
        on_grid_matrix([Series({"gpu": "0"}, np.array([T0 + 60.0]), np.array([1.0]))], ts)
    with pytest.raises(ValueError, match="not on the grid"):
        on_grid_matrix([Series({"gpu": "0"}, np.array([T0 + 480.0]), np.array([1.0]))], ts)


def test_an_answer_without_points_has_only_the_nonzero_line() -> None:
    ts = T0 + 120.0 * np.arange(3)
    assert stats_from_rows(SIGNALS["gpu_util"], [], ts) == {}
    xid = stats_from_rows(SIGNALS["xid_errors"], [], ts)
    assert list(xid) == [NONZERO]
    _same(xid[NONZERO], np.zeros(3))


def test_mismatched_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="one 2-D shape"):
        cross_gpu_stats(SIGNALS["gpu_util"], np.zeros((2, 3)), np.zeros((2, 2), dtype=bool))


def test_the_fast_path_for_full_columns_gives_the_row_by_row_rules_bit_for_bit() -> None:
    from jobs.metrics.cross_gpu import _promql_avg_general, _promql_extreme_general

    rng = np.random.default_rng(7)
    values = rng.random((256, 400)) * rng.choice([1.0, 1e-3, 1e6], size=(256, 1))
    present = np.ones_like(values, dtype=bool)
    present[rng.integers(0, 256, 30), rng.integers(0, 400, 30)] = False  # some columns not full
    values[rng.integers(0, 256, 5), rng.integers(0, 400, 5)] = NAN
    values[3, 7] = INF
    _same(promql_avg(values, present), _promql_avg_general(values, present))
    for smallest, fast in ((True, promql_min), (False, promql_max)):
        _same(fast(values, present), _promql_extreme_general(values, present, smallest=smallest))
    # A few columns go through the same rules on Python floats: the same bits as the numpy rows.
    few = [7, 11, 200]
    _same(_promql_avg_general(values[:, few], present[:, few]), promql_avg(values, present)[few])
    for smallest, fast in ((True, promql_min), (False, promql_max)):
        got = _promql_extreme_general(values[:, few], present[:, few], smallest=smallest)
        _same(got, fast(values, present)[few])
