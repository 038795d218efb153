"""#13 item 6, poll side, against a real Prometheus: when Prometheus holds only part of a window (one
node's samples late: remote-write lag, a replica behind), a poll does not advance `data_until` past the
missing part, so the next poll, after the rest has arrived, archives it: 0 samples lost."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from jobs.intake.registry import register_job
from jobs.metrics import ingest
from jobs.metrics.archive import load_job_signals
from jobs.metrics.prometheus import PrometheusClient
from jobs.metrics.signals import SIGNALS
from jobs.models import Job
from jobs.pipeline import poll as pipeline
from jobs.simulate import DEFAULT_START, SimSpec, backfill, openmetrics_lines, registration_body, simulate
from tests.prom_server import PROMETHEUS_MODULE, PrometheusProcess

pytestmark = PROMETHEUS_MODULE

T0 = DEFAULT_START  # a multiple of 7,200 s: the aggregate archive chunk boundary is at T0 + 2 h
MIN = 60.0
START = datetime.fromtimestamp(T0, tz=UTC)
# node-p2's samples arrive late for this span, across the 2 h chunk boundary; shorter than the 5 lags
# (5 min) after which incomplete data is taken as lost.
LATE_FROM, LATE_TO = T0 + 117 * MIN, T0 + 121 * MIN
_TS = re.compile(r" (\d+(?:\.\d+)?)\n$")


@pytest.fixture
def local_cache(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    from django.core.cache import cache

    cache.clear()
    return cache


def _split(sim) -> tuple[list[str], list[str]]:
    """(what Prometheus holds at first, what arrives later): node-p2's samples in (LATE_FROM, LATE_TO]."""
    first, late = [], []
    for line in openmetrics_lines([sim]):
        m = _TS.search(line)
        is_late = m is not None and 'Hostname="node-p2"' in line and LATE_FROM < float(m.group(1)) <= LATE_TO
        (late if is_late else first).append(line)
    return first, ["# EOF\n" if line.startswith("# EOF") else line for line in _typed(late, first)]


def _typed(late: list[str], all_lines: list[str]) -> list[str]:
    """The late samples with their families' TYPE/HELP lines, as a file promtool accepts."""
    out: list[str] = []
    meta: dict[str, list[str]] = {}
    for line in all_lines:
        if line.startswith(("# HELP ", "# TYPE ")):
            meta.setdefault(line.split()[2], []).append(line)
    current = ""
    for line in late:
        name = line.split("{", 1)[0]
        if name != current:
            out += meta.get(name, [])
            current = name
        out.append(line)
    return [*out, "# EOF\n"]


@pytest.mark.django_db
def test_a_poll_over_partial_data_loses_no_sample_once_the_rest_arrives(make_team, local_cache, settings,
                                                                        tmp_path):  # fmt: skip
    settings.PROMETHEUS_SCRAPE_INTERVAL_S = 30.0
    settings.PROMETHEUS_INGESTION_LAG_S = 60.0
    sim = simulate(SimSpec(scenario="healthy", gpus=8, gpus_per_host=4, hosts=("node-p1", "node-p2"),
                           job_id="4001", duration_s=3 * 3600.0, seed=7))  # fmt: skip
    first, late = _split(sim)
    assert len(late) > 100  # 4 min x 4 GPUs x every field: the test has something to lose
    (tmp_path / "first.om").write_text("".join(first))
    (tmp_path / "late.om").write_text("".join(late))
    tsdb = tmp_path / "tsdb"
    backfill(tmp_path / "first.om", tsdb)
    team = make_team("llm")
    job = register_job(registration_body(sim, team=team, ended=False)).job

    with PrometheusProcess(tsdb) as prom:
        pipeline.poll_cycle(
            PrometheusClient(prom.url, timeout_s=20, retries=0), now=START + timedelta(minutes=122)
        )
    job.refresh_from_db()
    assert job.ingest_error == ""
    # The last point at which both nodes have every signal is T0 + 117 min (node-p2's late span starts
    # after it): data_until stops there, not at now - lag = 121 min, past the hole and the chunk boundary.
    assert job.data_until == START + timedelta(minutes=117)
    partial = load_job_signals(job, per_gpu=False)
    assert partial is not None
    count = partial.signals["gpu_util"].stats["count"]
    at = partial.timestamps
    assert np.nanmax(count[(at > LATE_FROM) & (at <= LATE_TO)]) == 4  # only node-p1 was there

    backfill(tmp_path / "late.om", tsdb)  # the rest arrives (overlapping blocks: Prometheus merges them)
    reference = register_job(registration_body(sim, team=team, ended=False, external_id="4001-ref")).job
    now = START + timedelta(minutes=140)
    # Each job's per-GPU rows are read once per 5 minutes, in the minute its id picks (ingest.per_gpu_due);
    # the reference's first poll reads them whenever it runs: compare in one of the job's minutes.
    while not ingest.per_gpu_due(job, now):
        now += timedelta(minutes=1)
    with PrometheusProcess(tsdb) as prom:
        pipeline.poll_cycle(PrometheusClient(prom.url, timeout_s=20, retries=0), now=now)
    job.refresh_from_db()
    reference.refresh_from_db()
    assert job.data_until == reference.data_until == now - timedelta(seconds=60)
    got, want = load_job_signals(job), load_job_signals(reference)
    assert got is not None and want is not None
    np.testing.assert_array_equal(got.timestamps, want.timestamps)
    assert set(got.signals) == set(want.signals)
    lost = 0
    for key, series in want.signals.items():
        if key not in SIGNALS:  # derived series (throughput, MFU) are the evaluation's, not samples
            continue
        mine = got.signals[key]
        for stat, values in series.stats.items():
            if stat not in ("mean", "min", "max", "count", "sampled"):
                continue
            lost += int(np.sum(np.isfinite(values) & ~np.isfinite(mine.stats[stat])))
            np.testing.assert_allclose(mine.stats[stat], values, rtol=1e-6, equal_nan=True,
                                       err_msg=f"{key} {stat}")  # fmt: skip
        if series.per_gpu is not None:
            assert mine.per_gpu is not None and mine.gpus == series.gpus
            lost += int(np.sum(np.isfinite(series.per_gpu) & ~np.isfinite(mine.per_gpu)))
            np.testing.assert_allclose(mine.per_gpu, series.per_gpu, rtol=1e-6, equal_nan=True, err_msg=key)
    assert lost == 0
    count = got.signals["gpu_util"].stats["count"]
    assert np.nanmin(count[(got.timestamps > LATE_FROM) & (got.timestamps <= LATE_TO)]) == 8
    assert Job.objects.get(pk=job.pk).ingest_error == ""
