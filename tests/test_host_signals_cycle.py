"""Issue 25: the cluster-wide poll cycle reads node_exporter's host signals for the jobs that have hosts, in
bulk (one presence request and one query per present host signal for the whole cycle, joined by host),
and a cycle-polled job gets the host rows a per-job poll gets. Against a real Prometheus: simulated
dcgm-exporter and node_exporter series backfilled with promtool."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jobs.intake.registry import register_job
from jobs.metrics import archive, cluster
from jobs.metrics import host_signals as H
from jobs.metrics.prometheus import PrometheusClient, Selector
from jobs.metrics.signal_queries import fetch_job_signals
from jobs.models import Job
from jobs.pipeline import poll as pipeline
from jobs.simulate import (
    DEFAULT_START,
    SimResult,
    SimSpec,
    backfill,
    openmetrics_lines,
    registration_body,
    simulate,
)
from jobs.simulate import node_exporter as N
from tests.prom_server import PROMETHEUS_MODULE, PrometheusProcess

pytestmark = PROMETHEUS_MODULE

T0 = DEFAULT_START
MIN = 60.0
STEP, GPU_STEP = 30.0, 300.0
DURATION = 40 * MIN
INPUT_HOSTS = ("gpu-node-001", "gpu-node-002")  # an io-bound input pipeline on two nodes
CPU_HOST = ("gpu-node-003",)  # a CPU-bound one, its GPUs listed explicitly
DARK_HOST = ("gpu-node-009",)  # no node_exporter on this node


@pytest.fixture(scope="module")
def sims() -> dict[str, SimResult]:
    common: dict[str, Any] = {"scenario": "data_pipeline_stall", "duration_s": DURATION, "step_s": 15.0}
    return {
        "input": simulate(SimSpec(gpus=16, hosts=INPUT_HOSTS, job_id="4001", seed=1, **common)),
        "cpu": simulate(SimSpec(gpus=8, hosts=CPU_HOST, job_id=None, job_labels="none", seed=2, **common)),
        "dark": simulate(SimSpec(gpus=8, hosts=DARK_HOST, job_id="4003", seed=3, **common)),
    }


@pytest.fixture(scope="module")
def prom(sims: dict[str, SimResult], tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusProcess]:
    work: Path = tmp_path_factory.mktemp("host-cycle-prom")
    ts = T0 + 15.0 * np.arange(int(DURATION / 15.0) + 1)
    body = "".join(openmetrics_lines(list(sims.values()))).removesuffix("# EOF\n")
    for hosts, behaviour, seed in ((INPUT_HOSTS, "io_bound_input", 4), (CPU_HOST, "cpu_bound_input", 5)):
        nodes = N.simulate_hosts(hosts, ts, behaviour, n_cpus=4, seed=seed)
        body += "".join(N.openmetrics_lines(nodes)).removesuffix("# EOF\n")
    (work / "data.om").write_text(body + "# EOF\n")
    backfill(work / "data.om", work / "tsdb")
    with PrometheusProcess(work / "tsdb") as server:
        yield server


def _targets(sims: dict[str, SimResult], end: float, per_gpu: bool) -> list[cluster.Target]:
    cpu = tuple(sorted((g.hostname, str(g.index)) for g in sims["cpu"].gpus))
    return [
        cluster.Target(1, T0, end, T0, labels={"hpc_job": "4001"}, per_gpu=per_gpu),
        cluster.Target(2, T0 + 5 * MIN, end, T0, gpus=cpu, per_gpu=per_gpu),
        cluster.Target(3, T0, end, T0, labels={"hpc_job": "4003"}, per_gpu=per_gpu),
    ]


def _per_job(client: PrometheusClient, t: cluster.Target) -> Any:
    """What a per-job poll reads for the target: its GPU signals with per-GPU rows, then its hosts'."""
    if t.labels is not None:
        selector = Selector.from_labels(t.labels)
    else:
        selector = Selector.from_gpus([{"hostname": h, "gpu": g} for h, g in t.gpus])
    sigs = fetch_job_signals(client, selector, t.start, t.end, STEP, per_gpu_step=GPU_STEP,
                             scrape_interval_s=15.0)  # fmt: skip
    return H.attach_host_signals(client, sigs)


@pytest.mark.parametrize("per_gpu", [False, True], ids=["between-per-gpu-reads", "with-per-gpu-rows"])
def test_the_cycle_reads_every_jobs_host_signals_in_bulk_as_a_per_job_poll_does(
    prom: PrometheusProcess, sims: dict[str, SimResult], per_gpu: bool
) -> None:
    end = T0 + 30 * MIN
    targets = _targets(sims, end, per_gpu)
    step_gpu = GPU_STEP if per_gpu else None
    with PrometheusClient(prom.url, timeout_s=20, retries=0) as client:
        plain = cluster.read_cycle(client, targets, step=STEP, per_gpu_step=step_gpu, scrape_interval_s=15.0)
        joined = cluster.read_cycle(client, targets, step=STEP, per_gpu_step=step_gpu, scrape_interval_s=15.0,
                                    host_join=H.HostJoin())  # fmt: skip
        alone = {t.key: _per_job(client, t) for t in targets}
    # 1 presence request + 1 query per host signal for the whole cycle, plus (between per-GPU reads) 1
    # host look-up for the hpc_job group: the explicit GPUs name their hosts, the rows name the others'.
    assert joined.queries - plain.queries == 1 + len(H.HOST_SIGNALS) + (0 if per_gpu else 1)
    for t in targets:
        got, want = joined.signals[t.key], alone[t.key]
        keys = set(H.HOST_SIGNALS)
        assert {k for k in got.signals if k in keys} == {k for k in want.signals if k in keys}, t.key
        assert {k: v for k, v in got.missing.items() if k in keys} == {
            k: v for k, v in want.missing.items() if k in keys
        }, t.key
        for key in keys & set(want.signals):
            for stat, values in want.signals[key].stats.items():
                # Prometheus averages the hosts in the per-job query, numpy in the cycle: last bits only.
                np.testing.assert_allclose(got.signals[key].stats[stat], values, rtol=1e-9, equal_nan=True,
                                           err_msg=f"{t.key} {key} {stat}")  # fmt: skip
    # Not vacuous: both input nodes joined to job 1 at io-bound levels, the CPU-bound node to job 2, and
    # the node without node_exporter missing with its reason.
    busy = joined.signals[1].signals["host_cpu_iowait"]
    assert busy.count is not None and np.nanmax(busy.count) == 2.0
    assert np.nanmean(busy.stats["mean"]) == pytest.approx(0.25, abs=0.02)
    assert np.nanmean(joined.signals[2].signals["host_cpu_busy"].stats["mean"]) == pytest.approx(
        0.92, abs=0.03
    )
    assert joined.signals[3].missing["host_cpu_busy"].startswith("not collected")


@pytest.mark.django_db
def test_a_cycle_polled_job_archives_the_host_rows_a_per_job_poll_archives(
    prom: PrometheusProcess, sims: dict[str, SimResult], make_team: Any, settings: Any
) -> None:
    settings.NODE_EXPORTER_HOST_LABEL = "instance"
    settings.PROMETHEUS_SCRAPE_INTERVAL_S = 15.0
    settings.PROMETHEUS_INGESTION_LAG_S = 30.0
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    body = registration_body(sims["input"], team=make_team("hosts"), ended=False)
    body["gpus"], body["selector"] = [], {"hpc_job": "4001"}
    job = register_job(body).job
    now = datetime.fromtimestamp(T0, tz=UTC) + timedelta(minutes=30)

    def host_rows() -> dict[tuple[str, str], np.ndarray]:
        stored = archive.load_job_signals(Job.objects.get(pk=job.pk), per_gpu=False)
        assert stored is not None
        return {(k, stat): v for k, s in stored.signals.items() if k in H.HOST_SIGNALS
                for stat, v in s.stats.items()}  # fmt: skip

    with PrometheusClient(prom.url, timeout_s=20, retries=0) as client:
        pipeline.poll_job(job, client, now=now)
        per_job = host_rows()
        job.series.all().delete()
        Job.objects.filter(pk=job.pk).update(data_until=None, last_polled_at=None)
        report = pipeline.poll_cycle(client, now=now, shard_size=0)
    assert report["polled"] == [job.external_id] and report["per_job"] == 0  # read by the cycle itself
    cycled = host_rows()
    assert set(per_job) == set(cycled) and len({k for k, _ in cycled}) == len(H.HOST_SIGNALS)
    for key, values in per_job.items():
        np.testing.assert_allclose(cycled[key], values, rtol=1e-9, equal_nan=True, err_msg=str(key))
