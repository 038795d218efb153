"""The job registry: register (idempotently), update and end jobs, record pushed progress."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs.access.ownership import Claimant, check_claim, provenance_after, takeover_discards
from jobs.evaluation.catalog import match_gpu_name, match_mig_name, mig_profile
from jobs.evaluation.robust import config_fingerprint
from jobs.models import GpuModel, Job, ProgressSample

log = logging.getLogger(__name__)


class RegistryError(Exception):
    """A registration that conflicts with what is stored (e.g. the external id belongs to another team)."""


class RegistryConflict(RegistryError):
    """A request that contradicts what is stored or itself (HTTP 409): a re-registration whose start is
    after the stored end, two different progress points at one timestamp."""


def resolve_gpu_model(reported: str) -> GpuModel | None:
    """The catalog entry for a device name as torch, nvidia-smi or dcgm-exporter report it, or None.

    An admin-added name or alias wins; otherwise the built-in token matcher (which keeps "L40S" apart
    from "L4") names the canonical model. Never a default: unknown stays unknown.
    """
    name = reported.strip()
    if not name:
        return None
    for gpu in GpuModel.objects.all():
        if name.lower() == gpu.name.lower() or name.lower() in (a.lower() for a in gpu.aliases):
            return gpu
    spec = match_gpu_name(name)
    if spec is None:
        # A MIG device name ("NVIDIA-H100-80GB-HBM3-MIG-3g.40gb") is its parent GPU's model; the slice's
        # share of cost and peak comes from the profile in the name (jobs.evaluation.sharing).
        mig = match_mig_name(name)
        spec = mig[0] if mig is not None else None
    if spec is None:
        return None
    return GpuModel.objects.filter(name=spec.name).first()


def config_fields(job: Job) -> dict[str, object]:
    """The config fields a baseline fingerprint covers (model name aside)."""
    par = job.parallelism or {}
    return dict(
        # A MIG slice is not its parent GPU: its runs compare with runs on the same profile only.
        gpu_model=job.gpu_model.name
        if job.gpu_model and mig_profile(job.gpu_model_name) is None
        else job.gpu_model_name,
        gpu_count=job.gpu_count,
        dtype=job.dtype,
        tp=par.get("tp", 1),
        pp=par.get("pp", 1),
        dp=par.get("dp", 1),
        ep=par.get("ep", 1),
        micro_batch=job.micro_batch,
        global_batch=job.global_batch,
        seq_len=(job.model_config or {}).get("seq_len"),
        recompute=job.recompute,
    )


def fingerprint_for(job: Job) -> str:
    """The model + config fingerprint baselines are keyed by."""
    return config_fingerprint(job.model_name, config_fields(job))


EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
MAX_FUTURE = timedelta(days=1)  # clock skew between a scheduler and this service, not a plan


def check_moment(value: datetime | None, *, now: datetime | None = None) -> str | None:
    """Why a job or progress timestamp is implausible (before 2000, or more than a day ahead), or None."""
    if value is None:
        return None
    now = now or timezone.now()
    if value < EARLIEST:
        return f"is before {EARLIEST:%Y-%m-%d}; give the real time (ISO 8601 with a zone)"
    if value > now + MAX_FUTURE:
        return "is in the future (more than a day ahead of this server's clock)"
    return None


def check_window(started: datetime, ended: datetime | None, *, now: datetime | None = None) -> str | None:
    """Why a job's window is too long, or None: from start to end at most MAX_JOB_WINDOW_DAYS; a running
    job (no end) started at most MAX_RUNNING_JOB_DAYS ago (it is polled up to now, every cycle)."""
    days = settings.MAX_JOB_WINDOW_DAYS
    end = ended or now or timezone.now()
    running_days = settings.MAX_RUNNING_JOB_DAYS
    if ended is None and end - started > timedelta(days=running_days):
        return (
            f"the job is still running (no ended_at) and started {(end - started).days} days ago; a running "
            f"job started at most {running_days} days ago (MAX_RUNNING_JOB_DAYS): send its ended_at, or "
            "register each part of a chained run as its own job"
        )
    if end - started > timedelta(days=days):
        still = "" if ended else " (the job is still running)"
        return (
            f"the job spans {(end - started).days} days from started_at to {'ended_at' if ended else 'now'}"
            f"{still}; at most {days} days (MAX_JOB_WINDOW_DAYS)"
        )
    return None


@dataclass(frozen=True)
class Registration:
    """Outcome of a registration: the job and whether it was new."""

    job: Job
    created: bool


_REGISTERED_FIELDS = (
    "name",
    "owner",
    "kind",
    "dtype",
    "micro_batch",
    "global_batch",
    "recompute",
    "tokens_per_step",
    "throughput_query",
    "started_at",
    "ended_at",
)


@transaction.atomic
def register_job(data: dict[str, Any], claimant: Claimant | None = None) -> Registration:
    """Create the job, or update it in place when the external id is known (scheduler retries are safe).

    `data` is a validated JobRegisterSerializer payload; `claimant` who registers it (an API caller's
    `Claimant.of(user, token)`; platform code calling directly is `import` by default). What it may claim
    is jobs.access.ownership's `check_claim`, asked here with the stored job locked; this function is the one
    writer of the job's provenance (registered_by, cluster, registered_via);
    jobs.access.ownership.OwnershipError
    when the claim is refused.
    """
    claimant = claimant or Claimant.platform(Job.Provenance.IMPORT, "import (registry called directly)")
    model = dict(data["model"])
    values: dict[str, Any] = {field: data.get(field) for field in _REGISTERED_FIELDS if field in data}
    values.update(
        team=data["team"],
        model_name=model.pop("name"),
        model_config=model,
        parallelism=dict(data.get("parallelism") or {"tp": 1, "pp": 1, "dp": 1, "ep": 1}),
        gpu_model_name=data["gpu_model"],
        gpu_model=resolve_gpu_model(data["gpu_model"]),
        gpu_count=data["gpu_count"],
        price_tier=data.get("price_tier") or "",
        gpus=[dict(g) for g in data.get("gpus") or []],
        selector=dict(data.get("selector") or {}),
    )
    for optional in ("micro_batch", "global_batch", "tokens_per_step"):
        values.setdefault(optional, None)
    job = (
        # of=self: lock the job row only, not its team's row (registrations of one team run concurrently).
        Job.objects.select_for_update(of=("self",))
        .select_related("team")
        .filter(external_id=data["external_id"])
        .first()
    )
    check_claim(claimant, data, job)
    values["registered_by"], values["cluster"], values["registered_via"] = provenance_after(claimant, job)
    if job is not None and (refuted := takeover_discards(claimant, data, job)):
        # Series, progress, findings, artifacts and incidents of a claim the scheduler contradicts: not its.
        log.warning(
            "job %s: the scheduler's %s differ from the hand registration's; its data is discarded",
            job.external_id,
            ", ".join(refuted),
        )
        job.delete()
        job = None
    created = job is None
    if job is None:
        job = Job(external_id=data["external_id"])
    for field, value in values.items():
        setattr(job, field, value)
    if job.ended_at is not None and job.ended_at < job.started_at:
        raise RegistryConflict(
            f"started_at {job.started_at.isoformat()} is after the stored ended_at "
            f"{job.ended_at.isoformat()}; send ended_at too (or null to re-open the job)"
        )
    # A running job's distance to now is checked at the API edge (the serializer); here the window the
    # stored end gives a new start (callers such as batch imports reach this function directly).
    if (
        job.ended_at is not None
        and "ended_at" not in data
        and (problem := check_window(job.started_at, job.ended_at))
    ):
        raise RegistryConflict(f"with the stored ended_at, {problem}")
    if job.ended_at is not None and job.status == Job.Status.RUNNING:
        job.status = Job.Status.ENDED
    job.config_fingerprint = fingerprint_for(job)
    job.save()
    if job.gpu_model is None:
        log.warning(
            "job %s: unknown GPU model %r (add it to the catalog)", job.external_id, job.gpu_model_name
        )
    return Registration(job=job, created=created)


@transaction.atomic
def register_discovered(job: Job, via: str) -> Job:
    """Save a job discovery built from an exporter label (jobs.pipeline.discovery), with its provenance:
    platform-seen, not vouched for by a scheduler, so a member cannot take its id and the idle policy
    does not cancel it (jobs.access.ownership). The registry stays the one writer of provenance."""
    job.registered_by, job.cluster, job.registered_via = Job.Provenance.DISCOVERY, "", via[:200]
    job.config_fingerprint = fingerprint_for(job)
    job.save()
    return job


@transaction.atomic
def update_job(job: Job, data: dict[str, Any]) -> Job:
    """Apply a PATCH: end the job (or re-open it with ended_at null) and correct simple fields."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    for field in ("name", "kind", "tokens_per_step", "throughput_query", "price_tier"):
        if field in data:
            setattr(job, field, data[field] if data[field] is not None else None)
    if "ended_at" in data:
        ended: datetime | None = data["ended_at"]
        if ended is not None and ended < job.started_at:
            raise RegistryError("ended_at is before started_at")
        if problem := check_window(job.started_at, ended):
            raise RegistryError(problem)
        job.ended_at = ended
        if ended is None:
            job.status, job.finalized_at = Job.Status.RUNNING, None
        elif job.status == Job.Status.RUNNING:
            job.status = Job.Status.ENDED
    job.save()
    return job


def record_progress(job: Job, points: list[dict[str, Any]]) -> int:
    """Store pushed progress points; a point at an already-stored timestamp is replaced (retries are safe).

    Within one request the same point twice is stored once; two different points at one timestamp are a
    RegistryConflict (Postgres cannot update one row twice in one statement, and neither is "the" value).
    """
    by_time: dict[datetime, dict[str, Any]] = {}
    for p in points:
        seen = by_time.setdefault(p["timestamp"], p)
        if (seen.get("step"), seen["tokens"]) != (p.get("step"), p["tokens"]):
            raise RegistryConflict(
                f"two different progress points at {p['timestamp'].isoformat()} in one request "
                f"(step {seen.get('step')}, tokens {seen['tokens']} and step {p.get('step')}, "
                f"tokens {p['tokens']})"
            )
    rows = [
        ProgressSample(job=job, timestamp=p["timestamp"], step=p.get("step"), tokens=p["tokens"])
        for p in by_time.values()
    ]
    ProgressSample.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["job", "timestamp"],
        update_fields=["step", "tokens"],
    )
    return len(rows)
