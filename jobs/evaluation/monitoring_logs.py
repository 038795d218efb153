"""Read a job's uploaded nvidia-smi logs as signals where DCGM has none, and its dstat logs as host
signals where node_exporter has none (Django side of jobs.evaluation.monitoring_signals and
jobs.evaluation.monitoring_host).

Only logs the diagnosis may use are read (`Artifact.objects.used_in_diagnosis`: parsed, not excluded, and
whose run check did not find them foreign to the job, e.g. captured outside its time, unless a user
confirmed them); within those, only the job's window and, when the log covers more GPUs than the job
has, the job's registered GPUs (`monitoring_signals.pick_gpus`). The newest upload wins where two logs
overlap. dstat logs carry host CPU, disk and network only: no GPU signal comes from them; they supply
the host signals (CPU busy/iowait, disk and network bytes) of the windows node_exporter has no sample in,
and only when they belong to the job: their run check matched the job's host (or a user confirmed them).
A dstat log whose host could not be checked is listed with why, not used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from jobs.evaluation.cycle import CycleContext
from jobs.evaluation.monitoring_host import describe_dstat, dstat_signals
from jobs.evaluation.monitoring_signals import LogSignals, describe, log_signals, merge
from jobs.metrics.signals import JobSignals
from jobs.models import Artifact, Job

#: Logs read per job at most (the newest); an old log beyond them is still listed on the page.
MAX_LOGS = 8


@dataclass
class MonitoringMerge:
    """The job's signals with its logs', where each signal came from, and what the page should say."""

    signals: JobSignals | None
    sources: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: The sampling interval of the log the GPU utilisation came from (None: DCGM's, or no log).
    interval_s: float | None = None
    #: Per signal key taken wholly from a log: that log's sampling interval.
    intervals_s: dict[str, float] = field(default_factory=dict)


def _job_gpu_ids(job: Job) -> list[str]:
    ids = []
    for item in job.gpus or []:
        if isinstance(item, Mapping) and item.get("gpu") not in (None, ""):
            ids.append(str(item["gpu"]))
    return ids


LOG_KINDS = (Artifact.Kind.NVIDIA_SMI, Artifact.Kind.DSTAT)


def _has_logs(job: Job, cycle: CycleContext | None) -> bool:
    """Whether the job may have a parsed nvidia-smi or dstat log; in a poll cycle one query answers for
    all jobs."""
    if cycle is None:
        return True

    def jobs_with_logs() -> frozenset[int]:
        return frozenset(
            Artifact.objects.filter(kind__in=LOG_KINDS, status=Artifact.Status.DONE)
            .values_list("job_id", flat=True)
            .distinct()
        )

    found: frozenset[int] = cycle.lookups.get(("jobs_with_monitoring_logs",), jobs_with_logs)
    return job.pk in found


def with_monitoring_logs(
    job: Job,
    sigs: JobSignals | None,
    ts: np.ndarray,
    step: float,
    end_unix: float,
    cycle: CycleContext | None = None,
    used: Sequence[Artifact] | None = None,
) -> MonitoringMerge:
    """`sigs` (DCGM and node_exporter, fresh or archived; None when the job has none) with the job's
    nvidia-smi logs filling what DCGM lacks and its dstat logs what node_exporter lacks, on the evaluation
    grid `ts` (step `step`). `used`: the job's artifacts `Artifact.objects.used_in_diagnosis()` gives, when
    the caller has read them already (the diagnosis does): the logs are taken from them, not read again."""
    if used is not None:
        # The query's order and limit below, on the rows the caller read (#26 item 2: one query less).
        uploaded = sorted((a for a in used if a.kind in LOG_KINDS), key=lambda a: (a.uploaded_at, a.pk))
        uploaded = uploaded[::-1][: 2 * MAX_LOGS]
    elif not _has_logs(job, cycle):
        return MonitoringMerge(sigs)
    else:
        # One query for both kinds: the newest logs (at most MAX_LOGS of each are read below).
        uploaded = list(
            Artifact.objects.used_in_diagnosis()
            .filter(job=job, kind__in=LOG_KINDS)
            .order_by("-uploaded_at", "-pk")[: 2 * MAX_LOGS]
        )
    artifacts = [a for a in uploaded if a.kind == Artifact.Kind.NVIDIA_SMI][:MAX_LOGS]
    dstats = [a for a in uploaded if a.kind == Artifact.Kind.DSTAT][:MAX_LOGS]
    start = job.started_at.timestamp()
    logs: list[tuple[str, LogSignals]] = []
    notes: list[str] = []
    gpu_ids = _job_gpu_ids(job)
    for art in artifacts:
        analysis = art.analysis if isinstance(art.analysis, dict) else {}
        got = log_signals(
            analysis, ts, step, start=start, end=end_unix, job_gpus=gpu_ids, gpu_count=job.gpu_count
        )
        if got.series:
            logs.append((describe(art.original_name, analysis, got), got))
        elif got.note:
            notes.append(f"the uploaded nvidia-smi log {art.original_name!r} was not used: {got.note}")
    host_logs = []
    for art in dstats:
        if art.run_check == Artifact.RunCheck.MATCHES or art.confirmed_at is not None:
            host_logs.append((art.original_name, art.analysis if isinstance(art.analysis, dict) else {}))
        else:
            notes.append(
                f"the uploaded dstat log {art.original_name!r} was not used: its host could not be checked "
                "against the job's (confirm it on the job page to use its host signals)"
            )
    if host_logs:
        got_hosts, skipped = dstat_signals(host_logs, ts, step, start=start, end=end_unix)
        notes.extend(f"the uploaded dstat log {why}" for why in skipped)
        if got_hosts.series:
            logs.append((describe_dstat(got_hosts), got_hosts))
    merged, sources = merge(sigs, logs, start=start, end=end_unix, step=step, ts=ts)
    intervals: dict[str, float] = {}
    for key, source in sources.items():
        for text, got in logs:
            if source == text and got.interval_s is not None:
                intervals[key] = got.interval_s
    interval = intervals.get("gpu_util")
    if sources:
        keys = ", ".join(sorted(sources))
        texts = sorted(set(sources.values()))
        notes.insert(
            0, f"{keys}: " + "; ".join(texts) + " (DCGM and node_exporter win where both have samples)"
        )
    return MonitoringMerge(merged, sources, notes, interval, intervals)
