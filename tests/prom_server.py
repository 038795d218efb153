"""Test-side name for the real-Prometheus runner (the code lives in jobs.metrics.promserver), and the one
marker set that skips a test module when the binaries it needs are missing."""

import shutil

import pytest

from jobs.metrics.promserver import PrometheusProcess, PrometheusStartError, free_port, prometheus_binary

#: Skips a test without the prometheus and promtool binaries (the backfills run promtool).
needs_prometheus = pytest.mark.skipif(
    prometheus_binary() is None or shutil.which("promtool") is None,
    reason="prometheus and promtool binaries are not installed (Debian/Ubuntu package: prometheus)",
)
#: A module's `pytestmark` when every test in it reads a real Prometheus.
PROMETHEUS_MODULE = [pytest.mark.prometheus, needs_prometheus]

__all__ = [
    "PROMETHEUS_MODULE",
    "PrometheusProcess",
    "PrometheusStartError",
    "free_port",
    "needs_prometheus",
    "prometheus_binary",
]
