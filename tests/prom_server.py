"""Test-side name for the real-Prometheus runner; the code lives in jobs.metrics.promserver."""

from jobs.metrics.promserver import PrometheusProcess, PrometheusStartError, free_port, prometheus_binary

__all__ = ["PrometheusProcess", "PrometheusStartError", "free_port", "prometheus_binary"]
