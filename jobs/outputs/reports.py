"""Sending the weekly cost-waste email: one per team and ISO week, exactly once. What it says is built by
`report_content` (from the leaderboard's own numbers, so the email equals the leaderboard page for the same
week) and written by `report_render`.

Who gets it. Active team members with ``Membership.weekly_report`` on and a non-empty address, plus
``Team.extra_report_recipients``, de-duplicated case-insensitively. All of them are in one message's To:
one SMTP transaction per team and week is what "sent once" is recorded against.

Teams without GPU hours in the week get no email and no delivery row: "you used nothing" is not actionable,
and an idle team would otherwise be mailed every Monday forever. If jobs of that week are registered late,
a later run still sends the week (nothing was recorded for it). The preview page renders such weeks anyway.

Exactly once. Before sending, a worker claims the ``ReportDelivery`` row of (team, week): an
``INSERT ... ON CONFLICT DO NOTHING`` on the unique (team, week_start) creates it already claimed, and if the
row exists, one conditional ``UPDATE`` takes it over only when the last attempt failed or when its claim is
older than ``STALE_CLAIM_TIMEOUT`` (the worker died mid-send). Postgres re-checks the UPDATE's condition
after waiting for a concurrent writer's lock, so of two racing workers exactly one wins; the other reports
"in progress" or "already sent". A worker killed mid-send leaves a claimed row, which a later run (the
Celery redelivery of the ``acks_late`` task, or the operator's command) re-sends after the timeout: the
week is sent late, not lost. The one duplicate this cannot exclude is an SMTP server that accepted the
message while the worker died before recording it.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from email.utils import make_msgid
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection
from django.db.models import F, Q
from django.utils import timezone

from jobs.models import ReportDelivery, Team
from jobs.outputs.leaderboard import Period, iso_week
from jobs.outputs.report_content import build_report
from jobs.outputs.report_render import render_report

logger = logging.getLogger(__name__)

# A claim older than this belongs to a dead worker. It must exceed the longest healthy send (SMTP connect +
# DATA, each bounded by EMAIL_TIMEOUT) by a wide margin, or a slow send would be duplicated; and it stays
# below Celery's broker visibility timeout (1 h), so the redelivered task finds the row claimable again.
STALE_CLAIM_TIMEOUT = timedelta(minutes=30)
_MAX_ERROR_CHARS = 2000


class Outcome(StrEnum):
    """What happened to one team's email for one week."""

    SENT = "sent"
    ALREADY_SENT = "already_sent"
    IN_PROGRESS = "in_progress"
    FAILED = "failed"
    DRY_RUN = "dry_run"
    NO_ACTIVITY = "no_activity"
    NO_RECIPIENTS = "no_recipients"


@dataclass(frozen=True)
class DeliveryOutcome:
    """The result of one team's send (or preview) for one week."""

    team_slug: str
    week: str
    status: Outcome
    recipients: tuple[str, ...] = ()
    subject: str = ""
    text: str = ""
    error: str = ""
    message_id: str = ""
    attempts: int = 0

    def describe(self) -> str:
        """One line for operators: what happened and why."""
        who = f"{len(self.recipients)} recipient(s)"
        match self.status:
            case Outcome.SENT:
                return f"sent to {who} (attempt {self.attempts}, {self.message_id})"
            case Outcome.ALREADY_SENT:
                return "skipped (already sent)"
            case Outcome.IN_PROGRESS:
                return "skipped (another worker is sending it right now)"
            case Outcome.FAILED:
                return f"failed (attempt {self.attempts}): {self.error}"
            case Outcome.DRY_RUN:
                return f"dry run, would send to {who} (nothing sent, nothing recorded)"
            case Outcome.NO_ACTIVITY:
                return f"skipped (no GPU hours in {self.week})"
            case Outcome.NO_RECIPIENTS:
                return "skipped (no recipients: every member opted out and no extra addresses)"
        return str(self.status)


def _claim(team: Team, week_start: date, recipients: list[str]) -> str | None:
    """Take the (team, week) row for this worker; returns the claim token, or None when not ours to send."""
    token = secrets.token_hex(16)
    now = timezone.now()
    ReportDelivery.objects.bulk_create(
        [
            ReportDelivery(
                team=team,
                week_start=week_start,
                status=ReportDelivery.Status.CLAIMED,
                claimed_at=now,
                claim_token=token,
                attempts=1,
                recipients=recipients,
            )
        ],
        ignore_conflicts=True,  # INSERT ... ON CONFLICT DO NOTHING: the unique (team, week_start) arbitrates
    )
    rows = ReportDelivery.objects.filter(team=team, week_start=week_start)
    if rows.filter(claim_token=token).exists():
        return token
    claimable = Q(status=ReportDelivery.Status.FAILED) | Q(
        Q(claimed_at__lt=now - STALE_CLAIM_TIMEOUT) | Q(claimed_at__isnull=True),
        status=ReportDelivery.Status.CLAIMED,
    )
    taken = rows.filter(claimable).update(
        status=ReportDelivery.Status.CLAIMED,
        claimed_at=now,
        claim_token=token,
        attempts=F("attempts") + 1,
        recipients=recipients,
        error="",
    )
    return token if taken else None


def _deliver(subject: str, text: str, html: str, recipients: list[str]) -> str:
    domain = urlsplit(settings.SITE_URL).hostname or "localhost"
    # Short on purpose: a Message-ID longer than a header line gets folded, which some tools mangle.
    message_id = make_msgid(domain=domain)
    message = EmailMultiAlternatives(
        subject=subject,
        body=text,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=recipients,
        headers={"Message-ID": message_id, "Auto-Submitted": "auto-generated"},
        connection=get_connection(fail_silently=False),
    )
    message.attach_alternative(html, "text/html")
    message.send(fail_silently=False)
    return message_id


def send_team_report(team: Team, period: Period, *, dry_run: bool = False) -> DeliveryOutcome:
    """Send the team's email for `period` unless it was sent already or is being sent by another worker.

    A dry run renders it and returns subject, recipients and text without sending or writing anything.
    SMTP errors are recorded on the delivery row (status failed) and returned, never raised, so the next
    run retries that week once.
    """
    report = build_report(team, period)
    recipients = list(report.recipients)
    base: dict[str, Any] = {"team_slug": team.slug, "week": period.label, "recipients": report.recipients}
    if not report.has_activity:
        return DeliveryOutcome(status=Outcome.NO_ACTIVITY, **base)
    if not recipients:
        return DeliveryOutcome(status=Outcome.NO_RECIPIENTS, **base)
    subject, text, html = render_report(report)
    if dry_run:
        return DeliveryOutcome(status=Outcome.DRY_RUN, subject=subject, text=text, **base)

    week_start = period.start.date()
    token = _claim(team, week_start, recipients)
    if token is None:
        row = ReportDelivery.objects.get(team=team, week_start=week_start)
        status = Outcome.ALREADY_SENT if row.status == ReportDelivery.Status.SENT else Outcome.IN_PROGRESS
        return DeliveryOutcome(status=status, attempts=row.attempts, message_id=row.message_id, **base)

    mine = ReportDelivery.objects.filter(team=team, week_start=week_start, claim_token=token)
    try:
        message_id = _deliver(subject, text, html, recipients)
    except Exception as exc:  # any failure must release the claim as 'failed', or the week waits 30 min
        error = f"{type(exc).__name__}: {exc}"[:_MAX_ERROR_CHARS]
        logger.warning("weekly report %s %s failed: %s", team.slug, period.label, error)
        mine.update(status=ReportDelivery.Status.FAILED, error=error)
        attempts = mine.values_list("attempts", flat=True).first() or 0
        return DeliveryOutcome(status=Outcome.FAILED, error=error, attempts=attempts, subject=subject, **base)

    if not mine.update(status=ReportDelivery.Status.SENT, sent_at=timezone.now(), message_id=message_id):
        # Our claim went stale and another worker took the row: it will record its own send.
        logger.error("weekly report %s %s: claim lost while sending", team.slug, period.label)
    attempts = mine.values_list("attempts", flat=True).first() or 0
    logger.info("weekly report %s %s sent to %d recipients", team.slug, period.label, len(recipients))
    return DeliveryOutcome(
        status=Outcome.SENT, subject=subject, message_id=message_id, attempts=attempts, **base
    )


def default_period(now: datetime | None = None) -> Period:
    """The ISO week before the one containing `now`, the date taken in settings.TIME_ZONE."""
    local = timezone.localtime(now or timezone.now(), ZoneInfo(settings.TIME_ZONE))
    return iso_week(local.date() - timedelta(days=7))


def send_weekly_reports(
    period: Period | None = None, team_slug: str | None = None, dry_run: bool = False
) -> list[DeliveryOutcome]:
    """Send (or preview) every team's email for `period` (default: last week). Safe to run concurrently:
    each (team, week) is claimed before sending. Raises ValueError for an unknown team slug."""
    period = period or default_period()
    teams = Team.objects.order_by("slug")
    if team_slug is not None:
        teams = teams.filter(slug=team_slug)
        if not teams.exists():
            raise ValueError(f"no team with slug {team_slug!r}")
    outcomes = []
    for team in teams:
        try:
            outcomes.append(send_team_report(team, period, dry_run=dry_run))
        except Exception as exc:  # one team's broken data must not stop the other teams' emails
            logger.exception("weekly report %s %s could not be built", team.slug, period.label)
            outcomes.append(
                DeliveryOutcome(
                    team_slug=team.slug,
                    week=period.label,
                    status=Outcome.FAILED,
                    error=f"{type(exc).__name__}: {exc}"[:_MAX_ERROR_CHARS],
                )
            )
    return outcomes
