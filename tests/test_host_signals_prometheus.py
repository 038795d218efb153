"""Host signals and GPM aliases against a real Prometheus: node_exporter's and the GPM exporter's series,
as the simulators write them, backfilled with promtool and read back with the product's PromQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from jobs.diagnosis.rules.gpu_errors import counter_increase
from jobs.metrics import host_signals as H
from jobs.metrics.prometheus import PrometheusClient, Selector
from jobs.metrics.signal_queries import fetch_job_signals
from jobs.simulate import DEFAULT_START, SimSpec, backfill, gpm, openmetrics_lines, simulate
from jobs.simulate import node_exporter as N
from tests.prom_server import PROMETHEUS_MODULE, PrometheusProcess

pytestmark = PROMETHEUS_MODULE

HOSTS = ["gpu-node-001", "gpu-node-002"]
TS = DEFAULT_START + 15.0 * np.arange(41)  # 10 min of 15 s scrapes


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusClient]:
    work: Path = tmp_path_factory.mktemp("host-prom")
    nodes = N.simulate_hosts(HOSTS, TS, "io_bound_input", n_cpus=4, noise=0.0)
    body = "".join(N.openmetrics_lines(nodes)).removesuffix("# EOF\n")
    # One GPU job on the same hosts, exported by the GPM exporter only (relabelled as GPM_RELABEL says).
    res = simulate(SimSpec(gpus=16, duration_s=600.0, step_s=15.0, job_id="77", seed=2))
    body += "".join(gpm.openmetrics_lines([res])).removesuffix("# EOF\n")
    # A dcgm-exporter job on other hosts with a DCGM health event: 3 uncorrectable ECC errors on GPU 2
    # at 40 % of the job, a driver reload (reset to 0) at 70 % and 1 more at 80 %.
    events = [
        {"field": "ecc_dbe_volatile", "gpu": 2, "at": 0.4, "count": 3},
        {"field": "ecc_dbe_volatile", "gpu": 2, "at": 0.7, "reset": True},
        {"field": "ecc_dbe_volatile", "gpu": 2, "at": 0.8, "count": 1},
    ]
    health = simulate(SimSpec(gpus=4, hosts=("dcgm-node",), duration_s=600.0, step_s=15.0, job_id="78",
                              seed=3, params={"health": events}))  # fmt: skip
    body += "".join(openmetrics_lines([health], throughput=False))
    (work / "data.om").write_text(body)
    backfill(work / "data.om", work / "tsdb")
    with PrometheusProcess(work / "tsdb") as prom, PrometheusClient(prom.url, timeout_s=10, retries=0) as c:
        c.sim = res  # type: ignore[attr-defined]
        yield c


def test_host_signals_read_back_the_simulated_node_exporter(client: PrometheusClient) -> None:
    start, end = DEFAULT_START + 120.0, DEFAULT_START + 600.0
    got, missing = H.fetch_host_signals(client, HOSTS, start, end, 30.0, rate_window_s=60.0)
    assert not missing, missing
    # io_bound_input: busy 12 %, iowait 25 %, 2.5 GB/s disk reads (dm-0 not counted twice), 50 MB/s
    # Ethernet (lo and IPoIB left out), 2 GB/s InfiniBand per host, 60 % of memory available; 2 hosts.
    expect = {"host_cpu_busy": 0.12, "host_cpu_iowait": 0.25, "host_disk_read_bytes": 2.5e9,
              "host_net_rx_bytes": 0.05e9, "host_ib_rx_bytes": 2e9, "host_mem_available": 0.60}  # fmt: skip
    for key, value in expect.items():
        s = got[key]
        assert s.mean is not None and s.count is not None
        assert np.nanmean(s.mean) == pytest.approx(value, rel=1e-3), key
        assert np.nanmax(s.count) == 2.0, key


def test_a_host_not_in_the_job_is_not_joined(client: PrometheusClient) -> None:
    got, missing = H.fetch_host_signals(
        client, ["gpu-node-00"], DEFAULT_START + 120, DEFAULT_START + 600, 30.0
    )
    assert not got and set(missing) == set(H.HOST_SIGNALS)


def test_gpm_exporter_series_are_read_as_the_dcgm_signals(client: PrometheusClient) -> None:
    res = client.sim  # type: ignore[attr-defined]
    start, end = DEFAULT_START + 60.0, DEFAULT_START + 600.0
    sigs = fetch_job_signals(
        client, Selector.from_labels({"hpc_job": "77"}), start, end, 30.0,
        keys=["sm_active", "power_usage", "gpu_util", "fb_used"],
    )  # fmt: skip
    assert not sigs.missing, sigs.missing
    cols = (start - 30.0 <= TS) & (end >= TS)
    for key in ("sm_active", "power_usage", "gpu_util", "fb_used"):
        s = sigs.get(key)
        assert s is not None and s.mean is not None and s.count is not None
        assert np.nanmax(s.count) == 16.0, key
        # Each 30 s step averages two 15 s scrapes; over the window the means agree with the raw fields
        # in the registry's unit (power in W from mW, memory in MiB from bytes, utilisation as a ratio).
        raw = np.nanmean(res.fields[key][:, cols]) * {"gpu_util": 0.01}.get(key, 1.0)
        assert np.nanmean(s.mean) == pytest.approx(raw, rel=0.02), key


def test_health_counters_read_as_levels_rise_by_the_errors_inside_the_window(
    client: PrometheusClient,
) -> None:
    start, end = DEFAULT_START + 30.0, DEFAULT_START + 600.0
    sigs = fetch_job_signals(
        client, Selector.from_labels({"hpc_job": "78"}), start, end, 30.0, per_gpu_step=30.0,
        keys=["ecc_dbe_volatile", "pcie_replay"],
    )  # fmt: skip
    ecc, replays = sigs.get("ecc_dbe_volatile"), sigs.get("pcie_replay")
    assert ecc is not None and ecc.per_gpu is not None and replays is not None and replays.per_gpu is not None
    rows = {str(g): ecc.per_gpu[i] for i, g in enumerate(ecc.gpus)}
    # GPU 2: 4 errors before the job, 7 after the 3, 0 after the reload, then 1: 3 + 1 = 4 in the window;
    # GPU 1 had 2 before the job and none in it.
    assert counter_increase(rows["dcgm-node/2"]) == 4.0
    assert counter_increase(rows["dcgm-node/1"]) == 0.0 and np.nanmax(rows["dcgm-node/1"]) == 2.0
    assert all(counter_increase(r) == 0.0 for r in replays.per_gpu)  # replays from before the job only
