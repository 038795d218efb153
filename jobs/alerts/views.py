"""Alert pages: a team's incidents (open and recent), its subscriptions, delivery log and idle-GPU policy;
one's own subscriptions. Reads follow the read policy (READ_SCOPE, jobs.access.permissions: another team's
alerts page is not found under "team"); changes need write access to the team, and personal subscriptions
belong to their user."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from jobs.access.permissions import can_write_team, readable_team_or_404, scope_to_teams
from jobs.alerts.forms import IdlePolicyForm, SubscriptionForm
from jobs.models import AlertDelivery, AlertIncident, AlertSubscription, IdlePolicy, PolicyAction, Team

RECENT_DAYS = 14


def team_alerts(request: HttpRequest, slug: str) -> HttpResponse:
    """Open and recent incidents of a team, its subscriptions and delivery log, its idle-GPU policy."""
    return _team_page(request, readable_team_or_404(request.user, slug))


def _team_page(
    request: HttpRequest, team: Team, form: SubscriptionForm | None = None, status: int = 200
) -> HttpResponse:
    can_write = can_write_team(request.user, team)
    base = AlertIncident.objects.filter(team=team).select_related("job", "finding")
    policy = IdlePolicy.objects.filter(team=team).first()
    context = {
        "team": team,
        "can_write": can_write,
        "open_incidents": base.filter(resolved_at__isnull=True).order_by("-started_at")[:200],
        "recent_incidents": base.filter(
            resolved_at__gte=timezone.now() - timedelta(days=RECENT_DAYS)
        ).order_by("-resolved_at")[:100],
        "recent_days": RECENT_DAYS,
        "subscriptions": AlertSubscription.objects.filter(team=team),
        "deliveries": AlertDelivery.objects.filter(incident__team=team)
        .select_related("incident__job")
        .order_by("-created_at")[:100],
        "form": form or SubscriptionForm(),
        "policy": policy,
        "policy_form": IdlePolicyForm(instance=policy or IdlePolicy(team=team)),
        "policy_allowed": team.slug in settings.IDLE_POLICY_TEAMS,
        "policy_dry_run_forced": settings.IDLE_POLICY_DRY_RUN,
        "policy_actions": PolicyAction.objects.filter(team=team).select_related("job")[:50],
    }
    return render(request, "jobs/alerts_team.html", context, status=status)


def _back(slug: str | None) -> HttpResponseRedirect:
    return HttpResponseRedirect(reverse("team-alerts", args=[slug]) if slug else reverse("my-alerts"))


@require_POST
def team_subscription_add(request: HttpRequest, slug: str) -> HttpResponse:
    team = get_object_or_404(Team, slug=slug)
    if not can_write_team(request.user, team):
        raise PermissionDenied("only members of the team can change its alert subscriptions")
    form = SubscriptionForm(request.POST)
    if not form.is_valid():  # the page again with the form's errors: 400, nothing stored
        return _team_page(request, team, form, status=400)
    form.save(team=team, created_by=request.user)
    messages.success(request, "Subscription added.")
    return _back(slug)


@require_POST
def subscription_delete(request: HttpRequest, pk: int) -> HttpResponse:
    sub = get_object_or_404(AlertSubscription, pk=pk)
    if sub.user_id is not None:
        if sub.user_id != request.user.pk:
            raise PermissionDenied("not your subscription")
    elif sub.team is None or not can_write_team(request.user, sub.team):
        raise PermissionDenied("only members of the team can change its alert subscriptions")
    slug = sub.team.slug if sub.team is not None else None
    sub.delete()
    messages.success(request, "Subscription removed.")
    return _back(slug)


@require_POST
def team_idle_policy(request: HttpRequest, slug: str) -> HttpResponse:
    team = get_object_or_404(Team, slug=slug)
    if not can_write_team(request.user, team):
        raise PermissionDenied("only members of the team can change its idle-GPU policy")
    policy = IdlePolicy.objects.filter(team=team).first() or IdlePolicy(team=team)
    form = IdlePolicyForm(request.POST, instance=policy)
    if form.is_valid():
        saved = form.save(commit=False)
        saved.updated_by = request.user
        saved.save()
        messages.success(request, "Idle-GPU policy saved.")
    else:
        messages.error(
            request,
            "Idle-GPU policy not saved: " + "; ".join(str(m) for e in form.errors.values() for m in e),
        )
    return _back(slug)


def my_alerts(request: HttpRequest) -> HttpResponse:
    """One's own subscriptions (incidents of jobs one owns) and the incidents of those jobs."""
    user = request.user
    status = 200
    if request.method == "POST":
        form = SubscriptionForm(request.POST)
        if form.is_valid():
            form.save(user=user, created_by=user)
            messages.success(request, "Subscription added.")
            return _back(None)
        status = 400  # the form again with its errors
    else:
        form = SubscriptionForm()
    incidents = (
        scope_to_teams(AlertIncident.objects.filter(job__owner=user.get_username()), user)
        .select_related("job", "finding")
        .order_by("-started_at")[:100]
    )
    return render(
        request,
        "jobs/alerts_mine.html",
        {
            "form": form,
            "subscriptions": AlertSubscription.objects.filter(user_id=user.pk or 0),
            "incidents": incidents,
        },
        status=status,
    )
