"""The pipeline for new data: a poll of a running job (one job, or the cluster-wide cycle) and the finalize of
an ended one. Each reads through jobs.metrics.ingest / jobs.metrics.cluster, archives (jobs.metrics.archive),
then runs the pipeline's steps: evaluate and store (`steps.evaluate_and_store`), archive the derived series,
diagnose (jobs.findings; a running job every DIAGNOSE_RUNNING_EVERY) and, after a poll, the alert rules
(jobs.alerts.incidents). Prometheus down: the job keeps its archive and `ingest_error` says why."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from jobs import locks, service_health
from jobs.alerts import incidents as alerts
from jobs.evaluation.cycle import CycleContext
from jobs.evaluation.load import prepare_cycle
from jobs.evaluation.sharing import Neighbours
from jobs.findings import run_diagnosis
from jobs.metrics import archive, cluster
from jobs.metrics.ingest import (
    POLL_PER_GPU_STEP_S,
    POLL_STEP_S,
    READ_ERRORS,
    archive_cycle,
    cycle_target,
    derived_since,
    ended_jobs,
    energy_due,
    energy_total,
    job_selector,
    mark_stale,
    poll_window,
    prometheus_client,
    read_finalize,
    read_poll,
    record_missing,
    running_jobs,
    settled_data_until,
)
from jobs.metrics.prometheus import PrometheusClient, PrometheusError
from jobs.metrics.signals import JobSignals
from jobs.models import Job, JobSeries
from jobs.pipeline.discovery import discover
from jobs.pipeline.steps import evaluate_and_store

log = logging.getLogger(__name__)

DIAGNOSE_RUNNING_EVERY = timedelta(minutes=10)
#: The Django cache key of the last cycle's figures (read by /metrics): finished_at (Unix s), duration_s,
#: requests (to Prometheus), jobs (polled), stale (jobs left with an ingest error).
POLL_CYCLE_CACHE_KEY = "efficiency:poll_cycle"
#: The cycle's lock (jobs.locks.named_lock): one cycle at a time across workers.
LOCK_KEY = "efficiency:poll_cycle_lock"


def poll_job(job: Job, client: PrometheusClient | None = None, now: datetime | None = None) -> Job:
    """Archive a running job's new data (idempotent) and recompute its summary; records failures.

    The per-job path: `poll_cycle` reads all groupable jobs at once and uses this for the others."""
    client = client or prometheus_client()
    now = now or timezone.now()
    win = poll_window(job, now)
    if win.end <= win.start:
        return job
    try:
        read = read_poll(job, client, win)
    except READ_ERRORS as exc:
        return mark_stale(job, exc, now)
    return store_poll(job, read.signals, win.end, now, client, energy_j=read.energy_j)


_KEEP = object()  # store_poll: keep the job's energy from the last read


def store_poll(
    job: Job,
    sigs: JobSignals,
    end: float,
    now: datetime,
    client: PrometheusClient | None,
    *,
    energy_j: object = _KEEP,
    archived_rows: bool = False,
    derived_out: list[Any] | None = None,
    neighbours: Neighbours | None = None,
    cycle: CycleContext | None = None,
) -> Job:
    """Archive one poll's signals, re-evaluate the job and advance `data_until` to where its data has
    settled (`settled_data_until`); then the diagnosis (when due) and the alert rules.

    The cycle merges every job's rows in one `archive.upsert` (`archived_rows=True`: already written) and
    collects the derived rows in `derived_out` to merge them once too: one COPY per cycle, not per job;
    `neighbours` is its sharing index (jobs.evaluation.sharing.Neighbours), read once for all jobs."""
    with transaction.atomic():
        # The GPU model with the row (the evaluation reads it), locking only the job's row.
        job = Job.objects.select_for_update(of=("self",)).select_related("gpu_model").get(pk=job.pk)
        stored = _column_values(job)
        if energy_j is not _KEEP:
            job.energy_j = energy_j if isinstance(energy_j, float) else None
        if not archived_rows:
            archive.upsert(archive.rows_for(job, sigs, {}))
        # One read of the archive for the summary and the alert rules below (#14): GPU_UTIL per GPU for the
        # exact idle share; the other per-GPU rows are the bulk of the archive.
        snapshot = archive.Snapshot(job, per_gpu=("gpu_util",))
        archived = snapshot.load_job_signals(per_gpu=("gpu_util",))
        derived = evaluate_and_store(job, archived, client, neighbours, cycle=cycle)
        if archived is not None:
            rows = archive.derived_rows(*derived_since(job, archived, derived, sigs.start))
            snapshot.merge(rows)  # the rules read the archive as it is once these rows are written
            if derived_out is None:
                archive.upsert(rows)
            else:
                derived_out.extend(rows)
        # The ingestion state after the evaluation, which does not read it: the poll's metrics-side work
        # stays together instead of interleaving with the evaluation's.
        record_missing(job, sigs)
        job.data_until = archive.utc(settled_data_until(sigs, end, now, job.data_until or job.started_at))
        job.last_polled_at = now
        job.ingest_error = ""
        due = _diagnosis_due(job, now)
        # Only the columns this poll changed (the evaluation's JSON is most of the row and often the same).
        job.save(update_fields=_changed_columns(job, stored))
    if due:
        run_diagnosis(job)
    try:
        alerts.evaluate_job(job, now, archived=snapshot)
    except Exception:  # alerting must never fail a poll
        log.exception("job %s: alert rules failed", job.external_id)
    return job


def _diagnosis_due(job: Job, now: datetime) -> bool:
    """Running jobs are re-diagnosed every DIAGNOSE_RUNNING_EVERY, not on every one-minute poll: the
    diagnosis reads the whole per-GPU archive, which for a large job costs far more than the poll.
    When due, sets `diagnosed_at` to `now` on `job` (the caller saves it with the poll's other columns,
    under the row lock, so two polls never both run it)."""
    last = job.diagnosed_at
    if last is not None and now - last < DIAGNOSE_RUNNING_EVERY:
        return False
    job.diagnosed_at = now
    return True


def _column_values(job: Job) -> dict[str, Any]:
    """The job's column values as loaded (what `_changed_columns` compares against)."""
    return {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}


def _changed_columns(job: Job, stored: dict[str, Any]) -> list[str]:
    """Columns whose value differs from `stored` (values are assigned, never mutated in place, by the
    poll), plus `updated_at` (auto_now: saved only when named)."""
    changed = [name for name, value in stored.items() if getattr(job, name) != value]
    return sorted({*changed, "updated_at"} - {"id"})


def finalize_job(job: Job, client: PrometheusClient | None = None, now: datetime | None = None) -> Job:
    """Merge an ended job's whole window, at a resolution suited to its length, into its archive; evaluate
    the merged archive and diagnose it."""
    client = client or prometheus_client()
    now = now or timezone.now()
    if job.ended_at is None:
        raise ValueError(f"job {job.external_id} has not ended")
    try:
        read = read_finalize(job, client)
    except READ_ERRORS as exc:
        return mark_stale(job, exc, now)
    sigs = read.signals
    if not sigs.signals and JobSeries.objects.filter(job=job).exists():
        # Prometheus no longer has the data (retention): keep the archive from the polls.
        job = _finish(job, now, note="Prometheus had no data for the window; kept the archive from polling")
    else:
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job.pk)
            job.energy_j = read.energy_j
            record_missing(job, sigs)
            # Merge, never replace (#13.6): chunks Prometheus no longer holds (a job longer than its
            # retention) stay as polling archived them, and the summary is of the merged archive.
            archive.upsert(archive.rows_for(job, sigs, {}))
            merged = archive.load_job_signals(job, per_gpu=("gpu_util",))
            derived = evaluate_and_store(job, merged, client)
            if merged is not None:
                archive.upsert(archive.derived_rows(job, merged, derived))
            job.data_until = job.ended_at
            job = _finish(job, now)
    run_diagnosis(job)
    return job


def _finish(job: Job, now: datetime, note: str = "") -> Job:
    if note:
        job.finalize_note = note[:300]
    job.status = Job.Status.FINALIZED
    job.finalized_at = now
    job.last_polled_at = now
    job.ingest_error = ""
    job.save()
    return job


def ingest_once(client: PrometheusClient | None = None) -> dict[str, Any]:
    """Discover unregistered jobs (when configured), poll every running job (one cycle) and finalize every
    ended one, synchronously (the `ingest --once` command)."""
    client = client or prometheus_client()
    report: dict[str, Any] = {"polled": [], "finalized": [], "stale": []}
    report["discovered"] = discover(client)["created"]
    cycle = poll_cycle(client)
    report["polled"] += cycle["polled"]
    report["stale"] += cycle["stale_jobs"]
    for job in ended_jobs():
        job = finalize_job(job, client)
        report["stale" if job.ingest_error else "finalized"].append(job.external_id)
    return report


def poll_cycle(client: PrometheusClient | None = None, now: datetime | None = None) -> dict[str, Any]:
    """One poll of every running job: the groupable ones read cluster-wide (`jobs.metrics.cluster`, a
    fixed number of queries per signal), the others per job; each job archived and evaluated as
    `poll_job` does. One bad job (a stored selector that cannot be queried, an evaluation error) gets an
    `ingest_error` and never stops the cycle. Writes the cycle's figures to the cache
    (POLL_CYCLE_CACHE_KEY) and its end as the service's heartbeat (jobs.service_health). A second cycle while
    one runs returns at once (`skipped`). The lock has a short TTL renewed while the cycle runs
    (jobs.locks), so a worker killed mid-cycle delays the next cycle by at most POLL_CYCLE_LOCK_TTL_S."""
    lock = locks.named_lock(LOCK_KEY, settings.POLL_CYCLE_LOCK_TTL_S)
    if not lock.acquire():
        return {"skipped": True, "polled": [], "stale_jobs": [], "jobs": 0}
    try:
        now = now or timezone.now()
        report = _poll_cycle(client or prometheus_client(), now)
        duration = float(report["duration_s"])
        service_health.record_cycle(
            service_health.cycle_end(now, duration),
            duration,
            {"jobs": report["jobs"], "stale": report["stale"], "requests": report["requests"]},
        )
        return report
    finally:
        lock.release()


def _poll_cycle(client: PrometheusClient, now: datetime) -> dict[str, Any]:
    t0 = time.monotonic()
    requests0 = client.requests
    jobs = {job.pk: job for job in running_jobs()}
    targets: list[cluster.Target] = []
    fallback: list[int] = []
    done: dict[int, Job] = {}
    for job in jobs.values():
        try:
            target = cycle_target(job, now)
        except Exception as exc:  # a stored selector the builder refuses: that job only
            done[job.pk] = mark_stale(job, exc, now)
            continue
        if target is not None:
            targets.append(target)
        else:
            done[job.pk] = job
    grouped = targets
    with_gpu = sum(t.per_gpu for t in grouped)  # jobs whose per-GPU rows this cycle reads
    scrape = settings.PROMETHEUS_SCRAPE_INTERVAL_S
    try:
        result = cluster.read_cycle(
            client, grouped, step=POLL_STEP_S, per_gpu_step=POLL_PER_GPU_STEP_S,
            scrape_interval_s=scrape, workers=cluster.CYCLE_QUERY_WORKERS,
        )  # fmt: skip
    except PrometheusError as exc:  # discovery failed: Prometheus is down for everyone
        for t in grouped:
            done[t.key] = mark_stale(jobs[t.key], exc, now)
        result = cluster.CycleResult()
    fallback += result.fallback
    by_key = {t.key: t for t in grouped}
    for key, reason in result.errors.items():
        done[key] = mark_stale(jobs[key], RuntimeError(reason), now)
    archived_rows = archive_cycle(jobs, result.signals)
    # The sharing look-up of every evaluation below from one read (after the archive write, which brings
    # the per-GPU keys; when it failed each job writes its own rows, so each reads its own keys).
    neighbours = Neighbours(list(jobs.values())) if archived_rows and result.signals else None
    # MIG instances, the new window's throughput (one query per template) and the price/baseline memo,
    # read once for the cycle's evaluations instead of once per job (jobs.evaluation.cycle).
    shared: CycleContext | None = None
    if result.signals:
        try:
            shared = prepare_cycle(client, [jobs[k] for k in result.signals], result.signals, now)
        except Exception:  # the evaluations then read per job, as poll_job does
            log.exception("poll cycle: the shared reads for the evaluations failed; reading per job")
    derived: list[Any] = []
    for key, sigs in result.signals.items():
        job = jobs[key]
        try:
            energy: object = _KEEP
            if energy_due(job, now):
                energy = energy_total(client, job_selector(job), job.started_at.timestamp(), by_key[key].end)
            done[key] = store_poll(job, sigs, by_key[key].end, now, client, energy_j=energy,
                                   archived_rows=archived_rows, derived_out=derived,
                                   neighbours=neighbours, cycle=shared)  # fmt: skip
            if neighbours is not None:
                neighbours.update(done[key])
        except Exception as exc:  # one job's failure must not stop the cycle
            log.exception("job %s: poll failed", job.external_id)
            done[key] = mark_stale(job, exc, now)
    if shared is not None:
        derived += shared.repair_rows(jobs)
    try:
        archive.upsert(derived)
    except Exception:  # the next poll writes them again (merges are idempotent)
        log.exception("poll cycle: writing the derived series failed")
    for key in fallback:
        try:
            done[key] = poll_job(jobs[key], client, now)
        except Exception as exc:
            log.exception("job %s: poll failed", jobs[key].external_id)
            done[key] = mark_stale(jobs[key], exc, now)
    stale = sorted(j.external_id for j in done.values() if j.ingest_error)
    polled = sorted(j.external_id for j in done.values() if not j.ingest_error)
    stats = {
        "finished_at": time.time(),
        "duration_s": time.monotonic() - t0,
        "requests": client.requests - requests0,
        "jobs": len(jobs),
        "stale": len(stale),
    }
    cache.set(POLL_CYCLE_CACHE_KEY, stats, None)
    return {**stats, "polled": polled, "stale_jobs": stale, "per_gpu": with_gpu, "grouped": len(grouped),
            "per_job": len(fallback)}  # fmt: skip
