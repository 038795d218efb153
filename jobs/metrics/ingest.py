"""Ingestion's reading side: what a poll or a finalize of a job reads from Prometheus, and the job's
ingestion state (missing signals, `ingest_error`); the archive (jobs.metrics.archive) stores what is read.
The driver that evaluates, stores, diagnoses and alerts on it is jobs.pipeline.poll: this module calls
nothing above the metrics floor.

- poll (running jobs, every minute, cluster-wide: jobs.metrics.cluster): reads only the new window, from
  just before `data_until` (`poll_window`), and the archive merges it into its chunks; overlapping or
  repeated polls store the same values. `data_until` advances only to settled data (#13 item 6,
  `settled_data_until`).
- finalize (ended jobs, `read_finalize`): reads the whole window at a resolution suited to its length, in
  bounded queries, and the archive merges it (never deletes: what Prometheus no longer holds stays as
  polling archived it).
- Prometheus down: the job keeps its archive, `ingest_error` says why (`mark_stale`), and the next
  successful poll resumes from the last archived point, which fills the gap.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from jobs.metrics import archive, cluster
from jobs.metrics.engine_signals import ENGINE_SIGNALS, attach_engine_signals
from jobs.metrics.host_signals import HOST_SIGNALS, HostJoin, attach_host_signals
from jobs.metrics.prometheus import PrometheusClient, PrometheusError, RangeFetcher
from jobs.metrics.promql import GpuRef, Selector
from jobs.metrics.signal_queries import fetch_job_signals, window_total_query
from jobs.metrics.signals import SIGNALS, JobSignals
from jobs.models import Job

log = logging.getLogger(__name__)

POLL_STEP_S = 30  # dcgm-exporter's default collection interval
POLL_PER_GPU_STEP_S = 300  # heatmaps need coarse per-GPU data only
POLL_CYCLE_S = 60  # the beat's poll cadence (efficiency/schedule.py: every minute)
FINALIZE_MAX_POINTS = 4000  # per aggregate series of a finalized job
FINALIZE_MAX_GPU_POINTS = 500  # per GPU row of a finalized job's heatmap
_NICE_STEPS = (30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)


def prometheus_client() -> PrometheusClient:
    """The configured client (settings read at call time, not import time)."""
    return PrometheusClient(
        settings.PROMETHEUS_URL, timeout_s=settings.PROMETHEUS_TIMEOUT_S, retries=settings.PROMETHEUS_RETRIES,
        compress=settings.PROMETHEUS_COMPRESSION,
    )  # fmt: skip


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


# ------------------------------------------------------------------------------------- poll, finalize


#: The one reason every signal gets when the job's selector finds no DCGM series at all: pages show it once,
#: as an ingestion error with the PromQL, instead of one "missing field" row per signal.
NO_GPUS_MATCHED = "selector matched 0 GPUs"


def record_missing(job: Job, sigs: JobSignals) -> None:
    job.missing_signals = sorted(sigs.missing)
    if sigs.missing and not sigs.signals:
        # Not 30 fields switched off: the selector finds no GPU. Say so once, with the query that found none.
        from jobs.metrics.signal_queries import DCGM_NAME_REGEX

        queries = " or ".join(job_selector(job).series_selectors(DCGM_NAME_REGEX))
        reason = f"{NO_GPUS_MATCHED}: no DCGM series for {queries} in the window"
        job.missing_reasons = dict.fromkeys(sigs.missing, reason)
        return
    job.missing_reasons = dict(sigs.missing)


def energy_total(client: PrometheusClient, selector: Selector, start: float, end: float) -> float | None:
    """Energy in J over the window from the TOTAL_ENERGY_CONSUMPTION counter, or None when absent."""
    window = max(end - start, 60.0)
    try:
        samples = client.instant(window_total_query(SIGNALS["total_energy"], selector, window), end)
    except PrometheusError:
        return None
    values = [s.value for s in samples if math.isfinite(s.value)]
    return float(values[0]) if values else None


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


#: What a read could not do: Prometheus unreachable or refusing, or a stored selector that cannot be queried
#: (TypeError/AttributeError: a selector stored before today's validation, not a mapping, a list of GPUs
#: that are not mappings); the job shows why (`mark_stale`) instead of failing every poll.
READ_ERRORS = (PrometheusError, ValueError, TypeError, AttributeError)


@dataclass(frozen=True, slots=True)
class Read:
    """One read of a job from Prometheus: its signals on the window's grid (per-GPU rows attached) and the
    energy total in J over the job so far (None when the counter is absent)."""

    signals: JobSignals
    energy_j: float | None


def read_poll(job: Job, client: PrometheusClient, win: PollWindow) -> Read:
    """A per-job poll's read of `win` (the cluster-wide cycle reads groupable jobs in `cluster.read_cycle`);
    raises one of READ_ERRORS."""
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
    attach_hosts(client, sigs)
    attach_engine(client, sigs, job)
    return Read(sigs, energy_total(client, selector, job.started_at.timestamp(), win.end))


def host_join() -> HostJoin | None:
    """Where node_exporter's series name their node (NODE_EXPORTER_HOST_LABEL), or None when host signals
    are off: what the per-job read (`attach_hosts`) and the poll cycle (`cluster.read_cycle`) join on."""
    label = settings.NODE_EXPORTER_HOST_LABEL
    return HostJoin(label) if label else None


def attach_hosts(client: PrometheusClient, sigs: JobSignals) -> None:
    """node_exporter's host signals for the hosts of the job's GPU rows, when NODE_EXPORTER_HOST_LABEL
    names where node_exporter's series hold the node name (off when empty). Auxiliary: a failed host read
    leaves the host signals missing with the error, never fails the poll."""
    label = settings.NODE_EXPORTER_HOST_LABEL
    if not label:
        return
    try:
        attach_host_signals(client, sigs, join=HostJoin(label))
    except READ_ERRORS as exc:
        why = f"host signals not read: {type(exc).__name__}: {exc}"[:300]
        log.warning("%s (NODE_EXPORTER_HOST_LABEL=%r)", why, label)
        sigs.missing.update({k: why for k in HOST_SIGNALS if k not in sigs.signals})


def reads_engine(job: Job) -> bool:
    """Whether a read of the job also reads its serving engine's FLOP counters (jobs.metrics.engine_signals):
    serving jobs only; the engine's MFU is a serving job's figure (jobs.evaluation.kpis)."""
    return job.kind == Job.Kind.INFERENCE


def attach_engine(client: PrometheusClient, sigs: JobSignals, job: Job) -> None:
    """A serving job's engine counters (vLLM / SGLang `--enable-mfu-metrics`) on `sigs`' grid, joined by the
    job's label selector. Auxiliary like the host signals: a failed read leaves them missing with the error,
    never fails the poll."""
    if not reads_engine(job):
        return
    labels = job.selector if isinstance(job.selector, dict) and not job.gpus else None
    try:
        attach_engine_signals(client, sigs, labels, scrape_interval_s=settings.PROMETHEUS_SCRAPE_INTERVAL_S)
    except READ_ERRORS as exc:
        why = f"engine signals not read: {type(exc).__name__}: {exc}"[:300]
        log.warning("job %s: %s", job.external_id, why)
        sigs.missing.update({k: why for k in ENGINE_SIGNALS if k not in sigs.signals})


def derived_since(
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


def mark_stale(job: Job, exc: Exception, now: datetime) -> Job:
    reason = f"{type(exc).__name__}: {exc}"
    log.warning("job %s: ingestion failed, keeping archived data: %s", job.external_id, reason)
    Job.objects.filter(pk=job.pk).update(
        ingest_error=f"{now:%Y-%m-%d %H:%M} UTC: could not read Prometheus ({reason[:500]})",
        last_polled_at=now,
    )
    job.refresh_from_db()
    return job


#: Raw samples (across the job's GPUs) one finalize range query may read: a 256-GPU x 3-day job's signal
#: is read in a few queries of at most this, each far inside the client timeout (Prometheus evaluates
#: tens of millions of samples per second per core), every part stays within Prometheus' 11,000 points per
#: series, and a per-series answer (FINALIZE_STATS_HERE: one point per GPU per step) stays ~8 MB of JSON.
FINALIZE_MAX_SAMPLES = 2_000_000
#: A finalize computes each signal's cross-GPU stats here from one per-series read (`jobs.metrics.cross_gpu`)
#: instead of asking Prometheus for them in one query that evaluates the per-GPU expression once per stat
#: (#26 item 6, a 256-GPU x 3-day job: those 44 queries cost Prometheus 41.5 of its 51.4 CPU-s). The same
#: stats (cross_gpu's docstring says how exactly); False reads them as the poll does.
FINALIZE_STATS_HERE = True
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


def read_finalize(job: Job, client: PrometheusClient) -> Read:
    """An ended job's whole window at a resolution suited to its length (FINALIZE_MAX_POINTS aggregate points,
    FINALIZE_MAX_GPU_POINTS per GPU row), in queries of at most FINALIZE_MAX_SAMPLES samples and
    FINALIZE_GPU_BATCH GPUs; raises one of READ_ERRORS, or ValueError for a job that has not ended."""
    if job.ended_at is None:
        raise ValueError(f"job {job.external_id} has not ended")
    start, end = job.started_at.timestamp(), job.ended_at.timestamp()
    duration = max(end - start, POLL_STEP_S)
    step = nice_step(duration, FINALIZE_MAX_POINTS)
    gpu_step = max(nice_step(duration, FINALIZE_MAX_GPU_POINTS), step)
    scrape = settings.PROMETHEUS_SCRAPE_INTERVAL_S
    first = math.floor(start / step) * step
    selector = job_selector(job)
    # Only the label spellings Prometheus holds (2 look-ups instead of OR-ing every spelling in each
    # query); the time split below bounds what each query reads (FINALIZE_MAX_SAMPLES).
    found = cluster.discover(client, first, end)
    selector = selector.restricted(found.labels) or selector
    # The range queries FINALIZE_QUERY_CONCURRENCY at a time (each on its own copy of the client): sent
    # one after another they left all but one of Prometheus' cores idle (#26 item 6). Same queries, same
    # grids, so the same signals; a failed query fails the read as before (the rest are dropped).
    with RangeFetcher(client, settings.FINALIZE_QUERY_CONCURRENCY, name="finalize") as fetcher:
        sigs = fetch_job_signals(client, selector, first, end, step, scrape_interval_s=scrape,
                                 max_samples=FINALIZE_MAX_SAMPLES, gpus_hint=max(1, job.gpu_count),
                                 fetcher=fetcher, stats_here=FINALIZE_STATS_HERE)  # fmt: skip
        for batch in _gpu_batches(job, found):
            # Per-GPU rows by GPU batch (explicit GPU lists) and by time: no query over all GPUs x days.
            wide = fetch_job_signals(
                client, batch, first, end, gpu_step, keys=list(sigs.signals), per_gpu_step=gpu_step,
                aggregates=False, scrape_interval_s=scrape, max_samples=FINALIZE_MAX_SAMPLES,
                gpus_hint=FINALIZE_GPU_BATCH if job.gpus else max(1, job.gpu_count), fetcher=fetcher,
            )  # fmt: skip
            _add_per_gpu(sigs, wide)
    attach_hosts(client, sigs)
    attach_engine(client, sigs, job)
    return Read(sigs, energy_total(client, selector, start, end))


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


# ------------------------------------------------------------------------------------------ poll cycle


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


def cycle_target(job: Job, now: datetime) -> cluster.Target | None:
    """The cycle's view of a job (None when its window is empty); raises on a selector it cannot use."""
    win = poll_window(job, now)
    if win.end <= win.start:
        return None
    wide = per_gpu_due(job, now)
    if job.gpus:
        refs = [GpuRef.coerce(g) for g in job.gpus]
        job_selector(job)  # validates (the same errors as a per-job poll)
        pairs = tuple(sorted({(r.hostname, str(r.gpu)) for r in refs}))
        return cluster.Target(
            job.pk, win.start, win.end, win.gpu_start, gpus=pairs, per_gpu=wide, engine=reads_engine(job)
        )
    job_selector(job)
    return cluster.Target(job.pk, win.start, win.end, win.gpu_start, labels=dict(job.selector), per_gpu=wide,
                          engine=reads_engine(job))  # fmt: skip


def archive_cycle(jobs: dict[int, Job], signals: dict[int, JobSignals]) -> bool:
    """Merge every job's new window into the archive in one `archive.upsert` (one COPY and one INSERT
    per level for the cycle instead of per job). False when it failed: then each job writes its own rows,
    and a job whose rows cannot be written gets its own error.

    Tiers are refreshed only where a polled value changed (`tiers_of_changes`): a poll re-reads its
    overlap and its per-GPU lookback, whose values are mostly stored already, and the tier windows of what
    polls stored were refreshed when it was stored (an 800-GPU cycle's write: ~0.2 of ~1.1 CPU-s)."""
    try:
        rows = [row for key, sigs in signals.items() for row in archive.rows_for(jobs[key], sigs, {})]
        archive.upsert(rows, tiers_of_changes=True)
    except Exception:
        log.exception("poll cycle: one archive write for all jobs failed; writing job by job")
        return False
    return True
