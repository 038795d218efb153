"""Shared GPUs: which of a job's GPUs other jobs also used in its window, and each job's share of each GPU.

Detection (the seed's causes 4 and 7: a scheduler giving one GPU to several jobs, MIG slices):
- the same physical GPU (host/index, or UUID) in another job's explicit mapping, or among the GPUs its label
  selector matched (the archived per-GPU keys), in an overlapping window: time-slicing (or a double booking);
- MIG: dcgm-exporter labels each instance's series with `GPU_I_ID` and `GPU_I_PROFILE` (e.g. `3g.40gb`); a
  job on a slice uses that slice's share of the GPU (compute slices / 7 on A100/H100), not all of it.

Attribution (pure, `attribute`): per GPU, the timeline is cut where the set of users changes; in each
segment a MIG instance's slice fraction goes to its users (split evenly when several share one instance),
whole-GPU users split the GPU evenly (time-slicing), and what no one holds is `unallocated`. So per GPU and
segment, the shares plus the unallocated part sum to 1: a GPU's cost is split, never counted once per job.

What the diagnosis needs to show a `shared_gpu` finding (jobs/diagnosis is another engineer's): the
`SharingReport` of `shared_gpus(job)` (which GPUs, with whom, when, the job's share) and `finding_payload`
(code, title, evidence, recommendation in the Finding's shape); utilisation of a shared GPU is the GPU's,
thinned by the other users, so idle/MFU rules should read it against the job's share.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from typing import Any

from django.db.models import Q
from django.utils import timezone

from jobs.metrics.prometheus import PrometheusClient, PrometheusError
from jobs.metrics.promql import Selector
from jobs.models import Job, JobSeries

CODE = "shared_gpu"
MIG_SLICES = 7  # compute slices of an A100 / H100 / H200 in MIG mode
_PROFILE = re.compile(r"(?:^|\.)(\d+)g\.")
RECOMMENDATION = (
    "These GPUs were also used by other jobs (or are MIG slices) in this job's window: utilisation is "
    "thinned out and the job's cost is its share, not the whole GPU. Check the scheduler's GPU binding "
    "(CUDA_VISIBLE_DEVICES, the device plugin's time-slicing or MPS settings) or request whole GPUs."
)


# ------------------------------------------------------------------------------------------------- pure


@dataclass(frozen=True, slots=True)
class Usage:
    """One job on one physical GPU over [start, end) (unix s); `instance`/`profile` for a MIG slice."""

    gpu: str
    job: str
    start: float
    end: float
    instance: str = ""
    profile: str = ""


def mig_fraction(profile: str, slices: int = MIG_SLICES) -> float | None:
    """Share of the GPU's compute a MIG profile holds: `3g.40gb` -> 3/7 (also `1c.3g.40gb`); None when the
    profile is unknown or not MIG."""
    match = _PROFILE.search(profile or "")
    if match is None:
        return None
    n = int(match.group(1))
    return n / slices if 0 < n <= slices else None


@dataclass
class Attribution:
    """GPU-seconds per (job, gpu) attributed by share, the unallocated GPU-seconds per GPU, and each job's
    own GPU-seconds (what it would be charged if every GPU were its alone)."""

    shares: dict[tuple[str, str], float] = field(default_factory=dict)
    unallocated: dict[str, float] = field(default_factory=dict)
    held: dict[tuple[str, str], float] = field(default_factory=dict)

    def job_share(self, job: str) -> float | None:
        """The job's attributed GPU-time over the GPU-time it held (1.0 = no sharing)."""
        held = sum(v for (j, _), v in self.held.items() if j == job)
        if held <= 0:
            return None
        return sum(v for (j, _), v in self.shares.items() if j == job) / held

    def cost_usd(self, usd_per_gpu_hour: float) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for (job, _), seconds in self.shares.items():
            out[job] += seconds / 3600.0 * usd_per_gpu_hour
        return dict(out)


def attribute(usages: Iterable[Usage]) -> Attribution:
    """Split each GPU's time between its users (see the module docstring). A GPU's segments covered by
    nobody are not counted (no job held the GPU then)."""
    result = Attribution()
    by_gpu: dict[str, list[Usage]] = defaultdict(list)
    for u in usages:
        if u.end > u.start:
            by_gpu[u.gpu].append(u)
            key = (u.job, u.gpu)
            result.held[key] = result.held.get(key, 0.0) + (u.end - u.start)
    for gpu, users in by_gpu.items():
        cuts = sorted({t for u in users for t in (u.start, u.end)})
        for t0, t1 in pairwise(cuts):
            active = [u for u in users if u.start < t1 and u.end > t0]
            if not active:
                continue
            span = t1 - t0
            slices: dict[str, list[Usage]] = defaultdict(list)
            whole: list[Usage] = []
            for u in active:
                fraction = mig_fraction(u.profile) if u.instance else None
                (slices[f"{u.instance}|{u.profile}"] if fraction is not None else whole).append(u)
            allocated = 0.0
            for slice_key, group in slices.items():
                fraction = mig_fraction(slice_key.split("|", 1)[1]) or 0.0
                allocated += fraction
                for u in {g.job: g for g in group}.values():
                    k = (u.job, gpu)
                    result.shares[k] = result.shares.get(k, 0.0) + span * fraction / len(
                        {g.job for g in group}
                    )
            remainder = max(0.0, 1.0 - allocated)
            jobs = sorted({u.job for u in whole})
            for job in jobs:
                k = (job, gpu)
                result.shares[k] = result.shares.get(k, 0.0) + span * remainder / len(jobs)
            if not jobs and remainder > 0:
                result.unallocated[gpu] = result.unallocated.get(gpu, 0.0) + span * remainder
    return result


# ---------------------------------------------------------------------------------------------- Django


@dataclass(frozen=True)
class SharedGpu:
    """One of the job's GPUs that another job also used, and when."""

    gpu: str
    other_job: str
    start: datetime
    end: datetime
    mig: bool


@dataclass
class SharingReport:
    job: str
    shared: list[SharedGpu]
    attribution: Attribution
    share: float | None

    @property
    def is_shared(self) -> bool:
        return bool(self.shared) or (self.share is not None and self.share < 0.999)


def _window(job: Job, now: datetime) -> tuple[float, float]:
    return job.started_at.timestamp(), (job.ended_at or now).timestamp()


def gpu_keys(job: Job) -> list[str]:
    """The physical GPUs of a job: its explicit mapping (host/index or UUID), else the GPUs its selector
    matched as archived (per-GPU keys)."""
    keys = []
    for ref in job.gpus or []:
        if isinstance(ref, dict):
            if ref.get("hostname") is not None and ref.get("gpu") is not None:
                keys.append(f"{ref['hostname']}/{ref['gpu']}")
            elif ref.get("uuid"):
                keys.append(str(ref["uuid"]))
    if keys:
        return keys
    return sorted(
        set(
            JobSeries.objects.filter(job=job, signal="gpu_util", stat="gpu")
            .exclude(gpu_key="")
            .values_list("gpu_key", flat=True)
        )
    )


def _selector(job: Job) -> Selector | None:
    if job.gpus:
        return Selector.from_gpus(job.gpus)
    if job.selector:
        return Selector.from_labels(job.selector)
    return None


def mig_instances(client: PrometheusClient, job: Job, now: datetime) -> dict[str, tuple[str, str]]:
    """{host/index: (GPU_I_ID, GPU_I_PROFILE)} of the job's MIG instances ({} without MIG)."""
    selector = _selector(job)
    if selector is None:
        return {}
    start, end = _window(job, now)
    window = max(int(end - start), 60)
    inner = selector.select_range("DCGM_FI_DEV_GPU_UTIL", "last_over_time", window)
    query = f"count by (Hostname, hostname, gpu, GPU_I_ID, GPU_I_PROFILE) ({inner})"
    try:
        samples = client.instant(query, end)
    except PrometheusError:
        return {}
    out = {}
    for s in samples:
        host = s.labels.get("Hostname") or s.labels.get("hostname") or ""
        if s.labels.get("GPU_I_ID") not in (None, "") and host:
            out[f"{host}/{s.labels.get('gpu', '')}"] = (
                s.labels["GPU_I_ID"],
                s.labels.get("GPU_I_PROFILE", ""),
            )
    return out


def _usages(job: Job, now: datetime, mig: dict[str, tuple[str, str]]) -> list[Usage]:
    start, end = _window(job, now)
    out = []
    for key in gpu_keys(job):
        instance, profile = mig.get(key, ("", ""))
        out.append(Usage(key, job.external_id, start, end, instance, profile))
    return out


def shared_gpus(
    job: Job, client: PrometheusClient | None = None, now: datetime | None = None
) -> SharingReport:
    """The job's GPUs also used by other jobs in overlapping windows, and its share of them."""
    now = now or timezone.now()
    start, end = _window(job, now)
    mine = set(gpu_keys(job))
    others = (
        Job.objects.exclude(pk=job.pk)
        .filter(started_at__lt=job.ended_at or now)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=job.started_at))
    )
    migs: dict[int, dict[str, tuple[str, str]]] = {}

    def mig_of(j: Job) -> dict[str, tuple[str, str]]:
        if client is None:
            return {}
        if j.pk not in migs:
            migs[j.pk] = mig_instances(client, j, now)
        return migs[j.pk]

    usages = _usages(job, now, mig_of(job))
    shared: list[SharedGpu] = []
    for other in others[:500]:
        common = mine & set(gpu_keys(other))
        if not common:
            continue
        o_start, o_end = _window(other, now)
        lo, hi = max(start, o_start), min(end, o_end)
        other_mig = mig_of(other)
        usages += [u for u in _usages(other, now, other_mig) if u.gpu in common]
        for gpu in sorted(common):
            shared.append(
                SharedGpu(
                    gpu,
                    other.external_id,
                    datetime.fromtimestamp(lo, tz=now.tzinfo),
                    datetime.fromtimestamp(hi, tz=now.tzinfo),
                    gpu in other_mig or gpu in mig_of(job),
                )
            )
    attribution = attribute(usages)
    return SharingReport(job.external_id, shared, attribution, attribution.job_share(job.external_id))


def finding_payload(report: SharingReport) -> dict[str, Any] | None:
    """A `shared_gpu` finding in jobs.models.Finding's shape, for the diagnosis (None = not shared)."""
    if not report.is_shared:
        return None
    gpus = sorted({s.gpu for s in report.shared})
    others = sorted({s.other_job for s in report.shared})
    mig = any(s.mig for s in report.shared)
    share = report.share
    evidence: list[dict[str, Any]] = [
        {"label": "GPUs shared", "value": len(gpus), "unit": "GPUs"},
        {"label": "other jobs on them", "value": ", ".join(others[:10]), "unit": ""},
    ]
    if share is not None:
        evidence.append(
            {"label": "this job's share of its GPU-time", "value": round(share * 100, 1), "unit": "%"}
        )
    title = (
        f"{len(gpus)} GPU(s) shared with {len(others)} other job(s)"
        + (" as MIG slices" if mig else " (time-sliced)")
        + (f": this job holds {share:.0%} of them" if share is not None else "")
    )
    return {
        "code": CODE,
        "severity": "warning",
        "confidence": 0.9 if mig or report.shared else 0.6,
        "title": title,
        "evidence": evidence,
        "recommendation": RECOMMENDATION,
        "waste_per_day_usd": None,
    }


def describe(shared: Sequence[SharedGpu]) -> list[str]:
    return [f"{s.gpu} with {s.other_job} {s.start:%Y-%m-%d %H:%M}-{s.end:%H:%M}" for s in shared]
