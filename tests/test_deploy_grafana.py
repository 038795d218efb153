"""The Grafana dashboard and Prometheus rules in efficiency/deploy/ for the /metrics export: promtool
accepts the rules, a promtool unit test fires the waste alert and records the team MFU from exported
series, and every dashboard query is valid PromQL over metric names /metrics exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from jobs.metrics.signals import SIGNALS
from jobs.outputs.exporter import _GAUGES, INFO, SERVICE_METRICS
from tests.conftest import REPO_ROOT

DEPLOY = REPO_ROOT / "efficiency" / "deploy"
RULES = DEPLOY / "prometheus-rules.yml"
DASHBOARD = DEPLOY / "grafana-dashboard.json"
EXPORTED = {name for name, _, _ in _GAUGES} | {INFO, "efficiency_job_findings"} | set(SERVICE_METRICS)


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian package 'prometheus')")
    return path


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_promtool(), *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_promtool_checks_the_rules():
    result = _run("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_rules_read_only_exported_metrics():
    names = set(re.findall(r"(?<![:\w])efficiency_[a-z_]+(?![:\w])", RULES.read_text()))
    assert names and names <= EXPORTED, names - EXPORTED


def test_promtool_unit_test_of_the_rules(tmp_path):
    """Hand-made series as /metrics exports them: job 1 (llm, 8 GPUs, MFU 0.30, $800/day certain waste,
    running, $2,400/day), job 2 (llm, 24 GPUs, MFU 0.50, finished, its final $7,200/day and $900/day waste
    still exported). GPU-weighted MFU = (0.30*8 + 0.50*24) / 32 = 0.45; the $/day and GPU sums count the
    running job only (800, 2,400, 8: the finished job's 900 and 7,200 are not spend now); the waste alert
    fires for job 1 only, after its 30 minutes."""
    shutil.copy(RULES, tmp_path / "rules.yml")
    (tmp_path / "test.yml").write_text(textwrap.dedent("""\
        rule_files: [rules.yml]
        evaluation_interval: 1m
        tests:
          - interval: 1m
            input_series:
              - series: 'efficiency_job_info{job_id="1",team="llm",status="running",name="a"}'
                values: '1x40'
              - series: 'efficiency_job_info{job_id="2",team="llm",status="finalized",name="b"}'
                values: '1x40'
              - series: 'efficiency_job_mfu_ratio{job_id="1",team="llm"}'
                values: '0.3x40'
              - series: 'efficiency_job_mfu_ratio{job_id="2",team="llm"}'
                values: '0.5x40'
              - series: 'efficiency_job_gpus{job_id="1",team="llm"}'
                values: '8x40'
              - series: 'efficiency_job_gpus{job_id="2",team="llm"}'
                values: '24x40'
              - series: 'efficiency_job_waste_lower_bound_usd_per_day{job_id="1",team="llm"}'
                values: '800x40'
              - series: 'efficiency_job_waste_lower_bound_usd_per_day{job_id="2",team="llm"}'
                values: '900x40'
              - series: 'efficiency_job_cost_usd_per_day{job_id="1",team="llm"}'
                values: '2400x40'
              - series: 'efficiency_job_cost_usd_per_day{job_id="2",team="llm"}'
                values: '7200x40'
            promql_expr_test:
              - expr: team:efficiency_mfu_ratio:gpu_weighted
                eval_time: 5m
                exp_samples:
                  - labels: 'team:efficiency_mfu_ratio:gpu_weighted{team="llm"}'
                    value: 0.45
              - expr: team:efficiency_waste_lower_bound_usd_per_day:sum_running
                eval_time: 5m
                exp_samples:
                  - labels: 'team:efficiency_waste_lower_bound_usd_per_day:sum_running{team="llm"}'
                    value: 800
              - expr: team:efficiency_cost_usd_per_day:sum_running
                eval_time: 5m
                exp_samples:
                  - labels: 'team:efficiency_cost_usd_per_day:sum_running{team="llm"}'
                    value: 2400
              - expr: team:efficiency_gpus:sum_running
                eval_time: 5m
                exp_samples:
                  - labels: 'team:efficiency_gpus:sum_running{team="llm"}'
                    value: 8
            alert_rule_test:
              - alertname: EfficiencyJobWastingMoney
                eval_time: 20m
                exp_alerts: []
              - alertname: EfficiencyJobWastingMoney
                eval_time: 35m
                exp_alerts:
                  - exp_labels: {severity: warning, job_id: "1", team: llm, name: a}
                    exp_annotations:
                      summary: "Job 1 (llm) wastes at least $800/day"
                      description: "Waste = cost/day x max(idle share, 1 - MFU / reference MFU); the job page names the causes."
        """))  # fmt: skip  # noqa: E501
    result = _run("test", "rules", "test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def _exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_dashboard_queries_are_valid_promql_over_exported_metrics(tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "efficiency" and {"team", "job_id"} <= {
        v["name"] for v in dashboard["templating"]["list"]
    }
    exprs = _exprs(dashboard)
    assert len(exprs) >= 14
    names = {n for e in exprs for n in re.findall(r"\befficiency_[a-z_]+\b", e)}
    assert names <= EXPORTED, names - EXPORTED
    # DCGM panels read dcgm-exporter's series by the names the service itself reads (jobs.metrics.signals).
    dcgm = {n for e in exprs for n in re.findall(r"\bDCGM_FI_[A-Z0-9_]+\b", e)}
    known = {m for s in SIGNALS.values() for m in s.metrics}
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"} <= dcgm
    assert dcgm <= known, dcgm - known
    assert not any(re.search(r'\bjob="', e) for e in exprs)  # the label is job_id
    # promtool parses each query when it is a recording rule (template variables set to a match-all).
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}",
         "expr": e.replace("$team", ".*").replace("$job_id", ".*").replace("$job_label", "hpc_job")}
        for i, e in enumerate(exprs)
    ]}]}  # fmt: skip
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    result = _run("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_dollars_per_day_sum_counts_running_jobs_only():
    """$/day is a rate of a running job; the export keeps finished jobs' final $/day for 7 days, and summing
    them overstated spend ~9x (issue 28 item 4). Every dashboard query and recording rule that adds up $/day
    (or GPUs) joins efficiency_job_info{status="running"}."""
    dashboard = json.loads(DASHBOARD.read_text())
    # Sums, counts and rankings across jobs; a selected job's own series is shown as it is.
    across_jobs = [e for e in _exprs(dashboard) if re.match(r"(sum|count|topk)\b", e)]
    per_day = [e for e in across_jobs if re.search(r"usd_per_day|waste_known", e)]
    assert len(per_day) >= 5
    for expr in per_day:
        assert 'efficiency_job_info{status="running"}' in expr, expr
    rules = RULES.read_text()
    for block in re.split(r"\n      - record: ", rules)[1:]:
        name = block.split("\n", 1)[0]
        if name.startswith("team:") and ("usd_per_day" in name or "gpus" in name or "unknown" in name):
            assert name.endswith("_running") and 'status="running"' in block, name


@pytest.mark.django_db
def test_job_page_links_to_grafana_when_grafana_url_is_set(client, settings, make_team, make_user):
    from datetime import UTC, datetime
    from html import unescape

    from jobs.models import Job

    team = make_team("llm")
    client.force_login(make_user("alice", teams=[team]))
    start = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    Job.objects.create(team=team, external_id="g-1", gpu_count=8, started_at=start)
    settings.GRAFANA_URL = ""
    assert "grafana-link" not in client.get("/jobs/g-1/").content.decode()
    settings.GRAFANA_URL = "https://grafana.example.com/"
    html = unescape(client.get("/jobs/g-1/").content.decode())
    assert (
        'href="https://grafana.example.com/d/efficiency/efficiency?var-job_id=g-1&from=1796025600000&to=now"'
        in html
    )
