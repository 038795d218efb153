"""node_exporter host signals: the join on host names, the PromQL, the simulated exporter, the stats."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from jobs.metrics import host_signals as H
from jobs.metrics.prometheus import Series
from jobs.metrics.signals import COUNT, MAX, MEAN, MIN, JobSignals, grid
from jobs.simulate import node_exporter as N

HOSTS = ["gpu-node-001", "gpu-node-002"]
T0 = 1_767_225_600.0


def _instance_regex() -> re.Pattern[str]:
    m = re.fullmatch(r'instance=~"(.*)"', H.HostJoin().matcher(HOSTS))
    assert m
    return re.compile(m[1].replace("\\\\", "\\"))  # the PromQL string literal's escaping undone


@pytest.mark.parametrize(
    ("instance", "joined"),
    [
        ("gpu-node-001:9100", True),
        ("gpu-node-002", True),
        ("gpu-node-001.cluster.local:9100", True),  # FQDN targets, short GPU host names
        ("gpu-node-0011:9100", False),  # another node whose name starts the same
        ("login-gpu-node-001:9100", False),
    ],
)
def test_the_instance_join_matches_the_host_with_domain_and_port_only(instance: str, joined: bool) -> None:
    assert bool(_instance_regex().fullmatch(instance)) is joined


def test_a_relabelled_node_name_label_is_joined_without_a_port() -> None:
    assert H.HostJoin("nodename").matcher(["n1"]) == r'nodename=~"(n1)(\\..*)?"'
    with pytest.raises(ValueError):
        H.HostJoin("node name").matcher(["n1"])
    with pytest.raises(ValueError, match="no host names"):
        H.HostJoin().matcher([])


def test_cpu_busy_is_one_minus_idle_iowait_and_steal_averaged_over_cpus() -> None:
    q = H.per_host_query("host_cpu_busy", H.HostJoin(), ["n1"], 60.0, 30.0)
    assert q.startswith("avg by (instance) (1 - sum by (instance, cpu) (rate(node_cpu_seconds_total{")
    assert 'mode=~"idle|iowait|steal"' in q and q.endswith("[60s])))")


def test_byte_rates_leave_out_stacked_disks_and_virtual_nics() -> None:
    disk = H.per_host_query("host_disk_read_bytes", H.HostJoin(), ["n1"], 60.0, 30.0)
    assert "node_disk_read_bytes_total{" in disk and 'device!~"dm-.*|md.*"' in disk
    net = H.per_host_query("host_net_rx_bytes", H.HostJoin(), ["n1"], 60.0, 30.0)
    assert 'device!~"lo|veth.*|docker.*|cni.*|flannel.*|cali.*|virbr.*|br-.*|ib.*"' in net
    ib = H.per_host_query("host_ib_tx_bytes", H.HostJoin(), ["n1"], 60.0, 30.0)
    assert ib.startswith("sum by (instance) (rate(node_infiniband_port_data_transmitted_bytes_total{")


def test_aggregate_query_tags_mean_min_max_count() -> None:
    q = H.aggregate_host_query("host_cpu_iowait", H.HostJoin(), HOSTS, 60.0, 30.0)
    assert [s for s in re.findall(r'"stat", "(\w+)"', q)] == ["mean", "min", "max", "count"]


def test_host_stats_ignore_hosts_without_a_sample() -> None:
    s = H.host_stats(np.array([[0.2, np.nan, np.nan], [0.6, 0.4, np.nan]]))
    assert s[MEAN][:2].tolist() == pytest.approx([0.4, 0.4]) and np.isnan(s[MEAN][2])
    assert s[MIN][0] == 0.2 and s[MAX][0] == 0.6 and s[COUNT][:2].tolist() == [2.0, 1.0]


@pytest.mark.parametrize(
    ("behaviour", "busy", "iowait"),
    [("cpu_bound_input", 0.92, 0.01), ("io_bound_input", 0.12, 0.25), ("host_sync", 0.02, 0.002)],
)
def test_simulated_cpu_counters_read_back_as_the_shares_put_in(
    behaviour: str, busy: float, iowait: float
) -> None:
    nodes = N.simulate_hosts(HOSTS, T0 + 15.0 * np.arange(20), behaviour, n_cpus=4, noise=0.0)
    assert np.nanmean(N.per_host_values(nodes, "host_cpu_busy")) == pytest.approx(busy, abs=1e-6)
    assert np.nanmean(N.per_host_values(nodes, "host_cpu_iowait")) == pytest.approx(iowait, abs=1e-6)


def test_simulated_bytes_count_the_physical_disk_and_ethernet_once() -> None:
    nodes = N.simulate_hosts(HOSTS, T0 + 15.0 * np.arange(20), "io_bound_input", noise=0.0)
    # 2.5 GB/s from nvme0n1 (dm-0 repeats it: left out); 50 MB/s on eth0 (lo and ib0 left out).
    assert np.nanmean(N.per_host_values(nodes, "host_disk_read_bytes")) == pytest.approx(2.5e9)
    assert np.nanmean(N.per_host_values(nodes, "host_net_rx_bytes")) == pytest.approx(0.05e9)
    assert np.nanmean(N.per_host_values(nodes, "host_ib_rx_bytes")) == pytest.approx(2e9)


def test_simulated_series_have_node_exporters_names_labels_and_types() -> None:
    nodes = N.simulate_hosts(["n1"], T0 + 15.0 * np.arange(3), "healthy", n_cpus=2)
    text = "".join(N.openmetrics_lines(nodes))
    assert (
        "# TYPE node_cpu_seconds counter\n" in text
        and "# TYPE node_memory_MemAvailable_bytes gauge\n" in text
    )
    assert re.search(r'node_cpu_seconds_total\{cpu="1",instance="n1:9100",job="node",mode="iowait"\} ', text)
    assert re.search(r'node_infiniband_port_data_received_bytes_total\{device="mlx5_0",instance="n1:9100",'
                     r'job="node",port="1"\} ', text)  # fmt: skip
    assert text.endswith("# EOF\n")


class _Client:
    def __init__(self, names: list[str], series: dict[str, list[Series]]) -> None:
        self.names, self.series = names, series
        self.queries: list[str] = []

    def label_values(self, label: str, match: Any = (), start: Any = None, end: Any = None) -> list[str]:
        self.queries.append(f"labels:{match[0]}")
        return self.names

    def range(self, query: str, start: Any, end: Any, step: float | None = None) -> list[Series]:
        self.queries.append(query)
        key = next(k for k in H.HOST_SIGNALS if H.per_host_query(k, H.HostJoin(), HOSTS, 60.0, 30.0) in query)
        return self.series.get(key, [])


def test_fetch_reads_present_signals_and_names_the_missing_ones() -> None:
    ts = grid(T0, T0 + 120.0, 30.0)
    busy = [Series({"stat": s}, ts, np.full(ts.size, v)) for s, v in (("mean", 0.5), ("count", 2.0))]
    client = _Client([H.CPU], {"host_cpu_busy": busy})
    got, missing = H.fetch_host_signals(client, HOSTS, T0, T0 + 120.0, 30.0, rate_window_s=60.0)
    assert set(got) == {"host_cpu_busy"}  # iowait's query answered nothing: missing with its own reason
    assert got["host_cpu_busy"].mean is not None and got["host_cpu_busy"].mean.tolist() == [0.5] * 5
    assert "no samples" in missing["host_cpu_iowait"]
    assert "not collected" in missing["host_ib_rx_bytes"] and "node_infiniband" in missing["host_ib_rx_bytes"]
    assert client.queries[0].startswith('labels:{__name__=~"node_.+", instance=~')
    assert len(client.queries) == 1 + 2  # presence + the two CPU signals (node_cpu_seconds_total present)
    js = JobSignals(T0, T0 + 120.0, 30.0, ts)
    H.add_host_signals(js, got, missing)
    assert js.get("host_cpu_busy") is not None and "host_ib_rx_bytes" in js.missing


def test_job_hosts_are_the_host_names_of_its_gpu_rows() -> None:
    from jobs.metrics.signals import GpuKey, SignalSeries

    ts = grid(T0, T0 + 60.0, 30.0)
    js = JobSignals(T0, T0 + 60.0, 30.0, ts)
    s = SignalSeries("gpu_util", "ratio", ts, {})
    s.gpus = (GpuKey("gpu-node-002", "0"), GpuKey("gpu-node-001", "3"), GpuKey("gpu-node-001", "4"))
    js.signals["gpu_util"] = s
    assert H.job_hosts(js) == ["gpu-node-001", "gpu-node-002"]


def test_attach_reads_the_hosts_of_the_gpu_rows_on_the_jobs_grid() -> None:
    from jobs.metrics.signals import GpuKey, SignalSeries

    ts = grid(T0, T0 + 120.0, 30.0)
    js = JobSignals(T0, T0 + 120.0, 30.0, ts)
    s = SignalSeries("gpu_util", "ratio", ts, {})
    s.gpus = (GpuKey("gpu-node-001", "0"), GpuKey("gpu-node-002", "0"))
    js.signals["gpu_util"] = s
    busy = [Series({"stat": st}, ts, np.full(ts.size, v)) for st, v in (("mean", 0.9), ("count", 2.0))]
    client = _Client([H.CPU], {"host_cpu_busy": busy})
    H.attach_host_signals(client, js, rate_window_s=60.0)
    got = js.get("host_cpu_busy")
    assert (
        got is not None and np.array_equal(got.timestamps, ts) and got.mean is not None and got.mean[0] == 0.9
    )
    assert 'instance=~"(gpu-node-001|gpu-node-002)' in client.queries[0]
    assert "host_ib_rx_bytes" in js.missing


def test_attach_without_gpu_rows_says_the_hosts_are_unknown() -> None:
    ts = grid(T0, T0 + 60.0, 30.0)
    js = JobSignals(T0, T0 + 60.0, 30.0, ts)
    client = _Client([H.CPU], {})
    H.attach_host_signals(client, js)
    assert client.queries == [] and "host names are unknown" in js.missing["host_cpu_busy"]
