"""Who may write what: team-scoped writes (members of the owning team, and staff), one rule for the pages
and the REST API. Read policy: every logged-in user (or token) may read every team's jobs; only writes are
scoped (see README, "Access")."""

from __future__ import annotations

from typing import Any

from jobs.models import Team


def writable_team_ids(user: Any) -> set[int] | None:
    """Teams the user may write to; None means all (staff)."""
    if user.is_staff or user.is_superuser:
        return None
    return set(Team.objects.filter(memberships__user=user).values_list("id", flat=True))


def can_write_team(user: Any, team: Team | int) -> bool:
    """True when `user` may create or change objects owned by `team`."""
    team_id = team if isinstance(team, int) else team.pk
    allowed = writable_team_ids(user)
    return allowed is None or team_id in allowed


def owning_team(obj: Any) -> Team:
    """The team that owns a team, job, or something hanging off a job (artifact, finding)."""
    if isinstance(obj, Team):
        return obj
    if hasattr(obj, "team"):
        return obj.team
    return obj.job.team
