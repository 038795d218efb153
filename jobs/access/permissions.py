"""Who may read and who may write what: one rule for the pages, the REST API, exports, emails and alerts.

Writes are team-scoped: members of the owning team, and staff (`can_write_team`, `writable_team_ids`).
A team's monthly budget is a spending limit set for the team, not by any member: its leads and staff
(`can_set_budget`).

Reads follow the READ_SCOPE setting (see README, "Access"):

- ``team`` (the default): a member reads the jobs, findings, artifacts, costs, baselines and alerts of
  their own teams; staff read everything. Other teams appear only as aggregates (leaderboard rows, team
  totals), never with a job name or link. A job of another team answers 404, not 403, so that its
  existence is not leaked.
- ``all``: every logged-in user (or token) reads every team's jobs, as before this setting existed.

An API token reads what its user may read (the token authenticates as its user). Every read path goes
through `readable_team_ids` / `readable_jobs` / `can_read_team`; nothing else decides.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.http import Http404

from jobs.models import Job, Membership, Team

READ_SCOPES = ("team", "all")


def is_staff(user: Any) -> bool:
    """Staff or superuser: reads everything, writes to every team, may register any selector or PromQL."""
    return bool(getattr(user, "is_staff", False) or getattr(user, "is_superuser", False))


def _member_team_ids(user: Any) -> set[int]:
    if not getattr(user, "is_authenticated", False):
        return set()
    return set(Team.objects.filter(memberships__user=user).values_list("id", flat=True))


def _reads_everything(user: Any) -> bool:
    return is_staff(user) or settings.READ_SCOPE == "all"


def writable_team_ids(user: Any) -> set[int] | None:
    """Teams the user may write to; None means all (staff)."""
    if is_staff(user):
        return None
    return _member_team_ids(user)


def can_write_team(user: Any, team: Team | int) -> bool:
    """True when `user` may create or change objects owned by `team`."""
    team_id = team if isinstance(team, int) else team.pk
    allowed = writable_team_ids(user)
    return allowed is None or team_id in allowed


def can_set_budget(user: Any, team: Team) -> bool:
    """True when `user` may set or clear `team`'s monthly budget: staff, or a lead of that team."""
    if is_staff(user):
        return True
    if not getattr(user, "is_authenticated", False):
        return False
    return Membership.objects.filter(team=team, user=user, role=Membership.Role.LEAD).exists()


def readable_team_ids(user: Any) -> set[int] | None:
    """Teams whose jobs (and everything hanging off them) `user` may read; None means all.

    Staff read all; with READ_SCOPE=all every authenticated user does; otherwise the user's teams.
    An anonymous user reads nothing (the login middleware keeps them out anyway).
    """
    if not getattr(user, "is_authenticated", False):
        return set()
    if _reads_everything(user):
        return None
    return _member_team_ids(user)


def can_read_team(user: Any, team: Team | int) -> bool:
    """True when `user` may read the jobs, findings, costs, baselines and alerts of `team`."""
    team_id = team if isinstance(team, int) else team.pk
    allowed = readable_team_ids(user)
    return allowed is None or team_id in allowed


def scope_to_teams(qs: QuerySet[Any], user: Any, team_field: str = "team_id") -> QuerySet[Any]:
    """`qs` restricted to rows whose `team_field` is a team `user` may read (unchanged when all).

    The user's teams are a subquery of the same SQL statement, so scoping costs no extra query."""
    if not getattr(user, "is_authenticated", False):
        return qs.none()
    if _reads_everything(user):
        return qs
    teams = Membership.objects.filter(user_id=user.pk).values("team_id")
    return qs.filter(**{f"{team_field}__in": teams})


def readable_jobs(user: Any, qs: QuerySet[Job] | None = None) -> QuerySet[Job]:
    """The jobs `user` may read: `qs` (default all jobs) restricted by the read policy."""
    return scope_to_teams(Job.objects.all() if qs is None else qs, user)


def readable_job_or_404(user: Any, qs: QuerySet[Job] | None = None, **lookup: Any) -> Job:
    """The job matching `lookup` among those `user` may read; Http404 for a missing *or* unreadable job
    (the same answer, so another team's job ids cannot be probed)."""
    job = readable_jobs(user, qs).filter(**lookup).first()
    if job is None:
        raise Http404("No job matches the given query.")
    return job


def readable_team_or_404(user: Any, slug: str) -> Team:
    """The team with `slug` when `user` may read its jobs; Http404 otherwise (as for a missing team)."""
    team = Team.objects.filter(slug=slug).first()
    if team is None or not can_read_team(user, team):
        raise Http404("No team matches the given query.")
    return team


def owning_team(obj: Any) -> Team:
    """The team that owns a team, job, or something hanging off a job (artifact, finding)."""
    if isinstance(obj, Team):
        return obj
    if hasattr(obj, "team"):
        return obj.team
    return obj.job.team
