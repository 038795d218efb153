"""The idle-GPU policy: opt-in per team, warn the owner, then after the grace period cancel through the
command hook (efficiency/deploy/idle-scancel.sh with a fake `scancel` on PATH) or the Kubernetes API; dry
run, allow-list and a disabled policy never cancel; each action is logged once with who/what/why."""

from __future__ import annotations

import json
import os
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.core import mail
from django.utils import timezone

from jobs.alerts import policy
from jobs.models import AlertIncident, IdlePolicy, Job, PolicyAction

ROOT = Path(__file__).resolve().parents[1]
HOOK = ROOT / "efficiency" / "deploy" / "idle-scancel.sh"


@pytest.fixture
def fake_scancel(tmp_path, monkeypatch):
    """`scancel` and `scontrol` on PATH that record their arguments instead of talking to Slurm."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.log"
    for name in ("scancel", "scontrol"):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> "{calls}"\n')
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def read() -> list[str]:
        return calls.read_text().splitlines() if calls.exists() else []

    return read


@pytest.fixture
def idle_job(make_team, make_user, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.IDLE_POLICY_TEAMS = ["llm"]
    settings.IDLE_POLICY_DRY_RUN = False
    settings.IDLE_POLICY_COMMAND = str(HOOK)
    mail.outbox = []
    team = make_team("llm")
    make_user("alice", teams=[team])
    now = timezone.now()
    # Registered by the cluster's scheduler integration: the only jobs the policy may cancel
    # (jobs.access.ownership).
    job = Job.objects.create(
        external_id="48213", name="pretrain", team=team, owner="alice", gpu_count=8,
        selector={"hpc_job": "48213"}, started_at=now - timedelta(hours=2),
        registered_by="scheduler", cluster="slurm-a", registered_via="scheduler token 'prolog' of slurm-a",
    )  # fmt: skip
    incident = AlertIncident.objects.create(
        rule="gpus_idle", job=job, team=team, started_at=now - timedelta(minutes=12), opened_at=now,
        last_seen_at=now, title="2 of 8 GPUs idle for 12 min", finding_code="idle_gpus",
        evidence=[{"label": "GPUs idle", "value": 2, "unit": "GPUs"}],
    )  # fmt: skip
    IdlePolicy.objects.create(team=team, enabled=True, dry_run=False, warn_after_minutes=10, grace_minutes=5)
    return job, incident, now


@pytest.mark.django_db
def test_warns_then_cancels_once_with_scancel_after_the_grace_period(idle_job, fake_scancel):
    job, _, now = idle_job
    [warn] = policy.apply(job.pk, now)
    assert warn.kind == "warn" and warn.outcome == "done"
    assert mail.outbox[0].to == ["alice@example.com"] and "48213" in mail.outbox[0].subject
    assert "5 minutes" in mail.outbox[0].body and "idle-scancel.sh 48213" in mail.outbox[0].body
    assert fake_scancel() == []  # still in the grace period
    policy.apply(job.pk, now + timedelta(minutes=3))
    assert fake_scancel() == []
    actions = policy.apply(job.pk, now + timedelta(minutes=6))
    cancel = next(a for a in actions if a.kind == "cancel")
    assert cancel.outcome == "done", cancel.detail
    assert cancel.action == f"{HOOK} 48213" and "2 of 8 GPUs idle" in cancel.reason
    assert "IDLE_POLICY_TEAMS" in cancel.actor and cancel.target == "job 48213"
    calls = fake_scancel()
    assert "scancel --signal=TERM --full 48213" in calls
    policy.apply(job.pk, now + timedelta(minutes=8))  # a repeated poll: nothing more
    assert [c for c in fake_scancel() if c.startswith("scancel")] == ["scancel --signal=TERM --full 48213"]
    assert PolicyAction.objects.filter(job=job).count() == 2 and len(mail.outbox) == 1


@pytest.mark.django_db
@pytest.mark.parametrize("where", ["team", "global"])
def test_dry_run_logs_what_it_would_do_and_cancels_nothing(idle_job, fake_scancel, settings, where):
    job, _, now = idle_job
    if where == "team":
        IdlePolicy.objects.filter(team=job.team).update(dry_run=True)
    else:
        settings.IDLE_POLICY_DRY_RUN = True
    policy.apply(job.pk, now)
    actions = policy.apply(job.pk, now + timedelta(minutes=6))
    cancel = next(a for a in actions if a.kind == "cancel")
    assert cancel.outcome == "dry_run" and cancel.action.endswith("idle-scancel.sh 48213")
    assert ("IDLE_POLICY_DRY_RUN" if where == "global" else "the team's dry run") in cancel.actor
    assert fake_scancel() == []
    assert "dry run" in mail.outbox[0].body


@pytest.mark.django_db
def test_a_team_outside_the_allow_list_is_refused_and_logged(idle_job, fake_scancel, settings):
    job, _, now = idle_job
    settings.IDLE_POLICY_TEAMS = ["vision"]
    policy.apply(job.pk, now)
    actions = policy.apply(job.pk, now + timedelta(minutes=6))
    assert next(a for a in actions if a.kind == "cancel").outcome == "refused"
    assert fake_scancel() == []


@pytest.mark.django_db
def test_nothing_happens_without_the_policy_enabled_or_once_the_gpus_are_busy(idle_job, fake_scancel):
    job, incident, now = idle_job
    IdlePolicy.objects.filter(team=job.team).update(enabled=False)
    assert policy.apply(job.pk, now + timedelta(minutes=30)) == []
    IdlePolicy.objects.filter(team=job.team).update(enabled=True)
    AlertIncident.objects.filter(pk=incident.pk).update(resolved_at=now)  # GPUs busy again
    assert policy.apply(job.pk, now + timedelta(minutes=30)) == []
    assert not PolicyAction.objects.exists() and fake_scancel() == [] and mail.outbox == []


@pytest.mark.django_db
def test_kubernetes_action_suspends_the_pods_owning_job_with_the_service_account_token(
    idle_job, settings, tmp_path
):
    job, _, now = idle_job
    seen: list[tuple[str, str, str]] = []
    pod = {
        "kind": "Pod",
        "metadata": {
            "name": "pretrain-7b-0",
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "pretrain-7b", "controller": True}
            ],
        },
    }

    class Api(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append((self.command, self.path, self.headers.get("Authorization", "")))
            obj = pod if "/pods/" in self.path else {"kind": "Job", "metadata": {"name": "pretrain-7b"}}
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PATCH = do_DELETE = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    settings.IDLE_POLICY_K8S_API = f"http://127.0.0.1:{server.server_address[1]}"
    settings.IDLE_POLICY_K8S_TOKEN_FILE = str(token)
    settings.IDLE_POLICY_K8S_CA_FILE = str(tmp_path / "no-ca.crt")
    Job.objects.filter(pk=job.pk).update(selector={"namespace": "llm", "pod": "pretrain-7b-0"})
    IdlePolicy.objects.filter(team=job.team).update(action="kubernetes")
    try:
        policy.apply(job.pk, now)
        actions = policy.apply(job.pk, now + timedelta(minutes=6))
    finally:
        server.shutdown()
        server.server_close()
    cancel = next(a for a in actions if a.kind == "cancel")
    assert cancel.outcome == "done", cancel.detail
    # Behaviour change (issue 23): the pod is not deleted (its Job would start a new one); its owning Job is
    # found through ownerReferences and suspended.
    assert seen == [
        ("GET", "/api/v1/namespaces/llm/pods/pretrain-7b-0", "Bearer sa-token"),
        ("GET", "/apis/batch/v1/namespaces/llm/jobs/pretrain-7b", "Bearer sa-token"),
        ("PATCH", "/apis/batch/v1/namespaces/llm/jobs/pretrain-7b", "Bearer sa-token"),
    ]
    assert cancel.detail == "suspended Job llm/pretrain-7b"
    assert cancel.target == "pod llm/pretrain-7b-0 (job 48213)"
