"""Many series placed on their grids in one vectorised pass (the poll cycle's decode, #26 item 2) give the
values the one-series-at-a-time placement gives, bit for bit, and an answer decoded in one pass the arrays
the per-series decoding gave. Pure: no Django, no Prometheus.

The references are the per-series functions (`place_on_grid`, `Series.on_grid`) and, for the per-GPU
matrices, the row-by-row merge `per_gpu_matrix` did before it was batched (kept here as `_one_by_one`).
"""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from jobs.metrics import cluster, prometheus
from jobs.metrics.cycle_groups import Group, Target, label_stats, split_series
from jobs.metrics.prometheus import Series
from jobs.metrics.promql import Matcher, Selector, gpu_key
from jobs.metrics.sampling import place_on_grid, place_rows, rows_on_grids
from jobs.metrics.signal_queries import (
    per_gpu_matrices,
    per_gpu_matrix,
    stats_from_series,
    stats_of_jobs,
    stats_placed,
)
from jobs.metrics.signals import COUNT, GpuKey, JobSignals, SignalSeries, grid

T0 = 1_767_225_600.0


def _same(a: np.ndarray, b: np.ndarray) -> None:
    """Equal bit for bit (NaN where NaN, the same float64 everywhere else)."""
    assert a.dtype == b.dtype == np.float64 and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


def _random_series(rng: np.random.Generator, labels: dict[str, str], lo: float, hi: float) -> Series:
    """Samples on, off and between a 30 s lattice, some twice in one window, some NaN, some outside."""
    n = int(rng.integers(0, 12))
    times = np.sort(lo + rng.choice([0.0, 7.5, 15.0, 29.999, 30.0], n) + 30.0 * rng.integers(-2, 14, n))
    values = rng.normal(0.5, 0.3, n)
    values[rng.random(n) < 0.15] = np.nan
    return Series(labels, times[times < hi + 90], values[times < hi + 90])


def test_place_rows_gives_each_rows_place_on_grid_bit_for_bit() -> None:
    rng = np.random.default_rng(7)
    times, values, origins, steps, sizes = [], [], [], [], []
    for i in range(300):
        step = float(rng.choice([30.0, 60.0, 300.0, 0.001]))
        origin = T0 + 30.0 * int(rng.integers(0, 20))
        n = int(rng.integers(0, 15))
        t = origin + step * rng.integers(-3, 12, n) + rng.choice([0.0, 1e-7, 0.4 * step, step / 2], n)
        v = rng.normal(size=n) * 10 ** float(rng.integers(-3, 4))
        v[rng.random(n) < 0.1] = rng.choice([np.nan, np.inf, -np.inf])
        times.append(t)
        values.append(v)
        origins.append(origin)
        steps.append(step)
        sizes.append(int(rng.integers(0, 10)) if i % 7 else 0)
    flat = place_rows(times, values, origins, steps, sizes)
    at = 0
    for t, v, o, s, z in zip(times, values, origins, steps, sizes, strict=True):
        _same(flat[at : at + z], place_on_grid(t, v, o, s, z))
        at += z
    assert at == flat.size


def test_place_rows_averages_two_samples_of_one_window_in_their_order() -> None:
    # Row 0: 10 and 20 both close at 30 -> 15; row 1 (its own origin 60): 5 at 90 -> column 1.
    flat = place_rows([np.array([10.0, 20.0]), np.array([90.0])], [np.array([10.0, 20.0]), np.array([5.0])],
                      [0.0, 60.0], [30.0, 30.0], [2, 2])  # fmt: skip
    np.testing.assert_array_equal(np.isnan(flat), [True, False, True, False])
    assert flat[1] == 15.0 and flat[3] == 5.0


def test_place_rows_refuses_rows_that_do_not_line_up() -> None:
    with pytest.raises(ValueError, match="differ in rows"):
        place_rows([np.array([1.0])], [], [0.0], [30.0], [1])
    with pytest.raises(ValueError, match="one entry per row"):
        place_rows([np.array([1.0])], [np.array([1.0])], [0.0, 1.0], [30.0], [1])
    with pytest.raises(ValueError, match="differ in length"):
        place_rows([np.array([1.0, 2.0])], [np.array([1.0])], [0.0], [30.0], [1])
    with pytest.raises(ValueError, match="negative"):
        place_rows([np.array([1.0])], [np.array([1.0])], [0.0], [30.0], [-1])


def test_rows_on_grids_match_series_on_grid_on_empty_one_point_and_long_grids() -> None:
    rng = np.random.default_rng(11)
    grids = [grid(T0, T0 + 300, 30.0), grid(T0 + 30, T0 + 30, 30.0), np.empty(0), grid(T0, T0 + 3600, 300.0)]
    series = [_random_series(rng, {}, T0, T0 + 3600) for _ in range(40)]
    series.append(Series({}, np.array([T0 + 29.9995, T0 + 30.0, T0 + 30.002]), np.array([3.0, 1.0, 9.0])))
    pairs = [(s, g) for s in series for g in grids]
    times, values = [s.timestamps for s, _ in pairs], [s.values for s, _ in pairs]
    rows = rows_on_grids(times, values, [g for _, g in pairs])
    for (s, g), row in zip(pairs, rows, strict=True):
        _same(row, s.on_grid(g))
    # The one-point grid at T0 + 30 keeps only its millisecond (T0 + 29.999, T0 + 30]: 3 and 1, not 9.
    assert rows[-3][0] == 2.0


def test_stats_of_jobs_place_each_jobs_stats_on_its_own_grid() -> None:
    rng = np.random.default_rng(3)
    grids = {k: grid(T0 + 30.0 * k, T0 + 600.0, 30.0) for k in range(30)}
    series = {
        k: [_random_series(rng, {"hpc_job": str(k), "stat": stat}, T0, T0 + 600) for stat in ("mean", "min")]
        + [_random_series(rng, {"hpc_job": str(k)}, T0, T0 + 600)]  # no stat label: not a stat
        for k in range(25)  # jobs 25..29 have no series
    }
    got = stats_of_jobs(series, grids)
    assert set(got) == set(grids)
    for k, ts in grids.items():
        mine = series.get(k, [])
        assert set(got[k]) == ({"mean", "min"} if mine else set())
        for s in mine[:2]:
            _same(got[k][s.labels["stat"]], s.on_grid(ts))
        assert stats_from_series(mine, ts).keys() == got[k].keys()


def test_a_stat_seen_twice_keeps_the_last_series_as_before() -> None:
    ts = grid(0.0, 60.0, 30.0)
    first = Series({"stat": "mean"}, np.array([0.0]), np.array([1.0]))
    last = Series({"stat": "mean"}, np.array([30.0]), np.array([2.0]))
    _same(stats_from_series([first, last], ts)["mean"], last.on_grid(ts))


def _one_by_one(series: list[Series], ts: np.ndarray) -> tuple[tuple[GpuKey, ...], np.ndarray]:
    """`per_gpu_matrix` as it was before the batch: each series on the grid, spellings merged in order."""
    rows: dict[GpuKey, np.ndarray] = {}
    for s in series:
        key = GpuKey(*gpu_key(s.labels))
        row = s.on_grid(ts)
        if key in rows:
            row = np.where(np.isnan(rows[key]), row, rows[key])
        rows[key] = row
    keys = tuple(sorted(rows, key=lambda k: (k.hostname, int(k.gpu) if k.gpu.isdigit() else -1, k.gpu)))
    return keys, (np.vstack([rows[k] for k in keys]) if keys else np.empty((0, len(ts))))


def test_per_gpu_matrices_match_the_row_by_row_merge_with_host_spellings() -> None:
    rng = np.random.default_rng(5)
    spellings = ("Hostname", "hostname", "exported_Hostname", "exported_hostname")
    grids = {k: grid(T0 + 300.0 * (k % 3), T0 + 3600.0, 300.0) for k in range(12)}
    grids[12] = grid(T0, T0, 300.0)  # a one-point grid
    series: dict[int, list[Series]] = {}
    for k in range(12):
        mine = []
        for g in rng.permutation(["0", "1", "2", "10", "x"]):
            for spelling in rng.choice(spellings, int(rng.integers(1, 4)), replace=False):
                labels = {spelling: f"node-{k % 4}", "gpu": str(g), "hpc_job": str(k)}
                mine.append(_random_series(rng, labels, T0, T0 + 3600))
        series[k] = mine
    series[12] = [_random_series(rng, {"Hostname": "n", "gpu": "0"}, T0, T0) for _ in range(2)]
    del series[3]  # a job whose per-GPU query returned nothing
    got = per_gpu_matrices(series, grids)
    assert list(got) == list(grids)
    for k, ts in grids.items():
        keys, matrix = got[k]
        want_keys, want = _one_by_one(series.get(k, []), ts)
        assert keys == want_keys
        _same(matrix, want)
        assert matrix.flags.c_contiguous
    assert got[3][1].shape == (0, grids[3].size)
    assert per_gpu_matrix(series[0], grids[0])[0] == got[0][0]


# ----------------------------------------------------------------------------------------------- decoding


def _old_decode(body: bytes) -> list[Series]:
    """The per-series decoding `_matrix_series` replaced: two numpy conversions per series."""
    out = []
    for item in prometheus._MATRIX.decode(body):
        ts = np.array([p[0] for p in item.values], dtype=np.float64)
        out.append(Series(item.metric, ts, prometheus._floats([p[1] for p in item.values])))
    return out


def _answer(rng: np.random.Generator, words: list[str]) -> bytes:
    """A matrix result as Prometheus writes it: values as Go's FormatFloat(v, 'f', -1, 64) strings."""
    result = []
    for i in range(int(rng.integers(0, 40))):
        n = int(rng.integers(0, 30))
        times = T0 + 30.0 * np.arange(n) + rng.choice([0.0, 0.001, 0.5], n)
        pairs = [[float(t), str(rng.choice(words))] for t in times]
        result.append({"metric": {"hpc_job": str(i), "stat": "mean"}, "values": pairs})
    return json.dumps(result).encode()


def _numbers(rng: np.random.Generator, n: int) -> list[str]:
    """Random doubles of every magnitude, positional as Prometheus writes them (no exponent)."""
    x = rng.normal(size=n) * 10.0 ** rng.integers(-30, 30, n)
    return [np.format_float_positional(v, unique=True, trim="-") for v in x] + ["0", "1", "0.1", "1767225600"]


@pytest.mark.parametrize("extra", [[], ["NaN", "-Inf"], ["+Inf"], ["-0"], ["NaN", "+Inf", "-0", "-Inf"]])
def test_decoded_answers_are_bit_for_bit_the_per_series_decoding(extra: list[str]) -> None:
    # The lax path (msgspec parses the strings) and the numpy path ("+Inf" or "-0" present) alike.
    rng = np.random.default_rng(len(extra))
    words = _numbers(rng, 300) + extra
    for _ in range(20):
        body = _answer(rng, words)
        if not {"+Inf", "-0"} & set(extra):  # the lax path reads this answer itself (no fallback)
            assert prometheus._lax_matrix(body) is not None
        want = _old_decode(body)
        # As Prometheus writes it, and spaced out (a proxy that pretty-prints): the same series.
        for text in (body, json.dumps(json.loads(body), indent=1).encode()):
            got = prometheus._matrix_series(msgspec.Raw(text))
            assert [s.labels for s in got] == [s.labels for s in want]
            for g, w in zip(got, want, strict=True):
                _same(g.timestamps, w.timestamps)
                _same(g.values, w.values)


def test_negative_zero_and_infinities_keep_their_sign() -> None:
    body = json.dumps([{"metric": {}, "values": [[1, "-0"], [2, "+Inf"], [3, "-Inf"], [4, "NaN"]]}]).encode()
    (s,) = prometheus._matrix_series(msgspec.Raw(body))
    assert np.signbit(s.values[0]) and s.values[1] == np.inf and s.values[2] == -np.inf
    assert np.isnan(s.values[3])


@pytest.mark.parametrize("value", ["lots", "1[", "[2]", ""])
def test_an_unreadable_value_is_refused_as_before(value: str) -> None:
    body = json.dumps([{"metric": {}, "values": [[1, "0.5"], [2, value]]}]).encode()
    assert prometheus._lax_matrix(body) is None  # the point-by-point reading decides
    with pytest.raises(ValueError):
        prometheus._matrix_series(msgspec.Raw(body))


# ------------------------------------------------------------------------------------------ settled_until


def _settled_one_by_one(sigs: JobSignals) -> float | None:
    """`cluster.settled_until` as it was before it took every signal's counts in one matrix."""
    ts = sigs.timestamps
    full = np.ones(ts.size, dtype=bool)
    any_data = False
    for s in sigs.signals.values():
        c = None if s.count is None else np.asarray(s.count, dtype=np.float64)
        if c is None or c.size != ts.size or not np.isfinite(c).any():
            continue
        any_data = True
        ok = np.isfinite(c)
        first = int(np.argmax(ok))
        full[first:] &= (ok & (np.where(ok, c, -1.0) >= np.nanmax(c)))[first:]
    if not any_data:
        return None
    bad = np.flatnonzero(~full)
    if bad.size == 0:
        return float(ts[-1])
    return float(ts[max(int(bad[0]) - 1, 0)])


def test_settled_until_matches_the_signal_by_signal_rule() -> None:
    rng = np.random.default_rng(9)
    seen = set()
    for trial in range(400):
        n = int(rng.integers(0, 12))
        ts = grid(T0, T0 + 30.0 * (n - 1), 30.0) if n else np.empty(0)
        sigs = JobSignals(T0, T0 + 30.0 * n, 30.0, ts)
        for k in range(int(rng.integers(0, 5))):
            gpus = float(rng.integers(1, 9))
            count = np.full(n, gpus) - rng.choice([0.0, 0.0, 0.0, 1.0], n)
            count[rng.random(n) < 0.2] = np.nan
            count[: int(rng.integers(0, n + 1))] = np.nan  # a signal whose first sample comes late (a rate)
            stats = {} if k == 3 else {COUNT: count if trial % 11 else count[:-1]}  # no count / wrong length
            sigs.signals[f"s{k}"] = SignalSeries(f"s{k}", "ratio", ts, stats)
        got, want = cluster.settled_until(sigs), _settled_one_by_one(sigs)
        assert got == want, (trial, got, want)
        seen.add("none" if want is None else "last" if n and want == ts[-1] else "cut")
    assert seen == {"none", "last", "cut"}  # every outcome was exercised


def test_label_stats_find_the_jobs_and_stats_split_series_and_stats_of_jobs_find() -> None:
    rng = np.random.default_rng(13)
    # Jobs 0 and 8 (and 1 and 9) share their label value: each gets the series of both.
    targets = [Target(k, T0, T0 + 600, T0, labels={"hpc_job": str(k % 8)}) for k in range(10)]
    members: list[tuple[Target, tuple[str, ...]]] = [(t, (str(t.key % 8),)) for t in targets]
    group = Group(("hpc_job",), Selector([[Matcher("hpc_job", "=~", "[0-7]")]]), members)
    answer = [
        _random_series(rng, {"hpc_job": str(j), **({"stat": stat} if stat else {})}, T0, T0 + 600)
        for j in range(12)  # label values 8..11 belong to no job
        for stat in ("mean", "max", "", "mean")  # no stat label; a stat twice (the last one wins)
    ]
    grids = {t.key: grid(T0 + 30.0 * t.key, T0 + 600.0, 30.0) for t, _ in members}
    got = stats_placed(label_stats(answer, group), grids)
    want = stats_of_jobs(split_series(answer, group), grids)
    assert list(got) == list(want)
    for key in want:
        assert list(got[key]) == list(want[key])
        for stat in want[key]:
            _same(got[key][stat], want[key][stat])
