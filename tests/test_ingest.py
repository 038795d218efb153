"""Ingestion against a real Prometheus holding simulated dcgm-exporter data (backfilled with promtool)."""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from django.conf import settings

from jobs.intake.registry import register_job
from jobs.metrics import ingest
from jobs.metrics.archive import load_job_signals
from jobs.metrics.prometheus import PrometheusClient
from jobs.models import Job, JobSeries
from jobs.pipeline import poll as pipeline
from jobs.simulate import DEFAULT_START, SimSpec, backfill, registration_body, simulate, write_openmetrics
from tests.prom_server import PrometheusProcess, prometheus_binary

pytestmark = [pytest.mark.prometheus]
HOUR = 3600.0
START = datetime.fromtimestamp(DEFAULT_START, tz=UTC)


@pytest.fixture(scope="module")
def sims():
    """Two simulated jobs on separate nodes: a healthy one, and one without SM_ACTIVE (default exporter)."""
    healthy = simulate(SimSpec(scenario="healthy", gpus=8, job_id="1001", duration_s=2 * HOUR, seed=3,
                               hosts=("node-a",)))  # fmt: skip
    no_sm = simulate(SimSpec(scenario="false_saturation", gpus=4, job_id="1002", duration_s=2 * HOUR, seed=4,
                             hosts=("node-b",), disabled=frozenset({"sm_active"})))  # fmt: skip
    return {"1001": healthy, "1002": no_sm}


@pytest.fixture(scope="module")
def prom(sims, tmp_path_factory):
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (Debian package 'prometheus')")
    work = tmp_path_factory.mktemp("ingest-prom")
    om = work / "data.om"
    write_openmetrics(list(sims.values()), om)
    backfill(om, work / "tsdb")
    with PrometheusProcess(work / "tsdb") as server:
        yield server


def _register(sim, team, *, ended: bool) -> Job:
    return register_job(registration_body(sim, team=team, ended=ended)).job


def _client(prom) -> PrometheusClient:
    return PrometheusClient(prom.url, timeout_s=10, retries=0)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _snapshot(job: Job) -> dict:
    return {
        (r.signal, r.stat, r.gpu_key, r.step_seconds, r.start): tuple(map(tuple, r.points()))
        for r in JobSeries.objects.filter(job=job)
    }


def _assert_same(a: dict, b: dict) -> None:
    """Same rows, same timestamps, same values (Prometheus sums in no fixed order: last bits may differ)."""
    assert a.keys() == b.keys()
    for key in a:
        (ta, va), (tb, vb) = a[key], b[key]
        assert ta == tb, key
        fa = np.array([np.nan if v is None else v for v in va])
        fb = np.array([np.nan if v is None else v for v in vb])
        np.testing.assert_allclose(fa, fb, rtol=1e-9, equal_nan=True, err_msg=str(key))


@pytest.mark.django_db
def test_poll_archives_signals_and_computes_mfu_close_to_the_simulated_truth(prom, sims, make_team):
    job = _register(sims["1001"], make_team("llm"), ended=False)
    job = pipeline.poll_job(job, _client(prom), now=START + timedelta(hours=1))
    assert job.ingest_error == ""
    # Not past now minus the ingestion lag (2 x the 30 s scrape interval): later samples may be in flight.
    lag = timedelta(seconds=settings.PROMETHEUS_INGESTION_LAG_S)
    assert job.data_until == START + timedelta(hours=1) - lag
    signals = set(JobSeries.objects.filter(job=job).values_list("signal", flat=True))
    assert {
        "gpu_util",
        "sm_active",
        "tensor_active",
        "power_usage",
        "sm_clock",
        "tokens_per_second",
        "mfu",
    } <= signals
    assert JobSeries.objects.filter(job=job, stat="gpu").values("gpu_key").distinct().count() == 8
    truth = sims["1001"].throughput.mfu
    assert job.mfu == pytest.approx(truth, rel=0.1)
    assert job.gpu_util_mean > 0.9
    assert job.cost_per_day_usd == pytest.approx(8 * 6.88 * 24)
    assert job.waste_per_day_usd >= 0
    assert "6N" in job.flops_variant


@pytest.mark.django_db
def test_repeated_and_overlapping_polls_store_the_same_rows(prom, sims, make_team):
    job = _register(sims["1001"], make_team("llm"), ended=False)
    client = _client(prom)
    now = START + timedelta(minutes=70)
    pipeline.poll_job(job, client, now=now)
    first = _snapshot(job)
    job.refresh_from_db()
    pipeline.poll_job(job, client, now=now)
    _assert_same(_snapshot(job), first)
    job.refresh_from_db()
    # Reset the resume point to the middle of the archive: overlapping polls never double data.
    job.data_until = START + timedelta(minutes=10)
    job.save()
    pipeline.poll_job(job, client, now=now)
    _assert_same(_snapshot(job), first)


@pytest.mark.django_db
def test_a_missing_field_is_reported_missing_not_zero(prom, sims, make_team):
    job = _register(sims["1002"], make_team("llm"), ended=False)
    job = pipeline.poll_job(job, _client(prom), now=START + timedelta(hours=1))
    assert "sm_active" in job.missing_signals
    assert job.sm_active_mean is None
    assert not JobSeries.objects.filter(job=job, signal="sm_active").exists()
    assert "default counters" in job.missing_reasons["sm_active"]
    assert job.gpu_util_mean > 0.9


@pytest.mark.django_db
def test_prometheus_down_keeps_the_archive_and_the_next_poll_fills_the_gap(prom, sims, make_team):
    job = _register(sims["1001"], make_team("llm"), ended=False)
    pipeline.poll_job(job, _client(prom), now=START + timedelta(minutes=30))
    kept = _snapshot(job)
    job.refresh_from_db()
    down = PrometheusClient(f"http://127.0.0.1:{_closed_port()}", timeout_s=1, retries=0)
    job = pipeline.poll_job(job, down, now=START + timedelta(minutes=60))
    assert "could not read Prometheus" in job.ingest_error
    lag = timedelta(seconds=settings.PROMETHEUS_INGESTION_LAG_S)
    assert job.data_until == START + timedelta(minutes=30) - lag
    _assert_same(_snapshot(job), kept)
    job = pipeline.poll_job(job, _client(prom), now=START + timedelta(minutes=90))
    assert job.ingest_error == ""
    archived = load_job_signals(job)
    util = archived.get("gpu_util").mean
    covered = archived.timestamps[~np.isnan(util)]
    assert covered.min() <= DEFAULT_START + 60 and covered.max() >= DEFAULT_START + 89 * 60
    assert np.isnan(util).sum() <= 2  # no gap left between minute 30 and 60


@pytest.mark.django_db
def test_finalize_merges_into_the_archive_and_is_idempotent(prom, sims, make_team):
    job = _register(sims["1001"], make_team("llm"), ended=True)
    client = _client(prom)
    job = pipeline.finalize_job(job, client, now=START + timedelta(hours=3))
    assert job.status == Job.Status.FINALIZED
    first = _snapshot(job)
    mfu = job.mfu
    job = pipeline.finalize_job(job, client, now=START + timedelta(hours=3))
    _assert_same(_snapshot(job), first)
    assert job.mfu == pytest.approx(mfu)
    assert job.gpu_hours == pytest.approx(16.0)
    assert job.cost_usd == pytest.approx(16.0 * 6.88, rel=1e-6)
    assert (job.energy_j or 0) > 0 and (job.evaluated.energy_kwh or 0) > 0


@pytest.mark.django_db
def test_a_job_id_with_promql_metacharacters_cannot_widen_the_query(prom, sims, make_team):
    job = _register(sims["1001"], make_team("llm"), ended=False)
    job.gpus, job.selector = [], {"hpc_job": '"} or vector(1) #'}
    job.save()
    job = pipeline.poll_job(job, _client(prom), now=START + timedelta(hours=1))
    assert job.ingest_error == ""
    assert not JobSeries.objects.filter(job=job, signal="gpu_util").exists()
    assert "gpu_util" in job.missing_signals


@pytest.mark.django_db
def test_running_jobs_are_rediagnosed_every_ten_minutes_not_every_poll(prom, sims, make_team):
    job = _register(sims["1001"], make_team("llm"), ended=False)
    client = _client(prom)
    first = START + timedelta(minutes=30)
    job = pipeline.poll_job(job, client, now=first)
    assert job.diagnosed_at == first
    job = pipeline.poll_job(job, client, now=first + timedelta(minutes=1))
    assert job.diagnosed_at == first
    later = first + timedelta(minutes=11)
    job = pipeline.poll_job(job, client, now=later)
    assert job.diagnosed_at == later


@pytest.mark.django_db
def test_per_gpu_rows_archived_half_a_step_off_reload_one_sample_per_column(sims, make_team):
    """Rows read on start + k*step (before per-GPU grids were aligned) sit half a step off the reload grid.

    2 GPUs, aggregate grid T0, T0+30, ..., T0+3600 (121 points); per-GPU rows at T0+15+30k, k = 0..119,
    GPU 0 idle (0 %), GPU 1 busy (90 %). Each sample closes into column k+1 of the 30 s grid, so every
    row keeps its 120 samples in 120 distinct columns (np.rint sent k+0.5 to the even neighbour: 61
    columns, the odd ones empty). Idle share: 120 idle samples of 240 observed = 50.0 %, not the 99.2 %
    (121 bridged columns / 122 observed) the collided grid gave.
    """
    from jobs.diagnosis import DiagnosisInput
    from jobs.diagnosis.features import Features
    from jobs.diagnosis.rules import idle_gpus
    from jobs.metrics import archive
    from jobs.metrics.signals import COUNT, MEAN, GpuKey, JobSignals, SignalSeries, grid

    job = _register(sims["1001"], make_team("llm"), ended=True)
    t0 = DEFAULT_START
    ts = grid(t0, t0 + HOUR, 30.0)
    stats = {MEAN: np.full(ts.size, 0.45), COUNT: np.full(ts.size, 2.0)}
    series = SignalSeries("gpu_util", "ratio", ts, stats)
    series.gpus = (GpuKey("node-a", "0"), GpuKey("node-a", "1"))
    series.gpu_timestamps = t0 + 15 + 30.0 * np.arange(120)
    series.per_gpu = np.vstack([np.zeros(120), np.full(120, 0.9)])
    sigs = JobSignals(t0, t0 + HOUR, 30.0, ts, {"gpu_util": series})
    JobSeries.objects.filter(job=job).delete()
    archive.upsert(archive.rows_for(job, sigs, {}))

    loaded = load_job_signals(job)
    assert loaded is not None
    s = loaded.signals["gpu_util"]
    assert s.per_gpu is not None and s.gpu_timestamps is not None
    np.testing.assert_array_equal(s.gpu_timestamps, ts)  # aligned with the aggregate grid
    np.testing.assert_array_equal(np.isfinite(s.per_gpu).sum(axis=1), [120, 120])
    np.testing.assert_array_equal(np.isnan(s.per_gpu[:, 0]), [True, True])  # nothing closes at T0
    inp = DiagnosisInput(signals=loaded, gpu_count=2)
    finding = idle_gpus.check(inp, Features(inp))
    assert finding is not None
    share = {e.label: e.value for e in finding.evidence}["share of the job's GPU time idle"]
    assert share == 50.0


@pytest.mark.django_db
def test_finalize_in_bounded_queries_archives_the_same_as_one_query_per_signal(
    prom, sims, make_team, monkeypatch
):
    """Split by time (at most 500 raw samples per query: 8 GPUs x 1 sample per 30 s step = 8 per point, so
    62 points per aggregate query, 4 queries for the 2 h job's 241 points) and by GPU batch (3 GPUs: 3
    batches for 8 GPUs, each 166 points per query): the same archive as unsplit reads."""
    client = _client(prom)
    whole = _register(sims["1001"], make_team("llm"), ended=True)
    sent0 = client.requests
    pipeline.finalize_job(whole, client, now=START + timedelta(hours=3))
    unsplit = client.requests - sent0
    first = _snapshot(whole)
    whole.delete()
    monkeypatch.setattr(ingest, "FINALIZE_MAX_SAMPLES", 500)
    monkeypatch.setattr(ingest, "FINALIZE_GPU_BATCH", 3)
    split = _register(sims["1001"], make_team("llm"), ended=True)
    sent0 = client.requests
    split = pipeline.finalize_job(split, client, now=START + timedelta(hours=3))
    assert split.status == Job.Status.FINALIZED and split.ingest_error == ""
    assert client.requests - sent0 > 2 * unsplit
    _assert_same(_snapshot(split), first)
    assert JobSeries.objects.filter(job=split, stat="gpu").values("gpu_key").distinct().count() == 8


def _job_figures(job: Job) -> dict:
    """What a finalize stores on the job besides its archive rows (its evaluation and ingestion state)."""
    job.refresh_from_db()
    return {
        "status": job.status, "data_until": job.data_until, "energy_j": job.energy_j, "mfu": job.mfu,
        "gpu_util_mean": job.gpu_util_mean, "sm_active_mean": job.sm_active_mean,
        "missing_signals": job.missing_signals, "missing_reasons": job.missing_reasons,
        "ingest_error": job.ingest_error, "cost_usd": job.cost_usd, "gpu_hours": job.gpu_hours,
    }  # fmt: skip


class _InFlight:
    """Wraps PrometheusClient.range (the pool's per-thread copies included) to count the range queries in
    flight at once; each waits 20 ms so queries sent together overlap whatever the machine's speed."""

    def __init__(self, monkeypatch) -> None:
        import threading
        import time

        self.now = self.most = self.calls = 0
        lock = threading.Lock()
        original = PrometheusClient.range

        def range_(client, query, start, end, step=None):
            with lock:
                self.now += 1
                self.calls += 1
                self.most = max(self.most, self.now)
            try:
                time.sleep(0.02)
                return original(client, query, start, end, step)
            finally:
                with lock:
                    self.now -= 1

        monkeypatch.setattr(PrometheusClient, "range", range_)


@pytest.mark.django_db
def test_a_concurrent_finalize_stores_exactly_what_the_sequential_one_stored(
    prom, sims, make_team, monkeypatch, settings
):
    """FINALIZE_QUERY_CONCURRENCY 4 against 1 (one query after another), with the reads split small (500
    samples per query, GPU batches of 3) so dozens of range queries are in flight: the same archive rows,
    the same evaluation, and every request counted on the caller's client."""
    import threading

    monkeypatch.setattr(ingest, "FINALIZE_MAX_SAMPLES", 500)
    monkeypatch.setattr(ingest, "FINALIZE_GPU_BATCH", 3)
    client = _client(prom)
    settings.FINALIZE_QUERY_CONCURRENCY = 1
    one_by_one = _register(sims["1001"], make_team("llm"), ended=True)
    flight = _InFlight(monkeypatch)
    pipeline.finalize_job(one_by_one, client, now=START + timedelta(hours=3))
    assert flight.most == 1
    serial_calls = flight.calls
    rows, figures = _snapshot(one_by_one), _job_figures(one_by_one)
    assert figures["status"] == Job.Status.FINALIZED and figures["ingest_error"] == ""
    one_by_one.delete()

    settings.FINALIZE_QUERY_CONCURRENCY = 4
    together = _register(sims["1001"], make_team("llm"), ended=True)
    flight.most = flight.calls = 0
    sent0 = client.requests
    pipeline.finalize_job(together, client, now=START + timedelta(hours=3))
    assert flight.most == 4  # four range queries in flight at once
    assert flight.calls == serial_calls > 20  # the same queries
    assert client.requests - sent0 >= flight.calls  # the copies' requests are counted on the client
    _assert_same(_snapshot(together), rows)
    assert _job_figures(together) == figures
    assert not [t for t in threading.enumerate() if t.name.startswith("finalize")]  # the pool is gone


@pytest.mark.django_db
def test_a_failing_query_fails_the_concurrent_finalize_cleanly(prom, sims, make_team, monkeypatch, settings):
    """One of the finalize's range queries answered with an error while others are in flight: nothing is
    written (the polled archive stays as it was), the job stays unfinalized and says why, the queries
    not yet started are dropped; the next finalize succeeds."""
    import threading

    from jobs.metrics.prometheus import PrometheusQueryError

    settings.FINALIZE_QUERY_CONCURRENCY = 4
    monkeypatch.setattr(ingest, "FINALIZE_MAX_SAMPLES", 500)
    client = _client(prom)
    job = _register(sims["1001"], make_team("llm"), ended=False)
    job = pipeline.poll_job(job, client, now=START + timedelta(hours=1))
    assert job.ingest_error == ""
    job.ended_at = START + timedelta(hours=2)
    job.save()
    kept, status = _snapshot(job), job.status

    original = PrometheusClient.range
    calls = {"n": 0}
    fail = {"on": True}

    def failing(self, query, start, end, step=None):
        calls["n"] += 1
        if fail["on"] and "POWER_USAGE" in query:
            raise PrometheusQueryError("query processing would load too many samples", error_type="execution")
        return original(self, query, start, end, step)

    monkeypatch.setattr(PrometheusClient, "range", failing)
    job = pipeline.finalize_job(job, client, now=START + timedelta(hours=3))
    assert job.status == status and job.finalized_at is None
    assert "could not read Prometheus" in job.ingest_error
    assert "too many samples" in job.ingest_error
    _assert_same(_snapshot(job), kept)
    assert not [t for t in threading.enumerate() if t.name.startswith("finalize")]  # no query still running
    failed = calls["n"]
    fail["on"], calls["n"] = False, 0
    job = pipeline.finalize_job(job, client, now=START + timedelta(hours=3))
    assert job.status == Job.Status.FINALIZED and job.ingest_error == ""
    assert failed < calls["n"]  # the failed one stopped early: its per-GPU reads were never sent


@pytest.mark.django_db
def test_a_finalize_computing_the_stats_here_stores_what_prometheus_stats_stored(
    prom, sims, make_team, monkeypatch, settings
):
    """FINALIZE_STATS_HERE (one per-series read a signal, the cross-GPU stats computed here) against the
    poll's way (Prometheus aggregates each signal in one query): the same archive rows, the same evaluation,
    with fewer raw-sample passes on the server (tests/test_cross_gpu_prometheus.py compares the stats)."""
    settings.FINALIZE_QUERY_CONCURRENCY = 4
    client = _client(prom)
    monkeypatch.setattr(ingest, "FINALIZE_STATS_HERE", False)
    server = _register(sims["1001"], make_team("llm"), ended=True)
    pipeline.finalize_job(server, client, now=START + timedelta(hours=3))
    rows, figures = _snapshot(server), _job_figures(server)
    assert figures["status"] == Job.Status.FINALIZED and figures["ingest_error"] == ""
    server.delete()

    monkeypatch.setattr(ingest, "FINALIZE_STATS_HERE", True)
    here = _register(sims["1001"], make_team("llm"), ended=True)
    pipeline.finalize_job(here, client, now=START + timedelta(hours=3))
    _assert_same(_snapshot(here), rows)
    assert _job_figures(here) == figures
    assert {stat for _, stat, *_ in rows} >= {"mean", "min", "max", "count", "sampled", "gpu"}


@pytest.mark.django_db
@pytest.mark.parametrize("failing", ["per-series", "sampled"])
def test_either_query_of_a_signal_failing_fails_the_finalize_cleanly(
    prom, sims, make_team, monkeypatch, settings, failing
):
    """With the stats computed here a signal is read by two queries (its per-series values and the
    server-side sample count): either one failing leaves the polled archive as it was and the job
    unfinalized, saying why, with no query left running."""
    import threading

    from jobs.metrics.prometheus import PrometheusQueryError

    settings.FINALIZE_QUERY_CONCURRENCY = 4
    monkeypatch.setattr(ingest, "FINALIZE_STATS_HERE", True)
    client = _client(prom)
    job = _register(sims["1001"], make_team("llm"), ended=False)
    job = pipeline.poll_job(job, client, now=START + timedelta(hours=1))
    job.ended_at = START + timedelta(hours=2)
    job.save()
    kept, status = _snapshot(job), job.status
    original = PrometheusClient.range

    def failing_range(self, query, start, end, step=None):
        sampled = "count_over_time" in query
        if "POWER_USAGE" in query and sampled == (failing == "sampled") and not query.startswith("avg by"):
            raise PrometheusQueryError(f"{failing} query refused", error_type="execution")
        return original(self, query, start, end, step)

    monkeypatch.setattr(PrometheusClient, "range", failing_range)
    job = pipeline.finalize_job(job, client, now=START + timedelta(hours=3))
    assert job.status == status and job.finalized_at is None
    assert f"{failing} query refused" in job.ingest_error
    _assert_same(_snapshot(job), kept)
    assert not [t for t in threading.enumerate() if t.name.startswith("finalize")]
