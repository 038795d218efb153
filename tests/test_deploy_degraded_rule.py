"""The service-degraded alert in efficiency/deploy/prometheus-rules.yml (issue 23 item 7), with promtool: a
stalled poller fires one EfficiencyServiceDegraded and no per-job EfficiencyPollLagging; a job lagging
while the service polls still fires its own."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

RULES = Path(__file__).resolve().parents[1] / "efficiency" / "deploy" / "prometheus-rules.yml"


def test_a_stalled_poller_fires_one_service_alert_instead_of_one_per_job(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package 'prometheus')")
    shutil.copy(RULES, tmp_path / "rules.yml")
    (tmp_path / "test.yml").write_text(
        textwrap.dedent("""\
        rule_files: [rules.yml]
        evaluation_interval: 1m
        tests:
          - interval: 1m
            input_series:
              - series: 'efficiency_service_degraded{reason="poll_stalled"}'
                values: '1x40'
              - series: 'efficiency_poll_lag_seconds{job_id="1"}'
                values: '900x40'
              - series: 'efficiency_poll_lag_seconds{job_id="2"}'
                values: '900x40'
            alert_rule_test:
              - eval_time: 30m
                alertname: EfficiencyServiceDegraded
                exp_alerts:
                  - exp_labels: {severity: critical, reason: poll_stalled}
                    exp_annotations:
                      summary: "efficiency is not polling (poll_stalled); see /healthz"
              - eval_time: 30m
                alertname: EfficiencyPollLagging
                exp_alerts: []
          - interval: 1m
            input_series:
              - series: 'efficiency_service_degraded{reason="ok"}'
                values: '0x40'
              - series: 'efficiency_poll_lag_seconds{job_id="1"}'
                values: '900x40'
            alert_rule_test:
              - eval_time: 30m
                alertname: EfficiencyServiceDegraded
                exp_alerts: []
              - eval_time: 30m
                alertname: EfficiencyPollLagging
                exp_alerts:
                  - exp_labels: {severity: warning, job_id: "1"}
                    exp_annotations:
                      summary: "Job 1's data is 15m 0s behind"
        """)
    )
    result = subprocess.run(
        [promtool, "test", "rules", "test.yml"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
