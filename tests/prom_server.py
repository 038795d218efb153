"""Test-side name for the real-Prometheus runner; the code lives in jobs.promserver."""

from jobs.promserver import PrometheusProcess, PrometheusStartError, free_port, prometheus_binary

__all__ = ["PrometheusProcess", "PrometheusStartError", "free_port", "prometheus_binary"]
