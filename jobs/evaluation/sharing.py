"""Shared GPUs: which of a job's GPUs other jobs also used in its window, and each job's share of each GPU.

Detection (the seed's causes 4 and 7: "a GPU shared by several tasks competing for time slices ...
utilisation is thinned out"; MIG slices, a scheduler giving one GPU to several jobs):
- the same physical GPU (host/index, or UUID) in another job's explicit mapping, or among the GPUs its label
  selector matched (the archived per-GPU keys), in an overlapping window, on a GPU the platform declares
  time-sliced (TIME_SLICED_GPUS): time-slicing. Elsewhere an overlap is a double booking, not a share: it
  is not split (a member's claim must not lower another job's cost or raise its MFU), and a claim another
  team's member registered by hand never lowers a job's share, MIG included
  (jobs.access.ownership.counts_against);
- MIG: a job on a slice is billed for its compute slices / 7 of the GPU and its MFU is against the slice's
  SMs (jobs.evaluation.catalog.mig_slice); its instances are read by `jobs.evaluation.mig`.

Attribution: `jobs.evaluation.gpu_attribution.attribute` (pure) splits each GPU's time among its users.
`summarise` turns a job's attribution into the `GpuSharing` the evaluation charges (GPU equivalents for
cost, peak equivalents for MFU) and the diagnosis explains (the `shared_gpu` finding).

What this cannot see, and at what resolution:
- several processes of *different* owners on one GPU outside any registered job (a notebook, an unregistered
  pod), and MPS clients: dcgm-exporter exports per-GPU (or per-MIG-instance) fields, not per process, and
  its default counters have no process count (reference/dcgm.md). Only registered jobs' GPU claims are
  compared, so unregistered sharing is invisible here; a GPU busier than the job's own work suggests
  it but cannot be told apart from the job's own kernels.
- the split of a time-sliced GPU is assumed even while its users overlap (the device plugin's time-slicing
  gives each context equal slices when all are busy). When the other job idles, this job can use more than
  its share: its MFU against its share then reads high. No per-process utilisation exists to do better.
- GPUs are matched by key: a job mapped by UUID and another by host/index are not compared.
- windows are the jobs' registered start/end (seconds), a running neighbour's up to its last archived
  sample; a job whose selector matched a GPU for only part of its window is counted as holding it for
  the whole window. A neighbour without any archived data (never seen by the exporter) is not counted.
- a job evaluated before an overlapping job appeared is re-evaluated once the newcomer's evaluation is
  stored (`refresh_neighbours_on_commit`, queued by jobs.evaluation.store): until that task runs, its
  stored cost is the earlier, unshared one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.db.models import Q

from jobs.access.ownership import counts_against
from jobs.evaluation.catalog import GpuSpec, mig_profile, mig_slice
from jobs.evaluation.gpu_attribution import Attribution, Usage, attribute
from jobs.evaluation.mig import job_window, mig_instances, stored_mig
from jobs.evaluation.schema import GpuSharing, SharedWith
from jobs.metrics.prometheus import PrometheusClient
from jobs.models import Job, JobSeries

CODE = "shared_gpu"


@dataclass(frozen=True)
class SharedGpu:
    """One of the job's GPUs that another job also used, and when."""

    gpu: str
    other_job: str
    start: datetime
    end: datetime
    mig: bool
    other_team: bool = False


@dataclass
class SharingReport:
    """The job's shared GPUs, the attribution of every GPU-second on them, the job's share, and the MIG
    instances seen ({gpu: (GPU_I_ID, GPU_I_PROFILE)}) for the job itself."""

    job: str
    shared: list[SharedGpu]
    attribution: Attribution
    share: float | None
    mig: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def is_shared(self) -> bool:
        """True when another job used one of the GPUs, or the job held only part of them (a MIG slice)."""
        return bool(self.shared) or (self.share is not None and self.share < 0.999)


def _observed_window(job: Job, now: datetime) -> tuple[float, float]:
    """Another job's claim on its GPUs: from its start to its end, or, while it runs, to its last archived
    sample (`data_until`): a job whose end never arrived must not hold its GPUs forever."""
    end = job.ended_at or job.data_until or now
    return job.started_at.timestamp(), min(end, now).timestamp()


#: The per-GPU archive rows that name a job's GPUs: utilisation, or GR_ENGINE_ACTIVE where GPU_UTIL is
#: absent (MIG instances).
_KEY_SIGNALS = ("gpu_util", "gr_engine_active")


def _mapped_keys(job: Job) -> list[str]:
    keys = []
    for ref in job.gpus or []:
        if isinstance(ref, dict):
            if ref.get("hostname") is not None and ref.get("gpu") is not None:
                keys.append(f"{ref['hostname']}/{ref['gpu']}")
            elif ref.get("uuid"):
                keys.append(str(ref["uuid"]))
    return keys


def gpu_keys_of(jobs: Sequence[Job]) -> dict[int, list[str]]:
    """{job pk: its physical GPUs}: the explicit mapping (host/index or UUID), else the GPUs its selector
    matched as archived (per-GPU keys). One query for all the jobs that have no explicit mapping."""
    out: dict[int, list[str]] = {}
    archived: list[int] = []
    for job in jobs:
        keys = _mapped_keys(job)
        if keys:
            out[job.pk] = keys
        else:
            archived.append(job.pk)
    if archived:
        found: dict[int, set[str]] = defaultdict(set)
        rows = (
            JobSeries.objects.filter(job_id__in=archived, signal__in=_KEY_SIGNALS, stat="gpu")
            .exclude(gpu_key="")
            .values_list("job_id", "gpu_key")
            .distinct()
        )
        for pk, key in rows:
            found[pk].add(key)
        for pk in archived:
            out[pk] = sorted(found.get(pk, set()))
    return out


def gpu_keys(job: Job) -> list[str]:
    """The physical GPUs of one job (see `gpu_keys_of`)."""
    return gpu_keys_of([job])[job.pk]


def _usages(
    job: Job, keys: list[str], now: datetime, mig: dict[str, tuple[str, str]], *, other: bool = False
) -> list[Usage]:
    start, end = _observed_window(job, now) if other else job_window(job, now)
    out = []
    for key in keys:
        instance, profile = mig.get(key, ("", ""))
        out.append(Usage(key, job.external_id, start, end, instance, profile))
    return out


#: At most this many overlapping jobs are compared (a guard against a runaway query on a huge cluster).
MAX_OTHERS = 500

#: The fields of another job the comparison reads.
_NEIGHBOUR_FIELDS = (
    "pk", "external_id", "started_at", "ended_at", "data_until", "gpus", "selector", "evaluation", "team",
    "registered_by",
)  # fmt: skip


class Neighbours:
    """The jobs `look_up` compares against and their GPU keys, read once per poll cycle (two queries)
    instead of once per evaluated job: per job, the overlapping jobs and all their archived GPU keys were
    a query each, O(jobs^2) rows per cycle. `look_up(job, ..., neighbours=)` applies the same filter,
    order and MAX_OTHERS cut in Python, so its answer is the one the queries give; `update` keeps a job
    saved during the cycle (new `data_until`, new evaluation) current, as the database would be.

    Valid for jobs that started at or after `earliest` (the candidates are read from there) and while no
    per-GPU rows are written (the archived keys are read once: build it after the cycle's archive write).
    """

    def __init__(self, jobs: Sequence[Job]) -> None:
        self.earliest = min((j.started_at for j in jobs), default=None)
        self.jobs: dict[int, Job] = {}
        if self.earliest is not None:
            # A superset of every job's candidates: an ended job counts only if it ended after the job
            # started, so nothing that ended before the earliest start can be one.
            found = (
                Job.objects.filter(data_until__isnull=False)
                .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=self.earliest))
                .only(*_NEIGHBOUR_FIELDS)
            )
            self.jobs = {j.pk: j for j in found}
        self.keys = gpu_keys_of([*self.jobs.values(), *(j for j in jobs if j.pk not in self.jobs)])
        # Which jobs hold each GPU key: `others_sharing` looks only at jobs that share a GPU with the job.
        self.by_key: dict[str, set[int]] = defaultdict(set)
        for pk, keys in self.keys.items():
            for key in keys:
                self.by_key[key].add(pk)

    def covers(self, job: Job) -> bool:
        """True when this index answers for `job` (its keys are known, its candidates were read)."""
        return self.earliest is not None and job.pk in self.keys and job.started_at >= self.earliest

    def update(self, job: Job) -> None:
        """A job saved during the cycle: later evaluations see its new `data_until` and evaluation."""
        if job.pk in self.keys and job.data_until is not None:
            self.jobs[job.pk] = job

    def others(self, job: Job, now: datetime) -> list[Job]:
        """The query of `look_up`: jobs other than `job` seen by the exporter whose window overlaps its
        own, by (started_at, pk), at most MAX_OTHERS."""
        until = job.ended_at or now
        since = job.started_at
        found = [
            o
            for o in self.jobs.values()
            if o.pk != job.pk
            and o.data_until is not None
            and o.started_at < until
            and (o.ended_at > since if o.ended_at is not None else o.data_until > since)
        ]
        found.sort(key=lambda o: (o.started_at, o.pk))
        return found[:MAX_OTHERS]

    def others_sharing(self, job: Job, now: datetime) -> list[Job]:
        """`others(job, now)` less the jobs that hold none of the job's GPU keys (which `look_up`
        skips), without scanning every job. Exact while the index holds at most MAX_OTHERS + 1 jobs (the
        MAX_OTHERS cut of `others` then keeps every overlapping job); beyond, the cut depends on all of
        them, and this is `others` filtered."""
        mine = self.keys.get(job.pk, [])
        if len(self.jobs) > MAX_OTHERS + 1:
            return [o for o in self.others(job, now) if any(o.pk in self.by_key.get(k, ()) for k in mine)]
        until = job.ended_at or now
        since = job.started_at
        near = {pk for key in mine for pk in self.by_key.get(key, ())}
        found = [
            o
            for pk in near
            if (o := self.jobs.get(pk)) is not None
            and o.pk != job.pk
            and o.data_until is not None
            and o.started_at < until
            and (o.ended_at > since if o.ended_at is not None else o.data_until > since)
        ]
        found.sort(key=lambda o: (o.started_at, o.pk))
        return found


@dataclass(frozen=True)
class Candidate:
    """Another job that held some of the job's GPUs in an overlapping window, as `look_up` found it: the
    GPUs both held, its observed window (Unix s) and its MIG instances."""

    job: Job
    gpus: list[str]
    start: float
    end: float
    mig: dict[str, tuple[str, str]]


@dataclass(frozen=True)
class SharingLookup:
    """What the attribution of a job's GPUs needs from the database, Prometheus and the ownership rule,
    read before the evaluation (`look_up`): the job's GPU keys and MIG instances, the other jobs on its
    GPUs, and which (other job pk, GPU) claims lower its share (jobs.access.ownership.counts_against)."""

    keys: list[str]
    mig: dict[str, tuple[str, str]]
    others: list[Candidate]
    counted: frozenset[tuple[int, str]]


def look_up(
    job: Job,
    client: PrometheusClient | None,
    now: datetime,
    neighbours: Neighbours | None = None,
    mig: Mapping[int, dict[str, tuple[str, str]]] | None = None,
) -> SharingLookup:
    """The reads behind the job's share of its GPUs: the other jobs on them in overlapping windows, MIG
    instances, and the ownership rule's answer for each GPU they share (asked last, once the candidates
    are known, so the attribution itself reads nothing).

    Queries: one for the overlapping jobs, one for all their archived GPU keys; MIG instances from
    Prometheus for this job (with a client), else from stored evaluations (the other jobs', always: each
    was evaluated with its own instances, so they are not asked again). A job registered with a MIG device
    name ("...-MIG-3g.40gb") and no instance labels seen holds that profile on each of its GPUs (on one
    placeholder GPU when none is known yet). `neighbours`: the poll cycle's index of those jobs and keys
    (the same answer without the two queries), used when it covers the job. `mig`: the cycle's MIG
    instances per job pk (`mig_instances_of`, one query per batch of jobs), used for the jobs it holds
    instead of their own `mig_instances` query."""
    start, end = job_window(job, now)
    if neighbours is not None and neighbours.covers(job):
        # Only the overlapping jobs that hold one of its GPUs: the others are skipped below anyway.
        others = neighbours.others_sharing(job, now)
        keys = {pk: list(neighbours.keys[pk]) for pk in (job.pk, *(o.pk for o in others))}
    else:
        # Only jobs the exporter was seen for (`data_until` set) count: a registration alone is a claim
        # that may never have run (a job with no metrics at all); its use of the GPU is unknown, not a
        # share.
        others = list(
            Job.objects.exclude(pk=job.pk)
            .filter(started_at__lt=job.ended_at or now, data_until__isnull=False)
            .filter(Q(ended_at__gt=job.started_at) | Q(ended_at__isnull=True, data_until__gt=job.started_at))
            .only(*_NEIGHBOUR_FIELDS)
            .order_by("started_at", "pk")[:MAX_OTHERS]
        )
        keys = gpu_keys_of([job, *others])
    mine = set(keys[job.pk])
    known = mig if mig is not None else {}

    def instances(of: Job) -> dict[str, tuple[str, str]]:
        assert client is not None
        found = known.get(of.pk)
        return dict(found) if found is not None else mig_instances(client, of, now)

    own_mig = (instances(job) if client is not None else {}) or stored_mig(job)
    named = mig_profile(job.gpu_model_name)
    if not own_mig and named is not None:
        # The instance id is unknown: one per job, so two such jobs on a GPU are two slices, not one.
        slots = keys[job.pk] or [f"{job.external_id}/mig"]
        keys[job.pk] = slots
        own_mig = {key: (f"job:{job.pk}", named) for key in slots}
        mine = set(slots)
    candidates: list[Candidate] = []
    for other in others:
        common = mine & set(keys[other.pk])
        if not common:
            continue
        o_start, o_end = _observed_window(other, now)
        if min(end, o_end) <= max(start, o_start):
            continue
        other_mig = stored_mig(other)
        if not other_mig and client is not None and any(g in own_mig for g in common):
            other_mig = instances(other)  # a MIG neighbour not evaluated yet
        candidates.append(Candidate(other, sorted(common), o_start, o_end, other_mig))
    # Only a GPU known to be shared (MIG, or declared time-sliced by the platform) is split, and never by
    # another team's hand-registered claim (jobs.access.ownership): a claim is not proof of use.
    counted = frozenset(
        (c.job.pk, g)
        for c in candidates
        for g in c.gpus
        if counts_against(job, c.job, g, mig=g in c.mig or g in own_mig)
    )
    return SharingLookup(keys[job.pk], own_mig, candidates, counted)


def attribute_shares(job: Job, lookup: SharingLookup, now: datetime) -> SharingReport:
    """The job's GPUs also used by other jobs in overlapping windows, and its share of them, from what
    `look_up` read (no query of its own)."""
    start, end = job_window(job, now)
    usages = _usages(job, lookup.keys, now, lookup.mig)
    shared: list[SharedGpu] = []
    for other in lookup.others:
        counted = [g for g in other.gpus if (other.job.pk, g) in lookup.counted]
        if not counted:
            continue
        usages += _usages(other.job, counted, now, other.mig, other=True)
        lo, hi = max(start, other.start), min(end, other.end)
        for gpu in counted:
            shared.append(
                SharedGpu(
                    gpu,
                    other.job.external_id,
                    datetime.fromtimestamp(lo, tz=now.tzinfo),
                    datetime.fromtimestamp(hi, tz=now.tzinfo),
                    gpu in other.mig or gpu in lookup.mig,
                    other.job.team_id != job.team_id,
                )
            )
    attribution = attribute(usages)
    share = attribution.job_share(job.external_id)
    return SharingReport(job.external_id, shared, attribution, share, lookup.mig)


def summarise(report: SharingReport, gpu_count: int, spec: GpuSpec | None) -> GpuSharing | None:
    """What the evaluation charges and the diagnosis explains; None when the job's GPUs were its own.

    GPU equivalents = GPUs x share (attributed GPU-time / held GPU-time). Peak equivalents weight each GPU's
    attributed time by peak share / cost share: 1 on a time-sliced GPU, a slice's SMs / 7ths on MIG
    (catalog.mig_slice: on an H100 a 3g slice is billed 3/7 and peaks at 48/132 of the GPU).
    """
    if not report.is_shared or report.share is None:
        return None
    att = report.attribution
    job = report.job
    held = sum(v for (j, _), v in att.held.items() if j == job)
    peak_time = 0.0
    profiles: list[str] = []
    sources: list[str] = []
    for (j, gpu), seconds in att.shares.items():
        if j != job:
            continue
        ratio = 1.0
        instance = report.mig.get(gpu)
        piece = mig_slice(spec, instance[1]) if instance is not None else None
        if piece is not None and piece.cost_fraction > 0:
            ratio = piece.peak_fraction / piece.cost_fraction
            profiles.append(piece.profile)
            sources.append(piece.source)
        peak_time += seconds * ratio
    count = max(gpu_count, 1)
    gpu_eq = count * report.share
    peak_eq = count * peak_time / held if held > 0 else gpu_eq
    kinds = sorted(set(profiles))
    label = f"{gpu_eq:.2f} of {count} GPU{'s' if count != 1 else ''}"
    if kinds:
        label += ", MIG " + ", ".join(kinds)
    if report.shared and any(not s.mig for s in report.shared):
        # Another team's jobs are not named (read policy): counted instead.
        others = sorted({s.other_job for s in report.shared if not s.mig and not s.other_team})
        theirs = len({s.other_job for s in report.shared if not s.mig and s.other_team})
        named = others[:5] + ([f"{theirs} job{'s' if theirs != 1 else ''} of other teams"] if theirs else [])
        label += ", time-sliced with " + ", ".join(named)
    return GpuSharing(
        share=report.share,
        gpu_equivalents=gpu_eq,
        peak_equivalents=peak_eq,
        label=label,
        mig={gpu: list(pair) for gpu, pair in sorted(report.mig.items())},
        shared=[
            SharedWith(
                gpu=s.gpu,
                other_job=s.other_job,
                start=s.start.timestamp(),
                end=s.end.timestamp(),
                mig=s.mig,
                other_team=s.other_team,
            )
            for s in report.shared
        ],
        peak_source="; ".join(sorted(set(sources))),
    )


def stale_neighbours(job: Job, sharing: GpuSharing | None) -> list[int]:
    """The jobs this job shares a GPU with whose stored evaluation does not name it yet (they were
    evaluated before it appeared): their share changed with this job, so they need re-evaluating. A
    neighbour that names this job is up to date, which is also what ends the back-and-forth."""
    names = sorted({s.other_job for s in sharing.shared}) if sharing is not None else []
    if not names:
        return []
    stale = []
    for other in Job.objects.filter(external_id__in=names).exclude(pk=job.pk).only("pk", "evaluation"):
        evaluated = other.evaluated
        theirs = evaluated.sharing if evaluated is not None else None
        if theirs is None or job.external_id not in {s.other_job for s in theirs.shared}:
            stale.append(other.pk)
    return sorted(stale)


def refresh_neighbours_on_commit(job: Job, sharing: GpuSharing | None) -> None:
    """Queue one re-evaluation of `stale_neighbours` once the caller's transaction commits, so the shares
    of a GPU keep adding up to its cost when a later job joins it (the evaluation's one writer calls this)."""
    stale = stale_neighbours(job, sharing)
    if stale:
        from jobs.runtime.enqueue import enqueue  # Celery only when there is something to queue

        transaction.on_commit(lambda: enqueue("reevaluate_jobs", stale))


def describe(shared: Sequence[SharedGpu]) -> list[str]:
    """One line per shared GPU: which GPU, with whom, when (UTC)."""
    return [f"{s.gpu} with {s.other_job} {s.start:%Y-%m-%d %H:%M}-{s.end:%H:%M}" for s in shared]
