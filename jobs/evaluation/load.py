"""`load_context(job, signals, client)`: the one place that reads the database for an evaluation."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

import numpy as np
from django.conf import settings
from django.utils import timezone

from jobs.alerts.sharing import Neighbours, shared_gpus, summarise
from jobs.evaluation.baselines import active_baseline
from jobs.evaluation.catalog import gpu_by_name
from jobs.evaluation.context import EvaluationContext
from jobs.evaluation.kpis import ModelShape, target_mfu, tokens_per_second_from_progress
from jobs.evaluation.schema import DERIVED_THROUGHPUT, GpuSharing
from jobs.metrics.prometheus import PrometheusClient, PrometheusError
from jobs.metrics.signals import JobSignals, grid
from jobs.metrics.throughput import Runnable, runnable_query
from jobs.models import Job, PriceEntry

log = logging.getLogger(__name__)

#: Grid step of a job with no archived signal yet (dcgm-exporter's default collection interval).
DEFAULT_STEP_S = 30


def throughput_query(job: Job) -> Runnable:
    """The PromQL the server runs for the job's throughput: its template expanded with the job's own
    matchers, or staff's free-form query; None with the reason for an unmarked free-form one."""
    return runnable_query(
        job.throughput_query or "",
        job.external_id,
        job_label=settings.THROUGHPUT_JOB_LABEL,
        max_lookback_s=settings.THROUGHPUT_MAX_LOOKBACK_S,
    )


@contextmanager
def _query_timeout(client: PrometheusClient, seconds: float) -> Iterator[None]:
    """The client's timeout (HTTP and Prometheus' own `timeout=`) at most `seconds` for one query, so
    one expensive throughput query cannot hold a poll for the client's full timeout and retries."""
    saved = client.timeout_s
    client.timeout_s = min(saved, seconds)
    try:
        yield
    finally:
        client.timeout_s = saved


def throughput_series(
    job: Job, ts: np.ndarray, client: PrometheusClient | None, sigs: JobSignals | None = None
) -> tuple[np.ndarray | None, str]:
    """tokens/s on `ts` from, in order: pushed progress, the job's PromQL expression (read from Prometheus
    when a client is given, else from the archive, where each poll stored it), profiler step times.
    Without any, the text says why when the job's throughput_query was not run (else it is empty)."""
    points = list(job.progress.order_by("timestamp").values_list("timestamp", "tokens"))
    if len(points) >= 2:
        times = np.array([p[0].timestamp() for p in points])
        tokens = np.array([float(p[1]) for p in points])
        return tokens_per_second_from_progress(times, tokens, ts), "pushed progress (tokens over time)"
    runnable = throughput_query(job)
    query = runnable.query
    if query and client is not None and ts.size:
        step = float(ts[1] - ts[0]) if ts.size > 1 else float(DEFAULT_STEP_S)
        with _query_timeout(client, settings.THROUGHPUT_QUERY_TIMEOUT_S):
            series = client.range(query, float(ts[0]), float(ts[-1]), step)
        if series:
            rows = np.vstack([s.on_grid(ts) for s in series])
            # Several series (one per rank, say) add up; a time with no sample at all stays missing.
            values = np.where(np.isnan(rows).all(axis=0), np.nan, np.nansum(rows, axis=0))
            return values, f"PromQL: {query}"
    if query and client is None and sigs is not None:
        archived = sigs.get(DERIVED_THROUGHPUT)
        if archived is not None and archived.mean is not None and np.isfinite(archived.mean).any():
            return archived.mean, f"PromQL: {query} (as archived by the last poll)"
    if job.profiler_step_time_ms and job.tokens_per_step:
        rate = job.tokens_per_step / (job.profiler_step_time_ms / 1000.0)
        source = f"profiler step time {job.profiler_step_time_ms:.1f} ms × {job.tokens_per_step} tokens/step"
        return np.full(ts.shape, rate), source
    return None, runnable.reason


def prices_for(job: Job) -> tuple[list[tuple[datetime, float]], str]:
    """The dated price book entries of the job's GPU model and tier, and a label naming both."""
    tier = job.price_tier or settings.DEFAULT_PRICE_TIER
    if job.gpu_model is None:
        return [], f"unknown GPU model {job.gpu_model_name!r}"
    entries = PriceEntry.objects.filter(gpu_model=job.gpu_model, tier=tier).values_list(
        "effective_from", "usd_per_gpu_hour"
    )
    label = f"{job.gpu_model.name}, {PriceEntry.Tier(tier).label.lower()}"
    return [(when, float(usd)) for when, usd in entries], label


def reference_for(job: Job) -> tuple[float, str]:
    """The MFU waste is measured against: the active baseline's median, else the organisation's target
    for the job's dtype (FP8 against the FP8 peak has its own target; see settings.TARGET_MFU_FP8)."""
    baseline = active_baseline(job)
    if baseline is not None:
        median = (baseline.stats.get("mfu") or {}).get("median")
        if median:
            return float(median), f"baseline {baseline.fingerprint[:8]} median"
    return target_mfu(job.dtype, settings.TARGET_MFU, settings.TARGET_MFU_FP8)


def reference_mfu(job: Job) -> float:
    """The reference MFU of the job's stored evaluation; the dtype's target before the first one."""
    evaluated = job.evaluated
    if evaluated is not None and evaluated.reference_mfu:
        return evaluated.reference_mfu
    return target_mfu(job.dtype, settings.TARGET_MFU, settings.TARGET_MFU_FP8)[0]


def sharing_for(
    job: Job, client: PrometheusClient | None, now: datetime, neighbours: Neighbours | None = None
) -> GpuSharing | None:
    """The job's share of GPUs other jobs also used, or of its MIG slices (jobs.alerts.sharing); None when
    its GPUs were its own. Without a client the MIG instances come from the last stored evaluation.
    `neighbours`: the poll cycle's index of the other jobs and their GPUs (read once, not per job)."""
    spec = gpu_by_name(job.gpu_model.name) if job.gpu_model is not None else None
    return summarise(shared_gpus(job, client, now, neighbours), job.gpu_count, spec)


def load_context(
    job: Job,
    sigs: JobSignals | None,
    client: PrometheusClient | None,
    now: datetime | None = None,
    neighbours: Neighbours | None = None,
) -> EvaluationContext:
    """Everything `evaluate` needs about `job`, with `sigs` the signals to evaluate on (fresh or archived);
    `neighbours` as in `sharing_for`."""
    now = now or timezone.now()
    end = min(job.ended_at or now, now)
    if sigs is not None:
        ts, step = sigs.timestamps, float(sigs.step)
    else:
        ts, step = grid(job.started_at.timestamp(), end.timestamp(), DEFAULT_STEP_S), float(DEFAULT_STEP_S)
    try:
        tps, source = throughput_series(job, ts, client, sigs)
    except PrometheusError as exc:
        tps, source = None, f"the throughput query failed: {exc}"
        log.warning("job %s: throughput query failed: %s", job.external_id, exc)
    prices, label = prices_for(job)
    reference, ref_source = reference_for(job)
    gpu = job.gpu_model
    return EvaluationContext(
        start=job.started_at,
        end=end,
        gpu_count=job.gpu_count,
        shape=ModelShape.from_config(job.model_config or {}, job.recompute),
        dtype=job.dtype,
        gpu_known=gpu is not None,
        gpu_name=job.gpu_model_name,
        peak_flops_per_gpu=gpu.peak_flops(job.dtype) if gpu else None,
        peak_clock_mhz=float(gpu.peak_clock_mhz) if gpu and gpu.peak_clock_mhz else None,
        signals=sigs,
        timestamps=ts,
        step_s=step,
        tokens_per_second=tps,
        throughput_source=source,
        prices=tuple(prices),
        price_label=label,
        reference_mfu=reference,
        reference_source=ref_source,
        flops_convention=settings.MFU_FLOPS_CONVENTION,
        energy_j=job.energy_j,
        usd_per_kwh=settings.ENERGY_USD_PER_KWH,
        sharing=sharing_for(job, client, now, neighbours),
    )
