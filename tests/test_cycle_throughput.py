"""The poll cycle's throughput (issue #14): one grouped query per template for all jobs that use it, only
the new window read, the earlier part from the archived derived series; the same numbers as each job's own
query over its whole window, against a real Prometheus (simulated trainers' `train_tokens_total`)."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from jobs.evaluation import load
from jobs.intake.registry import register_job
from jobs.metrics import archive
from jobs.metrics.prometheus import PrometheusClient, read_summed
from jobs.metrics.signals import grid
from jobs.metrics.throughput import groupable, grouped_query, id_batches, runnable_query
from jobs.models import Job
from jobs.pipeline import poll as pipeline
from jobs.pipeline.reads import read_inputs, read_recent_throughput
from jobs.simulate import DEFAULT_START, SimSpec, backfill, registration_body, simulate
from jobs.simulate.writers import openmetrics_lines
from tests.prom_server import PrometheusProcess, prometheus_binary

T0 = DEFAULT_START
MIN = 60.0
START = datetime.fromtimestamp(T0, tz=UTC)
TEMPLATE = "sum(rate(train_tokens_total{$job}[120s]))"  # registration_body's default for the simulator
GAP = (T0 + 20 * MIN, T0 + 30 * MIN)  # 7002's trainer sends nothing in this window


# ------------------------------------------------------------------------------------------------- pure


def test_only_an_outermost_sum_over_one_selector_is_groupable():
    assert groupable(TEMPLATE)
    assert groupable("sum (clamp_min(rate(x{$job}[5m]), 0) * 2)")
    assert not groupable("sum by (rank) (rate(x{$job}[5m]))")  # its own grouping
    assert not groupable("sum(rate(x{$job}[5m])) by (rank)")
    assert not groupable("avg(rate(x{$job}[5m]))")  # not a sum
    assert not groupable("sum(max(rate(x{$job}[5m])))")  # a second aggregation
    assert not groupable("sum(rate(x{$job}[5m])) * 2")  # the outer sum is not the whole expression
    assert not groupable("sum(rate(x{$job}[5m])) + sum(rate(y{$job}[5m]))")
    assert not groupable("sum(rate(x{$job}[5m]) / rate(y{$job}[5m]))")  # two selectors
    assert not groupable("rate(x{$job}[5m])")


def test_the_grouped_query_matches_each_id_exactly():
    query = grouped_query(TEMPLATE, "job_id", ["70.1", "7001"])
    # Prometheus anchors the regex; the dot is escaped so "70.1" cannot match "7001" (nor "70x1").
    assert query == 'sum by (job_id) (rate(train_tokens_total{job_id=~"70\\\\.1|7001"}[120s]))'


def test_id_batches_bound_the_regex_length():
    ids = [f"{i:05d}" for i in range(10)]  # 5 characters + 1 separator each
    assert id_batches(ids, max_chars=18) == [ids[0:3], ids[3:6], ids[6:9], ids[9:10]]
    assert id_batches(["a.b"], max_chars=1) == [["a.b"]]  # one id longer than the bound is its own batch


# ------------------------------------------------------------------------------------ real Prometheus


@pytest.fixture
def local_cache(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    from django.core.cache import cache

    cache.clear()
    return cache


@pytest.fixture(scope="module")
def sims():
    d = 60 * MIN
    return {
        "7001": simulate(SimSpec(gpus=2, job_id="7001", hosts=("node-1",), duration_s=d, seed=1)),
        "7002": simulate(SimSpec(gpus=2, job_id="7002", hosts=("node-2",), duration_s=d, seed=2)),
        # Its trainer starts 10 min after the job's registered start; "70.1" would match 7001 unescaped.
        "70.1": simulate(SimSpec(gpus=2, job_id="70.1", hosts=("node-3",), duration_s=d - 10 * MIN,
                                 start=T0 + 10 * MIN, seed=3)),
        # No job label and no trainer: registered with explicit GPUs and the template, it has no series.
        "7004": simulate(SimSpec(gpus=2, job_id=None, job_labels="none", hosts=("node-4",), duration_s=d,
                                 seed=4)),
    }  # fmt: skip


def _keep(line: str) -> bool:
    if not line.startswith("train_tokens_total{") or 'job_id="7002"' not in line:
        return True
    return not GAP[0] < float(line.split()[-1]) < GAP[1]


@pytest.fixture(scope="module")
def prom(sims, tmp_path_factory):
    if prometheus_binary() is None or shutil.which("promtool") is None:
        pytest.skip("prometheus and promtool binaries are not installed (Debian/Ubuntu package: prometheus)")
    work = tmp_path_factory.mktemp("cycle-throughput")
    with open(work / "data.om", "w", encoding="utf-8") as fh:
        fh.writelines(line for line in openmetrics_lines(list(sims.values())) if _keep(line))
    backfill(work / "data.om", work / "tsdb")
    with PrometheusProcess(work / "tsdb") as server:
        yield server


class Recording(PrometheusClient):
    """A real client that keeps the text of every range and instant query it sends."""

    def __init__(self, url: str) -> None:
        super().__init__(url, timeout_s=20, retries=0)
        self.sent: list[str] = []

    def range(self, query, start, end, step=None):  # type: ignore[no-untyped-def]
        self.sent.append(query)
        return super().range(query, start, end, step)

    def instant(self, query, at=None):  # type: ignore[no-untyped-def]
        self.sent.append(query)
        return super().instant(query, at)


def _register(sims, team) -> dict[str, Job]:
    out = {}
    for key, sim in sims.items():
        body = registration_body(sim, team=team, ended=False)
        body["started_at"] = START.isoformat()
        body["throughput_query"] = TEMPLATE
        if sim.spec.job_id is not None:
            body["gpus"], body["selector"] = [], {"hpc_job": sim.spec.job_id}
        else:
            body["external_id"] = key
        out[key] = register_job(body).job
    return out


@pytest.mark.prometheus
@pytest.mark.django_db
def test_one_grouped_query_gives_each_job_its_own_querys_values(prom, sims, make_team, settings):
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed")
    jobs = _register(sims, make_team("llm"))
    ts = grid(T0 + 5 * MIN, T0 + 50 * MIN, 30.0)
    client = Recording(prom.url)
    got = read_recent_throughput(client, list(jobs.values()), {j.pk: ts for j in jobs.values()})
    assert len(client.sent) == 1 and client.sent[0].startswith("sum by (job_id)")
    for key, job in jobs.items():
        query = runnable_query(
            job.throughput_query,
            job.external_id,
            job_label=settings.THROUGHPUT_JOB_LABEL,
            max_lookback_s=settings.THROUGHPUT_MAX_LOOKBACK_S,
        )
        own = read_summed(client, query.query or "", ts, 30.0, timeout_s=10.0)
        if key == "7004":
            assert own is None and got[job.pk].values is None  # no series: unknown, not 0
            continue
        assert own is not None and got[job.pk].values is not None
        np.testing.assert_allclose(got[job.pk].values, own, rtol=1e-12, equal_nan=True, err_msg=key)
    # Not vacuous: 7002's gap and 70.1's late start are NaN in both, the others have values there.
    gap = (ts > GAP[0] + 120) & (ts < GAP[1])
    assert np.isnan(got[jobs["7002"].pk].values[gap]).all()
    assert np.isfinite(got[jobs["7001"].pk].values[gap]).all()
    assert np.isnan(got[jobs["70.1"].pk].values[ts < T0 + 10 * MIN]).all()


@pytest.mark.prometheus
@pytest.mark.django_db
def test_a_cycle_reads_the_new_window_once_per_template_and_keeps_the_whole_window_values(
    prom, sims, make_team, settings, local_cache
):
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed")
    settings.PROMETHEUS_SCRAPE_INTERVAL_S = 30.0
    settings.PROMETHEUS_INGESTION_LAG_S = 60.0
    jobs = _register(sims, make_team("llm"))
    client = Recording(prom.url)
    pipeline.poll_cycle(client, now=START + timedelta(minutes=40))  # first poll: each job's whole window
    client.sent.clear()
    report = pipeline.poll_cycle(client, now=START + timedelta(minutes=41))
    assert sorted(report["polled"]) == sorted(j.external_id for j in jobs.values())
    tokens = [q for q in client.sent if "train_tokens_total" in q]
    # One query for the 4 jobs sharing the template, over the new window only (no per-job query).
    assert len(tokens) == 1 and tokens[0].startswith("sum by (job_id)"), tokens
    # MIG instances: one query for the 3 hpc_job jobs and one for the explicit-GPU job (not 4).
    assert len([q for q in client.sent if "GPU_I_ID" in q]) == 2
    for key, job in jobs.items():
        job.refresh_from_db()
        archived = archive.load_job_signals(job, per_gpu=False)
        assert archived is not None
        # Today's per-job path: the job's query over the whole archived grid.
        readings = read_inputs(job, archived, client, START + timedelta(minutes=41))
        whole, source = load.throughput_of(job, archived.timestamps, readings.throughput)
        if key == "7004":
            assert whole is None and "returned no series" in source
            assert job.mfu is None and "returned no series" in str(job.evaluation)
            continue
        assert whole is not None
        stored = archived.get("tokens_per_second")
        assert stored is not None and stored.mean is not None
        # The archive holds float32 values: equal to ~6e-8 relative; gaps are NaN in both.
        np.testing.assert_allclose(stored.mean, whole, rtol=1e-6, equal_nan=True, err_msg=key)
        # The evaluation's mean tokens/s is the mean over the points with a value (kpis: tokens / covered).
        assert job.evaluated is not None
        assert job.evaluated.tokens_per_second == pytest.approx(float(np.nanmean(whole)), rel=1e-6)
    ts = archive.load_job_signals(jobs["7002"], per_gpu=False).timestamps  # type: ignore[union-attr]
    mean = archive.load_job_signals(jobs["7002"], per_gpu=False).get("tokens_per_second").mean  # type: ignore[union-attr]
    assert np.isnan(mean[(ts > GAP[0] + 120) & (ts < GAP[1])]).all()  # the gap stays a gap
