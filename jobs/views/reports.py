"""The weekly email's preview page: what a team's email for a week says, and its delivery history."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from jobs.access.permissions import readable_team_or_404
from jobs.models import ReportDelivery
from jobs.outputs.leaderboard import iso_week, parse_iso_week
from jobs.outputs.report_content import build_report
from jobs.outputs.report_render import render_report

_HISTORY = 26  # half a year of weeks


def report_preview(request: HttpRequest, slug: str, week: str) -> HttpResponse:
    """Render the team's email for an ISO week (HTML in a sandboxed frame, and the text part) without
    sending it, plus the team's recent deliveries. Addresses are shown to team members and staff only."""
    team = readable_team_or_404(request.user, slug)  # the email names the team's jobs
    try:
        period = parse_iso_week(week)
    except ValueError as exc:
        raise Http404(str(exc)) from None
    report = build_report(team, period)
    subject, text, html = render_report(report)
    user = request.user
    can_see_addresses = bool(
        user.is_staff or (user.is_authenticated and team.memberships.filter(user_id=user.pk).exists())
    )
    context = {
        "team": team,
        "period": period,
        "previous": period.previous(),
        "next": iso_week(period.end.date()),
        "report": report,
        "subject": subject,
        "text": text,
        "html": html,
        "can_see_addresses": can_see_addresses,
        "delivery": ReportDelivery.objects.filter(team=team, week_start=period.start.date()).first(),
        "deliveries": team.report_deliveries.order_by("-week_start")[:_HISTORY],
    }
    return render(request, "jobs/report_preview.html", context)
