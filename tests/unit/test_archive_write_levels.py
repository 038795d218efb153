"""The archive write's levels as matrices (jobs.metrics.archive.write: `_chunk_level`, `_coarser_level`),
without a database: where points land, which line wins, and which coarse points a write produces (#26
item 2)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from jobs.metrics.archive import CHUNK_POINTS, EXTREMES, Points
from jobs.metrics.archive.write import _chunk_level, _coarser_level

SPAN = 30 * CHUNK_POINTS  # 7,200 s: one 30 s chunk
T0 = 1_780_000_000 // SPAN * SPAN
TIER = 300 * CHUNK_POINTS  # 72,000 s: one 300 s chunk


def _line(times: ArrayLike, values: ArrayLike, *, stat: str = "mean", step: int = 30, job: int = 1) -> Points:
    return Points(job, "gpu_util", stat, "", step, np.asarray(times, float), np.asarray(values, float))


def test_a_line_across_two_chunks_fills_both_at_the_points_closing_its_samples_windows() -> None:
    times = T0 + SPAN + 30.0 * np.array([-1, 0, 1, 2])  # the last two points of one chunk, two of the next
    level = _chunk_level([_line(times, [0.25, 0.5, 0.75, np.nan])])
    assert level.keys == [(1, "gpu_util", "mean", "", 30, T0), (1, "gpu_util", "mean", "", 30, T0 + SPAN)]
    first, second = level.values
    assert first[-2:].tolist() == [0.25, 0.5] and np.isnan(first[:-2]).all()
    assert second[0] == np.float32(0.75) and np.isnan(second[1:]).all()  # the NaN brings nothing
    assert level.mask.sum(axis=1).tolist() == [2, 1]


def test_two_lines_writing_one_chunk_the_later_wins_where_it_has_a_value() -> None:
    times = T0 + 30.0 * np.arange(1, 4)
    level = _chunk_level([_line(times, [0.25, 0.25, 0.25]), _line(times, [0.5, np.nan, 0.75])])
    assert len(level.keys) == 1
    np.testing.assert_array_equal(level.values[0, :3], np.asarray([0.5, 0.25, 0.75], dtype=np.float32))
    assert level.mask[0, :3].all() and not level.mask[0, 3:].any()


def test_coarse_points_land_in_one_coarse_chunk_at_their_windows_columns_with_the_extremes() -> None:
    # Fine points on both sides of a 30 s chunk boundary, inside one 300 s chunk: two 300 s windows.
    times = T0 + SPAN + 30.0 * np.array([-2, -1, 0, 1, 2])
    level = _chunk_level([_line(times, [0.125, 0.25, 0.5, 0.75, 1.0])])
    coarse = _coarser_level(level.keys, level.values, level.mask)
    start = (T0 + SPAN) // TIER * TIER
    assert start == T0 // TIER * TIER  # (the test's premise: both fine chunks lie in this 300 s chunk)
    assert coarse.keys == [(1, "gpu_util", stat, "", 300, start) for stat in ("mean", *EXTREMES)]
    column = (T0 + SPAN - start) // 300 - 1  # the window (T0 + SPAN - 300, T0 + SPAN]
    mean, low, high = coarse.values
    assert np.flatnonzero(coarse.mask[0]).tolist() == [column, column + 1]
    assert mean[column] == np.float32((0.125 + 0.25 + 0.5) / 3) and mean[column + 1] == np.float32(0.875)
    assert (low[column], high[column]) == (np.float32(0.125), np.float32(0.5))
    assert np.isnan(np.delete(mean, [column, column + 1])).all()


def test_a_window_the_write_touched_without_any_value_writes_no_coarse_point() -> None:
    level = _chunk_level([_line(T0 + 30.0 * np.arange(1, 4), [0.5, 0.5, 0.5], stat="max")])
    level.values[0, :10] = np.nan  # as if the merged chunk had no value in the first 300 s window
    coarse = _coarser_level(level.keys, level.values, level.mask)
    assert coarse.keys == []
    assert coarse.values.shape == (0, CHUNK_POINTS)


def test_a_coarse_point_from_two_fine_steps_of_one_stat_takes_the_later_steps_value() -> None:
    # A 30 s and a 60 s line of one stat in one write both give the 300 s window (T0, T0 + 300].
    level = _chunk_level([
        _line(T0 + 30.0 * np.arange(1, 3), [0.25, 0.25], stat="max"),
        _line(T0 + 60.0 * np.arange(1, 3), [0.75, 0.75], stat="max", step=60),
    ])  # fmt: skip
    coarse = _coarser_level(level.keys, level.values, level.mask)
    column = (T0 - T0 // TIER * TIER) // 300
    assert len(coarse.keys) == 1 and coarse.values[0, column] == np.float32(0.75)


def test_rows_for_gives_one_line_per_gpu_with_a_value_at_the_per_gpu_step() -> None:
    from jobs.metrics.archive import rows_for
    from jobs.metrics.signals import GpuKey, JobSignals, SignalSeries
    from jobs.models import Job

    ts = T0 + 30.0 * np.arange(1, 11)
    gpu_ts = T0 + 300.0 * np.arange(1, 4)
    per_gpu = np.array([[0.5, 0.25, np.nan], [np.nan] * 3, [np.nan, np.nan, 0.75]])
    gpus = (GpuKey("h", "0"), GpuKey("h", "1"), GpuKey("h", "2"))
    stats = {"mean": np.full(10, 0.5), "count": np.full(10, np.nan)}
    sigs = JobSignals(ts[0], ts[-1], 30, ts)
    sigs.signals["gpu_util"] = SignalSeries("gpu_util", "ratio", ts, stats, gpus, gpu_ts, per_gpu)
    rows = rows_for(Job(pk=5), sigs, {})
    assert [(r.stat, r.gpu_key, r.step) for r in rows] == [
        ("mean", "", 30),  # the all-NaN count brings no line, nor GPU 1's all-NaN row
        ("gpu", str(gpus[0]), 300),
        ("gpu", str(gpus[2]), 300),
    ]
    np.testing.assert_array_equal(rows[2].values, per_gpu[2])
    np.testing.assert_array_equal(rows[1].times, gpu_ts)
    assert all(isinstance(r.step, int) and r.job_id == 5 for r in rows)


def test_a_fine_chunk_straddling_two_coarse_chunks_splits_its_windows_between_them() -> None:
    # A finalize's 120 s grid under the 300 s tier: a 120 s chunk spans 28,800 s, a 300 s chunk 72,000 s
    # (2.5 fine chunks), so some fine chunks' windows close in two coarse chunks. Every window is written
    # to the coarse chunk holding its closing point, at that point's column, with the window's mean.
    fine_span = 120 * CHUNK_POINTS
    start = T0 // TIER * TIER + 2 * fine_span  # from 57,600 s to 86,400 s past a coarse chunk start
    times = start + 120.0 * np.arange(1, CHUNK_POINTS + 1)
    values = np.arange(1, CHUNK_POINTS + 1, dtype=float) / CHUNK_POINTS
    level = _chunk_level([_line(times, values, step=120)])
    assert [k[5] for k in level.keys] == [start]
    coarse = _coarser_level(level.keys, level.values, level.mask)
    means = {k[5]: coarse.values[i] for i, k in enumerate(coarse.keys) if k[2] == "mean"}
    first = start // TIER * TIER
    assert sorted(means) == [first, first + TIER]  # the two coarse chunks, not a column past the first
    fine = np.asarray(values, dtype=np.float32).astype(float)
    for point in range(int(start // 300) + 1, int((start + fine_span) // 300) + 1):
        inside = (times > (point - 1) * 300) & (times <= point * 300)
        chunk = (point - 1) // CHUNK_POINTS * CHUNK_POINTS * 300
        assert means[chunk][(point - 1) % CHUNK_POINTS] == np.float32(fine[inside].mean())
    assert sum(int(np.isfinite(m).sum()) for m in means.values()) == fine_span // 300
