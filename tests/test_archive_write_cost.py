"""What an archive write costs the database: chunks a write leaves as they were are not rewritten, one lock
statement for all the jobs of a write, and the table leaves room for HOT updates (#14)."""

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


def _job(make_team, external_id: str = "w1") -> Job:
    start = datetime.fromtimestamp(T0, tz=UTC)
    return Job.objects.create(external_id=external_id, name="j", team=make_team("llm"), gpu_count=2,
                              started_at=start)  # fmt: skip


def _max(job: Job, times, values) -> Points:
    return Points(job.pk, "gpu_util", "max", "", 30, np.asarray(times, float), np.asarray(values, float))


def _versions(job: Job) -> dict[int, str]:
    """{step: ctid} of the job's rows: an UPDATE, HOT or not, gives the row a new ctid."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT step_seconds, ctid::text FROM jobs_jobseries WHERE job_id = %s", [job.pk])
        return dict(cursor.fetchall())


@pytest.mark.django_db
def test_repeating_a_write_rewrites_no_row(make_team):
    job = _job(make_team)
    rows = [_max(job, T0 + 30.0 * np.arange(1, 11), np.linspace(0.1, 0.9, 10))]
    first = archive.upsert(rows)
    assert first == 3  # the 30 s chunk and its 300 s and 3600 s tiers (max has no extremes)
    before = _versions(job)
    assert archive.upsert(rows) == 0
    assert _versions(job) == before


@pytest.mark.django_db
def test_a_tier_whose_window_value_did_not_move_is_not_rewritten(make_team):
    job = _job(make_team)
    # Maxima 0.5 then 0.9 in the first 300 s window (points T0+30, T0+60); a later point of the same window
    # with 0.3 changes the 30 s chunk, but the window's max stays 0.9 in the 300 s and 3600 s tiers.
    archive.upsert([_max(job, [T0 + 30.0, T0 + 60.0], [0.5, 0.9])])
    before = _versions(job)
    assert archive.upsert([_max(job, [T0 + 90.0], [0.3])]) == 1
    after = _versions(job)
    assert after[30] != before[30]
    assert (after[300], after[3600]) == (before[300], before[3600])
    stored = archive.load_job_signals(job, per_gpu=False)
    assert stored is not None
    np.testing.assert_array_equal(stored.signals["gpu_util"].stats["max"], np.float32([0.5, 0.9, 0.3]))


@pytest.mark.django_db
def test_one_write_of_many_jobs_takes_their_locks_in_one_statement(make_team):
    jobs = [_job(make_team, f"w{i}") for i in range(5)]
    rows = [_max(j, [T0 + 30.0], [0.5]) for j in jobs]
    with CaptureQueriesContext(connection) as ctx:
        archive.upsert(rows)
    locks = [q["sql"] for q in ctx.captured_queries if "pg_advisory_xact_lock" in q["sql"]]
    assert len(locks) == 1


@pytest.mark.django_db
def test_the_archive_table_leaves_room_for_hot_updates():
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'jobs_jobseries'")
        (options,) = cursor.fetchone()
    assert "fillfactor=70" in (options or [])


@pytest.mark.django_db
def test_text_columns_with_copys_special_characters_round_trip(make_team):
    job = _job(make_team)
    key = "node\\b\tx\ny\r/0"  # backslash, tab, newline, carriage return: escaped in COPY's text format
    archive.upsert([Points(job.pk, "gpu_util", "gpu", key, 300, np.array([T0 + 300.0]), np.array([0.25]))])
    row = JobSeries.objects.get(job=job, stat="gpu", step_seconds=300)
    assert row.gpu_key == key
    values = archive.decode(bytes(row.values))
    assert values[np.isfinite(values)].tolist() == [0.25]  # exact in float32 (the chunk's other points: gaps)


@pytest.mark.django_db
def test_reading_stored_chunks_leaves_out_the_per_gpu_rows_of_jobs_not_asking_for_them(make_team):
    # A cycle writes the per-GPU rows of the jobs due for them and the cross-GPU rows of every job: the read
    # of the stored chunks must not fetch the per-GPU chunks of the others (it fetched them all, to drop
    # them in Python, before the GPU keys were part of its filter).
    from jobs.metrics.archive.write import _existing

    jobs = [_job(make_team, f"x{i}") for i in range(3)]
    stored = []
    for n, job in enumerate(jobs):
        for gpu in range(4):
            value = 0.125 * (n + 1) + 0.0625 * gpu
            stored.append(Points(job.pk, "gpu_util", "gpu", f"node{n}/{gpu}", 30, np.array([T0 + 30.0]),
                                 np.array([value])))  # fmt: skip
        stored.append(
            Points(job.pk, "gpu_util", "mean", "", 30, np.array([T0 + 30.0]), np.array([0.5 + n / 8]))
        )
    archive.upsert(stored)
    wanted = [(jobs[0].pk, "gpu_util", "gpu", f"node0/{g}", 30, T0) for g in range(4)]
    wanted += [(job.pk, "gpu_util", "mean", "", 30, T0) for job in jobs]
    wanted.append((jobs[0].pk, "gpu_util", "gpu", "node0/9", 30, T0))  # not stored
    fetched: list[int] = []

    def count_rows(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if "SELECT" in sql:
            fetched.append(context["cursor"].rowcount)
        return result

    with connection.execute_wrapper(count_rows):
        positions, values = _existing(wanted)
    assert fetched == [7]  # jobs 1 and 2's 8 per-GPU chunks not among them
    found = {wanted[at]: row for at, row in zip(positions.tolist(), values, strict=True)}
    assert sorted(found) == sorted(wanted[:7])
    assert [found[k][0] for k in wanted[:4]] == [np.float32(0.125 + 0.0625 * g) for g in range(4)]
    assert [found[k][0] for k in wanted[4:7]] == [np.float32(0.5 + n / 8) for n in range(3)]
    assert np.isnan(found[wanted[0]][1:]).all() and found[wanted[0]].size == archive.CHUNK_POINTS


@pytest.mark.django_db
def test_reading_stored_chunks_returns_only_the_keys_asked_for_not_those_differing_in_one_column(make_team):
    # The read filters each (step, chunk start) of the write by lists of the other columns; a stored chunk
    # that differs from an asked-for key in one column only (job, signal, stat, GPU, step or start) must
    # not come back as that key, and each chunk comes back at its own key's position with its own values.
    from jobs.metrics.archive.write import _existing

    jobs = [_job(make_team, f"y{i}") for i in range(2)]
    a, b = jobs[0].pk, jobs[1].pk
    # Steps with no tier above them (3600 s cross-GPU, 7200 s), so the write stores exactly these chunks.
    t = T0 // (240 * 7200) * (240 * 7200)
    base = (a, "gpu_util", "mean", "", 3600, t)
    variants = [
        base,
        (b, "gpu_util", "mean", "", 3600, t),  # another job
        (a, "sm_active", "mean", "", 3600, t),  # another signal
        (a, "gpu_util", "max", "", 3600, t),  # another stat
        (a, "gpu_util", "mean", "n/0", 3600, t),  # another GPU key
        (a, "gpu_util", "mean", "", 7200, t),  # another step
        (a, "gpu_util", "mean", "", 3600, t + 240 * 3600),  # the next chunk
    ]
    stored = [
        Points(job, signal, stat, gpu, step, np.array([start + float(step)]), np.array([0.0625 * (n + 1)]))
        for n, (job, signal, stat, gpu, step, start) in enumerate(variants)
    ]
    archive.upsert(stored)
    assert JobSeries.objects.filter(job__in=jobs).count() == len(variants)
    # Asked for: the base and three variants, and keys not stored that differ in one column from a stored
    # variant not asked for (each crosses the asked-for lists' values).
    wanted = [variants[0], variants[2], variants[4], variants[6]]
    wanted += [
        (b, "sm_active", "mean", "", 3600, t),  # variant 1 with variant 2's signal
        (a, "gpu_util", "max", "", 3600, t + 240 * 3600),  # variant 3 in variant 6's chunk
        (a, "gpu_util", "mean", "n/0", 7200, t),  # variant 5 with variant 4's GPU key
        (b, "gpu_util", "mean", "n/0", 3600, t),  # variant 1 with variant 4's GPU key
    ]
    positions, values = _existing(wanted)
    got = {wanted[at]: float(row[0]) for at, row in zip(positions.tolist(), values, strict=True)}
    assert got == {variants[n]: 0.0625 * (n + 1) for n in (0, 2, 4, 6)}
    assert len(positions.tolist()) == len(set(positions.tolist())) == 4


def _tier_values(job: Job, step: int) -> list[float]:
    """The stored max tier values of the windows from (T0, T0 + step] on (T0 need not start its chunk)."""
    row = JobSeries.objects.get(job=job, stat="max", step_seconds=step)
    values = archive.decode(bytes(row.values))
    first = (T0 - int(row.start.timestamp())) // step
    return values[first:].tolist()


@pytest.mark.django_db
def test_a_poll_write_refreshes_the_tier_windows_where_a_value_changed_and_only_those(make_team):
    job = _job(make_team)
    # Two 300 s windows: (T0, T0 + 300] and (T0 + 300, T0 + 600].
    archive.upsert([_max(job, T0 + 30.0 * np.arange(1, 13), np.full(12, 0.25))])
    assert _tier_values(job, 300) == [0.25, 0.25]
    # A poll re-reads the first window unchanged and brings a new, higher point in the second; first both
    # windows' tier values are stamped 0.125, as if something else had written the tier, to see which ones
    # the write refreshes.
    row = JobSeries.objects.get(job=job, stat="max", step_seconds=300)
    stamped = archive.decode(bytes(row.values)).astype(np.float32)
    stamped[np.isfinite(stamped)] = 0.125
    JobSeries.objects.filter(pk=row.pk).update(values=stamped.tobytes())
    poll = [_max(job, T0 + 30.0 * np.arange(1, 14), np.r_[np.full(12, 0.25), 0.75])]
    archive.upsert(poll, tiers_of_changes=True)
    assert _tier_values(job, 300) == [0.125, 0.75]  # only the window with a changed value
    assert _tier_values(job, 3600)[0] == 0.75  # and its window one tier up
    archive.upsert(poll)  # the default refreshes every window the write touched
    assert _tier_values(job, 300) == [0.25, 0.75]
