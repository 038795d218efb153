"""Ingestion: pull a job's DCGM signals from Prometheus, archive them in Postgres, recompute its summary.

- poll (running jobs, every minute): re-reads from the start of the archive chunk that holds the last
  archived point, so a chunk row is always rewritten whole; overlapping or repeated polls store the same rows.
- finalize (ended jobs): reads the whole window at a resolution suited to its length and replaces the
  archive in one transaction, so a job page keeps working after Prometheus dropped the data.
- Prometheus down: the job keeps its archive, `ingest_error` says why, and the next successful poll
  resumes from the last archived point, which fills the gap.
- After each poll and finalize the job's diagnosis runs again (findings updated in place).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs import archive
from jobs.baselines import active_baseline
from jobs.discovery import discover
from jobs.findings import run_diagnosis
from jobs.kpis import ModelShape, compute_kpis, tokens_per_second_from_progress
from jobs.models import Job, JobSeries, PriceEntry
from jobs.prometheus import PrometheusClient, PrometheusError
from jobs.promql import Selector
from jobs.signals import SIGNALS, JobSignals, fetch_job_signals, grid, window_total_query

log = logging.getLogger(__name__)

POLL_STEP_S = 30  # dcgm-exporter's default collection interval
POLL_PER_GPU_STEP_S = 300  # heatmaps need coarse per-GPU data only
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


def _aligned(ts: float, step: int) -> float:
    span = step * archive.CHUNK_POINTS
    return math.floor(ts / span) * span


# ---------------------------------------------------------------------------------------- throughput


def throughput_series(
    job: Job, ts: np.ndarray, client: PrometheusClient | None
) -> tuple[np.ndarray | None, str]:
    """tokens/s on `ts` from, in order: pushed progress, the job's PromQL expression, profiler step times."""
    points = list(job.progress.order_by("timestamp").values_list("timestamp", "tokens"))
    if len(points) >= 2:
        times = np.array([p[0].timestamp() for p in points])
        tokens = np.array([float(p[1]) for p in points])
        return tokens_per_second_from_progress(times, tokens, ts), "pushed progress (tokens over time)"
    if job.throughput_query and client is not None and ts.size:
        step = float(ts[1] - ts[0]) if ts.size > 1 else float(POLL_STEP_S)
        series = client.range(job.throughput_query, float(ts[0]), float(ts[-1]), step)
        if series:
            rows = np.vstack([s.on_grid(ts) for s in series])
            # Several series (one per rank, say) add up; a time with no sample at all stays missing.
            values = np.where(np.isnan(rows).all(axis=0), np.nan, np.nansum(rows, axis=0))
            return values, f"PromQL: {job.throughput_query}"
    step_ms = (job.summary or {}).get("profiler_step_time_ms")
    if step_ms and job.tokens_per_step:
        rate = job.tokens_per_step / (step_ms / 1000.0)
        return np.full(
            ts.shape, rate
        ), f"profiler step time {step_ms:.1f} ms × {job.tokens_per_step} tokens/step"
    return None, ""


# ------------------------------------------------------------------------------------------- summary


def _prices(job: Job) -> tuple[list[tuple[datetime, float]], str]:
    tier = job.price_tier or settings.DEFAULT_PRICE_TIER
    if job.gpu_model is None:
        return [], f"unknown GPU model {job.gpu_model_name!r}"
    entries = PriceEntry.objects.filter(gpu_model=job.gpu_model, tier=tier).values_list(
        "effective_from", "usd_per_gpu_hour"
    )
    label = f"{job.gpu_model.name}, {PriceEntry.Tier(tier).label.lower()}"
    return [(when, float(usd)) for when, usd in entries], label


def reference_for(job: Job) -> tuple[float, str]:
    """The MFU waste is measured against: the active baseline's median, else the organisation target."""
    baseline = active_baseline(job)
    if baseline is not None:
        median = (baseline.stats.get("mfu") or {}).get("median")
        if median:
            return float(median), f"baseline {baseline.fingerprint[:8]} median"
    return settings.TARGET_MFU, "organisation target"


def update_summary(
    job: Job, sigs: JobSignals | None, client: PrometheusClient | None
) -> dict[str, np.ndarray]:
    """Recompute the job's KPIs from its signals; returns the derived series to archive (throughput, MFU)."""
    end = min(job.ended_at or timezone.now(), timezone.now())
    ts = (
        sigs.timestamps
        if sigs is not None
        else grid(job.started_at.timestamp(), end.timestamp(), POLL_STEP_S)
    )
    step = float(sigs.step) if sigs is not None else float(POLL_STEP_S)
    try:
        tps, source = throughput_series(job, ts, client)
    except PrometheusError as exc:
        tps, source = None, ""
        log.warning("job %s: throughput query failed: %s", job.external_id, exc)

    def mean_of(key: str) -> np.ndarray | None:
        series = sigs.get(key) if sigs is not None else None
        return series.mean if series is not None else None

    prices, label = _prices(job)
    reference, ref_source = reference_for(job)
    power = sigs.get("power_usage") if sigs is not None else None
    kpis = compute_kpis(
        start=job.started_at,
        end=end,
        gpu_count=job.gpu_count,
        shape=ModelShape.from_config(job.model_config or {}, job.recompute),
        peak_flops_per_gpu=job.gpu_model.peak_flops(job.dtype) if job.gpu_model else None,
        peak_clock_mhz=job.gpu_model.peak_clock_mhz if job.gpu_model else None,
        grid_step_s=step,
        tokens_per_second=tps,
        throughput_source=source,
        gpu_util=mean_of("gpu_util"),
        sm_active=mean_of("sm_active"),
        tensor_active=mean_of("tensor_active"),
        sm_clock=mean_of("sm_clock"),
        prices=prices,
        price_label=label,
        reference_mfu=reference,
        reference_source=ref_source,
        energy_increase_j=(job.summary or {}).get("energy_j"),
        power_w=power.mean if power is not None else None,
        power_times=power.timestamps if power is not None else None,
        usd_per_kwh=settings.ENERGY_USD_PER_KWH,
    )
    if job.gpu_model is None:
        kpis.notes.insert(
            0, f"unknown GPU model {job.gpu_model_name!r}: an admin can add it to the GPU catalog"
        )
    for field in (
        "mfu",
        "hfu",
        "tokens_per_second",
        "gpu_util_mean",
        "sm_active_mean",
        "tensor_active_mean",
        "gpu_hours",
        "cost_usd",
        "cost_per_day_usd",
        "waste_per_day_usd",
    ):
        setattr(job, field, getattr(kpis, field))
    summary = dict(job.summary or {})
    summary.update(kpis.details())
    summary["price_note"] = kpis.variants.get("cost", "")
    fb_used = sigs.get("fb_used") if sigs is not None else None
    peak = fb_used.max if fb_used is not None else None
    summary["peak_memory_mib"] = (
        float(np.nanmax(peak)) if peak is not None and not np.isnan(peak).all() else None
    )
    summary["flops_variant"] = kpis.variants.get("mfu", "")
    job.summary = summary
    derived: dict[str, np.ndarray] = {}
    if tps is not None:
        derived[archive.THROUGHPUT] = tps
    if kpis.mfu_series is not None:
        derived[archive.MFU] = kpis.mfu_series
    return derived


# ------------------------------------------------------------------------------------- poll, finalize


def _record_missing(job: Job, sigs: JobSignals) -> None:
    job.missing_signals = sorted(sigs.missing)
    summary = dict(job.summary or {})
    summary["missing_reasons"] = dict(sigs.missing)
    job.summary = summary


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
    summary = dict(job.summary or {})
    summary["energy_j"] = energy_j
    job.summary = summary


def poll_job(job: Job, client: PrometheusClient | None = None, now: datetime | None = None) -> Job:
    """Archive a running job's new data (idempotent) and recompute its summary; records failures."""
    client = client or prometheus_client()
    now = now or timezone.now()
    end = min(job.ended_at or now, now).timestamp()
    resume = (job.data_until or job.started_at).timestamp()
    start = max(_aligned(resume, POLL_STEP_S), _aligned(job.started_at.timestamp(), POLL_STEP_S))
    gpu_start = max(
        _aligned(resume, POLL_PER_GPU_STEP_S), _aligned(job.started_at.timestamp(), POLL_PER_GPU_STEP_S)
    )
    if end <= start:
        return job
    try:
        selector = job_selector(job)
        sigs = fetch_job_signals(client, selector, start, end, POLL_STEP_S)
        # Per-GPU chunks are longer than aggregate ones: read them from their own chunk start so each
        # archived row is rewritten whole (one per-GPU query per present signal).
        wide = fetch_job_signals(
            client, selector, gpu_start, end, POLL_PER_GPU_STEP_S,
            keys=list(sigs.signals), per_gpu_step=POLL_PER_GPU_STEP_S, aggregates=False,
        )  # fmt: skip
        for key, series in wide.signals.items():
            if key in sigs.signals:
                sigs.signals[key].gpus = series.gpus
                sigs.signals[key].gpu_timestamps = series.gpu_timestamps
                sigs.signals[key].per_gpu = series.per_gpu
        energy_j = _energy_total(client, selector, job.started_at.timestamp(), end)
    except (PrometheusError, ValueError) as exc:
        return _mark_stale(job, exc, now)
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        _set_energy(job, energy_j)
        _record_missing(job, sigs)
        archive.upsert(archive.rows_for(job, sigs, {}))
        archived = archive.load_job_signals(job, per_gpu=False)
        derived = update_summary(job, archived, client)
        if archived is not None:
            archive.upsert(archive.rows_for(job, _derived_only(archived), derived))
        job.data_until = archive.utc(end)
        job.last_polled_at = now
        job.ingest_error = ""
        job.save()
    if _diagnosis_due(job, now):
        run_diagnosis(job)
    return job


def _diagnosis_due(job: Job, now: datetime) -> bool:
    """Running jobs are re-diagnosed every DIAGNOSE_RUNNING_EVERY, not on every one-minute poll: the
    diagnosis reads the whole per-GPU archive, which for a large job costs far more than the poll."""
    last = (job.summary or {}).get("diagnosed_at")
    if last is not None and now.timestamp() - float(last) < DIAGNOSE_RUNNING_EVERY.total_seconds():
        return False
    Job.objects.filter(pk=job.pk).update(summary={**(job.summary or {}), "diagnosed_at": now.timestamp()})
    job.refresh_from_db(fields=["summary"])
    return True


def _derived_only(sigs: JobSignals) -> JobSignals:
    return JobSignals(sigs.start, sigs.end, sigs.step, sigs.timestamps)


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
    """Replace an ended job's archive with its whole window at a resolution suited to its length."""
    client = client or prometheus_client()
    now = now or timezone.now()
    if job.ended_at is None:
        raise ValueError(f"job {job.external_id} has not ended")
    start, end = job.started_at.timestamp(), job.ended_at.timestamp()
    duration = max(end - start, POLL_STEP_S)
    step = nice_step(duration, FINALIZE_MAX_POINTS)
    gpu_step = max(nice_step(duration, FINALIZE_MAX_GPU_POINTS), step)
    try:
        selector = job_selector(job)
        sigs = fetch_job_signals(
            client, selector, math.floor(start / step) * step, end, step, per_gpu_step=gpu_step
        )
        energy_j = _energy_total(client, selector, start, end)
    except (PrometheusError, ValueError) as exc:
        return _mark_stale(job, exc, now)
    if not sigs.signals and JobSeries.objects.filter(job=job).exists():
        # Prometheus no longer has the data (retention): keep the archive from the polls.
        job = _finish(job, now, note="Prometheus had no data for the window; kept the archive from polling")
    else:
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job.pk)
            JobSeries.objects.filter(job=job).delete()
            _set_energy(job, energy_j)
            _record_missing(job, sigs)
            derived = update_summary(job, sigs, client)
            archive.upsert(archive.rows_for(job, sigs, derived))
            job.data_until = job.ended_at
            job = _finish(job, now)
    run_diagnosis(job)
    return job


def _finish(job: Job, now: datetime, note: str = "") -> Job:
    if note:
        summary = dict(job.summary or {})
        summary["finalize_note"] = note
        job.summary = summary
    job.status = Job.Status.FINALIZED
    job.finalized_at = now
    job.last_polled_at = now
    job.ingest_error = ""
    job.save()
    return job


def running_jobs() -> Iterable[Job]:
    """Jobs to poll: running, or ended but not yet finalized."""
    return Job.objects.filter(status=Job.Status.RUNNING).select_related("gpu_model")


def ended_jobs(grace: timedelta = timedelta(minutes=2)) -> Iterable[Job]:
    """Ended jobs to finalize, once the last scrapes after their end have landed."""
    cutoff = timezone.now() - grace
    return (
        Job.objects.filter(ended_at__isnull=False, ended_at__lte=cutoff)
        .exclude(status=Job.Status.FINALIZED)
        .select_related("gpu_model")
    )


def ingest_once(client: PrometheusClient | None = None) -> dict[str, Any]:
    """Discover unregistered jobs (when configured), poll every running job and finalize every ended one,
    synchronously (the `ingest --once` command)."""
    client = client or prometheus_client()
    report: dict[str, Any] = {"polled": [], "finalized": [], "stale": []}
    report["discovered"] = discover(client)["created"]
    for job in running_jobs():
        job = poll_job(job, client)
        report["stale" if job.ingest_error else "polled"].append(job.external_id)
    for job in ended_jobs():
        job = finalize_job(job, client)
        report["stale" if job.ingest_error else "finalized"].append(job.external_id)
    return report
