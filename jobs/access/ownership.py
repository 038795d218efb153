"""Who may claim what: one place for the rules on a job's identity, GPUs and selector (issue 23).

A job's identity (scheduler cluster + job id), its GPUs and its selector are facts the scheduler knows, not
a member's word. The registry (jobs.intake.registry, the one writer of a job's provenance) asks `check_claim`
before it writes; the idle policy asks `may_cancel` before it acts; GPU sharing asks `counts_against`
before one job's claim lowers another's share. Who is who (`Claimant`):

- scheduler: a cluster-scoped service credential (ApiToken kind=scheduler). Registers, updates and ends
  jobs of any team on its cluster, declaring team and owner; takes over a job a member registered by hand
  under the same id (logged); cannot touch another cluster's scheduler job.
- member: a user token or session of a team member. Registers and updates its own team's jobs, but may
  not (a) take an id a scheduler (or discovery) registered, nor change the identity fields (team, owner,
  GPUs, selector, cluster) of such a job; (b) list GPUs another team's running job holds, unless the
  platform declares them time-sliced (TIME_SLICED_GPUS); (c) select on anything but its own id under one of
  the platform's job-identity labels (SELECTOR_JOB_LABELS, never the scrape `job` label); (d) name an owner
  who is not a member of the job's team. Refusals do not say whether, or in which team, a job with the id
  exists.
- staff: keep their powers (any team, any selector); their registrations are `staff`.
- discovery, import, demo: platform code calling the registry directly.

Only `scheduler` jobs may be cancelled: the scheduler declared their owner and team, and no member can
change those afterwards. Hand-registered, discovered, imported and demo jobs get the warning only.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Q
from django.utils import timezone

from jobs.access.permissions import can_write_team, is_staff
from jobs.metrics.throughput import own_job_selector_problem
from jobs.models import ApiToken, Job, JobSeries, Membership, Team

log = logging.getLogger(__name__)

Provenance = Job.Provenance

#: Registrations whose identity a member may not take or change: the platform saw or declared them.
PLATFORM_SEEN = frozenset({Provenance.SCHEDULER, Provenance.DISCOVERY})
#: The only provenance the idle policy may cancel (see the module docstring).
CANCELLABLE = frozenset({Provenance.SCHEDULER})
#: How recent a running job's data must be for it to hold its GPUs against a member's claim.
HELD_FOR = timedelta(hours=1)
#: Prometheus' own scrape-job labels (efficiency.env.SCRAPE_JOB_LABELS): never a job's identity.
SCRAPE_JOB_LABELS = ("job", "exported_job")
#: The answer to a member whose id is taken, the same whether a scheduler, discovery or another team holds
#: it, so that it confirms no other team's ids.
ID_TAKEN = (
    "external id {id!r} is not available to you: it is registered by a scheduler integration or by a "
    "team you are not a member of. A scheduler job is registered by its scheduler integration (which "
    "also takes over a registration made by hand under its id); ask your platform team otherwise."
)


class OwnershipError(Exception):
    """A claim the caller may not make: `status` is the HTTP answer (400, 403 or 409), `field` the body
    field it is about."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status, self.field, self.message = status, field, message


@dataclass(frozen=True)
class Claimant:
    """Who registers or changes a job: its provenance, the user (members, staff), the scheduler's cluster
    and the credential ("via") recorded on the job and in the idle policy's log."""

    provenance: str
    user: Any = None
    cluster: str = ""
    via: str = ""

    @classmethod
    def of(cls, user: Any, auth: Any = None) -> Claimant:
        """The claimant behind an API request: a scheduler token, else staff, else a member."""
        if isinstance(auth, ApiToken):
            via = f"token {auth.name!r} ({auth.prefix}…) of {getattr(user, 'username', '?')}"
            if auth.is_scheduler:
                via = f"scheduler {via} of cluster {auth.cluster}"
                return cls(Provenance.SCHEDULER, user, auth.cluster, via)
        else:
            via = f"user {getattr(user, 'username', '')}"
        if is_staff(user):
            return cls(Provenance.STAFF, user, "", f"staff {via}")
        return cls(Provenance.MEMBER, user, "", via)

    @classmethod
    def platform(cls, provenance: str, via: str = "") -> Claimant:
        """Platform code calling the registry directly (discovery, import_jobs, the demo)."""
        return cls(provenance, None, "", via or str(provenance))

    @property
    def is_scheduler(self) -> bool:
        return self.provenance == Provenance.SCHEDULER

    @property
    def is_member(self) -> bool:
        return self.provenance == Provenance.MEMBER


# ------------------------------------------------------------------------------------------------- pure


def gpu_key(ref: Mapping[str, Any]) -> str:
    """A listed GPU as sharing's keys name it: "host/index" (index without leading zeros), or the UUID."""
    host, gpu = str(ref.get("hostname", "")), str(ref.get("gpu", ""))
    if gpu.isdigit():
        gpu = str(int(gpu))
    return f"{host}/{gpu}" if host else gpu


def declared_time_sliced(key: str, patterns: Iterable[str]) -> bool:
    """True when the platform declares GPU `key` ("host/index" or UUID) time-sliced: it matches one of the
    glob `patterns` (TIME_SLICED_GPUS, e.g. "node-t*/*"); case-sensitive, as host names are labels."""
    return any(fnmatch.fnmatchcase(key, p) for p in patterns)


def identity_labels(configured: Sequence[str]) -> list[str]:
    """The job-identity labels a member may select on: the configured ones less the scrape-job labels
    (the setting's parser refuses those; this is the same rule for a list set in code or tests)."""
    return [label for label in configured if label not in SCRAPE_JOB_LABELS]


def selector_problem(
    selector: Mapping[str, Any], gpus: Sequence[Any], external_id: str, configured: Sequence[str]
) -> str | None:
    """Why a member's selector could read other jobs' GPUs, or None: it must hold the job's own id, exactly,
    under one of the platform's job-identity labels (other labels may only narrow it further)."""
    labels = identity_labels(configured)
    if not gpus and not labels:
        return "no job-identity label is configured (SELECTOR_JOB_LABELS); list the GPUs in 'gpus'"
    return own_job_selector_problem(selector, gpus, external_id, labels)


def identity_changes(job: Job, data: Mapping[str, Any], team: Team) -> list[str]:
    """The identity fields a registration body would change on a stored job (team, owner, gpus, selector,
    cluster); an owner or cluster left blank is not a change (the body did not say)."""
    changed = []
    if job.team_id != team.pk:
        changed.append("team")
    if data.get("owner") and data["owner"] != job.owner:
        changed.append("owner")
    if data.get("cluster") and data["cluster"] != job.cluster:
        changed.append("cluster")
    gpus = [dict(g) for g in data.get("gpus") or []]
    if sorted(map(gpu_key, gpus)) != sorted(map(gpu_key, job.gpus or [])):
        changed.append("gpus")
    if dict(data.get("selector") or {}) != dict(job.selector or {}):
        changed.append("selector")
    return changed


def cancel_refusal(provenance: str) -> str | None:
    """Why the idle policy may not cancel a job registered this way, or None when it may."""
    if provenance in CANCELLABLE:
        return None
    reasons: dict[str, str] = {
        Provenance.MEMBER.value: "registered by hand by a team member",
        Provenance.DISCOVERY.value: "discovered from an exporter label (no scheduler vouches for its owner)",
        Provenance.STAFF.value: "registered by staff, not by its scheduler",
        Provenance.IMPORT.value: "imported, not registered by its scheduler",
        Provenance.DEMO.value: "demo data",
    }
    who = reasons.get(provenance, f"registered by {provenance!r}")
    return (
        f"not cancelled: the job was {who}; only jobs a scheduler integration registered (owner and team "
        "as the scheduler declared them) are cancelled"
    )


# ---------------------------------------------------------------------------------------------- Django


def _owner_problem(owner: str, team: Team) -> str | None:
    if not owner:
        return None
    user = get_user_model().objects.filter(username=owner).first()
    if user is None or not Membership.objects.filter(team=team, user=user).exists():
        return (
            f"owner {owner!r} is not a member of team {team.slug!r}; name a member of the team (or leave "
            "owner out: a scheduler integration declares owners of other users' jobs)"
        )
    return None


def held_gpus(
    claimed: Sequence[Mapping[str, Any]], team: Team, external_id: str, now: datetime | None = None
) -> list[str]:
    """The claimed GPUs that another team's running job holds (its explicit list, or the GPUs its
    selector was last seen on), less the GPUs the platform declares time-sliced; sorted keys.

    A MIG slice is not a whole GPU, but a member's word that it is on a slice is not proof either: only
    the exporter's instance labels are, and those are counted at poll time (jobs.evaluation.sharing)."""
    keys = {gpu_key(g) for g in claimed}
    keys = {k for k in keys if not declared_time_sliced(k, settings.TIME_SLICED_GPUS)}
    if not keys:
        return []
    now = now or timezone.now()
    recent = now - HELD_FOR
    running = Job.objects.filter(ended_at__isnull=True).exclude(team=team).exclude(external_id=external_id)
    held: set[str] = set()
    # A listed job holds its GPUs until polled, then while its data keeps arriving: a job whose end never
    # arrived (a lost epilog) must not block its GPUs for good.
    listed = running.exclude(gpus=[]).filter(Q(data_until__isnull=True) | Q(data_until__gte=recent))
    for gpus in listed.values_list("gpus", flat=True).iterator():
        held |= keys & {gpu_key(g) for g in gpus or [] if isinstance(g, Mapping)}
    # Selector jobs: the GPUs their per-GPU rows name in the last HELD_FOR (the poll writes them; older
    # rows may name GPUs the job has since left).
    seen = JobSeries.objects.filter(
        job__in=running.filter(gpus=[]),
        signal__in=("gpu_util", "gr_engine_active"),
        stat="gpu",
        gpu_key__in=sorted(keys),
        end__gte=recent,
    ).values_list("gpu_key", flat=True)
    held |= set(seen)
    return sorted(held)


def check_claim(claimant: Claimant, data: Mapping[str, Any], existing: Job | None) -> None:
    """Refuse (OwnershipError) a registration `claimant` may not make; `data` is a validated registration
    body, `existing` the stored job with its external id (locked by the caller), if any."""
    team: Team = data["team"]
    external_id = data["external_id"]
    if claimant.is_scheduler:
        if data.get("cluster") and data["cluster"] != claimant.cluster:
            raise OwnershipError(
                400,
                "cluster",
                f"this credential speaks for cluster {claimant.cluster!r}, not {data['cluster']!r}",
            )
        if (
            existing is not None
            and existing.registered_by == Provenance.SCHEDULER
            and existing.cluster != claimant.cluster
        ):
            raise OwnershipError(
                409, "external_id", f"external id {external_id!r} is held by another cluster's scheduler"
            )
        return
    if claimant.is_member:
        if not can_write_team(claimant.user, team):
            raise OwnershipError(403, "team", f"you are not a member of team {team.slug!r}")
        if data.get("cluster"):
            raise OwnershipError(
                403, "cluster", "only a scheduler credential declares a job's cluster (leave 'cluster' out)"
            )
        if existing is not None and (
            existing.team_id != team.pk
            or not can_write_team(claimant.user, existing.team_id)
            or existing.registered_by in PLATFORM_SEEN
        ):
            # One answer whether the id is another team's or the scheduler's (and, for the latter, only
            # when the body would change what the scheduler declared).
            mine = existing.team_id == team.pk and can_write_team(claimant.user, existing.team_id)
            changed = identity_changes(existing, data, team) if mine else ["team"]
            if changed:
                if mine:
                    raise OwnershipError(
                        409,
                        changed[0],
                        f"{', '.join(changed)} of job {external_id!r} are its scheduler integration's "
                        "(it registered the job); a member may change its description, not its identity",
                    )
                raise OwnershipError(409, "external_id", ID_TAKEN.format(id=external_id))
        if problem := selector_problem(
            data.get("selector") or {}, data.get("gpus") or [], external_id, settings.SELECTOR_JOB_LABELS
        ):
            raise OwnershipError(400, "selector", problem)
        owner = data.get("owner") or ""
        if (existing is None or owner != existing.owner) and (problem := _owner_problem(owner, team)):
            raise OwnershipError(400, "owner", problem)
        running = data.get("ended_at") is None
        if data.get("gpus") and running and (held := held_gpus(data["gpus"], team, external_id)):
            shown = ", ".join(held[:8]) + (f" and {len(held) - 8} more" if len(held) > 8 else "")
            raise OwnershipError(
                409,
                "gpus",
                f"{len(held)} of the listed GPUs ({shown}) are held by a running job that is not your "
                "team's; a GPU is shared only when the platform declares it time-sliced "
                "(TIME_SLICED_GPUS) or the exporter labels MIG instances",
            )
        return
    # Staff and platform code: what was allowed before provenance existed (one team per job id).
    if existing is not None and existing.team_id != team.pk:
        raise OwnershipError(
            409, "team", f"job {external_id!r} is registered to team {existing.team.slug!r}; change it there"
        )


def provenance_after(claimant: Claimant, existing: Job | None) -> tuple[str, str, str]:
    """(registered_by, cluster, registered_via) of the job once `claimant`'s registration is written.

    A scheduler's registration makes (or takes over) a scheduler job. A member's update of a scheduler or
    discovery job changes no identity (check_claim), so it keeps the platform's provenance. Anyone else's
    registration is theirs."""
    if claimant.is_scheduler:
        if existing is not None and existing.registered_by != Provenance.SCHEDULER:
            log.warning(
                "job %s: taken over by %s (was registered by %s via %s, team %s, owner %r)",
                existing.external_id,
                claimant.via,
                existing.registered_by,
                existing.registered_via or "?",
                existing.team.slug,
                existing.owner,
            )
        return Provenance.SCHEDULER, claimant.cluster, claimant.via[:200]
    if existing is not None and existing.registered_by in PLATFORM_SEEN and claimant.is_member:
        return existing.registered_by, existing.cluster, existing.registered_via
    return claimant.provenance, "", claimant.via[:200]


def takeover_discards(claimant: Claimant, data: Mapping[str, Any], existing: Job | None) -> list[str]:
    """The identity fields (team, gpus, selector) in which a scheduler's registration contradicts a job
    registered under its id by someone else ([] when it confirms them, or is no takeover). Then what was
    archived, computed, uploaded and alerted for that job belongs to a claim the scheduler refutes, not
    to the scheduler's job: the registry starts the job afresh rather than hand it to the job's team."""
    if not claimant.is_scheduler or existing is None or existing.registered_by == Provenance.SCHEDULER:
        return []
    return [f for f in identity_changes(existing, data, data["team"]) if f in ("team", "gpus", "selector")]


def scheduler_jobs(claimant: Claimant) -> Any:
    """The jobs a scheduler credential may read, update and end: those of its cluster."""
    return Job.objects.filter(registered_by=Provenance.SCHEDULER, cluster=claimant.cluster)


def may_cancel(job: Job) -> str | None:
    """Why the idle policy may not cancel `job` (its provenance), or None when it may."""
    return cancel_refusal(job.registered_by)


def counts_against(job: Job, other: Job, key: str, *, mig: bool) -> bool:
    """Whether `other`'s use of GPU `key` lowers `job`'s share of it (jobs.evaluation.sharing).

    Only on a GPU known to be shared: a MIG instance (`mig`: the exporter's instance labels, or a job's
    own MIG device name), or one the platform declares time-sliced (TIME_SLICED_GPUS); and never by a claim
    another team's member made by hand: a member's word is no proof of anyone else's GPU use, so it never
    lowers another team's share (a MIG device name included)."""
    if not (mig or declared_time_sliced(key, settings.TIME_SLICED_GPUS)):
        return False
    return not (other.registered_by == Provenance.MEMBER and other.team_id != job.team_id)
