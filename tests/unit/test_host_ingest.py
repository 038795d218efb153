"""The poll's host-signal read (jobs.metrics.ingest.attach_hosts): off unless NODE_EXPORTER_HOST_LABEL
names the node label, joined on the GPU rows' hosts, and never failing the poll."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from jobs.metrics.ingest import attach_hosts
from jobs.metrics.prometheus import PrometheusError, Series
from jobs.metrics.signals import GpuKey, JobSignals, SignalSeries, grid

T0 = 1_767_225_600.0


class _Client:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.queries: list[str] = []

    def label_values(self, label: str, match: Any = (), start: Any = None, end: Any = None) -> list[str]:
        self.queries.append(f"labels:{match[0]}")
        if self.fail:
            raise PrometheusError("HTTP 503")
        return ["node_cpu_seconds_total"]

    def range(self, query: str, start: Any, end: Any, step: float | None = None) -> list[Series]:
        self.queries.append(query)
        ts = grid(start, end, step or 30.0)
        return [Series({"stat": s}, ts, np.full(ts.size, v)) for s, v in (("mean", 0.3), ("count", 1.0))]


def _sigs() -> JobSignals:
    ts = grid(T0, T0 + 90.0, 30.0)
    js = JobSignals(T0, T0 + 90.0, 30.0, ts)
    s = SignalSeries("gpu_util", "ratio", ts, {})
    s.gpus = (GpuKey("gpu-node-001", "0"),)
    js.signals["gpu_util"] = s
    return js


def test_host_signals_are_off_by_default(settings: Any) -> None:
    settings.NODE_EXPORTER_HOST_LABEL = ""
    client, js = _Client(), _sigs()
    attach_hosts(client, js)  # type: ignore[arg-type]
    assert client.queries == [] and "host_cpu_busy" not in js.missing


def test_a_named_label_joins_the_gpu_hosts(settings: Any) -> None:
    settings.NODE_EXPORTER_HOST_LABEL = "nodename"
    client, js = _Client(), _sigs()
    attach_hosts(client, js)  # type: ignore[arg-type]
    assert 'nodename=~"(gpu-node-001)' in client.queries[0]
    busy = js.get("host_cpu_busy")
    assert busy is not None and busy.mean is not None and busy.mean.tolist() == [0.3] * 4
    assert "node_infiniband" in js.missing["host_ib_rx_bytes"]


def test_a_failed_host_read_is_missing_data_not_a_failed_poll(settings: Any) -> None:
    settings.NODE_EXPORTER_HOST_LABEL = "instance"
    js = _sigs()
    attach_hosts(_Client(fail=True), js)  # type: ignore[arg-type]
    assert js.missing["host_cpu_busy"].startswith("host signals not read: PrometheusError")
    assert js.get("gpu_util") is not None


@pytest.mark.parametrize("label", ["node name", "1abc"])
def test_an_invalid_label_name_is_reported_as_missing(settings: Any, label: str) -> None:
    settings.NODE_EXPORTER_HOST_LABEL = label
    js = _sigs()
    attach_hosts(_Client(), js)  # type: ignore[arg-type]
    assert "invalid label name" in js.missing["host_cpu_busy"]
