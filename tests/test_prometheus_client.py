"""PrometheusClient against a real Prometheus (simulated jobs backfilled with promtool) and against a tiny
local HTTP server that misbehaves on purpose (503, 400, hangs, refuses connections)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import numpy as np
import pytest
import requests

from jobs.metrics.prometheus import (
    MAX_POINTS_PER_SERIES,
    PrometheusClient,
    PrometheusQueryError,
    PrometheusUnavailable,
    Selector,
    choose_step,
    plan_chunks,
    to_unix,
)
from jobs.metrics.signal_queries import aggregate_query, fetch_job_signals, window_total_query
from jobs.metrics.signals import DEFAULT_DISABLED, SIGNALS
from jobs.simulate import SimResult, SimSpec, backfill, simulate, write_openmetrics
from tests.prom_server import PrometheusProcess, free_port, needs_prometheus, prometheus_binary

EVIL_ID = 'x\\"} or vector(1) #'  # a real job id full of PromQL syntax
INJECTION = '"} or vector(1) #'  # what an attacker would send as a job id


class CountingSession(requests.Session):
    """A requests.Session that records every request it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str]] = []

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        self.sent.append((str(method), str(url)))
        return super().request(method, url, *args, **kwargs)


# --- real Prometheus -----------------------------------------------------------------------------------


@dataclass
class Cluster:
    url: str
    a: SimResult  # false saturation, hpc_job=48213, Hostname, 2 hosts x 4 GPUs
    b: SimResult  # default exporter set, DCGM 4.6 names, `hostname`, job id full of quotes
    c: SimResult  # straggler, no job label, host stored as exported_Hostname

    @property
    def start(self) -> float:
        return float(self.a.timestamps[0])

    @property
    def end(self) -> float:
        return float(self.a.timestamps[-1])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if prometheus_binary() is None or shutil.which("promtool") is None:
        pytest.skip("prometheus and promtool binaries are not installed (Debian/Ubuntu package: prometheus)")
    base = {"duration_s": 3600.0, "step_s": 30.0, "noise": 0.02}
    # Every registered field, the health counters dcgm-exporter leaves off by default included (they draw
    # no random numbers: the other fields are as before).
    a = simulate(
        SimSpec(
            scenario="false_saturation",
            gpus=8,
            gpus_per_host=4,
            seed=1,
            params={"health_fields": "all"},
            **base,
        )
    )
    b = simulate(
        SimSpec(
            scenario="healthy", gpus=2, gpus_per_host=2, hosts=("node-b.dc1",), job_id=EVIL_ID,
            host_label="hostname", metric_names="dcgm46", disabled=DEFAULT_DISABLED, seed=2, **base,
        )
    )  # fmt: skip
    c = simulate(
        SimSpec(
            scenario="straggler", gpus=4, gpus_per_host=4, hosts=("gpu-node-003",), job_id=None,
            job_labels="none", host_label="exported_Hostname", seed=3, **base,
        )
    )  # fmt: skip
    tmp = tmp_path_factory.mktemp("prom")
    write_openmetrics([a, b, c], tmp / "cluster.om")
    backfill(tmp / "cluster.om", tmp / "tsdb")
    with PrometheusProcess(tmp / "tsdb") as prom:
        yield Cluster(prom.url, a, b, c)


@pytest.fixture
def client(cluster: Cluster) -> Iterator[PrometheusClient]:
    with PrometheusClient(cluster.url, timeout_s=10, retries=0, backoff_s=0) as c:
        yield c


JOB_A = Selector.from_labels({"hpc_job": "48213"})


@pytest.mark.prometheus
@needs_prometheus
def test_ping_reports_ready_with_the_server_version(client: PrometheusClient) -> None:
    health = client.ping()
    assert health and health.ok and health.version and health.version.startswith("2.")


@pytest.mark.prometheus
@needs_prometheus
def test_range_query_returns_one_float64_series_per_gpu_on_the_step_grid(
    client: PrometheusClient, cluster: Cluster
) -> None:
    series = client.range(JOB_A.select("DCGM_FI_PROF_SM_ACTIVE"), cluster.start, cluster.end, 30)
    assert len(series) == 8
    by_key = {(s.labels["Hostname"], s.labels["gpu"]): s for s in series}
    for g, gpu in enumerate(cluster.a.gpus):
        s = by_key[(gpu.hostname, str(gpu.index))]
        assert s.timestamps.dtype == np.float64 and s.values.dtype == np.float64
        np.testing.assert_array_equal(s.timestamps, cluster.a.timestamps)
        np.testing.assert_allclose(s.values, cluster.a.fields["sm_active"][g], rtol=1e-5)
        assert s.labels["modelName"] == "NVIDIA H100 80GB HBM3" and s.labels["instance"].endswith(":9400")


@pytest.mark.prometheus
@needs_prometheus
def test_aggregation_across_gpus_matches_numpy(client: PrometheusClient, cluster: Cluster) -> None:
    sig = SIGNALS["gpu_util"]
    series = client.range(aggregate_query(sig, JOB_A), cluster.start, cluster.end, 30)
    stats = {s.labels["stat"]: s.values for s in series}
    util = sig.normalise(cluster.a.fields["gpu_util"])
    np.testing.assert_allclose(stats["mean"], util.mean(axis=0), rtol=1e-9)
    np.testing.assert_allclose(stats["min"], util.min(axis=0))
    np.testing.assert_allclose(stats["max"], util.max(axis=0))
    assert set(stats["count"]) == {8.0}


@pytest.mark.prometheus
@needs_prometheus
def test_fetch_job_signals_exposes_false_saturation(client: PrometheusClient, cluster: Cluster) -> None:
    js = fetch_job_signals(client, JOB_A, cluster.start, cluster.end, 60, per_gpu_step=300)
    assert not js.missing
    util, sm = js.signals["gpu_util"], js.signals["sm_active"]
    assert util.mean is not None and sm.mean is not None
    assert np.nanmean(util.mean) >= 0.9 and np.nanmax(sm.mean) < 0.5
    assert sm.per_gpu is not None and sm.per_gpu.shape == (8, 13)
    assert [str(k) for k in sm.gpus][:2] == ["gpu-node-001/0", "gpu-node-001/1"]
    energy_w = js.signals["total_energy"].mean
    power_w = js.signals["power_usage"].mean
    assert energy_w is not None and power_w is not None
    # Average power from the energy counter agrees with the power gauge once the rate window is full.
    np.testing.assert_allclose(np.nanmean(energy_w[10:]), np.nanmean(power_w[10:]), rtol=0.05)


@pytest.mark.prometheus
@needs_prometheus
def test_default_exporter_job_lists_missing_signals_and_reads_dcgm_4_6_names(
    client: PrometheusClient, cluster: Cluster
) -> None:
    sel = Selector.from_gpus(cluster.b.gpu_refs())
    js = fetch_job_signals(client, sel, cluster.start, cluster.end, 60)
    assert set(js.missing) == set(DEFAULT_DISABLED)
    assert "DCGM_FI_PROF_SM_ACTIVE, gauge" in js.missing["sm_active"]
    util = js.signals["gpu_util"].mean  # stored as DCGM_FI_DEV_GPU_UTIL_RATIO, still percent
    assert util is not None and 0.9 <= np.nanmean(util) <= 1.0


@pytest.mark.prometheus
@needs_prometheus
def test_injected_job_id_matches_nothing_instead_of_returning_vector_1(client: PrometheusClient) -> None:
    sel = Selector.from_labels({"hpc_job": INJECTION})
    assert client.instant(f"count({sel.select('DCGM_FI_DEV_GPU_UTIL')})", 1_767_227_400) == []


@pytest.mark.prometheus
@needs_prometheus
def test_job_id_with_quotes_and_backslash_selects_exactly_its_gpus(client: PrometheusClient) -> None:
    sel = Selector.from_labels({"hpc_job": EVIL_ID})
    samples = client.instant(f"count({sel.select(['DCGM_FI_DEV_GPU_UTIL', 'DCGM_FI_DEV_GPU_UTIL_RATIO'])})",
                             1_767_227_400)  # fmt: skip
    assert [s.value for s in samples] == [2.0]
    assert EVIL_ID in client.label_values("hpc_job")


@pytest.mark.prometheus
@needs_prometheus
def test_explicit_gpus_match_exported_hostname_and_show_the_straggler(
    client: PrometheusClient, cluster: Cluster
) -> None:
    sel = Selector.from_gpus(cluster.c.gpu_refs())
    js = fetch_job_signals(client, sel, cluster.start, cluster.end, 60, keys=["sm_active"], per_gpu_step=120)
    sm = js.signals["sm_active"]
    assert sm.per_gpu is not None and len(sm.gpus) == 4
    slowest = int(np.nanargmin(np.nanmean(sm.per_gpu, axis=1)))
    assert str(sm.gpus[slowest]) == cluster.c.truth["straggler_keys"][0]


@pytest.mark.prometheus
@needs_prometheus
def test_one_selector_spans_hostname_and_Hostname_labelled_hosts(
    client: PrometheusClient, cluster: Cluster
) -> None:
    sel = Selector.from_gpus([*cluster.a.gpu_refs(), *cluster.b.gpu_refs(), *cluster.c.gpu_refs()])
    expr = sel.select(SIGNALS["gpu_util"].metrics)
    assert client.instant(f"count({expr})", 1_767_227_400)[0].value == 14.0


@pytest.mark.prometheus
@needs_prometheus
def test_nan_and_infinities_are_parsed_as_floats(client: PrometheusClient, cluster: Cluster) -> None:
    assert np.isnan(client.instant("0 / 0", 1_767_227_400)[0].value)
    assert np.isnan(client.instant("vector(0) / 0", 1_767_227_400)[0].value)
    q = f"sum({JOB_A.select('DCGM_FI_DEV_GPU_UTIL')})"
    pos = client.range(f"{q} / 0", cluster.start, cluster.start + 300, 60)[0].values
    neg = client.range(f"-{q} / 0", cluster.start, cluster.start + 300, 60)[0].values
    assert np.isposinf(pos).all() and np.isneginf(neg).all()


@pytest.mark.prometheus
@needs_prometheus
def test_more_than_11000_points_are_split_into_chunks_and_stitched(cluster: Cluster) -> None:
    session = CountingSession()
    client = PrometheusClient(cluster.url, timeout_s=30, retries=0, session=session)
    q = f"sum({JOB_A.select('DCGM_FI_DEV_GPU_UTIL')})"
    (series,) = client.range(q, cluster.start, cluster.end, step=0.25)
    assert len(series) == 14_401  # 3600 s / 0.25 s + 1, more than one request may return
    assert len(session.sent) == 2
    np.testing.assert_allclose(series.timestamps, cluster.start + 0.25 * np.arange(14_401))
    (coarse,) = client.range(q, cluster.start, cluster.end, step=30)
    np.testing.assert_array_equal(series.values[::120], coarse.values)


@pytest.mark.prometheus
@needs_prometheus
def test_smaller_point_limit_splits_into_more_chunks_on_the_same_grid(cluster: Cluster) -> None:
    session = CountingSession()
    client = PrometheusClient(cluster.url, timeout_s=30, retries=0, session=session, max_points=1000)
    (series,) = client.range(f"sum({JOB_A.select('DCGM_FI_DEV_GPU_UTIL')})", cluster.start, cluster.end, 1)
    assert len(series) == 3601 and len(session.sent) == 4
    assert (np.diff(series.timestamps) == 1.0).all()


@pytest.mark.prometheus
@needs_prometheus
def test_server_rejects_unsplit_queries_over_11000_points(cluster: Cluster) -> None:
    client = PrometheusClient(cluster.url, timeout_s=30, retries=0, max_points=20_000)
    with pytest.raises(PrometheusQueryError) as err:
        client.range("vector(1)", cluster.start, cluster.end, step=0.25)
    assert err.value.error_type == "bad_data" and "11,000 points" in err.value.message


@pytest.mark.prometheus
@needs_prometheus
def test_bad_query_raises_query_error_once_without_retrying(cluster: Cluster) -> None:
    session = CountingSession()
    client = PrometheusClient(cluster.url, timeout_s=5, retries=3, backoff_s=0, session=session)
    with pytest.raises(PrometheusQueryError) as err:
        client.instant("sum(", 1_767_227_400)
    assert err.value.error_type == "bad_data" and err.value.status == 400
    assert "parse error" in str(err.value)
    assert len(session.sent) == 1


@pytest.mark.prometheus
@needs_prometheus
def test_energy_over_the_job_window_matches_the_counter_increase(
    client: PrometheusClient, cluster: Cluster
) -> None:
    q = window_total_query(SIGNALS["total_energy"], JOB_A, 3600)
    (sample,) = client.instant(q, datetime.fromtimestamp(cluster.end, tz=UTC))
    energy = cluster.a.fields["total_energy"]
    expected_j = float((energy[:, -1] - energy[:, 0]).sum()) / 1000.0
    assert sample.value == pytest.approx(expected_j, rel=0.02)


@pytest.mark.prometheus
@needs_prometheus
def test_label_values_discover_jobs_and_metric_names_for_readiness(
    client: PrometheusClient, cluster: Cluster
) -> None:
    assert {"48213", EVIL_ID} <= set(client.label_values("hpc_job", start=cluster.start, end=cluster.end))
    names = client.label_values("__name__", Selector.from_gpus(cluster.b.gpu_refs()).series_selectors())
    assert "DCGM_FI_DEV_GPU_UTIL_RATIO" in names and "DCGM_FI_PROF_SM_UTIL_RATIO" not in names


# --- pure helpers -----------------------------------------------------------------------------------------


def test_choose_step_keeps_thirty_days_under_the_point_limit() -> None:
    assert choose_step(0, 30 * 86400) == 236.0
    assert choose_step(0, 60) == 1.0
    assert 30 * 86400 / choose_step(0, 30 * 86400) <= MAX_POINTS_PER_SERIES


def test_plan_chunks_cover_the_grid_without_gaps_or_overlap() -> None:
    chunks = plan_chunks(100.0, 100.0 + 25_000, 1.0)
    assert chunks == [(100.0, 11_099.0), (11_100.0, 22_099.0), (22_100.0, 25_100.0)]
    assert plan_chunks(0.0, 10.0, 30.0) == [(0.0, 0.0)]


def test_timestamps_must_be_aware_datetimes_or_numbers() -> None:
    assert to_unix(datetime(2026, 1, 1, tzinfo=UTC)) == 1_767_225_600.0
    for bad in [datetime(2026, 1, 1), float("nan"), "2026-01-01", True]:
        with pytest.raises(ValueError):
            to_unix(bad)  # type: ignore[arg-type]


def test_client_rejects_bad_configuration() -> None:
    with pytest.raises(ValueError):
        PrometheusClient("localhost:9090")
    with pytest.raises(ValueError):
        PrometheusClient("http://x", timeout_s=0)
    with pytest.raises(ValueError):
        PrometheusClient("http://x", retries=-1)


# --- misbehaving local server -------------------------------------------------------------------------


SCALAR_ONE = {"status": "success", "data": {"resultType": "scalar", "result": [1, "1"]}}


@dataclass
class Reply:
    status: int = 200
    body: Any = field(default_factory=lambda: dict(SCALAR_ONE))
    hang: bool = False


@dataclass
class FakePrometheus:
    url: str
    replies: list[Reply]
    seen: list[dict[str, Any]]
    release: threading.Event


@pytest.fixture
def fake() -> Iterator[FakePrometheus]:
    replies: list[Reply] = []
    seen: list[dict[str, Any]] = []
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            seen.append({"method": self.command, "path": self.path, "type": self.headers.get("Content-Type"),
                         "form": parse_qs(body)})  # fmt: skip
            reply = replies.pop(0) if replies else Reply()
            if reply.hang:
                release.wait(10)
                return
            raw = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    # A short poll interval keeps shutdown() (and so each test's teardown) fast.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield FakePrometheus(f"http://127.0.0.1:{server.server_address[1]}", replies, seen, release)
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def error_body(error_type: str, message: str) -> dict[str, str]:
    return {"status": "error", "errorType": error_type, "error": message}


def test_503_then_200_succeeds_after_one_backoff(fake: FakePrometheus) -> None:
    fake.replies += [Reply(503, error_body("unavailable", "starting up")), Reply()]
    sleeps: list[float] = []
    client = PrometheusClient(fake.url, timeout_s=2, retries=2, backoff_s=0.5, sleep=sleeps.append)
    assert client.instant("1")[0].value == 1.0
    assert len(fake.seen) == 2 and sleeps == [0.5]


def test_persistent_5xx_raises_unavailable_after_exponential_backoff(fake: FakePrometheus) -> None:
    fake.replies += [Reply(503, error_body("timeout", "query timed out")) for _ in range(4)]
    sleeps: list[float] = []
    client = PrometheusClient(fake.url, timeout_s=2, retries=3, backoff_s=0.1, sleep=sleeps.append)
    with pytest.raises(PrometheusUnavailable) as err:
        client.instant("up")
    assert len(fake.seen) == 4 and sleeps == [0.1, 0.2, 0.4]
    assert err.value.status == 503 and err.value.error_type == "timeout"
    assert "query timed out" in str(err.value) and "after 4 attempts" in str(err.value)


def test_400_bad_data_is_raised_at_once_with_a_clear_message(fake: FakePrometheus) -> None:
    fake.replies.append(Reply(400, error_body("bad_data", '1:5: parse error: unexpected "}"')))
    client = PrometheusClient(fake.url, timeout_s=2, retries=3, backoff_s=0, sleep=lambda s: None)
    with pytest.raises(PrometheusQueryError) as err:
        client.instant("up}")
    assert len(fake.seen) == 1
    assert err.value.error_type == "bad_data" and err.value.status == 400
    assert str(err.value) == 'bad_data: 1:5: parse error: unexpected "}"'


def test_422_execution_error_is_not_retried(fake: FakePrometheus) -> None:
    fake.replies.append(Reply(422, error_body("execution", "query processing would load too many samples")))
    client = PrometheusClient(fake.url, timeout_s=2, retries=3, backoff_s=0, sleep=lambda s: None)
    with pytest.raises(PrometheusQueryError) as err:
        client.range("up", 0, 600, 60)
    assert err.value.error_type == "execution" and len(fake.seen) == 1


def test_hanging_server_times_out_and_is_retried_then_unavailable(fake: FakePrometheus) -> None:
    fake.replies += [Reply(hang=True), Reply(hang=True)]
    client = PrometheusClient(fake.url, timeout_s=0.3, retries=1, backoff_s=0, sleep=lambda s: None)
    t0 = time.monotonic()
    with pytest.raises(PrometheusUnavailable) as err:
        client.instant("up")
    assert "Timeout" in str(err.value)
    assert len(fake.seen) == 2 and time.monotonic() - t0 < 3


def test_connection_refused_is_unavailable_and_ping_says_so() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    client = PrometheusClient(url, timeout_s=1, retries=1, backoff_s=0, sleep=lambda s: None)
    with pytest.raises(PrometheusUnavailable) as err:
        client.instant("up")
    assert "ConnectionError" in str(err.value)
    health = client.ping()
    assert not health and "ConnectionError" in health.detail


def test_queries_are_posted_form_encoded_with_a_server_timeout(fake: FakePrometheus) -> None:
    fake.replies.append(Reply(body={"status": "success", "data": {"resultType": "matrix", "result": []}}))
    client = PrometheusClient(fake.url, timeout_s=7, retries=0)
    assert client.range('up{job="a b"}', 0, 120, 60) == []
    req = fake.seen[0]
    assert req["method"] == "POST" and req["path"] == "/api/v1/query_range"
    assert req["type"] == "application/x-www-form-urlencoded"
    assert req["form"] == {"query": ['up{job="a b"}'], "start": ["0"], "end": ["120"], "step": ["60"],
                           "timeout": ["7s"]}  # fmt: skip


def test_non_json_answer_is_a_query_error_not_a_crash(fake: FakePrometheus) -> None:
    fake.replies.append(Reply(200, b"<html>proxy login</html>"))
    client = PrometheusClient(fake.url, timeout_s=2, retries=0)
    with pytest.raises(PrometheusQueryError) as err:
        client.instant("up")
    assert err.value.error_type == "bad_response" and "proxy login" in err.value.message


def test_non_json_502_from_a_proxy_is_retried_as_transient(fake: FakePrometheus) -> None:
    fake.replies += [Reply(502, b"Bad Gateway"), Reply()]
    client = PrometheusClient(fake.url, timeout_s=2, retries=1, backoff_s=0, sleep=lambda s: None)
    assert client.instant("1")[0].value == 1.0


def test_warnings_are_kept_and_vector_results_are_typed(fake: FakePrometheus) -> None:
    body = {"status": "success", "warnings": ["partial response"], "data": {"resultType": "vector",
                                                                           "result": [
        {"metric": {"gpu": "0"}, "value": [1767225600.5, "+Inf"]},
        {"metric": {"gpu": "1"}, "value": [1767225600.5, "-Inf"]},
        {"metric": {"gpu": "2"}, "value": [1767225600.5, "NaN"]},
    ]}}  # fmt: skip
    fake.replies.append(Reply(body=body))
    client = PrometheusClient(fake.url, timeout_s=2, retries=0)
    samples = client.instant("x", 1767225600.5)
    assert [s.labels["gpu"] for s in samples] == ["0", "1", "2"]
    assert np.isposinf(samples[0].value) and np.isneginf(samples[1].value) and np.isnan(samples[2].value)
    assert samples[0].timestamp == 1767225600.5
    assert client.last_warnings == ["partial response"]
    assert fake.seen[0]["form"]["time"] == ["1767225600.5"]


def test_ping_falls_back_to_ready_endpoint_when_buildinfo_is_missing(fake: FakePrometheus) -> None:
    fake.replies += [Reply(404, b"not found"), Reply(200, b"Prometheus Server is Ready.")]
    health = PrometheusClient(fake.url, timeout_s=2).ping()
    assert health.ok and health.version is None
    assert [r["path"] for r in fake.seen] == ["/api/v1/status/buildinfo", "/-/ready"]


def test_ping_reports_not_ready(fake: FakePrometheus) -> None:
    fake.replies += [Reply(404, b"not found"), Reply(503, b"Service Unavailable")]
    health = PrometheusClient(fake.url, timeout_s=2).ping()
    assert not health.ok and "503" in health.detail


def test_prometheus_process_reports_a_missing_binary(tmp_path: Path) -> None:
    from tests.prom_server import PrometheusStartError

    with pytest.raises(PrometheusStartError):
        PrometheusProcess(tmp_path, binary=str(tmp_path / "no-such-prometheus")).start()
