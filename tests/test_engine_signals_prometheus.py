"""Issue 25 item 3 end to end: a serving engine's MFU counters (vLLM `--enable-mfu-metrics`) as the server
exports them and a ServiceMonitor scrape stores them, backfilled with promtool into a real Prometheus, read
with the product's PromQL (rate() through a server restart), joined to the serving job by its pod/namespace
selector (the GPUs' dcgm-exporter series there as `exported_pod`/`exported_namespace`), in a per-job poll
and in the cluster-wide cycle, and shown as the job's MFU beside the forward-FLOPs MFU."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.test import Client

from jobs.intake.registry import register_job
from jobs.metrics import cluster
from jobs.metrics.engine_signals import ENGINE_SIGNALS, NOT_JOINABLE, fetch_engine_signals
from jobs.metrics.prometheus import PrometheusClient
from jobs.models import Job, JobSeries
from jobs.pipeline import poll as pipeline
from jobs.simulate import DEFAULT_START, SimSpec, backfill, openmetrics_lines, registration_body, simulate
from jobs.simulate import vllm as V
from tests.prom_server import PROMETHEUS_MODULE, PrometheusProcess

pytestmark = PROMETHEUS_MODULE

T0 = DEFAULT_START
MIN = 60.0
SCRAPE = 15.0
DURATION = 40 * MIN
FLOPS = 296.85e12  # per GPU: 30.0 % of the H100 SXM's 989.5 TFLOP/s dense BF16 peak
READ_BPS = 1.2e12
RESTART = T0 + 20 * MIN  # the server restarts right after the scrape at 20 min: its counters start again
SERVING = {"namespace": "llm", "pod": "serve-7b-worker-0"}
QUIET = {"namespace": "llm", "pod": "serve-13b-worker-0"}  # served without --enable-mfu-metrics


@pytest.fixture(scope="module")
def sims() -> dict[str, object]:
    common: dict[str, Any] = {"scenario": "healthy", "gpus": 1, "duration_s": DURATION, "step_s": SCRAPE}
    k8s = {**common, "job_labels": "kubernetes"}
    return {
        "serve": simulate(SimSpec(job_id="serve-7b", hosts=("node-s1",), seed=7, **k8s)),
        "quiet": simulate(SimSpec(job_id="serve-13b", hosts=("node-s2",), seed=8, **k8s)),
        # A serving job on a Slurm-style cluster: its GPUs carry hpc_job, which no engine series carries.
        "batch": simulate(SimSpec(job_id="5005", hosts=("node-s3",), seed=9, job_labels="hpc_job", **common)),
    }


@pytest.fixture(scope="module")
def prom(sims: dict[str, object], tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusProcess]:
    work: Path = tmp_path_factory.mktemp("engine-prom")
    # dcgm-exporter's pod labels clash with the target labels of its own pod: stored as exported_*.
    body = "".join(openmetrics_lines(list(sims.values()), rename_exported=("namespace", "pod")))  # type: ignore[arg-type]
    ts = T0 + SCRAPE * np.arange(int(DURATION / SCRAPE) + 1)
    engine = V.simulate_engine(["serve-7b-worker-0"], ts, FLOPS, read_bytes_per_gpu_s=READ_BPS,
                               write_bytes_per_gpu_s=0.1e12, restart_at=RESTART + 1.0)  # fmt: skip
    body = body.removesuffix("# EOF\n") + "".join(V.openmetrics_lines(engine)) + "# EOF\n"
    (work / "data.om").write_text(body)
    backfill(work / "data.om", work / "tsdb")
    with PrometheusProcess(work / "tsdb") as server:
        yield server


def _client(prom: PrometheusProcess) -> PrometheusClient:
    return PrometheusClient(prom.url, timeout_s=20, retries=0)


def test_the_engines_counter_reads_back_as_flops_per_gpu_through_a_restart(prom: PrometheusProcess) -> None:
    start, end = T0 + 2 * MIN, T0 + DURATION
    with _client(prom) as client:
        got, missing = fetch_engine_signals(client, SERVING, start, end, 30.0, scrape_interval_s=SCRAPE)
    assert not missing, missing
    flops = got["engine_flops"]
    assert flops.unit == "FLOP/s" and flops.mean is not None and flops.count is not None
    assert np.nanmax(flops.count) == 1.0
    ts = flops.timestamps
    # rate() over 30 s: exactly the engine's FLOP/s wherever the window holds no restart ...
    clean = (ts < RESTART) | (ts > RESTART + 60.0)
    np.testing.assert_allclose(flops.mean[clean], FLOPS, rtol=1e-9)
    # ... and across the restart neither a negative rate nor a spike of the whole count: rate() takes the
    # drop to 0 as a reset. What the server did between its last scrape and the restart (1 s) is lost.
    across = flops.mean[~clean]
    assert across.size >= 1 and np.isfinite(across).all()
    assert (across > 0.9 * FLOPS).all() and (across <= FLOPS * (1 + 1e-9)).all()
    read = got["engine_read_bytes"].mean
    assert read is not None
    np.testing.assert_allclose(read[clean], READ_BPS, rtol=1e-9)


def test_no_engine_series_is_missing_with_its_reason_never_zero(prom: PrometheusProcess) -> None:
    with _client(prom) as client:
        got, missing = fetch_engine_signals(client, QUIET, T0, T0 + DURATION, 30.0, scrape_interval_s=SCRAPE)
        explicit, why = fetch_engine_signals(client, None, T0, T0 + DURATION, 30.0)
    assert not got and set(missing) == set(ENGINE_SIGNALS)
    reason = missing["engine_flops"]
    assert reason.startswith("not exported: no vllm:estimated_flops_per_gpu_total or sglang:")
    assert "--enable-mfu-metrics" in missing["engine_flops"]
    assert not explicit and why == dict.fromkeys(ENGINE_SIGNALS, NOT_JOINABLE)


def test_the_cycle_reads_the_engine_as_a_per_job_read_does(prom: PrometheusProcess) -> None:
    start, end = T0, T0 + 30 * MIN
    targets = [
        cluster.Target(1, start, end, start, labels=SERVING, engine=True),
        cluster.Target(2, start, end, start, labels=QUIET, engine=True),
        cluster.Target(3, start, end, start, labels=SERVING),  # not a serving job: no engine read
        cluster.Target(4, start, end, start, gpus=(("node-s1", "0"),), engine=True),
        cluster.Target(5, start, end, start, labels={"hpc_job": "5005"}, engine=True),
    ]
    with _client(prom) as client:
        result = cluster.read_cycle(client, targets, step=30.0, per_gpu_step=None, scrape_interval_s=SCRAPE)
        plain = [*targets[:4], cluster.Target(5, start, end, start, labels={"hpc_job": "5005"})]
        without = cluster.read_cycle(client, plain, step=30.0, per_gpu_step=None, scrape_interval_s=SCRAPE)
        alone, alone_missing = fetch_engine_signals(client, SERVING, start, end, 30.0,
                                                    scrape_interval_s=SCRAPE)  # fmt: skip
        _, quiet_missing = fetch_engine_signals(client, QUIET, start, end, 30.0, scrape_interval_s=SCRAPE)
    assert result.errors == {} and result.fallback == []
    serving = result.signals[1]
    assert "gpu_util" in serving.signals  # the GPU read is unchanged
    assert set(alone) == {k for k in serving.signals if k in ENGINE_SIGNALS} == set(ENGINE_SIGNALS)
    for key, series in alone.items():
        for stat, values in series.stats.items():
            np.testing.assert_allclose(serving.signals[key].stats[stat], values, rtol=1e-9, equal_nan=True,
                                       err_msg=f"{key} {stat}")  # fmt: skip
    assert not alone_missing and not set(serving.missing) & set(ENGINE_SIGNALS)
    assert {k: v for k, v in result.signals[2].missing.items() if k in ENGINE_SIGNALS} == quiet_missing
    assert not set(result.signals[3].signals) & set(ENGINE_SIGNALS)
    assert not set(result.signals[3].missing) & set(ENGINE_SIGNALS)
    assert result.signals[4].missing["engine_flops"] == NOT_JOINABLE
    # hpc_job is on no engine series: missing as not exported, and no request is spent finding that out.
    assert "gpu_util" in result.signals[5].signals
    assert result.signals[5].missing["engine_flops"].startswith("not exported: no vllm:")
    assert result.queries == without.queries


def _register(sim: object, team: object, labels: dict[str, str], external_id: str) -> Job:
    body = registration_body(sim, team=team, ended=False, kind="inference", external_id=external_id)  # type: ignore[arg-type]
    body["gpus"], body["selector"] = [], labels
    return register_job(body).job


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["per_job", "cycle"])
def test_a_serving_jobs_mfu_is_the_engines_with_the_forward_mfu_beside_it(
    prom: PrometheusProcess,
    sims: dict[str, object],
    make_team: Any,
    make_user: Any,
    api_client_for: Any,
    client: Any,
    settings: Any,
    path: str,
) -> None:
    settings.PROMETHEUS_SCRAPE_INTERVAL_S = SCRAPE
    settings.PROMETHEUS_INGESTION_LAG_S = 30.0
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    team = make_team("serving")
    job = _register(sims["serve"], team, SERVING, "serve-7b")
    quiet = _register(sims["quiet"], team, QUIET, "serve-13b")
    now = datetime.fromtimestamp(T0, tz=UTC) + timedelta(minutes=18)  # before the restart
    with _client(prom) as client:
        if path == "per_job":
            pipeline.poll_job(job, client, now=now)
            pipeline.poll_job(quiet, client, now=now)
        else:
            pipeline.poll_cycle(client, now=now, shard_size=0)
    job.refresh_from_db()
    quiet.refresh_from_db()
    ev = job.evaluation
    # 296.85 TFLOP/s per GPU over the H100 SXM's 989.5 TFLOP/s: 30.0 %, the job's MFU and its column.
    assert ev["mfu_source"] == "engine" and ev["engine_mfu"] == pytest.approx(0.30, rel=1e-6)
    assert job.mfu == pytest.approx(0.30, rel=1e-6)
    assert ev["flops_mfu"] is not None and ev["flops_mfu"] > 0  # the simulator's tokens x forward FLOPs
    assert ev["flops_variant"].startswith("MFU, engine-reported FLOPs (vLLM/SGLang")
    assert ev["variants"]["mfu_cross_check"].startswith(f"forward-FLOPs MFU {ev['flops_mfu']:.1%}")
    assert JobSeries.objects.filter(job=job, signal="engine_flops", stat="mean").exists()
    # The job without the counters keeps its forward-FLOPs MFU; the engine's is absent with the reason.
    qe = quiet.evaluation
    assert qe["mfu_source"] == "flops" and qe["engine_mfu"] is None and quiet.mfu is not None
    assert qe["engine_mfu_reason"] and "engine_flops" in quiet.missing_signals
    assert "--enable-mfu-metrics" in quiet.missing_reasons["engine_flops"]
    # The API and the page say which MFU is shown and give the other's value.
    member = make_user("server-owner", teams=[team])
    metrics = api_client_for(member).get(f"/api/v1/jobs/{job.external_id}/").json()["metrics"]
    assert metrics["mfu_source"] == "engine" and metrics["engine_mfu"] == pytest.approx(0.30, rel=1e-6)
    assert metrics["flops_mfu"] == pytest.approx(ev["flops_mfu"])
    quiet_metrics = api_client_for(member).get(f"/api/v1/jobs/{quiet.external_id}/").json()["metrics"]
    assert quiet_metrics["mfu_source"] == "flops" and quiet_metrics["engine_mfu"] is None
    assert quiet_metrics["engine_mfu_reason"]
    web = Client()
    web.force_login(member)
    page = web.get(f"/jobs/{job.external_id}/").content.decode()
    assert "engine-reported FLOPs (vLLM/SGLang estimated_flops_per_gpu_total)" in page
    other = page[page.index('data-kpi="mfu-other"') :]
    assert other.startswith('data-kpi="mfu-other">shown: the serving engine\'s own MFU')
    assert f"kept as a cross-check: {ev['flops_mfu'] * 100:.1f} %" in other[:400]
    quiet_page = web.get(f"/jobs/{quiet.external_id}/").content.decode()
    ready = quiet_page[quiet_page.index('id="readiness"') :]
    assert "<code>vllm:estimated_flops_per_gpu_total</code>" in ready and "--enable-mfu-metrics" in ready
    assert "shown: forward-FLOPs MFU; the serving engine's own MFU is unknown" in quiet_page
