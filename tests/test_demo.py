"""The demo: every scenario is planned, the synthetic trace shows host syncs, the live exporter is valid."""

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from jobs import demo
from jobs.diagnosis import ArtifactAnalysis, diagnose
from jobs.diagnosis.testing import input_from_sim
from jobs.profiling.kineto import parse_kineto
from jobs.profiling.trace_analysis import analyze_trace
from jobs.simulate import SCENARIOS

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_the_plan_covers_every_scenario_on_disjoint_hosts():
    plan = demo.plan(NOW)
    assert {d.spec.scenario for d in plan} >= set(SCENARIOS)
    hosts = [h for d in plan for h in d.spec.hosts]
    assert len(hosts) == len(set(hosts))
    assert len({d.spec.job_id for d in plan}) == len(plan)
    assert [d.spec.job_id for d in plan if not d.ended] == ["demo-4900", "demo-4901"]


def test_the_synthetic_trace_yields_a_host_sync_finding():
    analysis = analyze_trace(parse_kineto(demo.host_sync_trace()))
    rank = analysis["ranks"][0]
    assert rank["sync"]["cpu_sync_calls"] == 5 * 4  # 4 per step; the last step is left out, as HTA does
    assert rank["step_times"]["count"] == 6
    spec = demo.plan(NOW)[0].spec
    from jobs.simulate import simulate

    inp = input_from_sim(simulate(spec), artifacts=[ArtifactAnalysis("kineto", analysis, "rank0.json", 0)])
    assert "host_sync" in {f.code for f in diagnose(inp)}


def test_the_live_exporter_serves_valid_exposition_text(tmp_path: Path):
    running = [d.spec for d in demo.plan(NOW) if not d.ended]
    (tmp_path / demo.LIVE_SPECS_FILE).write_text(json.dumps([_spec_dict(s) for s in running]))
    text = demo.live_exporter_text(tmp_path, running[0].start + 600)
    assert "DCGM_FI_DEV_GPU_UTIL{" in text and 'train_tokens_total{job_id="demo-4900"' in text
    try:
        result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                                timeout=30)  # fmt: skip
    except FileNotFoundError:
        pytest.skip("promtool is not installed (Debian package 'prometheus')")
    assert "parsing error" not in (result.stdout + result.stderr), result.stdout + result.stderr


def _spec_dict(spec) -> dict:
    from dataclasses import asdict

    return asdict(spec) | {"disabled": sorted(spec.disabled)}


@pytest.mark.django_db
def test_the_exporter_endpoint_is_off_unless_configured(client, settings, tmp_path):
    settings.DEMO_STATE_DIR = ""
    assert client.get("/simulated/dcgm-exporter/metrics").status_code == 404
    settings.DEMO_STATE_DIR = str(tmp_path)
    response = client.get("/simulated/dcgm-exporter/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
