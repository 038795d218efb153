"""The weekly cost-waste email: one per team and ISO week, built from the leaderboard's own numbers.

Numbers. GPU hours, cost, waste and the GPU-hour-weighted MFU come from ``leaderboard.team_rows`` and the
top jobs from ``leaderboard.worst_jobs``, so the email always equals the leaderboard page for the same week
(jobs that span the week boundary count only their hours inside the week).

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
import re
import secrets
import textwrap
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
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from jobs.evaluation.costs import Amount, format_usd
from jobs.evaluation.kpis import CONVENTION_LABELS
from jobs.models import Finding, Job, Membership, PriceEntry, ReportDelivery, Team
from jobs.models.jobs import FINDING_RANK_ORDER, REMAINDER_CODE
from jobs.outputs.leaderboard import Period, TeamRow, iso_week, team_rows, worst_jobs
from jobs.templatetags import units

logger = logging.getLogger(__name__)

# A claim older than this belongs to a dead worker. It must exceed the longest healthy send (SMTP connect +
# DATA, each bounded by EMAIL_TIMEOUT) by a wide margin, or a slow send would be duplicated; and it stays
# below Celery's broker visibility timeout (1 h), so the redelivered task finds the row claimable again.
STALE_CLAIM_TIMEOUT = timedelta(minutes=30)
TOP_JOBS = 5
#: A top job whose (known) waste in the week is below this is not worth a block of its own: such jobs are
#: summed into one line ("2 more jobs wasted under $1.00 each: $0.07 in total"). Stated in the email.
MIN_LISTED_WASTE_USD = 1.0
#: The text part is wrapped at this width (RFC 5322 recommends lines of at most 78 characters).
TEXT_WIDTH = 78
_MAX_ERROR_CHARS = 2000
_NA = "n/a"


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
class JobLine:
    """One of the week's top wasting jobs, with its main finding (the one explaining the most $/day)."""

    external_id: str
    name: str
    model_name: str
    gpus: str
    mfu: float | None
    gpu_hours: float
    waste_usd: float
    waste_is_lower_bound: bool
    waste_unknown_reason: str
    url: str
    finding_title: str
    finding_recommendation: str
    finding_waste_per_day_usd: float | None
    bar_pct: int


@dataclass(frozen=True)
class WeeklyReport:
    """A team's week: its leaderboard row, the previous week's, its rank and its top wasting jobs."""

    team: Team
    period: Period
    previous: Period
    row: TeamRow | None
    previous_row: TeamRow | None
    rank: int | None
    teams_ranked: int
    top_jobs: tuple[JobLine, ...]
    price_tiers: tuple[str, ...]
    recipients: tuple[str, ...]
    #: Top jobs whose known waste was under MIN_LISTED_WASTE_USD: how many and their waste (one line).
    small_jobs: int = 0
    small_jobs_waste_usd: float = 0.0

    @property
    def has_activity(self) -> bool:
        """True when the team used any GPU hours in the week."""
        return self.row is not None and self.row.gpu_hours > 0

    @property
    def gpu_hours(self) -> float:
        """GPU hours inside the week."""
        return self.row.gpu_hours if self.row else 0.0

    @property
    def cost_usd(self) -> float:
        """Cost in USD of the hours inside the week."""
        return self.row.cost_usd if self.row else 0.0

    @property
    def waste_usd(self) -> float | None:
        """Waste in USD of the hours inside the week; None when some job's waste is unknown."""
        return self.row.waste_usd if self.row else 0.0

    @property
    def waste(self) -> Amount:
        """The week's waste as the leaderboard shows it: exact or "at least" with the reason."""
        return self.row.waste if self.row else Amount(0.0)

    @property
    def cost(self) -> Amount:
        """The week's cost as the leaderboard shows it."""
        return self.row.cost if self.row else Amount(0.0)

    @property
    def weighted_mfu(self) -> float | None:
        """GPU-hour-weighted MFU (0-1), None when no job of the week has an MFU."""
        return self.row.weighted_mfu if self.row else None

    @property
    def previous_waste_usd(self) -> float | None:
        """Last week's waste; None when the team had no jobs then (as the leaderboard shows it)."""
        return self.previous_row.waste_usd if self.previous_row else None

    @property
    def waste_change_usd(self) -> float | None:
        """Waste this week minus last week, the leaderboard's trend column."""
        prev, now = self.previous_waste_usd, self.waste_usd
        return None if prev is None or now is None else now - prev

    @property
    def week_start(self) -> datetime:
        """Monday 00:00 UTC of the week."""
        return self.period.start


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


# --------------------------------------------------------------------------------------------- building


def report_recipients(team: Team) -> list[str]:
    """Opted-in active members with an address, then the team's extra addresses; no duplicates."""
    members = (
        Membership.objects.filter(team=team, weekly_report=True, user__is_active=True)
        .exclude(user__email="")
        .select_related("user")
        .order_by("user__username")
    )
    seen: set[str] = set()
    out: list[str] = []
    for address in [m.user.email for m in members] + list(team.extra_report_recipients or []):
        address = (address or "").strip()
        # Mail systems treat the domain (and in practice the local part) case-insensitively.
        if address and address.lower() not in seen:
            seen.add(address.lower())
            out.append(address)
    return out


def _absolute(path: str) -> str:
    return settings.SITE_URL.rstrip("/") + path


def _main_findings(job_ids: list[int]) -> dict[int, Finding]:
    best: dict[int, Finding] = {}
    # The job page's order (FINDING_RANK_ORDER); the unexplained remainder is never a job's main finding.
    for finding in (
        Finding.objects.filter(job_id__in=job_ids)
        .exclude(code=REMAINDER_CODE)
        .order_by("job_id", *FINDING_RANK_ORDER)
    ):
        best.setdefault(finding.job_id, finding)
    return best


def _job_lines(jobs: list[Job]) -> tuple[JobLine, ...]:
    # The jobs come from leaderboard.worst_jobs(), which sets gpu_h and waste_in_period (queryset
    # annotations) and waste_in_period_is_lower_bound on each instance: attributes the model does not declare.
    findings = _main_findings([j.pk for j in jobs])
    top = max((j.waste_in_period for j in jobs), default=0.0)  # type: ignore[attr-defined]
    lines = []
    for job in jobs:
        finding = findings.get(job.pk)
        gpu = job.gpu_model.name if job.gpu_model else (job.gpu_model_name or "GPU")
        lines.append(
            JobLine(
                external_id=job.external_id,
                name=job.name or job.external_id,
                model_name=job.model_name,
                gpus=f"{job.gpu_count} × {gpu}",
                mfu=job.mfu,
                gpu_hours=job.gpu_h,  # type: ignore[attr-defined]
                waste_usd=job.waste_in_period,  # type: ignore[attr-defined]
                waste_is_lower_bound=job.waste_in_period_is_lower_bound,  # type: ignore[attr-defined]
                waste_unknown_reason=job.waste_unknown_reason if job.waste_in_period_is_lower_bound else "",  # type: ignore[attr-defined]
                url=_absolute(reverse("job-detail", args=[job.external_id])),
                finding_title=finding.title if finding else "",
                finding_recommendation=finding.recommendation if finding else "",
                finding_waste_per_day_usd=finding.waste_per_day_usd if finding else None,
                bar_pct=round(100 * job.waste_in_period / top) if top > 0 else 0,  # type: ignore[attr-defined]
            )
        )
    return tuple(lines)


def _price_tiers(team: Team, period: Period) -> tuple[str, ...]:
    tiers = (
        Job.objects.filter(team=team, started_at__lt=period.end)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=period.start))
        .values_list("price_tier", flat=True)
        .distinct()
    )
    labels = dict(PriceEntry.Tier.choices)
    # A job without a tier is priced at the organisation default (see jobs.evaluation.costs / settings).
    names = {labels.get(t or settings.DEFAULT_PRICE_TIER, t) for t in tiers}
    return tuple(sorted(names))


def build_report(team: Team, period: Period, *, now: datetime | None = None) -> WeeklyReport:
    """The team's numbers for `period` and the one before, its leaderboard rank and its top wasting jobs."""
    rows = team_rows(period, now)
    position = next((i for i, r in enumerate(rows) if r.team_id == team.pk), None)
    previous = period.previous()
    previous_row = next((r for r in team_rows(previous, now) if r.team_id == team.pk), None)
    lines = _job_lines(worst_jobs(period, limit=TOP_JOBS, team_id=team.pk, now=now))
    # A lower bound under the threshold stays listed: its total is unknown, so it may be large.
    small = [j for j in lines if not j.waste_is_lower_bound and j.waste_usd < MIN_LISTED_WASTE_USD]
    return WeeklyReport(
        team=team,
        period=period,
        previous=previous,
        row=rows[position] if position is not None else None,
        previous_row=previous_row,
        rank=position + 1 if position is not None else None,
        teams_ranked=len(rows),
        top_jobs=tuple(j for j in lines if j not in small),
        price_tiers=_price_tiers(team, period),
        recipients=tuple(report_recipients(team)),
        small_jobs=len(small),
        small_jobs_waste_usd=sum(j.waste_usd for j in small),
    )


# --------------------------------------------------------------------------------------------- rendering


def _pct(value: float | None) -> str:
    return _NA if value is None else units.pct(value)


def _usd(value: float | None) -> str:
    return _NA if value is None else units.usd(value)


def _hours(value: float | None) -> str:
    return _NA if value is None else f"{units.num(value, 1)} GPU-h"


def _signed_usd(value: float | None) -> str:
    return _NA if value is None else units.signed_usd(value)


def _short(amount: Amount) -> str:
    """An amount without its reason, for the subject line: '$1,234' or 'at least $56'."""
    text = format_usd(amount.usd) if amount.usd is not None else "unknown"
    return f"at least {text}" if amount.lower_bound else text


def _one_line(value: str) -> str:
    # Header injection guard: team names are free text, and a newline in a subject is refused by Django.
    return " ".join(value.split())


def _bar(value: float, top: float) -> int:
    return round(100 * value / top) if top > 0 else 0


def _context(report: WeeklyReport) -> dict[str, object]:
    period, previous = report.period, report.previous
    last_day = period.end - timedelta(days=1)
    share = report.row.waste_share if report.row else None
    prev = report.previous_row
    change = report.waste_change_usd
    if change is None and report.previous_row is not None:
        change_s = f"{_NA} (waste only bounded below in one of the weeks)"
    elif change is None:
        change_s = f"{_NA} (no jobs in {previous.label})"
    else:
        change_s = f"{_signed_usd(change)} (from {_usd(report.previous_waste_usd)} in {previous.label})"
    rank_s = f"#{report.rank} of {report.teams_ranked} teams" if report.rank else _NA
    kpis = [
        ("GPU hours", _hours(report.gpu_hours), "GPUs × hours each job ran inside the week"),
        ("Cost", report.cost.text(), "USD for those hours, at each job's price tier"),
        ("Weighted MFU", _pct(report.weighted_mfu), "model FLOPs utilisation, weighted by GPU hours"),
        (
            "Waste",
            f"{report.waste.text()} ({'at least ' if report.waste.lower_bound else ''}{_pct(share)} of cost)",
            "USD lost: per job cost × max(idle share, 1 − MFU ÷ reference MFU); no MFU: the idle part only",
        ),
        (f"Waste vs {previous.label}", change_s, "positive = more waste than last week"),
        ("Leaderboard", rank_s, "teams ranked by weighted MFU, as on the leaderboard page"),
    ]
    top = max(report.cost_usd, prev.cost_usd if prev else 0.0)
    chart = [
        (f"Cost {period.label}", _usd(report.cost_usd), _bar(report.cost_usd, top), "#4a6fa5"),
        (
            f"Waste {period.label}",
            report.waste.text(),
            _bar(report.row.waste_lower_bound_usd if report.row else 0.0, top),
            "#c0392b",
        ),
    ]
    if prev:
        chart += [
            (f"Cost {previous.label}", _usd(prev.cost_usd), _bar(prev.cost_usd, top), "#9fb3d1"),
            (f"Waste {previous.label}", prev.waste.text(), _bar(prev.waste_lower_bound_usd, top), "#e2a39c"),
        ]
    jobs = [
        {
            "line": line,
            "mfu": _pct(line.mfu),
            "gpu_hours": _hours(line.gpu_hours),
            "waste": Amount(line.waste_usd, line.waste_is_lower_bound, line.waste_unknown_reason).text(),
            "finding_waste": (
                "impact unknown"
                if line.finding_title and line.finding_waste_per_day_usd is None
                else _usd(line.finding_waste_per_day_usd) + "/day"
            ),
        }
        for line in report.top_jobs
    ]
    return {
        "report": report,
        "team_name": _one_line(report.team.name),
        "week": period.label,
        "dates": f"{period.start:%a %d %b} – {last_day:%a %d %b %Y} (UTC)",
        "kpis": kpis,
        "chart": [{"label": c[0], "value": c[1], "pct": c[2], "color": c[3]} for c in chart],
        "jobs": jobs,
        "small_jobs": (
            f"{report.small_jobs} more job{'s' if report.small_jobs != 1 else ''} wasted under "
            f"{_usd(MIN_LISTED_WASTE_USD)} each: {_usd(report.small_jobs_waste_usd)} in total."
            if report.small_jobs
            else ""
        ),
        "min_listed": _usd(MIN_LISTED_WASTE_USD),
        "price_tiers": ", ".join(report.price_tiers) or _NA,
        "target_mfu": _pct(settings.TARGET_MFU),
        "target_mfu_fp8": _pct(settings.TARGET_MFU_FP8),
        "mfu_convention": CONVENTION_LABELS[settings.MFU_FLOPS_CONVENTION],
        "waste_unknown": report.row.waste_unknown_reason if report.row else "",
        "mfu_fallback": report.row.jobs_mfu_fallback if report.row else 0,
        "low_coverage": report.row.jobs_low_coverage if report.row else 0,
        "leaderboard_url": _absolute(reverse("leaderboard")) + f"?week={period.label}",
        "team_url": _absolute(reverse("team-detail", args=[report.team.slug])),
    }


def render_report(report: WeeklyReport) -> tuple[str, str, str]:
    """(subject, text part, HTML part). The HTML part escapes user text; the text part is raw by design,
    so neither may be embedded in a page without escaping."""
    ctx = _context(report)
    # ASCII separators: a non-ASCII subject is RFC 2047-encoded and folded, which some clients show oddly.
    if report.has_activity:
        subject = (
            f"{ctx['team_name']} {report.period.label}: {_short(report.waste)} wasted of "
            f"{_short(report.cost)}, MFU {_pct(report.weighted_mfu)}"
        )
    else:
        subject = f"{ctx['team_name']} {report.period.label}: no GPU hours"
    ctx["subject"] = subject
    text = wrap_text(render_to_string("emails/weekly_report.txt", ctx))
    html = render_to_string("emails/weekly_report.html", ctx)
    return subject, text, html


def wrap_text(text: str, width: int = TEXT_WIDTH) -> str:
    """`text` with every line longer than `width` wrapped at word boundaries, continuation lines indented
    like the line's text (after a "- " or "1. " marker), so lists stay lists. Words longer than the width
    (URLs) are kept whole on a line of their own: a broken URL is worse than a long line."""
    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[: len(line) - len(line.lstrip(" "))]
        marker = re.match(r"\s*(?:-\s|\d+\.\s)?\s*", line)
        indent = " " * (marker.end() if marker else 0)
        wrapped = textwrap.wrap(
            line[len(lead) :],
            width=width,
            initial_indent=lead,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
        out.extend(wrapped or [line])
    return "\n".join(out)


# --------------------------------------------------------------------------------------------- sending


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
