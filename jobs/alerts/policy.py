"""The idle-GPU policy: opt-in per team, warn the owner, then after a grace period cancel the job.

Nothing is cancelled unless all of these hold: the job was registered by a scheduler integration (its
cluster-scoped service credential declared the job's owner and team, and no member can change them:
jobs.access.ownership; a job registered by hand, discovered, imported or demo data gets the warning only, and
the
cancel is logged as refused with the reason); the team has an IdlePolicy with `enabled`; its slug is in
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
- kubernetes: suspend the workload that owns the job's pod, not the pod (the Job controller would only
  start a new one): the pod's controller ownerReference names its Job (batch/v1); when that Job is owned
  by a JobSet (jobset.x-k8s.io), the JobSet is suspended, else the Job, with a merge patch
  `{"spec": {"suspend": true}}` (Kubernetes "Suspending a Job": active pods are terminated, the Job stays
  for its owner to resume or delete). When the patch is refused the owning Job (or JobSet) is deleted
  with propagationPolicy=Background. A pod without an owning Job is not touched. Calls go to
  IDLE_POLICY_K8S_API with the service account token (RBAC: efficiency/deploy/idle-policy-rbac.yaml); the
  job's selector must name the pod and namespace exactly.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from jobs.access.ownership import may_cancel
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
    """The action the policy would take on `job`, as written in the warning and the log."""
    if policy.action == IdlePolicy.Action.KUBERNETES:
        ns, pod = _pod(job)
        return (
            f"suspend the Job/JobSet owning pod {ns}/{pod} on {settings.IDLE_POLICY_K8S_API} "
            "(PATCH spec.suspend=true; else DELETE the owning Job)"
            if pod
            else ""
        )
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


class _KubeError(Exception):
    """A Kubernetes API call that failed (transport, or an unexpected status)."""


def _kube(method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """One call to IDLE_POLICY_K8S_API with the service account token: (status, JSON body or {})."""
    token = Path(settings.IDLE_POLICY_K8S_TOKEN_FILE).read_text().strip()
    ca = settings.IDLE_POLICY_K8S_CA_FILE
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/merge-patch+json"
    try:
        response = requests.request(
            method,
            f"{settings.IDLE_POLICY_K8S_API.rstrip('/')}{path}",
            headers=headers,
            data=json.dumps(body) if body is not None else None,
            verify=ca if Path(ca).exists() else True,
            timeout=settings.IDLE_POLICY_COMMAND_TIMEOUT_S,
            allow_redirects=False,
        )
    except requests.RequestException as exc:
        raise _KubeError(f"{method} {path}: {type(exc).__name__}: {exc}") from None
    try:
        payload = response.json()
    except ValueError:
        payload = {}
    return response.status_code, payload if isinstance(payload, dict) else {}


def _owner(obj: dict[str, Any], kinds: tuple[str, ...]) -> dict[str, Any] | None:
    """The object's controller ownerReference when it is of one of `kinds` (else any owner of them)."""
    refs = [r for r in (obj.get("metadata") or {}).get("ownerReferences") or [] if isinstance(r, dict)]
    for ref in sorted(refs, key=lambda r: not r.get("controller")):
        if ref.get("kind") in kinds and isinstance(ref.get("name"), str) and ref["name"]:
            return ref
    return None


def _resource(api_version: str, kind: str, ns: str, name: str) -> str:
    """The API path of a namespaced Job or JobSet of `api_version` (e.g. batch/v1)."""
    plural = {"Job": "jobs", "JobSet": "jobsets"}[kind]
    return f"/apis/{api_version}/namespaces/{ns}/{plural}/{name}"


def _suspend_owner(job: Job) -> tuple[bool, str, str]:
    """Suspend (else delete) the Job or JobSet that owns the job's pod: (done, detail, calls made)."""
    ns, pod = _pod(job)
    if not pod or not settings.IDLE_POLICY_K8S_API:
        return False, "the job's selector names no exact pod, or IDLE_POLICY_K8S_API is not set", ""
    calls: list[str] = []

    def call(method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        status, payload = _kube(method, path, body)
        calls.append(f"{method} {path} -> {status}")
        return status, payload

    try:
        status, pod_obj = call("GET", f"/api/v1/namespaces/{ns}/pods/{pod}")
        if status != 200:
            return False, f"pod {ns}/{pod} not readable (HTTP {status})", "; ".join(calls)
        owner = _owner(pod_obj, ("Job",))
        if owner is None:
            return (
                False,
                f"pod {ns}/{pod} has no owning Job (ownerReferences); a pod without one is not cancelled",
                "; ".join(calls),
            )
        target = ("batch/v1", "Job", owner["name"])
        status, job_obj = call("GET", _resource("batch/v1", "Job", ns, owner["name"]))
        if status == 200 and (jobset := _owner(job_obj, ("JobSet",))) is not None:
            target = (str(jobset.get("apiVersion") or "jobset.x-k8s.io/v1alpha2"), "JobSet", jobset["name"])
        path = _resource(*target[:2], ns, target[2])
        status, _ = call("PATCH", path, {"spec": {"suspend": True}})
        if status == 200:
            return True, f"suspended {target[1]} {ns}/{target[2]}", "; ".join(calls)
        status, _ = call("DELETE", f"{path}?propagationPolicy=Background")
        if status in (200, 202):
            return True, f"deleted {target[1]} {ns}/{target[2]} (suspend refused)", "; ".join(calls)
        return False, f"{target[1]} {ns}/{target[2]}: neither suspended nor deleted", "; ".join(calls)
    except (OSError, _KubeError) as exc:
        return False, f"{type(exc).__name__}: {exc}", "; ".join(calls)


def _warn(policy: IdlePolicy, incident: AlertIncident, now: datetime, dry_run: bool) -> None:
    job = incident.job
    reason = _reason(incident, now)
    to = _owner_email(job)
    what = describe_action(policy, job) or "(no action configured)"
    refusal = may_cancel(job)
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
    then = (
        f"The team's idle-GPU policy will not cancel it ({refusal}). Please release the GPUs yourself."
        if refusal
        else f"Unless its GPUs get busy again within {policy.grace_minutes} minutes, the team's idle-GPU "
        f"policy will {'(dry run: only log that it would) ' if dry_run else ''}cancel it: {what}"
    )
    head = f"Your job {job.external_id} ({job.name or job.model_name}) holds idle GPUs: {reason}."
    body = f"{head}\n\n{then}\n\n{url}\n"
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
    # Who vouched for the job: the credential that registered it, logged with every cancel.
    registered = f"; job registered by {job.registered_by} via {job.registered_via or '?'}"
    if refusal := may_cancel(job):
        actor, outcome = f"{ACTOR} (job not registered by a scheduler)", PolicyAction.Outcome.REFUSED
        reason = f"{refusal}. {reason}"
    elif not team_allowed:
        actor, outcome = f"{ACTOR} (team not in IDLE_POLICY_TEAMS)", PolicyAction.Outcome.REFUSED
    elif dry_run:
        why = "IDLE_POLICY_DRY_RUN" if settings.IDLE_POLICY_DRY_RUN else "the team's dry run"
        actor, outcome = f"{ACTOR} ({why})", PolicyAction.Outcome.DRY_RUN
    else:
        actor, outcome = (
            f"{ACTOR} of team {incident.team.slug} (allowed by IDLE_POLICY_TEAMS)",
            PolicyAction.Outcome.FAILED,
        )
    row = _record(incident, PolicyAction.Kind.CANCEL, outcome, (actor + registered)[:200], what, reason, now)
    if row is None or outcome != PolicyAction.Outcome.FAILED:
        if row is not None:
            log.warning("idle policy: job %s %s: %s (%s)", job.external_id, outcome, what, reason)
        return
    if policy.action == IdlePolicy.Action.KUBERNETES:
        ok, detail, calls = _suspend_owner(job)
        what = f"{what}: {calls}" if calls else what
    else:
        ok, detail = _run_command(job, reason)
    PolicyAction.objects.filter(pk=row.pk).update(
        outcome=PolicyAction.Outcome.DONE if ok else PolicyAction.Outcome.FAILED,
        detail=detail[:2000],
        action=what[:1000],
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
