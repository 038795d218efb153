"""Ingestion: pull a job's DCGM signals from Prometheus, archive them in Postgres, re-evaluate the job.

- poll (running jobs, every minute, `poll_cycle`: cluster-wide, see jobs.metrics.cluster): reads only the
  new window, from just before `data_until`, and the archive merges it into its chunks; overlapping or
  repeated polls store the same values. `data_until` advances only to settled data (#13 item 6).
- finalize (ended jobs): reads the whole window at a resolution suited to its length and merges it into
  the archive (never deletes: what Prometheus no longer holds stays as polling archived it).
- Prometheus down: the job keeps its archive, `ingest_error` says why, and the next successful poll
  resumes from the last archived point, which fills the gap.
- After each poll and finalize the job's diagnosis runs again (findings updated in place).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from jobs import locks, service_health
from jobs.alerts import incidents as alerts
from jobs.alerts import sharing
from jobs.evaluation.cycle import CycleContext
from jobs.evaluation.evaluate import evaluate
from jobs.evaluation.load import load_context, prepare_cycle
from jobs.evaluation.store import store
from jobs.findings import run_diagnosis
from jobs.metrics import archive, cluster
from jobs.metrics.discovery import discover
from jobs.metrics.prometheus import PrometheusClient, PrometheusError
from jobs.metrics.promql import GpuRef, Selector
from jobs.metrics.signal_queries import fetch_job_signals, window_total_query
from jobs.metrics.signals import SIGNALS, JobSignals
from jobs.models import Job, JobSeries

log = logging.getLogger(__name__)

POLL_STEP_S = 30  # dcgm-exporter's default collection interval
POLL_PER_GPU_STEP_S = 300  # heatmaps need coarse per-GPU data only
POLL_CYCLE_S = 60  # the beat's poll cadence (efficiency/schedule.py: every minute)
FINALIZE_MAX_POINTS = 4000  # per aggregate series of a finalized job
FINALIZE_MAX_GPU_POINTS = 500  # per GPU row of a finalized job's heatmap
DIAGNOSE_RUNNING_EVERY = timedelta(minutes=10)
_NICE_STEPS = (30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)


def prometheus_client() -> PrometheusClient:
    """The configured client (settings read at call time, not import time)."""
    return PrometheusClient(
        settings.PROMETHEUS_URL, timeout_s=settings.PROMETHEUS_TIMEOUT_S, retries=settings.PROMETHEUS_RETRIES
    )


def job_selector(job: Job) -> Selector:
    """The PromQL selector of the job's GPUs: explicit (host, GPU) pairs or a label matcher."""
    if job.gpus:
        return Selector.from_gpus(job.gpus)
    if job.selector:
        return Selector.from_labels(job.selector)
    raise ValueError(f"job {job.external_id} has neither a GPU list nor a label selector")


def nice_step(duration_s: float, max_points: int) -> int:
    """The smallest step from a fixed ladder that keeps `duration_s` within `max_points` points."""
    for step in _NICE_STEPS:
        if duration_s / step <= max_points:
            return step
    return math.ceil(duration_s / max_points)


# ------------------------------------------------------------------------------------------- evaluation


def update_summary(
    job: Job,
    sigs: JobSignals | None,
    client: PrometheusClient | None,
    neighbours: sharing.Neighbours | None = None,
    *,
    cycle: CycleContext | None = None,
) -> dict[str, np.ndarray]:
    """Re-evaluate the job on `sigs` through the spine (load_context -> evaluate -> store; not saved);
    returns the derived series to archive (throughput, MFU). `neighbours`: the cycle's sharing index;
    `cycle`: the cycle's shared reads (jobs.evaluation.cycle), None on the per-job paths."""
    evaluated = evaluate(load_context(job, sigs, client, neighbours=neighbours, cycle=cycle))
    store(job, evaluated.evaluation)
    return evaluated.derived


# ------------------------------------------------------------------------------------- poll, finalize


#: The one reason every signal gets when the job's selector finds no DCGM series at all: pages show it once,
#: as an ingestion error with the PromQL, instead of one "missing field" row per signal.
NO_GPUS_MATCHED = "selector matched 0 GPUs"


def _record_missing(job: Job, sigs: JobSignals) -> None:
    job.missing_signals = sorted(sigs.missing)
    if sigs.missing and not sigs.signals:
        # Not 30 fields switched off: the selector finds no GPU. Say so once, with the query that found none.
        from jobs.metrics.signal_queries import DCGM_NAME_REGEX

        queries = " or ".join(job_selector(job).series_selectors(DCGM_NAME_REGEX))
        reason = f"{NO_GPUS_MATCHED}: no DCGM series for {queries} in the window"
        job.missing_reasons = dict.fromkeys(sigs.missing, reason)
        return
    job.missing_reasons = dict(sigs.missing)


def _energy_total(client: PrometheusClient, selector: Selector, start: float, end: float) -> float | None:
    """Energy in J over the window from the TOTAL_ENERGY_CONSUMPTION counter, or None when absent."""
    window = max(end - start, 60.0)
    try:
        samples = client.instant(window_total_query(SIGNALS["total_energy"], selector, window), end)
    except PrometheusError:
        return None
    values = [s.value for s in samples if math.isfinite(s.value)]
    return float(values[0]) if values else None


def _set_energy(job: Job, energy_j: float | None) -> None:
    job.energy_j = energy_j


@dataclass(frozen=True, slots=True)
class PollWindow:
    """What a poll of one job reads: the aggregate grid from `start`, per-GPU rows from `gpu_start`,
    through `end` (the job's end or now)."""

    start: float
    gpu_start: float
    end: float


#: A poll re-reads from one step before `data_until`: the point closing the window that holds it.
POLL_OVERLAP_S = POLL_STEP_S
#: Per-GPU rows are read every POLL_PER_GPU_STEP_S (`per_gpu_due`) from this far before `data_until`,
#: so a slow or skipped cycle leaves no hole (the archive merges overlapping windows).
PER_GPU_LOOKBACK_S = 3 * POLL_PER_GPU_STEP_S


def poll_window(job: Job, now: datetime) -> PollWindow:
    """The window a poll reads: only what is new, from just before `data_until` (the archive merges a
    window into its chunks, so nothing outside it is rewritten), the whole job on its first poll."""
    end = min(job.ended_at or now, now).timestamp()
    first = job.started_at.timestamp()
    start, gpu_start = _floor(first, POLL_STEP_S), _floor(first, POLL_PER_GPU_STEP_S)
    if job.data_until is not None:
        resume = job.data_until.timestamp()
        start = max(start, _floor(resume - POLL_OVERLAP_S, POLL_STEP_S))
        gpu_start = max(gpu_start, _floor(resume - PER_GPU_LOOKBACK_S, POLL_PER_GPU_STEP_S))
    return PollWindow(start, gpu_start, end)


def _floor(ts: float, step: float) -> float:
    return math.floor(ts / step) * step


def poll_job(job: Job, client: PrometheusClient | None = None, now: datetime | None = None) -> Job:
    """Archive a running job's new data (idempotent) and recompute its summary; records failures.

    The per-job path: `poll_cycle` reads all groupable jobs at once and uses this for the others."""
    client = client or prometheus_client()
    now = now or timezone.now()
    win = poll_window(job, now)
    if win.end <= win.start:
        return job
    try:
        selector = job_selector(job)
        scrape = settings.PROMETHEUS_SCRAPE_INTERVAL_S
        sigs = fetch_job_signals(client, selector, win.start, win.end, POLL_STEP_S, scrape_interval_s=scrape)
        # Per-GPU chunks are longer than aggregate ones: read them from their own chunk start so each
        # archived row is rewritten whole (one per-GPU query per present signal).
        wide = fetch_job_signals(
            client, selector, win.gpu_start, win.end, POLL_PER_GPU_STEP_S,
            keys=list(sigs.signals), per_gpu_step=POLL_PER_GPU_STEP_S, aggregates=False,
            scrape_interval_s=scrape,
        )  # fmt: skip
        for key, series in wide.signals.items():
            if key in sigs.signals:
                sigs.signals[key].gpus = series.gpus
                sigs.signals[key].gpu_timestamps = series.gpu_timestamps
                sigs.signals[key].per_gpu = series.per_gpu
        energy_j = _energy_total(client, selector, job.started_at.timestamp(), win.end)
    except (PrometheusError, ValueError, TypeError, AttributeError) as exc:
        # TypeError/AttributeError: a selector stored before today's validation (not a mapping, a list
        # of GPUs that are not mappings); the job shows why instead of failing every poll.
        return _mark_stale(job, exc, now)
    return store_poll(job, sigs, win.end, now, client, energy_j=energy_j)


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
    neighbours: sharing.Neighbours | None = None,
    cycle: CycleContext | None = None,
) -> Job:
    """Archive one poll's signals, re-evaluate the job and advance `data_until` to where its data has
    settled (`settled_data_until`); then the diagnosis (when due) and the alert rules.

    The cycle merges every job's rows in one `archive.upsert` (`archived_rows=True`: already written) and
    collects the derived rows in `derived_out` to merge them once too: one COPY per cycle, not per job;
    `neighbours` is its sharing index (jobs.alerts.sharing.Neighbours), read once for all jobs."""
    with transaction.atomic():
        # The GPU model with the row (the evaluation reads it), locking only the job's row.
        job = Job.objects.select_for_update(of=("self",)).select_related("gpu_model").get(pk=job.pk)
        stored = _column_values(job)
        if energy_j is not _KEEP:
            _set_energy(job, energy_j if isinstance(energy_j, float) else None)
        _record_missing(job, sigs)
        if not archived_rows:
            archive.upsert(archive.rows_for(job, sigs, {}))
        # One read of the archive for the summary and the alert rules below (#14): GPU_UTIL per GPU for the
        # exact idle share; the other per-GPU rows are the bulk of the archive.
        snapshot = archive.Snapshot(job, per_gpu=("gpu_util",))
        archived = snapshot.load_job_signals(per_gpu=("gpu_util",))
        derived = update_summary(job, archived, client, neighbours, cycle=cycle)
        if archived is not None:
            rows = archive.derived_rows(*_new_part(job, archived, derived, sigs.start))
            snapshot.merge(rows)  # the rules read the archive as it is once these rows are written
            if derived_out is None:
                archive.upsert(rows)
            else:
                derived_out.extend(rows)
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


def _new_part(
    job: Job, archived: JobSignals, derived: dict[str, np.ndarray], since: float
) -> tuple[Job, JobSignals, dict[str, np.ndarray]]:
    """The derived series (throughput, MFU) from `since` on: the archive merges them into their chunks,
    so a poll writes only its own window of them, not the whole job's."""
    keep = archived.timestamps >= since
    ts = archived.timestamps[keep]
    part = JobSignals(float(ts[0]) if ts.size else since, archived.end, archived.step, ts)
    return job, part, {k: np.asarray(v)[keep] for k, v in derived.items() if np.size(v) == keep.size}


#: Data still incomplete this many ingestion lags after its time is taken as lost (a failed scrape, a node
#: that went away), not late: otherwise one missed scrape would hold `data_until` back, and the
#: ingestion-stale alert (ALERT_STALE_MINUTES, 10 by default) would fire on a healthy job.
INCOMPLETE_GIVE_UP_LAGS = 5.0


def settled_data_until(sigs: JobSignals, end: float, now: datetime, previous: datetime) -> float:
    """How far a poll may advance `data_until` (#13 item 6): no further than now minus
    PROMETHEUS_INGESTION_LAG_S (samples still in flight), the job's end, and the last grid time for
    which every present signal has data across the job's GPUs (`cluster.settled_until`), so late or
    partial data is re-read by the next poll. Data incomplete for INCOMPLETE_GIVE_UP_LAGS lags (5 min by
    default) is given up on.
    Never before the previous value."""
    lag = float(settings.PROMETHEUS_INGESTION_LAG_S)
    limit = min(end, now.timestamp() - lag)
    settled = cluster.settled_until(sigs)
    if settled is not None:
        give_up = now.timestamp() - INCOMPLETE_GIVE_UP_LAGS * max(lag, float(POLL_STEP_S))
        limit = min(limit, max(settled, give_up))
    return max(limit, min(previous.timestamp(), end))


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


def _mark_stale(job: Job, exc: Exception, now: datetime) -> Job:
    reason = f"{type(exc).__name__}: {exc}"
    log.warning("job %s: ingestion failed, keeping archived data: %s", job.external_id, reason)
    Job.objects.filter(pk=job.pk).update(
        ingest_error=f"{now:%Y-%m-%d %H:%M} UTC: could not read Prometheus ({reason[:500]})",
        last_polled_at=now,
    )
    job.refresh_from_db()
    return job


def finalize_job(job: Job, client: PrometheusClient | None = None, now: datetime | None = None) -> Job:
    """Merge an ended job's whole window, at a resolution suited to its length, into its archive."""
    client = client or prometheus_client()
    now = now or timezone.now()
    if job.ended_at is None:
        raise ValueError(f"job {job.external_id} has not ended")
    start, end = job.started_at.timestamp(), job.ended_at.timestamp()
    duration = max(end - start, POLL_STEP_S)
    step = nice_step(duration, FINALIZE_MAX_POINTS)
    gpu_step = max(nice_step(duration, FINALIZE_MAX_GPU_POINTS), step)
    scrape = settings.PROMETHEUS_SCRAPE_INTERVAL_S
    first = math.floor(start / step) * step
    try:
        selector = job_selector(job)
        # Only the label spellings Prometheus holds (2 look-ups instead of OR-ing every spelling in each
        # query); the time split below bounds what each query reads (FINALIZE_MAX_SAMPLES).
        found = cluster.discover(client, first, end)
        selector = selector.restricted(found.labels) or selector
        sigs = fetch_job_signals(client, selector, first, end, step, scrape_interval_s=scrape,
                                 max_samples=FINALIZE_MAX_SAMPLES)  # fmt: skip
        for batch in _gpu_batches(job, found):
            # Per-GPU rows by GPU batch (explicit GPU lists) and by time: no query over all GPUs x days.
            wide = fetch_job_signals(
                client, batch, first, end, gpu_step, keys=list(sigs.signals), per_gpu_step=gpu_step,
                aggregates=False, scrape_interval_s=scrape, max_samples=FINALIZE_MAX_SAMPLES,
                gpus_hint=FINALIZE_GPU_BATCH if job.gpus else max(1, job.gpu_count),
            )  # fmt: skip
            _add_per_gpu(sigs, wide)
        energy_j = _energy_total(client, selector, start, end)
    except (PrometheusError, ValueError, TypeError, AttributeError) as exc:
        return _mark_stale(job, exc, now)
    if not sigs.signals and JobSeries.objects.filter(job=job).exists():
        # Prometheus no longer has the data (retention): keep the archive from the polls.
        job = _finish(job, now, note="Prometheus had no data for the window; kept the archive from polling")
    else:
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job.pk)
            _set_energy(job, energy_j)
            _record_missing(job, sigs)
            # Merge, never replace (#13.6): chunks Prometheus no longer holds (a job longer than its
            # retention) stay as polling archived them, and the summary is of the merged archive.
            archive.upsert(archive.rows_for(job, sigs, {}))
            merged = archive.load_job_signals(job, per_gpu=("gpu_util",))
            derived = update_summary(job, merged, client)
            if merged is not None:
                archive.upsert(archive.derived_rows(job, merged, derived))
            job.data_until = job.ended_at
            job = _finish(job, now)
    run_diagnosis(job)
    return job


#: Raw samples (across the job's GPUs) one finalize range query may read: a 256-GPU x 3-day job's signal
#: is read in a few queries of at most this, each far inside the client timeout (Prometheus evaluates
#: tens of millions of samples per second per core; 2 M leaves room for the 5 stats of one query on a
#: loaded server), and every part stays within Prometheus' 11,000 points per series.
FINALIZE_MAX_SAMPLES = 2_000_000
#: GPUs per per-GPU finalize query of a job with an explicit GPU list.
FINALIZE_GPU_BATCH = 64


def _gpu_batches(job: Job, found: cluster.Discovery) -> list[Selector]:
    """Selectors of at most FINALIZE_GPU_BATCH GPUs each for an explicit GPU list (only the host-label
    spellings that exist); a label selector is one batch (its GPUs are not known before reading)."""
    if not job.gpus:
        selector = job_selector(job)
        return [selector.restricted(found.labels) or selector]
    refs = [GpuRef.coerce(g) for g in job.gpus]
    out = []
    for i in range(0, len(refs), FINALIZE_GPU_BATCH):
        batch = Selector.from_gpus(refs[i : i + FINALIZE_GPU_BATCH])
        out.append(batch.restricted(found.labels) or batch)
    return out


def _add_per_gpu(sigs: JobSignals, wide: JobSignals) -> None:
    """Append one GPU batch's per-GPU rows to `sigs` (rows kept sorted by GPU as `per_gpu_matrix` sorts)."""
    for key, part in wide.signals.items():
        target = sigs.signals.get(key)
        if target is None or part.per_gpu is None:
            continue
        if target.per_gpu is None or target.gpu_timestamps is None:
            target.gpus, target.per_gpu, target.gpu_timestamps = part.gpus, part.per_gpu, part.gpu_timestamps
            continue
        rows = dict(zip(target.gpus, target.per_gpu, strict=True))
        rows.update(zip(part.gpus, part.per_gpu, strict=True))
        order = sorted(rows, key=lambda k: (k.hostname, int(k.gpu) if k.gpu.isdigit() else -1, k.gpu))
        target.gpus = tuple(order)
        target.per_gpu = np.vstack([rows[k] for k in order]) if order else target.per_gpu


def _finish(job: Job, now: datetime, note: str = "") -> Job:
    if note:
        job.finalize_note = note[:300]
    job.status = Job.Status.FINALIZED
    job.finalized_at = now
    job.last_polled_at = now
    job.ingest_error = ""
    job.save()
    return job


def running_jobs() -> QuerySet[Job]:
    """Jobs to poll: running, or ended but not yet finalized."""
    return Job.objects.filter(status=Job.Status.RUNNING).select_related("gpu_model")


def ended_jobs(grace: timedelta = timedelta(minutes=2)) -> QuerySet[Job]:
    """Ended jobs to finalize, once the last scrapes after their end have landed."""
    cutoff = timezone.now() - grace
    return (
        Job.objects.filter(ended_at__isnull=False, ended_at__lte=cutoff)
        .exclude(status=Job.Status.FINALIZED)
        .select_related("gpu_model")
    )


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


# ------------------------------------------------------------------------------------------ poll cycle

#: The Django cache key of the last cycle's figures (read by /metrics): finished_at (Unix s), duration_s,
#: requests (to Prometheus), jobs (polled), stale (jobs left with an ingest error).
POLL_CYCLE_CACHE_KEY = "efficiency:poll_cycle"
_LOCK_KEY = "efficiency:poll_cycle_lock"


def per_gpu_due(job: Job, now: datetime) -> bool:
    """Whether this cycle reads the job's per-GPU rows (the heatmap's, at POLL_PER_GPU_STEP_S) and its energy
    total (`energy_due`): on its first poll, then once per POLL_PER_GPU_STEP_S, in the minute of that step
    the job's id picks. Work done per job at that cadence is spread evenly over the cycles (a fifth of the
    jobs in each) instead of landing in one cycle out of five: reading every job's rows in the same cycle
    made it 1.5-2x a steady one at 4,000 GPUs (81.5 s against 40.7-58.9 s, #14). A cycle that skips a
    minute delays those jobs by one step; PER_GPU_LOOKBACK_S re-reads enough that no window is lost."""
    if job.data_until is None:
        return True
    slots = max(1, round(POLL_PER_GPU_STEP_S / POLL_CYCLE_S))
    return math.floor(now.timestamp() / POLL_CYCLE_S) % slots == job.pk % slots


def energy_due(job: Job, now: datetime) -> bool:
    """Whether this cycle reads the job's energy total: in the same cycles as its per-GPU rows. Energy over
    the whole job is one instant query per job (each job has its own window, so it cannot be read
    cluster-wide); spread so, each cycle sends a fifth of them (100 rather than 500 at 4,000 GPUs). Between
    reads the last value is kept."""
    return per_gpu_due(job, now)


def _target(job: Job, now: datetime) -> cluster.Target | None:
    """The cycle's view of a job (None when its window is empty); raises on a selector it cannot use."""
    win = poll_window(job, now)
    if win.end <= win.start:
        return None
    wide = per_gpu_due(job, now)
    if job.gpus:
        refs = [GpuRef.coerce(g) for g in job.gpus]
        job_selector(job)  # validates (the same errors as a per-job poll)
        pairs = tuple(sorted({(r.hostname, str(r.gpu)) for r in refs}))
        return cluster.Target(job.pk, win.start, win.end, win.gpu_start, gpus=pairs, per_gpu=wide)
    job_selector(job)
    return cluster.Target(job.pk, win.start, win.end, win.gpu_start, labels=dict(job.selector), per_gpu=wide)


def poll_cycle(client: PrometheusClient | None = None, now: datetime | None = None) -> dict[str, Any]:
    """One poll of every running job: the groupable ones read cluster-wide (`jobs.metrics.cluster`, a
    fixed number of queries per signal), the others per job; each job archived and evaluated as
    `poll_job` does. One bad job (a stored selector that cannot be queried, an evaluation error) gets an
    `ingest_error` and never stops the cycle. Writes the cycle's figures to the cache
    (POLL_CYCLE_CACHE_KEY) and its end as the service's heartbeat (jobs.service_health). A second cycle while
    one runs returns at once (`skipped`). The lock has a short TTL renewed while the cycle runs
    (jobs.locks), so a worker killed mid-cycle delays the next cycle by at most POLL_CYCLE_LOCK_TTL_S."""
    lock = locks.named_lock(_LOCK_KEY, settings.POLL_CYCLE_LOCK_TTL_S)
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


def _archive_cycle(jobs: dict[int, Job], signals: dict[int, JobSignals]) -> bool:
    """Merge every job's new window into the archive in one `archive.upsert` (one COPY and one INSERT
    per level for the cycle instead of per job). False when it failed: then each job writes its own rows,
    and a job whose rows cannot be written gets its own error."""
    try:
        rows = [row for key, sigs in signals.items() for row in archive.rows_for(jobs[key], sigs, {})]
        archive.upsert(rows)
    except Exception:
        log.exception("poll cycle: one archive write for all jobs failed; writing job by job")
        return False
    return True


def _poll_cycle(client: PrometheusClient, now: datetime) -> dict[str, Any]:
    t0 = time.monotonic()
    requests0 = client.requests
    jobs = {job.pk: job for job in running_jobs()}
    targets: list[cluster.Target] = []
    fallback: list[int] = []
    done: dict[int, Job] = {}
    for job in jobs.values():
        try:
            target = _target(job, now)
        except Exception as exc:  # a stored selector the builder refuses: that job only
            done[job.pk] = _mark_stale(job, exc, now)
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
            done[t.key] = _mark_stale(jobs[t.key], exc, now)
        result = cluster.CycleResult()
    fallback += result.fallback
    by_key = {t.key: t for t in grouped}
    for key, reason in result.errors.items():
        done[key] = _mark_stale(jobs[key], RuntimeError(reason), now)
    archived_rows = _archive_cycle(jobs, result.signals)
    # The sharing look-up of every evaluation below from one read (after the archive write, which brings
    # the per-GPU keys; when it failed each job writes its own rows, so each reads its own keys).
    neighbours = sharing.Neighbours(list(jobs.values())) if archived_rows and result.signals else None
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
                energy = _energy_total(client, job_selector(job), job.started_at.timestamp(), by_key[key].end)
            done[key] = store_poll(job, sigs, by_key[key].end, now, client, energy_j=energy,
                                   archived_rows=archived_rows, derived_out=derived,
                                   neighbours=neighbours, cycle=shared)  # fmt: skip
            if neighbours is not None:
                neighbours.update(done[key])
        except Exception as exc:  # one job's failure must not stop the cycle
            log.exception("job %s: poll failed", job.external_id)
            done[key] = _mark_stale(job, exc, now)
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
            done[key] = _mark_stale(jobs[key], exc, now)
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
