"""Notifications of incidents: email, a generic JSON webhook, a Slack-compatible incoming webhook and an
Alertmanager-compatible webhook payload; each (incident, subscription, event) delivered once.

Exactly once, as the weekly email (jobs.outputs.reports): the AlertDelivery row exists before anything is
sent (jobs.alerts.incidents creates it with ON CONFLICT DO NOTHING); a sender first claims it with one
conditional UPDATE (pending, failed, or claimed longer than ALERT_STALE_CLAIM_S ago by a worker that died),
sends, then marks it sent under its own claim token. Two workers never both win the claim; a worker killed
after claiming leaves a claimed row that the next attempt (acks_late redelivery, the task's retry or the
beat sweep) takes over once the claim is stale. The one duplicate this cannot exclude is a receiver that
accepted the message while the worker died before recording it; webhooks carry the delivery id
(`X-Efficiency-Delivery`, Alertmanager's `groupKey`) so receivers can de-duplicate that too.

Failures: timeouts, connection errors, HTTP 408/425/429/5xx and SMTP 4xx are transient (the row is marked
failed and the Celery task retries with exponential backoff up to ALERT_DELIVERY_MAX_ATTEMPTS); other HTTP
4xx, SMTP 5xx and a missing address are permanent (gave up at once, the reason logged on the row).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets as pysecrets
import smtplib
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.utils import make_msgid
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection
from django.db.models import F, Q
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from jobs.alerts import outbound, secrets
from jobs.models import AlertDelivery, AlertIncident, AlertSubscription

log = logging.getLogger(__name__)
_MAX_ERROR = 2000
_TRANSIENT_HTTP = {408, 425, 429}


class Outcome(StrEnum):
    SENT = "sent"
    ALREADY_SENT = "already_sent"
    IN_PROGRESS = "in_progress"
    RETRY = "retry"
    GAVE_UP = "gave_up"
    MISSING = "missing"


class DeliveryError(Exception):
    """A failed send; `transient` says whether trying again may help."""

    def __init__(self, message: str, *, transient: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status


@dataclass(frozen=True)
class Message:
    """What every channel says about one incident event."""

    event: str
    rule: str
    rule_label: str
    title: str
    job_id: str
    job_name: str
    team: str
    owner: str
    started_at: datetime
    resolved_at: datetime | None
    finding_code: str
    finding_title: str
    finding_waste: float | None
    evidence: list[dict[str, Any]]
    job_url: str
    alerts_url: str
    incident_id: int
    delivery_id: int

    @property
    def headline(self) -> str:
        verb = "RESOLVED" if self.event == AlertDelivery.Event.RESOLVED else "OPEN"
        return f"[efficiency] {verb}: {self.rule_label} on job {self.job_id} ({self.team})"


def _absolute(path: str) -> str:
    return settings.SITE_URL.rstrip("/") + path


def build_message(delivery: AlertDelivery) -> Message:
    incident: AlertIncident = delivery.incident
    job = incident.job
    finding = incident.finding
    return Message(
        event=delivery.event,
        rule=incident.rule,
        rule_label=incident.get_rule_display(),
        title=incident.title,
        job_id=job.external_id,
        job_name=job.name,
        team=incident.team.slug,
        owner=job.owner,
        started_at=incident.started_at,
        resolved_at=incident.resolved_at,
        finding_code=incident.finding_code,
        finding_title=finding.title if finding else "",
        finding_waste=finding.waste_per_day_usd if finding else None,
        evidence=list(incident.evidence or []),
        job_url=_absolute(reverse("job-detail", args=[job.external_id])),
        alerts_url=_absolute(reverse("team-alerts", args=[incident.team.slug])),
        incident_id=incident.pk,
        delivery_id=delivery.pk,
    )


# -------------------------------------------------------------------------------------------- payloads


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def json_payload(m: Message) -> dict[str, Any]:
    """The generic webhook body (versioned)."""
    return {
        "version": 1,
        "event": m.event,
        "delivery_id": m.delivery_id,
        "incident": {
            "id": m.incident_id,
            "rule": m.rule,
            "title": m.title,
            "state": "resolved" if m.resolved_at else "open",
            "started_at": _iso(m.started_at),
            "resolved_at": _iso(m.resolved_at),
            "evidence": m.evidence,
            "finding": {
                "code": m.finding_code,
                "title": m.finding_title,
                "waste_per_day_usd": m.finding_waste,
            }
            if m.finding_code
            else None,
        },
        "job": {
            "external_id": m.job_id,
            "name": m.job_name,
            "team": m.team,
            "owner": m.owner,
            "url": m.job_url,
        },
    }


def slack_payload(m: Message) -> dict[str, Any]:
    """A Slack incoming-webhook body (mrkdwn text; Mattermost and others accept the same)."""
    icon = ":white_check_mark:" if m.event == AlertDelivery.Event.RESOLVED else ":rotating_light:"

    def esc(text: str) -> str:
        return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    lines = [f"{icon} *{esc(m.headline)}*", esc(m.title)]
    if m.finding_code:
        lines.append(f"Finding: `{esc(m.finding_code)}` {esc(m.finding_title)}")
    lines.append(f"<{m.job_url}|Open the job page>")
    return {"text": "\n".join(lines)}


def alertmanager_payload(m: Message) -> dict[str, Any]:
    """Alertmanager's webhook_config body (version 4), one alert: receivers written for Alertmanager
    (PagerDuty bridges, incident tools) take it as is."""
    status = "resolved" if m.event == AlertDelivery.Event.RESOLVED else "firing"
    labels = {"alertname": f"efficiency_{m.rule}", "rule": m.rule, "job_id": m.job_id, "team": m.team}
    if m.finding_code:
        labels["finding"] = m.finding_code
    annotations = {"summary": m.title, "description": m.finding_title or m.title}
    fingerprint = hashlib.sha256(f"{m.incident_id}".encode()).hexdigest()[:16]
    alert = {
        "status": status,
        "labels": labels,
        "annotations": annotations,
        "startsAt": _iso(m.started_at),
        "endsAt": _iso(m.resolved_at) or "0001-01-01T00:00:00Z",
        "generatorURL": m.job_url,
        "fingerprint": fingerprint,
    }
    return {
        "version": "4",
        "groupKey": f"efficiency/incident/{m.incident_id}",
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "efficiency",
        "groupLabels": {"alertname": labels["alertname"]},
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": m.alerts_url,
        "alerts": [alert],
    }


# -------------------------------------------------------------------------------------------- senders


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> int:
    """POST through jobs.alerts.outbound (internal addresses refused, no redirects, bounded time and reply
    size); the status code only: a receiver's reply body is never stored or shown (issue 23: a
    subscription to Prometheus' query API showed its answer on the alerts page)."""
    data = json.dumps(body, separators=(",", ":"), default=str).encode()
    try:
        reply = outbound.post(
            url,
            data,
            {"Content-Type": "application/json", "User-Agent": "efficiency-alerts/1", **headers},
            allowed=outbound.AllowList.parse(settings.ALERT_ALLOWED_HOSTS),
            timeout_s=settings.ALERT_WEBHOOK_TIMEOUT_S,
            max_bytes=settings.ALERT_WEBHOOK_MAX_RESPONSE_BYTES,
        )
    except outbound.OutboundError as exc:
        raise DeliveryError(str(exc), transient=exc.transient) from exc
    status = reply.status
    if 200 <= status < 300:
        return status
    if 300 <= status < 400:
        raise DeliveryError(f"HTTP {status}: redirects are not followed", transient=False, status=status)
    transient = status >= 500 or status in _TRANSIENT_HTTP
    raise DeliveryError(f"HTTP {status}", transient=transient, status=status)


def _send_webhook(sub: AlertSubscription, m: Message) -> int:
    url = secrets.reveal(sub.url_encrypted)
    if not url:
        raise DeliveryError("no webhook URL stored (or SECRET_KEY changed): set it again", transient=False)
    secret = secrets.reveal(sub.secret_encrypted)
    headers = {"X-Efficiency-Delivery": str(m.delivery_id), "X-Efficiency-Event": m.event}
    if sub.channel == AlertSubscription.Channel.SLACK:
        return _post(url, slack_payload(m), {})
    if sub.channel == AlertSubscription.Channel.ALERTMANAGER:
        if secret:
            headers["Authorization"] = f"Bearer {secret}"
        return _post(url, alertmanager_payload(m), headers)
    body = json_payload(m)
    if secret:
        raw = json.dumps(body, separators=(",", ":"), default=str).encode()
        headers["X-Efficiency-Signature"] = (
            "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
        )
    return _post(url, body, headers)


def _recipient(sub: AlertSubscription) -> str:
    if sub.email:
        return sub.email
    return sub.user.email if sub.user is not None and sub.user.email else ""


def _send_email(sub: AlertSubscription, m: Message) -> None:
    to = _recipient(sub)
    if not to:
        raise DeliveryError("no email address", transient=False)
    context = {"m": m}
    domain = urlsplit(settings.SITE_URL).hostname or "localhost"
    message = EmailMultiAlternatives(
        subject=m.headline,
        body=render_to_string("emails/alert.txt", context),
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[to],
        headers={"Message-ID": make_msgid(domain=domain), "Auto-Submitted": "auto-generated"},
        connection=get_connection(fail_silently=False),
    )
    message.attach_alternative(render_to_string("emails/alert.html", context), "text/html")
    try:
        message.send(fail_silently=False)
    except smtplib.SMTPResponseException as exc:
        raise DeliveryError(
            f"SMTP {exc.smtp_code}: {exc.smtp_error!r}", transient=400 <= exc.smtp_code < 500
        ) from exc
    except smtplib.SMTPRecipientsRefused as exc:
        codes = [code for code, _ in exc.recipients.values()]
        raise DeliveryError(
            f"SMTP refused {to}: {codes}", transient=all(400 <= c < 500 for c in codes)
        ) from exc
    except (OSError, smtplib.SMTPException) as exc:
        raise DeliveryError(f"{type(exc).__name__}: {exc}", transient=True) from exc


def _send(delivery: AlertDelivery) -> int | None:
    sub = delivery.subscription
    m = build_message(delivery)
    if sub.channel == AlertSubscription.Channel.EMAIL:
        _send_email(sub, m)
        return None
    return _send_webhook(sub, m)


# ------------------------------------------------------------------------------------- exactly once


def _claim(delivery_id: int, now: datetime) -> str | None:
    """Take the delivery for this worker; returns the claim token, or None when it is not ours to send."""
    token = pysecrets.token_hex(16)
    stale = now - timedelta(seconds=settings.ALERT_STALE_CLAIM_S)
    claimable = Q(status__in=[AlertDelivery.Status.PENDING, AlertDelivery.Status.FAILED]) | Q(
        Q(claimed_at__lt=stale) | Q(claimed_at__isnull=True), status=AlertDelivery.Status.CLAIMED
    )
    taken = (
        AlertDelivery.objects.filter(pk=delivery_id)
        .filter(claimable)
        .update(
            status=AlertDelivery.Status.CLAIMED, claimed_at=now, claim_token=token, attempts=F("attempts") + 1
        )
    )
    return token if taken else None


def send_delivery(delivery_id: int, now: datetime | None = None) -> Outcome:
    """Send one delivery unless it was sent or is being sent; record the result on the row."""
    now = now or timezone.now()
    token = _claim(delivery_id, now)
    if token is None:
        row = AlertDelivery.objects.filter(pk=delivery_id).values_list("status", flat=True).first()
        if row is None:
            return Outcome.MISSING
        return {
            AlertDelivery.Status.SENT: Outcome.ALREADY_SENT,
            AlertDelivery.Status.GAVE_UP: Outcome.GAVE_UP,
        }.get(AlertDelivery.Status(row), Outcome.IN_PROGRESS)
    mine = AlertDelivery.objects.filter(pk=delivery_id, claim_token=token)
    delivery = AlertDelivery.objects.select_related(
        "incident__job", "incident__team", "incident__finding", "subscription__user"
    ).get(pk=delivery_id)
    try:
        status = _send(delivery)
    except DeliveryError as exc:
        error = str(exc)[:_MAX_ERROR]
        retry = exc.transient and delivery.attempts < settings.ALERT_DELIVERY_MAX_ATTEMPTS
        state = AlertDelivery.Status.FAILED if retry else AlertDelivery.Status.GAVE_UP
        mine.update(status=state, error=error, response_status=exc.status)
        log.warning("alert delivery %s (%s) failed (%s): %s", delivery_id, delivery.channel, state, error)
        return Outcome.RETRY if retry else Outcome.GAVE_UP
    except Exception as exc:  # a bug or bad data: record it and give up rather than hold the claim
        error = f"{type(exc).__name__}: {exc}"[:_MAX_ERROR]
        mine.update(status=AlertDelivery.Status.GAVE_UP, error=error)
        log.exception("alert delivery %s crashed", delivery_id)
        return Outcome.GAVE_UP
    if not mine.update(
        status=AlertDelivery.Status.SENT, sent_at=timezone.now(), error="", response_status=status
    ):
        log.error("alert delivery %s: claim lost while sending", delivery_id)
    log.info("alert delivery %s sent (%s %s)", delivery_id, delivery.channel, delivery.event)
    return Outcome.SENT


def backoff_s(attempts: int) -> float:
    """Seconds before attempt `attempts + 1`: ALERT_RETRY_BACKOFF_S x 2^(attempts - 1), at most 1 h."""
    return min(settings.ALERT_RETRY_BACKOFF_S * 2 ** max(attempts - 1, 0), 3600.0)


def attempts_of(delivery_id: int) -> int:
    return AlertDelivery.objects.filter(pk=delivery_id).values_list("attempts", flat=True).first() or 0


def due_deliveries(now: datetime | None = None) -> list[int]:
    """Deliveries the beat sweep should (re)queue: pending for over a minute (the queued task was lost),
    failed past their backoff, or claimed by a worker that died. Queuing one twice is harmless (claims)."""
    now = now or timezone.now()
    out = []
    stale = now - timedelta(seconds=settings.ALERT_STALE_CLAIM_S)
    rows = AlertDelivery.objects.filter(
        Q(status=AlertDelivery.Status.PENDING, created_at__lt=now - timedelta(minutes=1))
        | Q(status=AlertDelivery.Status.FAILED)
        | Q(status=AlertDelivery.Status.CLAIMED, claimed_at__lt=stale)
    ).values_list("id", "status", "attempts", "claimed_at")
    for pk, status, attempts, claimed_at in rows[:500]:
        if (
            status == AlertDelivery.Status.FAILED
            and claimed_at
            and claimed_at + timedelta(seconds=backoff_s(attempts)) > now
        ):
            continue
        out.append(pk)
    return out
