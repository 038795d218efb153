"""The idle-GPU policy: opt-in per team, warn the owner, then after a grace period cancel the job.

Nothing is cancelled unless all of these hold: the team has an IdlePolicy with `enabled`; its slug is in
IDLE_POLICY_TEAMS (the operator's allow-list); the job still runs with an open `gpus_idle` incident; the
owner was warned at least `grace_minutes` earlier; neither the team's `dry_run` nor IDLE_POLICY_DRY_RUN is
set. Every step (warning, cancel, dry run, refusal, failure) is a PolicyAction row saying who acted (the
policy and the setting that allowed it), on what (job id, pod), with which command or API call, and why
(the incident's evidence). One warning and one cancel per incident: the row is written before acting
(unique per incident and kind), so a repeated poll or a redelivered task cannot act twice.

Actions:
- command: IDLE_POLICY_COMMAND is run without a shell as `<command> <external_id>`, with
  EFFICIENCY_JOB_ID, EFFICIENCY_JOB_SELECTOR (JSON), EFFICIENCY_JOB_GPUS (JSON) and EFFICIENCY_REASON in its
  environment (example: efficiency/deploy/idle-scancel.sh calling `scancel`);
- kubernetes: DELETE /api/v1/namespaces/<namespace>/pods/<pod> on IDLE_POLICY_K8S_API with the service
  account token (example with RBAC: efficiency/deploy/idle-policy-rbac.yaml); the job's selector must name
  the pod and namespace exactly.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from datetime import datetime, timedelta
from pathlib import Path

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from jobs.alerts import rules
from jobs.models import AlertIncident, IdlePolicy, Job, PolicyAction

log = logging.getLogger(__name__)
ACTOR = "idle-GPU policy"


def _reason(incident: AlertIncident, now: datetime) -> str:
    idle_min = (now - incident.started_at).total_seconds() / 60.0
    parts = [f"{incident.title}", f"idle since {incident.started_at:%Y-%m-%d %H:%M} UTC ({idle_min:.0f} min)"]
    parts += [
        f"{e.get('label')}: {e.get('value')} {e.get('unit', '')}".strip() for e in incident.evidence or []
    ]
    return "; ".join(parts)


def _record(
    incident: AlertIncident, kind: str, outcome: str, actor: str, action: str, reason: str, now: datetime
) -> PolicyAction | None:
    """Write the action row first (the claim); None when this incident already has one of this kind."""
    try:
        with transaction.atomic():
            return PolicyAction.objects.create(
                job=incident.job,
                team=incident.team,
                incident=incident,
                kind=kind,
                outcome=outcome,
                actor=actor,
                target=_target(incident.job),
                action=action[:1000],
                reason=reason,
                at=now,
            )
    except IntegrityError:
        return None


def _target(job: Job) -> str:
    sel = job.selector or {}
    if isinstance(sel.get("pod"), str):
        return f"pod {sel.get('namespace', 'default')}/{sel['pod']} (job {job.external_id})"
    return f"job {job.external_id}"


def _owner_email(job: Job) -> str:
    if not job.owner:
        return ""
    user = get_user_model().objects.filter(username=job.owner, is_active=True).first()
    return getattr(user, "email", "") or ""


def _command(job: Job) -> list[str]:
    return [settings.IDLE_POLICY_COMMAND, job.external_id] if settings.IDLE_POLICY_COMMAND else []


def describe_action(policy: IdlePolicy, job: Job) -> str:
    if policy.action == IdlePolicy.Action.KUBERNETES:
        ns, pod = _pod(job)
        return f"DELETE {settings.IDLE_POLICY_K8S_API}/api/v1/namespaces/{ns}/pods/{pod}" if pod else ""
    return " ".join(_command(job))


def _pod(job: Job) -> tuple[str, str]:
    sel = job.selector or {}
    pod, ns = sel.get("pod"), sel.get("namespace", "default")
    if not isinstance(pod, str) or not isinstance(ns, str):
        return "", ""
    return ns, pod


def _run_command(job: Job, reason: str) -> tuple[bool, str]:
    argv = _command(job)
    if not argv:
        return False, "IDLE_POLICY_COMMAND is not set"
    env = {
        **os.environ,
        "EFFICIENCY_JOB_ID": job.external_id,
        "EFFICIENCY_JOB_SELECTOR": json.dumps(job.selector or {}),
        "EFFICIENCY_JOB_GPUS": json.dumps(job.gpus or []),
        "EFFICIENCY_REASON": reason[:2000],
    }
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=settings.IDLE_POLICY_COMMAND_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    out = (done.stdout + done.stderr).strip()[-2000:]
    return done.returncode == 0, f"exit {done.returncode}: {out}"


def _delete_pod(job: Job) -> tuple[bool, str]:
    ns, pod = _pod(job)
    if not pod or not settings.IDLE_POLICY_K8S_API:
        return False, "the job's selector names no exact pod, or IDLE_POLICY_K8S_API is not set"
    token_file = Path(settings.IDLE_POLICY_K8S_TOKEN_FILE)
    ca = settings.IDLE_POLICY_K8S_CA_FILE
    try:
        token = token_file.read_text().strip()
        response = requests.delete(
            f"{settings.IDLE_POLICY_K8S_API.rstrip('/')}/api/v1/namespaces/{ns}/pods/{pod}",
            headers={"Authorization": f"Bearer {token}"},
            verify=ca if Path(ca).exists() else True,
            timeout=settings.IDLE_POLICY_COMMAND_TIMEOUT_S,
        )
    except (OSError, requests.RequestException) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    return response.status_code in (200, 202), f"HTTP {response.status_code}: {response.text[:500]}"


def _warn(policy: IdlePolicy, incident: AlertIncident, now: datetime, dry_run: bool) -> None:
    job = incident.job
    reason = _reason(incident, now)
    to = _owner_email(job)
    what = describe_action(policy, job) or "(no action configured)"
    row = _record(
        incident,
        PolicyAction.Kind.WARN,
        PolicyAction.Outcome.DONE,
        ACTOR,
        f"email {to or '(no address)'}",
        reason,
        now,
    )
    if row is None:
        return
    url = settings.SITE_URL.rstrip("/") + reverse("job-detail", args=[job.external_id])
    body = (
        f"Your job {job.external_id} ({job.name or job.model_name}) holds idle GPUs: {reason}.\n\n"
        f"Unless its GPUs get busy again within {policy.grace_minutes} minutes, the team's idle-GPU "
        f"policy will {'(dry run: only log that it would) ' if dry_run else ''}cancel it: {what}\n\n{url}\n"
    )
    try:
        if not to:
            raise ValueError("the owner has no email address")
        send_mail(
            f"[efficiency] Job {job.external_id} holds idle GPUs", body, settings.DEFAULT_FROM_EMAIL, [to]
        )
    except Exception as exc:
        PolicyAction.objects.filter(pk=row.pk).update(
            outcome=PolicyAction.Outcome.FAILED, detail=f"{type(exc).__name__}: {exc}"[:2000]
        )
        log.warning("idle policy: warning for job %s not sent: %s", job.external_id, exc)
        return
    log.info("idle policy: warned %s about job %s", to, job.external_id)


def _cancel(policy: IdlePolicy, incident: AlertIncident, now: datetime, dry_run: bool) -> None:
    job = incident.job
    reason = _reason(incident, now)
    what = describe_action(policy, job)
    team_allowed = incident.team.slug in settings.IDLE_POLICY_TEAMS
    if not team_allowed:
        actor, outcome = f"{ACTOR} (team not in IDLE_POLICY_TEAMS)", PolicyAction.Outcome.REFUSED
    elif dry_run:
        why = "IDLE_POLICY_DRY_RUN" if settings.IDLE_POLICY_DRY_RUN else "the team's dry run"
        actor, outcome = f"{ACTOR} ({why})", PolicyAction.Outcome.DRY_RUN
    else:
        actor, outcome = (
            f"{ACTOR} of team {incident.team.slug} (allowed by IDLE_POLICY_TEAMS)",
            PolicyAction.Outcome.FAILED,
        )
    row = _record(incident, PolicyAction.Kind.CANCEL, outcome, actor, what, reason, now)
    if row is None or outcome != PolicyAction.Outcome.FAILED:
        if row is not None:
            log.warning("idle policy: job %s %s: %s (%s)", job.external_id, outcome, what, reason)
        return
    if policy.action == IdlePolicy.Action.KUBERNETES:
        ok, detail = _delete_pod(job)
    else:
        ok, detail = _run_command(job, reason)
    PolicyAction.objects.filter(pk=row.pk).update(
        outcome=PolicyAction.Outcome.DONE if ok else PolicyAction.Outcome.FAILED, detail=detail[:2000]
    )
    log.warning(
        "idle policy: cancel job %s by %s: %s (%s)", job.external_id, what, "done" if ok else "failed", detail
    )


def apply(job_id: int, now: datetime | None = None) -> list[PolicyAction]:
    """Warn and (after the grace period) cancel one job with idle GPUs when its team's policy says so;
    returns the job's policy actions for the current idle incident."""
    now = now or timezone.now()
    job = Job.objects.select_related("team").filter(pk=job_id).first()
    if job is None or job.status != Job.Status.RUNNING:
        return []
    policy = IdlePolicy.objects.filter(team_id=job.team_id, enabled=True).first()
    if policy is None:
        return []
    incident = (
        AlertIncident.objects.filter(job=job, rule=rules.GPUS_IDLE, resolved_at__isnull=True)
        .select_related("job", "team")
        .first()
    )
    if incident is None:
        return []
    dry_run = policy.dry_run or settings.IDLE_POLICY_DRY_RUN
    if now - incident.started_at >= timedelta(minutes=policy.warn_after_minutes):
        _warn(policy, incident, now, dry_run)
    warned = PolicyAction.objects.filter(incident=incident, kind=PolicyAction.Kind.WARN).first()
    if warned is not None and now - warned.at >= timedelta(minutes=policy.grace_minutes):
        _cancel(policy, incident, now, dry_run)
    return list(PolicyAction.objects.filter(incident=incident).order_by("at"))


def enabled_for(job: Job) -> bool:
    return IdlePolicy.objects.filter(team_id=job.team_id, enabled=True).exists()
