"""Issue 25: node_exporter's readiness line on /healthz and the cluster readiness page: configured or not
(NODE_EXPORTER_HOST_LABEL), series seen or not, with the reason. The line is auxiliary: it never turns
/healthz's answer into a failure."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jobs.metrics import host_signals as H
from jobs.runtime.health import node_exporter_source
from jobs.simulate import DEFAULT_START, backfill
from jobs.simulate import node_exporter as N
from tests.prom_server import PrometheusProcess, prometheus_binary

ALL = sorted(H.NODE_EXPORTER_METRICS)


def test_the_line_says_not_configured_seen_partly_or_not_at_all() -> None:
    off = H.source_readiness("", None)
    assert off["configured"] is False and off["series_seen"] is None
    assert off["reason"].startswith("not configured: NODE_EXPORTER_HOST_LABEL is empty")
    unchecked = H.source_readiness("instance", None, "ConnectionError: refused")
    assert unchecked["configured"] and unchecked["series_seen"] is None
    assert unchecked["reason"] == "not checked: Prometheus did not answer (ConnectionError: refused)"
    none = H.source_readiness("instance", ["up", "DCGM_FI_DEV_GPU_UTIL"])
    assert none["series_seen"] is False and "no node_exporter series carry 'instance'" in none["reason"]
    # Nodes without InfiniBand: the infiniband collector exports nothing, the rest is there.
    no_ib = H.source_readiness("instance", [m for m in ALL if "infiniband" not in m])
    assert no_ib["series_seen"] is True and len(no_ib["metrics_missing"]) == 2
    assert no_ib["reason"].startswith(f"series seen for {len(ALL) - 2} of {len(ALL)} metrics")
    every = H.source_readiness("nodename", ALL)
    assert every["metrics_missing"] == [] and every["reason"].startswith(f"series seen for all {len(ALL)}")


@pytest.fixture(scope="module")
def node_prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusProcess]:
    if prometheus_binary() is None or shutil.which("promtool") is None:
        pytest.skip("prometheus and promtool binaries are not installed (Debian/Ubuntu package: prometheus)")
    work: Path = tmp_path_factory.mktemp("node-ready")
    ts = DEFAULT_START + 15.0 * np.arange(41)
    (work / "data.om").write_text("".join(N.openmetrics_lines(N.simulate_hosts(["n1"], ts, "healthy"))))
    backfill(work / "data.om", work / "tsdb")
    with PrometheusProcess(work / "tsdb") as prom:
        yield prom


@pytest.mark.prometheus
def test_the_check_asks_prometheus_for_node_exporter_series_under_the_join_label(
    node_prom: PrometheusProcess, settings: Any
) -> None:
    settings.PROMETHEUS_URL = node_prom.url
    settings.NODE_EXPORTER_HOST_LABEL = "instance"
    seen = node_exporter_source(now=DEFAULT_START + 600.0)
    assert seen["series_seen"] is True and seen["metrics_missing"] == [] and seen["metrics_seen"] == ALL
    # Relabelled to a label node_exporter's series do not carry: configured, but nothing joins.
    settings.NODE_EXPORTER_HOST_LABEL = "nodename"
    assert node_exporter_source(now=DEFAULT_START + 600.0)["series_seen"] is False
    # Ten minutes after the last scrape the series are gone from the look-back: not seen.
    settings.NODE_EXPORTER_HOST_LABEL = "instance"
    assert node_exporter_source(now=DEFAULT_START + 600.0 + 1200.0)["series_seen"] is False


@pytest.mark.django_db
def test_healthz_carries_the_line_without_failing_on_it(
    client: Any, settings: Any, prometheus_server: Any
) -> None:
    settings.PROMETHEUS_URL = prometheus_server.url
    settings.NODE_EXPORTER_HOST_LABEL = ""
    body = client.get("/healthz").json()
    assert body["sources"]["node_exporter"]["configured"] is False
    settings.NODE_EXPORTER_HOST_LABEL = "instance"
    response = client.get("/healthz")
    body = response.json()
    line = body["sources"]["node_exporter"]
    assert line["configured"] is True and line["series_seen"] is False and line["reason"]
    assert response.status_code == 200 and body["ok"] is True  # an empty Prometheus is still healthy


@pytest.mark.django_db
def test_the_readiness_page_lists_node_exporter_among_the_sources(admin_client: Any, settings: Any) -> None:
    settings.NODE_EXPORTER_HOST_LABEL = ""
    page = admin_client.get("/readiness/").content.decode()
    assert 'id="sources-table"' in page and "<code>node_exporter</code>" in page
    assert "not configured: NODE_EXPORTER_HOST_LABEL is empty" in page
