"""archive.Snapshot: one read of a job's archive answers the poll's later reads (the summary's, the alert
rules' windowed ones) exactly as the database would, before and after a write merged into it."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.metrics import archive
from jobs.metrics.archive import Points
from jobs.models import Job, JobSeries

SPAN = 30 * archive.CHUNK_POINTS  # 7,200 s: one 30 s chunk
T0 = 1_780_000_000 // SPAN * SPAN  # a chunk boundary


def _job(make_team) -> Job:
    start = datetime.fromtimestamp(T0, tz=UTC)
    return Job.objects.create(
        external_id="s1", name="j", team=make_team("llm"), gpu_count=2, started_at=start,
        missing_reasons={"nvlink_tx": "not exported"},
    )  # fmt: skip


def _line(job: Job, signal: str, stat: str, times, values, *, gpu: str = "", step: int = 30) -> Points:
    return Points(job.pk, signal, stat, gpu, step, np.asarray(times, float), np.asarray(values, float))


def _history(job: Job) -> None:
    """2.5 chunks of 30 s polls (so the 300 s and 3600 s tiers exist), a gap, a stretch archived only at
    300 s (as finalize would), per-GPU rows of two signals, and a derived MFU line."""
    rng = np.random.default_rng(7)
    n = 600  # 5 h of 30 s points
    ts = T0 + 30.0 * np.arange(1, n + 1)
    util = rng.uniform(0, 1, n)
    util[100:130] = np.nan  # 15 min without data
    rows = [
        _line(job, "gpu_util", "mean", ts, util),
        _line(job, "gpu_util", "min", ts, util * 0.5),
        _line(job, "sm_clock", "mean", ts, rng.uniform(1000, 1900, n)),
        _line(job, "xid_errors", "nonzero", ts, (rng.uniform(0, 1, n) > 0.97).astype(float)),
        _line(job, archive.MFU, "mean", ts[:500], rng.uniform(0.2, 0.5, 500)),
        _line(job, "power_usage", "mean", T0 + 300.0 * np.arange(70, 80), np.full(10, 300.0), step=300),
    ]
    gts = T0 + 300.0 * np.arange(1, 61)
    for gpu in ("n1/0", "n1/1"):
        rows.append(_line(job, "gpu_util", "gpu", gts, rng.uniform(0, 1, 60), gpu=gpu, step=300))
        rows.append(_line(job, "sm_clock", "gpu", gts, rng.uniform(1000, 1900, 60), gpu=gpu, step=300))
    archive.upsert(rows)


def _assert_same(a, b) -> None:
    if a is None or b is None:
        assert a is None and b is None
        return
    np.testing.assert_array_equal(a.timestamps, b.timestamps)
    assert (a.start, a.end, a.step, a.missing) == (b.start, b.end, b.step, b.missing)
    assert set(a.signals) == set(b.signals)
    for key, mine in a.signals.items():
        theirs = b.signals[key]
        assert set(mine.stats) == set(theirs.stats), key
        for stat in mine.stats:
            np.testing.assert_array_equal(mine.stats[stat], theirs.stats[stat], err_msg=f"{key}.{stat}")
        assert mine.gpus == theirs.gpus
        for name in ("per_gpu", "gpu_timestamps"):
            x, y = getattr(mine, name), getattr(theirs, name)
            assert (x is None) == (y is None)
            if x is not None:
                np.testing.assert_array_equal(x, y, err_msg=f"{key} {name}")


#: Windows the alert rules and pages read: the last 30 min, one inside the gap, one over the stretch only
#: archived at 300 s, one before the job, one across a chunk boundary.
WINDOWS = [
    (T0 + 16200.0, T0 + 18000.0),
    (T0 + 3000.0, T0 + 3900.0),
    (T0 + 21000.0, T0 + 24000.0),
    (T0 - 3600.0, T0 - 60.0),
    (T0 + 6900.0, T0 + 7500.0),
]


@pytest.mark.django_db
def test_a_snapshot_reads_what_the_database_reads_in_one_query(make_team):
    job = _job(make_team)
    _history(job)
    with CaptureQueriesContext(connection) as ctx:
        snap = archive.Snapshot(job, per_gpu=("gpu_util",))
        full = snap.load_job_signals(per_gpu=("gpu_util",))
        views = [
            snap.load_job_signals(per_gpu=False, signals=["gpu_util", archive.MFU], window=w) for w in WINDOWS
        ]
        heat = [snap.load_per_gpu("gpu_util", window=w) for w in WINDOWS]
    assert len(ctx.captured_queries) == 1
    _assert_same(full, archive.load_job_signals(job, per_gpu=("gpu_util",)))
    for w, view, series in zip(WINDOWS, views, heat, strict=True):
        _assert_same(
            view, archive.load_job_signals(job, per_gpu=False, signals=["gpu_util", archive.MFU], window=w)
        )
        theirs = archive.load_per_gpu(job, "gpu_util", window=w)
        assert (series is None) == (theirs is None)
        if series is not None and theirs is not None:
            np.testing.assert_array_equal(series.per_gpu, theirs.per_gpu)
            np.testing.assert_array_equal(series.gpu_timestamps, theirs.gpu_timestamps)


@pytest.mark.django_db
def test_a_write_merged_into_a_snapshot_reads_as_the_database_after_that_write(make_team):
    job = _job(make_team)
    _history(job)
    snap = archive.Snapshot(job, per_gpu=("gpu_util",))
    # A poll's derived rows: over the last stored MFU points (new values, a NaN that keeps the old one),
    # into the next chunk, and a new throughput line; their tiers change too.
    ts = T0 + 30.0 * np.arange(480, 700)
    mfu = np.linspace(0.1, 0.6, ts.size)
    mfu[5] = np.nan
    rows = [_line(job, archive.MFU, "mean", ts, mfu), _line(job, archive.THROUGHPUT, "mean", ts, mfu * 1e5)]
    snap.merge(rows)
    archive.upsert(rows)
    _assert_same(
        snap.load_job_signals(per_gpu=("gpu_util",)), archive.load_job_signals(job, per_gpu=("gpu_util",))
    )
    for w in WINDOWS:
        signals = ["gpu_util", archive.MFU, archive.THROUGHPUT]
        _assert_same(snap.load_job_signals(per_gpu=False, signals=signals, window=w),
                     archive.load_job_signals(job, per_gpu=False, signals=signals, window=w))  # fmt: skip
    # Every level it holds, the tiers the write refreshed included, as stored (the extremes it never holds).
    stored = {
        (r.signal, r.stat, r.gpu_key, r.step_seconds, round(r.start.timestamp())): bytes(r.values)
        for r in JobSeries.objects.filter(job=job).exclude(stat__in=archive.EXTREMES)
        if r.stat != archive.GPU_STAT or r.signal == "gpu_util"
    }
    held = {**snap._agg, **snap._gpu}  # the cross-GPU and the per-GPU chunks, held apart
    assert {k: h.chunk.blob for k, h in held.items()} == stored
    assert all(k[1] == archive.GPU_STAT for k in snap._gpu) and archive.GPU_STAT not in {
        k[1] for k in snap._agg
    }
    assert any(k[0] == archive.THROUGHPUT and k[3] == 3600 for k in stored)


@pytest.mark.django_db
def test_a_snapshot_refuses_per_gpu_rows_it_did_not_read(make_team):
    job = _job(make_team)
    _history(job)
    snap = archive.Snapshot(job, per_gpu=("gpu_util",))
    with pytest.raises(ValueError, match="were not read"):
        snap.load_job_signals(per_gpu=("sm_clock",))


@pytest.mark.django_db
def test_a_snapshot_of_an_empty_archive_reads_nothing(make_team):
    job = _job(make_team)
    snap = archive.Snapshot(job, per_gpu=("gpu_util",))
    assert snap.load_job_signals(per_gpu=("gpu_util",)) is None
    assert snap.load_per_gpu("gpu_util") is None


@pytest.mark.django_db
def test_a_merge_of_some_signals_reads_them_as_the_database_and_refuses_the_skipped_ones(make_team):
    job = _job(make_team)
    _history(job)
    snap = archive.Snapshot(job, per_gpu=("gpu_util",))
    ts = T0 + 30.0 * np.arange(480, 700)
    mfu = np.linspace(0.1, 0.6, ts.size)
    rows = [_line(job, archive.MFU, "mean", ts, mfu), _line(job, archive.THROUGHPUT, "mean", ts, mfu * 1e5)]
    snap.merge(rows, only=["gpu_util", archive.MFU])
    archive.upsert(rows)
    for w in WINDOWS:
        signals = ["gpu_util", archive.MFU]
        _assert_same(snap.load_job_signals(per_gpu=False, signals=signals, window=w),
                     archive.load_job_signals(job, per_gpu=False, signals=signals, window=w))  # fmt: skip
    # The throughput write was not merged: its old chunks must not answer, nor a read of every signal.
    with pytest.raises(ValueError, match="was not merged"):
        snap.load_job_signals(per_gpu=False, signals=[archive.THROUGHPUT])
    with pytest.raises(ValueError, match="was not merged"):
        snap.load_job_signals(per_gpu=("gpu_util",))


@pytest.mark.django_db
def test_a_merge_that_skips_no_written_signal_leaves_every_read_open(make_team):
    job = _job(make_team)
    _history(job)
    snap = archive.Snapshot(job, per_gpu=("gpu_util",))
    ts = T0 + 30.0 * np.arange(480, 700)
    rows = [_line(job, archive.MFU, "mean", ts, np.linspace(0.1, 0.6, ts.size))]
    snap.merge(rows, only=[archive.MFU])
    archive.upsert(rows)
    _assert_same(
        snap.load_job_signals(per_gpu=("gpu_util",)), archive.load_job_signals(job, per_gpu=("gpu_util",))
    )
