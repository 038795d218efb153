"""Benchmarks: scripts run from the repository root (`.venv/bin/python benchmarks/NAME.py`); _setup holds
what the Prometheus-backed ones share."""
