"""The cluster-wide poll cycle against a real Prometheus (simulated dcgm-exporter data backfilled with
promtool): per-job results equal the per-job queries', requests per cycle do not grow with the number of
jobs, one bad job never stops a cycle, and the cycle's figures reach the cache."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from jobs.intake.registry import register_job
from jobs.metrics import cluster
from jobs.metrics.prometheus import PrometheusClient, Selector
from jobs.metrics.signal_queries import fetch_job_signals
from jobs.metrics.signals import SIGNALS
from jobs.models import Job, JobSeries
from jobs.pipeline import poll as pipeline
from jobs.simulate import DEFAULT_START, SimSpec, backfill, registration_body, simulate, write_openmetrics
from tests.prom_server import PROMETHEUS_MODULE, PrometheusProcess

pytestmark = PROMETHEUS_MODULE

T0 = DEFAULT_START
MIN = 60.0
STEP, GPU_STEP = 30.0, 300.0
START = datetime.fromtimestamp(T0, tz=UTC)


def _specs() -> dict[str, SimSpec]:
    """Label spellings and metric names as real clusters mix them: hpc_job jobs with the released names and
    `Hostname`, Kubernetes pods, explicit GPU lists on nodes without a job label, one with 2026's
    `hostname` and DCGM 4.6's *_RATIO names, one default exporter (no SM_ACTIVE), one with XID errors."""
    d = 90 * MIN
    return {
        "a1": SimSpec(scenario="healthy", gpus=8, job_id="3001", hosts=("node-a1",), duration_s=d, seed=1),
        "a2": SimSpec(scenario="straggler", gpus=8, job_id="3002", hosts=("node-a2",), duration_s=d, seed=2,
                      missing_fraction=0.02),
        "a3": SimSpec(scenario="gpu_errors", gpus=4, job_id="3003", hosts=("node-a3",), duration_s=d, seed=3,
                      disabled=frozenset({"sm_active"})),
        "k": SimSpec(scenario="healthy", gpus=8, job_id="train-7", job_labels="kubernetes",
                     hosts=("node-k",), duration_s=d, seed=4),
        "g1": SimSpec(scenario="idle_gpus", gpus=8, job_id=None, job_labels="none", hosts=("node-g1",),
                      host_label="hostname", metric_names="dcgm46", duration_s=d, seed=5),
        "g2": SimSpec(scenario="throttling", gpus=4, job_id=None, job_labels="none", hosts=("node-g2",),
                      duration_s=d, seed=6),
    }  # fmt: skip


@pytest.fixture(scope="module")
def sims():
    return {k: simulate(s) for k, s in _specs().items()}


@pytest.fixture(scope="module")
def prom(sims, tmp_path_factory):
    work = tmp_path_factory.mktemp("cluster-prom")
    write_openmetrics(list(sims.values()), work / "data.om")
    backfill(work / "data.om", work / "tsdb")
    with PrometheusProcess(work / "tsdb") as server:
        yield server


def _client(prom) -> PrometheusClient:
    return PrometheusClient(prom.url, timeout_s=20, retries=0)


def _target(key: int, sim, start: float, end: float, *, labels=None) -> cluster.Target:
    gpu_start = np.floor(start / (GPU_STEP * 240)) * GPU_STEP * 240
    if labels is not None:
        return cluster.Target(key, start, end, float(gpu_start), labels=labels)
    pairs = tuple(sorted((g.hostname, str(g.index)) for g in sim.gpus))
    return cluster.Target(key, start, end, float(gpu_start), gpus=pairs)


def _selector(t: cluster.Target) -> Selector:
    if t.labels is not None:
        return Selector.from_labels(t.labels)
    return Selector.from_gpus([{"hostname": h, "gpu": g} for h, g in t.gpus])


def _targets(sims, end: float) -> list[cluster.Target]:
    """Windows as polls give them: most from T0, one job that started later (its grid starts at T0 + 10
    min, a point of the others' grid), one ended before the cycle's end."""
    return [
        _target(1, sims["a1"], T0, end, labels={"hpc_job": "3001"}),
        _target(2, sims["a2"], T0 + 10 * MIN, end, labels={"hpc_job": "3002"}),
        _target(3, sims["a3"], T0, end - 10 * MIN, labels={"hpc_job": "3003"}),
        _target(4, sims["k"], T0, end, labels={"namespace": "llm", "pod": "train-7-worker-0"}),
        _target(5, sims["g1"], T0, end),
        _target(6, sims["g2"], T0 + 5 * MIN, end),
    ]


def _assert_equal_signals(cycle_sigs, job_sigs, per_gpu) -> None:
    assert set(cycle_sigs.signals) == set(job_sigs.signals)
    assert cycle_sigs.missing == job_sigs.missing
    np.testing.assert_array_equal(cycle_sigs.timestamps, job_sigs.timestamps)
    for key, mine in cycle_sigs.signals.items():
        theirs = job_sigs.signals[key]
        if not per_gpu:
            assert set(mine.stats) == set(theirs.stats), key
            for stat, values in theirs.stats.items():
                # Prometheus sums in no fixed order (and here numpy sums the explicit-GPU stats): last bits.
                np.testing.assert_allclose(mine.stats[stat], values, rtol=1e-9, atol=1e-12,
                                           equal_nan=True, err_msg=f"{key} {stat}")  # fmt: skip
        else:
            assert mine.gpus == theirs.gpus, key
            np.testing.assert_array_equal(mine.gpu_timestamps, theirs.gpu_timestamps)
            np.testing.assert_allclose(mine.per_gpu, theirs.per_gpu, rtol=1e-9, equal_nan=True, err_msg=key)


def test_cluster_wide_results_per_job_equal_the_per_job_queries(prom, sims):
    end = T0 + 70 * MIN
    targets = _targets(sims, end)
    with _client(prom) as client:
        result = cluster.read_cycle(client, targets, step=STEP, per_gpu_step=GPU_STEP, scrape_interval_s=30.0)
        assert result.fallback == [] and result.errors == {}
        for t in targets:
            sel = _selector(t)
            agg = fetch_job_signals(client, sel, t.start, t.end, STEP, scrape_interval_s=30.0)
            wide = fetch_job_signals(
                client, sel, t.gpu_start, t.end, GPU_STEP, keys=list(agg.signals),
                per_gpu_step=GPU_STEP, aggregates=False, scrape_interval_s=30.0,
            )  # fmt: skip
            got = result.signals[t.key]
            _assert_equal_signals(got, agg, per_gpu=False)
            wide.missing = got.missing  # the per-GPU read was asked for the present keys only
            wide.timestamps = got.timestamps
            _assert_equal_signals(got, wide, per_gpu=True)
    # What the data holds, so the comparison is not vacuous: the default exporter lacks SM_ACTIVE, the
    # DCGM 4.6 job is read through its *_RATIO names, the XID job's codes arrive, 4- and 8-GPU counts.
    assert "sm_active" in result.signals[3].missing and "sm_active" in result.signals[1].signals
    assert np.nanmax(result.signals[5].signals["gpu_util"].stats["count"]) == 8
    assert np.nanmax(result.signals[6].signals["gpu_util"].stats["count"]) == 4
    assert np.nanmax(result.signals[3].signals["xid_errors"].stats["nonzero"]) >= 1
    assert result.signals[2].timestamps[0] == T0 + 10 * MIN


def test_requests_per_cycle_grow_with_signals_not_jobs(prom, sims):
    end = T0 + 70 * MIN
    targets = _targets(sims, end)
    with _client(prom) as client:
        one = cluster.read_cycle(client, targets[:1], step=STEP, per_gpu_step=GPU_STEP)
        sent_one = client.requests
        three = cluster.read_cycle(client, targets[:3], step=STEP, per_gpu_step=GPU_STEP)
        sent_three = client.requests - sent_one
        everything = cluster.read_cycle(client, targets, step=STEP, per_gpu_step=None)
    assert len(three.signals) == 3 and len(one.signals) == 1
    # One hpc_job job or three: 2 discovery requests + per present signal 1 aggregate + 1 per-GPU query.
    present = len(three.signals[1].signals)
    assert sent_one == sent_three == 2 + 2 * present
    # A job whose window starts an hour before the others' (after an outage) is read in a round of its
    # own, not by widening everyone's window: 2 + 2 rounds x the signals present, aggregates only.
    late = _target(7, sims["a1"], T0 + 60 * MIN, end, labels={"hpc_job": "3001"})
    with _client(prom) as client:
        rounds = cluster.read_cycle(client, [targets[0], late], step=STEP, per_gpu_step=None)
    assert rounds.queries == 2 + 2 * present
    assert rounds.signals[7].timestamps[0] == T0 + 60 * MIN and rounds.signals[1].timestamps[0] == T0
    # Three groups (hpc_job, namespace+pod, explicit GPUs), aggregates only: 2 + 3 x the metrics present.
    assert everything.queries == 2 + 3 * len({k for k, s in SIGNALS.items() if any(
        m in _present_names(sims) for m in s.metrics)})  # fmt: skip


def test_new_jobs_with_different_starts_are_read_in_one_catch_up_round(prom, sims):
    """#26 item 3: N first polls (or catch-ups) whose windows start at N different times cost one round of
    queries together, beside the up-to-date jobs' round: requests do not grow with N (one round per job
    before, 80 requests for 3 new jobs), and each job's series are those it gets read alone."""
    end = T0 + 80 * MIN
    current = _target(1, sims["a1"], T0 + 75 * MIN, end, labels={"hpc_job": "3001"})
    ids = ("3001", "3002", "3003")

    def behind(n: int) -> list[cluster.Target]:  # n jobs, starts 5 minutes apart over the first hour
        return [
            _target(100 + i, sims["a1"], T0 + 5 * MIN * i, end, labels={"hpc_job": ids[i % 3]})
            for i in range(n)
        ]

    with _client(prom) as client:
        few = cluster.read_cycle(client, [current, *behind(3)], step=STEP, per_gpu_step=None)
        many = cluster.read_cycle(client, [current, *behind(11)], step=STEP, per_gpu_step=None)
        alone = cluster.read_cycle(client, behind(11)[7:8], step=STEP, per_gpu_step=None)
    present = len(few.signals[1].signals)
    assert few.errors == many.errors == {}
    assert few.queries == many.queries == 2 + 2 * present  # discovery + 2 rounds, for 3 new jobs or 11
    assert len(many.signals) == 12
    _assert_equal_signals(many.signals[107], alone.signals[107], per_gpu=False)
    assert many.signals[107].timestamps[0] == T0 + 35 * MIN
    # Starts further apart than one catch-up bucket are cut into buckets: still not one round per job.
    with _client(prom) as client:
        bucketed = cluster.read_cycle(
            client, [current, *behind(11)], step=STEP, per_gpu_step=None, catch_up_s=20 * MIN
        )
    assert bucketed.queries == 2 + (1 + 3) * present  # starts over 50 min in 20-min buckets: 3 rounds


def _present_names(sims) -> set[str]:
    return {r.metric_name(k) for r in sims.values() for k in r.fields if k in SIGNALS}


def test_selectors_that_cannot_be_grouped_fall_back_to_per_job_queries(prom, sims):
    end = T0 + 30 * MIN
    regex = cluster.Target(9, T0, end, T0, labels={"hpc_job": {"regex": "300[12]"}})
    unknown = cluster.Target(10, T0, end, T0, labels={"slurm_job": "1"})
    with _client(prom) as client:
        result = cluster.read_cycle(client, [regex, unknown, *_targets(sims, end)[:1]], step=STEP,
                                    per_gpu_step=None)  # fmt: skip
    assert sorted(result.fallback) == [9, 10]
    assert set(result.signals) == {1}


def test_settled_until_stops_at_the_first_point_a_gpu_is_missing():
    from jobs.metrics.signals import COUNT, JobSignals, SignalSeries, grid

    ts = grid(0.0, 300.0, 30.0)  # 11 points
    # GPU counts per point: nothing before the job starts (points 0-1), 4 GPUs, a late GPU at point 7.
    util = np.array([np.nan, np.nan, 4, 4, 4, 4, 4, 3, 4, 4, np.nan])
    power = np.array([np.nan, np.nan, 4, 4, 4, 4, 4, 4, 4, 4, 4])
    sigs = JobSignals(0.0, 300.0, 30.0, ts, {
        "gpu_util": SignalSeries("gpu_util", "ratio", ts, {COUNT: util}),
        "power_usage": SignalSeries("power_usage", "W", ts, {COUNT: power}),
    })  # fmt: skip
    assert cluster.settled_until(sigs) == 180.0  # point 6 (t = 180) is the last with all 4 GPUs so far
    util[7] = 4
    assert cluster.settled_until(sigs) == 270.0  # point 10 has no GPU_UTIL yet
    # A rate has no value at the job's first point (two samples needed): its own first point counts.
    power[2] = np.nan
    assert cluster.settled_until(sigs) == 270.0
    util[2] = 3
    assert cluster.settled_until(sigs) == 30.0  # nothing settled: the point before the job's first one
    assert cluster.settled_until(JobSignals(0.0, 300.0, 30.0, ts)) is None


# ---------------------------------------------------------------------------------- the Django cycle


@pytest.fixture
def local_cache(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    from django.core.cache import cache

    cache.clear()
    return cache


def _register(sim, team, *, labels=None, external_id=None) -> Job:
    body = registration_body(sim, team=team, ended=False)
    if external_id is not None:
        body["external_id"] = external_id
    if labels is not None:
        body["gpus"], body["selector"] = [], labels
    return register_job(body).job


@pytest.mark.django_db
def test_one_bad_job_never_stops_the_cycle_and_the_figures_reach_the_cache(prom, sims, make_team,
                                                                          local_cache, settings):  # fmt: skip
    settings.PROMETHEUS_SCRAPE_INTERVAL_S = 30.0
    settings.PROMETHEUS_INGESTION_LAG_S = 60.0
    team = make_team("llm")
    good = _register(sims["a1"], team, labels={"hpc_job": "3001"})
    explicit = _register(sims["g2"], team, external_id="g2")
    bad = _register(sims["a2"], team, labels={"hpc_job": "3002"})
    # Stored before today's validation: 9 labels (the builder refuses > 8) and a non-string value.
    Job.objects.filter(pk=bad.pk).update(selector={f"l{i}": "x" for i in range(9)})
    worse = _register(sims["a3"], team, labels={"hpc_job": "3003"})
    Job.objects.filter(pk=worse.pk).update(selector={"hpc_job": ["not", "a", "string"]})
    now = START + timedelta(minutes=40)
    report = pipeline.poll_cycle(_client(prom), now=now)
    assert sorted(report["stale_jobs"]) == sorted([bad.external_id, worse.external_id])
    assert sorted(report["polled"]) == sorted([good.external_id, explicit.external_id])
    for job in (bad, worse):
        job.refresh_from_db()
        assert "could not read Prometheus" in job.ingest_error or job.ingest_error
    good.refresh_from_db()
    assert good.ingest_error == "" and good.gpu_util_mean is not None
    assert good.data_until == now - timedelta(seconds=60)  # now minus the ingestion lag
    assert JobSeries.objects.filter(job=good, stat="gpu").values("gpu_key").distinct().count() == 8
    stats = local_cache.get(pipeline.POLL_CYCLE_CACHE_KEY)
    assert set(stats) == {"finished_at", "duration_s", "requests", "jobs", "stale"}
    assert stats["jobs"] == 4 and stats["stale"] == 2 and stats["requests"] > 0
