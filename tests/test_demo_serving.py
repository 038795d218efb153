"""Issue 25 follow-up: the demo's model server (`demo-4903`, Llama 3.1 8B on vLLM over 2 H100s, kind
inference, registered by its pod's label selector). Its GPUs follow a request load, its engine exports the
`--enable-mfu-metrics` FLOP counters and vLLM's token counters through the demo's own paths (the promtool
backfill and the live exporter), and the demo's pipeline gives it the engine's MFU with the forward-FLOPs
MFU beside it and the serving reading (no input stall, right-sizing/batching advice)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jobs.demo import cluster, live, loader
from jobs.simulate import vllm as V

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
FLOPS = "vllm:estimated_flops_per_gpu_total"


def _server(now: datetime = NOW) -> cluster.DemoJob:
    return next(d for d in cluster.plan(now) if d.spec.job_id == cluster.SERVING_JOB)


def test_the_demo_server_is_a_kubernetes_serving_job_registered_by_its_pod() -> None:
    demo = _server()
    assert demo.kind == "inference" and not demo.ended and demo.serving is not None
    assert demo.spec.gpus == 2 and demo.spec.job_labels == "kubernetes"
    res = cluster.simulate_job(demo, NOW)
    pods = {g.labels["pod"] for g in res.gpus}
    assert pods == {"demo-4903-worker-0"} and {g.labels["namespace"] for g in res.gpus} == {"llm-serving"}
    assert all("hpc_job" not in g.labels for g in res.gpus)
    # Only what has happened: 6 hours of 30 s samples up to NOW.
    assert res.timestamps[-1] <= NOW.timestamp() and len(res.timestamps) == 6 * 120 + 1


def test_the_servers_gpus_follow_its_load_and_its_engine_counts_the_forward_flops_of_its_tokens() -> None:
    demo = _server()
    assert demo.serving is not None
    load = demo.serving
    server = V.simulate_server(demo.spec, load)
    res, ts = server.result, server.result.timestamps
    c = server.in_flight
    # GPU_UTIL is the share of time a request is in flight: 1 - e^(-c), in percent, within the noise.
    util = np.nanmean(res.fields["gpu_util"], axis=0) / 100.0
    assert np.corrcoef(util, 1.0 - np.exp(-c))[0, 1] > 0.95
    assert np.corrcoef(util, res.throughput.tokens_per_s)[0, 1] > 0.8  # the utilisation follows the load
    assert util.min() < 0.4 and util.max() > 0.9  # quiet between requests, ~busy at the burst peaks
    # The counters' increase over an interval is the rate times the interval (30 s).
    (labels, flops), *_ = server.engines.series[FLOPS]
    assert labels["pod"] == "demo-4903-worker-0" and labels["namespace"] == "llm-serving"
    rate = np.diff(flops) / np.diff(ts)
    # By hand at one sample: λ = c / (2000/8000 + 250/75 s) requests/s; prefill tokens attend to 1000
    # context tokens, decode tokens to 2125; each 2N + 4·L·H·Q·C with N 8.0e9, L 32, H·Q 4096; 2 GPUs.
    k = 100
    lam = c[k] / (2000 / 8000 + 250 / 75)
    per_gpu = (lam * 2000 * (16e9 + 4 * 32 * 4096 * 1000) + lam * 250 * (16e9 + 4 * 32 * 4096 * 2125)) / 2
    assert rate[k - 1] == pytest.approx(per_gpu, rel=1e-9)
    prompt = dict(server.engines.series)[V.PROMPT_TOKENS_METRIC][0][1]
    assert prompt[k] - prompt[k - 1] == pytest.approx(lam * 2000 * 30, abs=1.0)
    # Engine MFU = FLOP/s per GPU over the H100's 989.5 TFLOP/s dense BF16 peak; tensor activity is its
    # hardware upper estimate (the simulator's ~12 % margin over MFU).
    engine_mfu = res.truth["engine_mfu"]
    assert engine_mfu == pytest.approx(float(np.mean(server.engine_flops_per_gpu_s)) / 989.5e12)
    assert np.nanmean(res.fields["tensor_active"]) * 0.98 == pytest.approx(engine_mfu * 1.12, rel=0.05)


def test_the_live_exporter_serves_the_servers_engine_counters_as_backfilled(tmp_path: Path) -> None:
    running = [d for d in cluster.plan(NOW) if not d.ended]
    specs = [
        asdict(d.spec)
        | {"disabled": sorted(d.spec.disabled)}
        | ({live.SERVING_KEY: asdict(d.serving)} if d.serving else {})
        for d in running
    ]
    (tmp_path / live.LIVE_SPECS_FILE).write_text(json.dumps(specs))
    at = NOW.timestamp() + 95.0  # the exporter keeps going after the backfill ended at NOW
    text = live.live_exporter_text(tmp_path, at)
    line = next(x for x in text.splitlines() if x.startswith(FLOPS + "{"))
    assert 'namespace="llm-serving"' in line and 'pod="demo-4903-worker-0"' in line
    assert 'DCGM_FI_DEV_GPU_UTIL{gpu="0"' in text and 'pod="demo-4903-worker-0"' in text
    assert 'train_tokens_total{job_id="demo-4903"' not in text  # a server's tokens are vLLM's counters
    assert "# TYPE vllm:generation_tokens_total counter" in text
    # The live value is the value the backfill would hold at that sample: one series, no reset between.
    engines = cluster.engine_series(_server(), datetime.fromtimestamp(at, tz=UTC))
    assert engines is not None
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(engines.series[FLOPS][0][1][-1], rel=1e-15)
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package 'prometheus')")
    checked = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                             timeout=30)  # fmt: skip
    assert "parsing error" not in checked.stdout + checked.stderr, checked.stdout + checked.stderr


# ------------------------------------------------------------- end to end: backfill, register, finish, page


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Any, datetime]]:
    """A real Prometheus holding the demo server's backfill (its GPUs and its engine), as `load` writes it."""
    from tests.prom_server import PrometheusProcess, prometheus_binary

    if prometheus_binary() is None or shutil.which("promtool") is None:
        pytest.skip("prometheus and promtool are not installed (Debian package 'prometheus')")
    now = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=1)
    demo = _server(now)
    result = cluster.simulate_job(demo, now)
    engines = cluster.engine_series(demo, now)
    assert engines is not None
    loader.backfill_results([result], tmp_path / "tsdb", engines={demo.spec.job_id or "": engines})
    with PrometheusProcess(tmp_path / "tsdb") as server:
        yield server, now


@pytest.mark.prometheus
@pytest.mark.django_db
def test_the_demo_server_gets_the_engines_mfu_and_the_serving_reading(
    served: tuple[Any, datetime], settings: Any, catalog: Any, client: Any, media_root: Any
) -> None:
    from jobs.models import Finding, Job

    server, now = served
    settings.PROMETHEUS_URL = server.url
    settings.PROMETHEUS_SCRAPE_INTERVAL_S = 30.0
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    demo = _server(now)
    teams = cluster.ensure_people()
    job = cluster.register(demo, cluster.simulate_job(demo, now), teams, now)
    assert job.kind == "inference"
    assert job.selector == {"namespace": "llm-serving", "pod": "demo-4903-worker-0"}
    assert job.status == Job.Status.RUNNING
    loader.finish(wait_live_s=0)
    job.refresh_from_db()
    ev = job.evaluation
    assert ev["mfu_source"] == "engine", (ev.get("engine_mfu_reason"), job.missing_reasons)
    # What the simulated engine did over the job so far (its load depends on the time of day), within the
    # edges of the polled window and rate()'s windows: the job's MFU is the engine's.
    assert demo.serving is not None
    sim = V.simulate_server(demo.spec, demo.serving)
    done = sim.result.timestamps <= now.timestamp()
    truth = float(np.mean(sim.engine_flops_per_gpu_s[done])) / 989.5e12
    assert ev["engine_mfu"] == pytest.approx(job.mfu) and ev["engine_mfu"] == pytest.approx(truth, rel=0.15)
    # The forward-FLOPs MFU of the token counters, beside it: the product's context (half of 8,192) is
    # longer than what the requests attend to (1,000 and 2,125 tokens), so it reads a little higher.
    assert ev["flops_mfu"] is not None and 1.0 < ev["flops_mfu"] / ev["engine_mfu"] < 1.3
    assert ev["variants"]["mfu_cross_check"].startswith(f"forward-FLOPs MFU {ev['flops_mfu']:.1%}")
    codes = {f.code: f for f in job.findings.all()}
    warned = {c for c, f in codes.items() if f.severity != Finding.Severity.INFO}
    assert not {"data_pipeline_stall", "launch_overhead"} & set(codes), codes
    assert "unexplained_waste" in warned, {c: f.severity for c, f in codes.items()}
    advice = codes["unexplained_waste"].recommendation
    assert "Right-size" in advice and "batch requests" in advice and "autoscale" in advice
    client.force_login(get_demo_user())
    page = client.get(f"/jobs/{job.external_id}/").content.decode()
    assert "engine-reported FLOPs (vLLM/SGLang estimated_flops_per_gpu_total)" in page
    assert f"kept as a cross-check: {ev['flops_mfu'] * 100:.1f} %" in page


def get_demo_user() -> Any:
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get(username="demo")


@pytest.mark.prometheus
@pytest.mark.django_db(transaction=True)
def test_the_servers_live_engine_counters_are_scraped_and_finish_waits_for_its_pod(
    live_server: Any, settings: Any, tmp_path: Path, catalog: Any
) -> None:
    """`make demo`'s path: the web server serves the simulated exporter, Prometheus scrapes it with
    honor_labels, `finish` waits until the server's GPUs (found by pod, they carry no hpc_job) were scraped
    after it began, and the engine's counters arrive through the same scrape."""
    import time

    from jobs.metrics.prometheus import PrometheusClient
    from tests.browser.test_demo_browser import _prometheus_scraping

    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package 'prometheus')")
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    demo = _server(now)
    assert demo.serving is not None
    before = now - timedelta(minutes=5)
    engines = cluster.engine_series(demo, before)
    assert engines is not None
    result = cluster.simulate_job(demo, before)
    loader.backfill_results([result], tmp_path / "tsdb", engines={cluster.SERVING_JOB: engines})
    state = tmp_path / "state"
    state.mkdir()
    spec = asdict(demo.spec) | {"disabled": [], live.SERVING_KEY: asdict(demo.serving)}
    (state / live.LIVE_SPECS_FILE).write_text(json.dumps([spec]))
    settings.DEMO_STATE_DIR = str(state)
    settings.MEDIA_ROOT = str(tmp_path / "media")
    settings.PROMETHEUS_SCRAPE_INTERVAL_S = 30.0
    with _prometheus_scraping(tmp_path / "tsdb", live_server.url.removeprefix("http://"), tmp_path) as url:
        settings.PROMETHEUS_URL = url
        cluster.register(demo, result, cluster.ensure_people(), now)
        began = time.time()
        lines: list[str] = []
        report = loader.finish(lines.append, wait_live_s=60.0)
        prom = PrometheusClient(url)
        newest = loader.live_data_until(
            prom, [cluster.SERVING_JOB], {cluster.SERVING_JOB: "demo-4903-worker-0"}
        )
        scraped = prom.instant(f'timestamp({FLOPS}{{namespace="llm-serving",pod="demo-4903-worker-0"}})')
    assert report["live_caught_up"], lines
    assert newest[cluster.SERVING_JOB] >= began
    assert len(scraped) == 1 and scraped[0].value >= began  # one series: the backfill's, continued live
