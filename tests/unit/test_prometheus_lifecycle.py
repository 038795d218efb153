"""Issue 23: the local Prometheus never runs with its lifecycle (/-/quit, /-/reload) or admin API, which any
local client could call (a webhook subscription to /-/quit shut it down)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.metrics.promserver import FORBIDDEN_FLAGS, PrometheusProcess

ROOT = Path(__file__).resolve().parents[2]


def _launchers() -> list[Path]:
    found = [ROOT / ".ci" / "services", ROOT / "Makefile", ROOT / "jobs" / "metrics" / "promserver.py"]
    found += sorted(ROOT.glob("docker-compose*.y*ml")) + sorted(ROOT.glob("Dockerfile*"))
    found += sorted((ROOT / "efficiency" / "deploy").rglob("*"))
    return [p for p in found if p.is_file()]


def test_no_launcher_starts_prometheus_with_a_write_api():
    launchers = _launchers()
    assert ROOT / ".ci" / "services" in launchers and any("docker-compose" in p.name for p in launchers)
    for path in launchers:
        text = path.read_text(errors="replace")
        if path.name == "promserver.py":  # it names the flags once, to refuse them
            text = text.replace('FORBIDDEN_FLAGS = ("--web.enable-lifecycle", "--web.enable-admin-api")', "")
        for flag in FORBIDDEN_FLAGS:
            assert flag not in text, f"{path.relative_to(ROOT)} starts Prometheus with {flag}"


@pytest.mark.parametrize("flag", ["--web.enable-lifecycle", "--web.enable-admin-api=true"])
def test_the_test_prometheus_runner_refuses_the_write_apis(tmp_path, flag):
    with pytest.raises(ValueError, match="stay off"):
        PrometheusProcess(tmp_path, binary="/bin/true", extra_args=(flag,))
