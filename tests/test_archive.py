"""The compact archive: float32 chunks without timestamps, writes that merge, downsampled tiers, retention."""

from __future__ import annotations

import importlib
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from jobs.metrics import archive
from jobs.metrics.archive import Points
from jobs.models import Job, JobSeries

SPAN = 30 * archive.CHUNK_POINTS  # 7,200 s: one 30 s chunk
T0 = 1_780_000_000 // SPAN * SPAN  # a chunk boundary (a multiple of 7,200 s)


def _job(make_team, external_id: str = "a1") -> Job:
    team = make_team("llm")
    start = datetime.fromtimestamp(T0, tz=UTC)
    return Job.objects.create(
        external_id=external_id, name="j", team=team, gpu_count=2, started_at=start,
        ended_at=start + timedelta(days=2),
    )  # fmt: skip


def _pts(job: Job, times, values, *, stat: str = "mean", gpu: str = "", step: int = 30) -> Points:
    return Points(
        job.pk, "gpu_util", stat, gpu, step, np.asarray(times, dtype=float), np.asarray(values, dtype=float)
    )


def _stored(job: Job, step: int, stat: str = "mean", gpu: str = "") -> dict[float, float]:
    """{grid point: value} of every stored value of one line at one step (NaN gaps left out)."""
    out: dict[float, float] = {}
    for row in JobSeries.objects.filter(job=job, stat=stat, gpu_key=gpu, step_seconds=step):
        for t, v in zip(*row.points(), strict=True):
            if v == v:
                out[t] = v
    return out


@pytest.mark.django_db
def test_round_trip_keeps_values_and_gaps_stay_gaps(make_team):
    job = _job(make_team)
    times = T0 + 30.0 * np.arange(1, 21)
    values = np.full(20, 0.5)
    values[[3, 4, 11]] = np.nan  # three missing scrapes
    values[7] = 0.25
    archive.upsert([_pts(job, times, values)])
    sigs = archive.load_job_signals(job, per_gpu=False)
    assert sigs is not None
    got = sigs.signals["gpu_util"].mean
    assert got is not None
    np.testing.assert_array_equal(sigs.timestamps, times)
    # 0.5 and 0.25 are exact in float32: the round trip is exact, and the gaps come back NaN (never 0).
    np.testing.assert_array_equal(got, values)
    row = JobSeries.objects.get(job=job, stat="mean", step_seconds=30)
    assert len(bytes(row.values)) == 20 * 4  # float32, no timestamps


@pytest.mark.django_db
def test_a_window_merges_into_its_chunks_and_a_nan_never_overwrites(make_team):
    job = _job(make_team)
    # First write: 10 points ending 2 points before a chunk boundary. Second write: 10 points from the
    # 6th on, across the boundary, with a NaN at its 3rd point (the 8th overall).
    first = T0 + SPAN - 30.0 * np.arange(11, 1, -1)  # T0 + SPAN - 330 ... T0 + SPAN - 60
    archive.upsert([_pts(job, first, np.full(10, 0.5))])
    second_times = first[5] + 30.0 * np.arange(10)
    second = np.full(10, 0.25)
    second[2] = np.nan
    archive.upsert([_pts(job, second_times, second)])
    got = _stored(job, 30)
    expected = {t: 0.5 for t in first[:5]}  # points only the first write had: kept
    expected |= {t: 0.25 for t in second_times}  # the second write's values win where it has one
    expected[float(second_times[2])] = 0.5  # its NaN kept the first write's value
    assert got == expected
    # Two chunks: the second write crossed the boundary at T0 + SPAN.
    starts = set(JobSeries.objects.filter(job=job, step_seconds=30).values_list("start", flat=True))
    assert starts == {archive.utc(T0), archive.utc(T0 + SPAN)}


@pytest.mark.django_db
def test_repeating_a_write_changes_nothing(make_team):
    job = _job(make_team)
    rows = [_pts(job, T0 + 30.0 * np.arange(1, 50), np.linspace(0.1, 0.9, 49).round(2))]
    archive.upsert(rows)
    before = {(r.step_seconds, r.start): bytes(r.values) for r in JobSeries.objects.filter(job=job)}
    archive.upsert(rows)
    after = {(r.step_seconds, r.start): bytes(r.values) for r in JobSeries.objects.filter(job=job)}
    assert after == before


@pytest.mark.django_db
def test_the_coarse_tier_is_computed_from_the_merged_chunk_with_each_stats_rule(make_team):
    job = _job(make_team)
    # One 300 s tier window (T0, T0 + 300] holds the 30 s points T0 + 30 ... T0 + 300. Written in two
    # polls of five points each: the tier value must be of all ten, not of the last poll.
    times = T0 + 30.0 * np.arange(1, 11)
    means = np.arange(10) / 10  # 0.0 ... 0.9
    mins = means / 2
    sampled = np.array([2.0, 2.0, np.nan, 2.0, 1.0, 2.0, 2.0, 2.0, np.nan, 2.0])  # 2 GPUs, scrapes missed
    for part in (slice(0, 5), slice(5, 10)):
        archive.upsert([
            _pts(job, times[part], means[part]),
            _pts(job, times[part], mins[part], stat="min"),
            _pts(job, times[part], sampled[part], stat="sampled"),
        ])  # fmt: skip
    tier = T0 + 300.0
    mean = _stored(job, 300)[tier]
    assert mean == pytest.approx(0.45, rel=1e-6)  # (0 + 0.1 + ... + 0.9) / 10
    assert _stored(job, 300, "min")[tier] == pytest.approx(0.0)  # the smallest minimum
    # Coverage is kept: 15 GPU-windows' worth of samples over 10 fine windows = 1.5 GPUs' worth.
    assert _stored(job, 300, "sampled")[tier] == pytest.approx(15.0 / 10)
    # The next tier (3600 s) is the mean of the 300 s windows that have a value: only this one.
    assert _stored(job, 3600)[T0 + 3600.0] == pytest.approx(0.45, rel=1e-6)


@pytest.mark.django_db
def test_a_page_budget_reads_the_coarse_tier_and_a_zoom_the_polled_rows(make_team):
    job = _job(make_team)
    times = T0 + 30.0 * np.arange(1, 2 * 2880 + 1)  # two days at 30 s
    archive.upsert([_pts(job, times, np.full(times.size, 0.5))])
    whole = archive.load_means(job, ["gpu_util"], max_points=1000)  # 2 days / 1000 = 173 s: the 300 s tier
    assert whole is not None and whole.step == 300
    mean = whole.signals["gpu_util"].mean
    assert mean is not None and np.isfinite(mean).sum() == 2 * 86400 // 300
    zoom = archive.load_means(job, ["gpu_util"], (T0 + 3600.0, T0 + 7200.0), max_points=1000)
    assert zoom is not None and zoom.step == 30


@pytest.mark.django_db
def test_raw_per_gpu_rows_past_retention_are_pruned_and_their_tier_stays(make_team):
    job = _job(make_team)
    gpu_span = 300 * archive.CHUNK_POINTS  # 72,000 s per 300 s chunk
    base = T0 // gpu_span * gpu_span
    old_times = base + 300.0 * np.arange(1, 241)  # one whole old chunk
    archive.upsert([_pts(job, old_times, np.full(240, 0.5), stat="gpu", gpu="node-a/0", step=300)])
    recent = old_times[-1] + 20 * 86400 + 300.0 * np.arange(1, 11)
    archive.upsert([_pts(job, recent, np.full(10, 0.5), stat="gpu", gpu="node-a/0", step=300)])
    now = archive.utc(float(recent[-1]) + 3600)
    deleted = archive.prune_raw(now, retention_days=14)
    assert deleted == 1  # the old raw chunk only
    assert _stored(job, 300, "gpu", "node-a/0") == {t: 0.5 for t in recent}
    # The 1800 s tier of the old chunk is kept forever: 72,000 / 1800 = 40 windows of 0.5.
    tier = _stored(job, 1800, "gpu", "node-a/0")
    assert sum(1 for t in tier if t <= old_times[-1]) == 40


def test_the_migration_places_each_old_sample_on_the_point_closing_its_window():
    mig = importlib.import_module("jobs.migrations.0010_compact_archive")
    # Old rows: samples 15 s after the grid points (a scrape offset) and one gap; step 30 s.
    times = T0 + 15.0 + 30.0 * np.arange(5)
    values = np.array([0.5, np.nan, 0.25, 0.5, 0.75])
    chunks = mig._chunks(times, values, 30)
    # T0 + 15 closes at T0 + 30: the first point of the chunk starting at T0, value index 0.
    assert list(chunks) == [T0]
    np.testing.assert_array_equal(chunks[T0], np.array([0.5, np.nan, 0.25, 0.5, 0.75], dtype=np.float32))


# ------------------------------------------------------------------- finalize against a real Prometheus


def _late_only(sim, after: float):
    """A copy of `sim` whose DCGM samples before `after` are gone (Prometheus' retention passed them)."""
    import copy

    late = copy.deepcopy(sim)
    early = late.timestamps < after
    for key in late.fields:
        late.fields[key][:, early] = np.nan
    return late


@pytest.mark.django_db
@pytest.mark.prometheus
def test_finalize_keeps_the_early_archive_prometheus_no_longer_holds(make_team, tmp_path):
    from jobs.intake.registry import register_job
    from jobs.metrics.prometheus import PrometheusClient
    from jobs.pipeline import poll as pipeline
    from jobs.simulate import DEFAULT_START, SimSpec, backfill, registration_body, simulate, write_openmetrics
    from tests.prom_server import PrometheusProcess, prometheus_binary

    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (Debian package 'prometheus')")
    hour = 3600.0
    sim = simulate(SimSpec(scenario="healthy", gpus=4, job_id="2001", duration_s=2 * hour, seed=5,
                           hosts=("node-r",)))  # fmt: skip
    job = register_job(registration_body(sim, team=make_team("llm"), ended=True)).job
    end = datetime.fromtimestamp(DEFAULT_START + 2 * hour, tz=UTC)

    def prometheus(results, name: str) -> PrometheusProcess:
        om = tmp_path / f"{name}.om"
        write_openmetrics(results, om)
        backfill(om, tmp_path / name)
        return PrometheusProcess(tmp_path / name)

    with prometheus([sim], "full") as full:  # while the job ran, Prometheus held everything
        pipeline.poll_job(job, PrometheusClient(full.url, timeout_s=10, retries=0), now=end)
    polled_agg = _stored(job, 30)
    polled_gpu = {g: _stored(job, 300, "gpu", g) for g in ("node-r/0", "node-r/3")}
    first_hour = [t for t in polled_agg if t <= DEFAULT_START + hour]
    assert len(first_hour) >= 110  # ~120 windows of 30 s in the first hour were archived by polling

    job.refresh_from_db()
    with prometheus([_late_only(sim, DEFAULT_START + hour)], "late") as late:  # the first hour expired
        job = pipeline.finalize_job(job, PrometheusClient(late.url, timeout_s=10, retries=0), now=end)
    assert job.status == Job.Status.FINALIZED
    # 0 samples lost: every value polling archived is still there (finalize re-read the same windows of
    # the second hour and could only add to them), at every level.
    after_agg = _stored(job, 30)
    lost = [t for t in polled_agg if t not in after_agg]
    assert lost == []
    for gpu, before in polled_gpu.items():
        assert set(before) <= set(_stored(job, 300, "gpu", gpu)), gpu
    # And the reader still draws the first hour.
    sigs = archive.load_job_signals(job, per_gpu=False, signals=["gpu_util"])
    assert sigs is not None and sigs.signals["gpu_util"].mean is not None
    early = sigs.timestamps <= DEFAULT_START + hour
    assert np.isfinite(sigs.signals["gpu_util"].mean[early]).sum() == len(first_hour)


# ------------------------------------------------------------------------------------------------ pages


@pytest.mark.django_db
def test_the_cached_whole_job_figures_change_with_the_next_poll(make_team, make_user, client):
    from django.urls import reverse

    job = _job(make_team, "cached-figures")
    job.status, job.ended_at = Job.Status.RUNNING, None
    job.save()
    client.force_login(make_user("viewer", teams=[job.team]))
    url = reverse("job-figures", args=[job.external_id])
    times = T0 + 30.0 * np.arange(1, 121)  # the first hour
    archive.upsert([_pts(job, times, np.full(120, 0.5))])
    job.data_until = archive.utc(float(times[-1]))
    job.save()

    def drawn() -> int:
        body = client.get(url).json()
        line = next(t for t in body["timeseries"]["data"] if t["name"] == "nvidia-smi util")
        return sum(1 for y in line["y"] if y is not None)

    assert drawn() == 120
    assert drawn() == 120  # the same figures, from the cache
    more = times[-1] + 30.0 * np.arange(1, 61)  # the next poll archives 30 more minutes
    archive.upsert([_pts(job, more, np.full(60, 0.25))])
    job.data_until = archive.utc(float(more[-1]))
    job.save()
    assert drawn() == 180  # the poll's save changed the key: nothing stale is served


@pytest.mark.django_db
def test_evaluation_reads_the_tier_for_a_long_job_and_the_polled_rows_for_a_short_one(make_team):
    long_job = _job(make_team)
    two_days = T0 + 30.0 * np.arange(1, 2 * 2880 + 1)
    archive.upsert([_pts(long_job, two_days, np.full(two_days.size, 0.5))])
    long_job.ended_at = archive.utc(float(two_days[-1]))
    # 2 days / 4000 points = 43.2 s: finer than the 300 s tier is not needed, 30 s is too fine.
    sigs = archive.load_for_evaluation(long_job, per_gpu=False)
    assert sigs is not None and sigs.step == 300
    short_job = Job.objects.create(
        external_id="short", name="s", team=long_job.team, gpu_count=2, started_at=long_job.started_at,
        ended_at=long_job.started_at + timedelta(hours=20),
    )  # fmt: skip
    twenty_hours = T0 + 30.0 * np.arange(1, 2400 + 1)
    archive.upsert([_pts(short_job, twenty_hours, np.full(twenty_hours.size, 0.5))])
    # 20 h / 4000 = 18 s: the polled 30 s rows are read unchanged.
    sigs = archive.load_for_evaluation(short_job, per_gpu=False)
    assert sigs is not None and sigs.step == 30


@pytest.mark.django_db
def test_a_line_archived_only_coarser_is_drawn_over_each_coarse_window_on_the_finer_grid(make_team):
    job = _job(make_team)
    fine = T0 + 30.0 * np.arange(1, 21)  # 10 minutes of 30 s util
    archive.upsert([_pts(job, fine, np.full(20, 0.5))])
    # MFU evaluated on the 300 s tier only: one value per window (T0, T0 + 300] and (T0 + 300, T0 + 600].
    mfu = Points(job.pk, "mfu", "mean", "", 300, np.array([T0 + 300.0, T0 + 600.0]), np.array([0.25, 0.375]))
    archive.upsert([mfu])
    sigs = archive.load_job_signals(job, per_gpu=False, window=(T0, T0 + 600.0))
    assert sigs is not None and sigs.step == 30
    line = sigs.signals["mfu"].mean
    assert line is not None
    # Grid points T0 + 30 ... T0 + 300 lie in the first window, T0 + 330 ... T0 + 600 in the second.
    np.testing.assert_array_equal(line, np.r_[np.full(10, 0.25), np.full(10, 0.375)])


@pytest.mark.django_db(transaction=True)
def test_migration_0010_converts_old_rows_and_the_reader_gets_the_same_samples(make_team):
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("jobs")
    executor.migrate([("jobs", "0009_team_budget_promotion_override")])
    try:
        # The job as the schema at 0009 has it (today's model has columns added later, e.g. registered_by).
        old_apps = executor.loader.project_state(("jobs", "0009_team_budget_promotion_override")).apps
        team = make_team("llm")
        start = datetime.fromtimestamp(T0, tz=UTC)
        old_job = old_apps.get_model("jobs", "Job").objects.create(
            external_id="old-layout", name="j", team_id=team.pk, gpu_count=2, started_at=start,
            ended_at=start + timedelta(days=2),
        )  # fmt: skip
        # An old row: chunk from its aligned start T0 (the old rule: floor(t / 7200 s)), timestamps next to
        # every value, NULL for a gap; the first sample sits on T0 itself.
        times = [T0 + 30.0 * i for i in range(6)]
        values = [0.5, None, 0.25, 0.75, 0.5, 0.25]
        with connection.cursor() as cur:
            cur.execute(
                'INSERT INTO jobs_jobseries (job_id, signal, stat, gpu_key, step_seconds, start, "end", '
                'timestamps, "values") '
                "VALUES (%s, %s, %s, %s, %s, to_timestamp(%s), to_timestamp(%s), %s, %s)",
                [old_job.pk, "gpu_util", "mean", "", 30, T0, times[-1], times, values],
            )
        executor = MigrationExecutor(connection)
        executor.migrate(latest)
    finally:
        MigrationExecutor(connection).migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
    job = Job.objects.get(pk=old_job.pk)
    # T0 closes the window (T0 - 30, T0]: it belongs to the chunk before (ending at T0) now.
    assert _stored(job, 30) == {t: v for t, v in zip(times, values, strict=True) if v is not None}
    sigs = archive.load_job_signals(job, per_gpu=False)
    assert sigs is not None and sigs.timestamps[0] == T0
    mean = sigs.signals["gpu_util"].mean
    assert mean is not None
    np.testing.assert_array_equal(mean[:6], [0.5, np.nan, 0.25, 0.75, 0.5, 0.25])
