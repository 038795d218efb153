"""What a team's weekly cost-waste email says: `build_report` reads the week from the leaderboard's own
numbers, so the email always equals the leaderboard page for the same week (jobs that span the week
boundary count only their hours inside the week): GPU hours, cost, waste and the GPU-hour-weighted MFU from
``leaderboard.team_rows``, the top jobs from ``leaderboard.worst_jobs`` with each one's main finding, and
the recipients (`report_recipients`). `report_render` writes it as text and HTML; `reports` sends it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import Q
from django.urls import reverse

from jobs.evaluation.costs import Amount
from jobs.models import Finding, Job, Membership, PriceEntry, Team
from jobs.models.jobs import FINDING_RANK_ORDER, REMAINDER_CODE
from jobs.outputs.leaderboard import Period, TeamRow, team_rows, worst_jobs

TOP_JOBS = 5


#: A top job whose (known) waste in the week is below this is not worth a block of its own: such jobs are
#: summed into one line ("2 more jobs wasted under $1.00 each: $0.07 in total"). Stated in the email.
MIN_LISTED_WASTE_USD = 1.0


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


def absolute_url(path: str) -> str:
    """The site's URL of a path (SITE_URL + path), for links in an email."""
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
                url=absolute_url(reverse("job-detail", args=[job.external_id])),
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
