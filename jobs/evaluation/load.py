"""`load_context(job, signals, readings, now)`: the one place that reads the database for an evaluation.
What it needs from Prometheus, the archive and the other jobs (the grid, the throughput, the sharing
look-up) the driver reads first (jobs.pipeline.reads, which also holds the poll cycle's shared reads) and
hands over as `Readings`: the evaluation calls no metrics code mid-way."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
from django.conf import settings

from jobs.evaluation.baseline_stats import decode_stats
from jobs.evaluation.baselines import active_baseline
from jobs.evaluation.catalog import gpu_by_name
from jobs.evaluation.context import EvaluationContext
from jobs.evaluation.cycle import CycleContext
from jobs.evaluation.kpis import ModelShape, target_mfu, tokens_per_second_from_progress
from jobs.evaluation.monitoring_logs import with_monitoring_logs
from jobs.evaluation.schema import GpuSharing
from jobs.evaluation.sharing import SharingLookup, attribute_shares, summarise
from jobs.metrics.signals import JobSignals
from jobs.models import Job, PriceEntry

#: Grid step of a job with no archived signal yet (dcgm-exporter's default collection interval).
DEFAULT_STEP_S = 30


@dataclass(frozen=True, slots=True)
class ThroughputRead:
    """The job's throughput as the driver read it (jobs.pipeline.reads): pushed `progress` (times, tokens),
    or PromQL `values` on the grid with their `source`; else `reason` says why there are none (not run, no
    series), and `failed` that the query raised (the evaluation then does not fall back to profiler step
    times: the job has a throughput source, it could not be read)."""

    progress: tuple[np.ndarray, np.ndarray] | None = None
    values: np.ndarray | None = None
    source: str = ""
    reason: str = ""
    failed: bool = False


@dataclass(frozen=True, slots=True)
class Readings:
    """What one evaluation needs from Prometheus, the archive and the other jobs, read before it runs: the
    grid it runs on (`timestamps`, `step_s`), the window's `end`, the look-up behind its share of GPUs
    other jobs also used (jobs.evaluation.sharing.look_up) and the throughput on the grid."""

    timestamps: np.ndarray
    step_s: float
    end: datetime
    sharing: SharingLookup
    throughput: ThroughputRead


def throughput_of(job: Job, ts: np.ndarray, read: ThroughputRead) -> tuple[np.ndarray | None, str]:
    """tokens/s on `ts` from, in order: pushed progress, the job's PromQL series, profiler step times; without
    any, None and why (the job's throughput_query was not run, returned no series, or failed)."""
    if read.progress is not None:
        times, tokens = read.progress
        return tokens_per_second_from_progress(times, tokens, ts), "pushed progress (tokens over time)"
    if read.values is not None:
        return read.values, read.source
    if read.failed:
        return None, read.reason
    if job.profiler_step_time_ms and job.tokens_per_step:
        rate = job.tokens_per_step / (job.profiler_step_time_ms / 1000.0)
        source = f"profiler step time {job.profiler_step_time_ms:.1f} ms × {job.tokens_per_step} tokens/step"
        return np.full(ts.shape, rate), source
    return None, read.reason


def prices_for(job: Job, cycle: CycleContext | None = None) -> tuple[list[tuple[datetime, float]], str]:
    """The dated price book entries of the job's GPU model and tier, and a label naming both. `cycle`:
    one query per GPU model and tier for the cycle (the answer depends on nothing else)."""
    tier = job.price_tier or settings.DEFAULT_PRICE_TIER
    if cycle is not None and job.gpu_model_id is not None:
        return cycle.lookups.get(("prices", job.gpu_model_id, tier), lambda: prices_for(job))
    if job.gpu_model is None:
        return [], f"unknown GPU model {job.gpu_model_name!r}"
    entries = PriceEntry.objects.filter(gpu_model=job.gpu_model, tier=tier).values_list(
        "effective_from", "usd_per_gpu_hour"
    )
    label = f"{job.gpu_model.name}, {PriceEntry.Tier(tier).label.lower()}"
    return [(when, float(usd)) for when, usd in entries], label


def reference_for(job: Job, cycle: CycleContext | None = None) -> tuple[float, str]:
    """The MFU waste is measured against: the active baseline's median, else the organisation's target
    for the job's dtype (FP8 against the FP8 peak has its own target; see settings.TARGET_MFU_FP8).
    `cycle`: the baseline is looked up once per team and config fingerprint for the cycle (baselines are
    team-scoped: a job is measured against its own team's healthy runs only)."""
    if cycle is not None and job.config_fingerprint:
        key = ("baseline", job.team_id, job.config_fingerprint)
        baseline = cycle.lookups.get(key, lambda: active_baseline(job))
    else:
        baseline = active_baseline(job)
    if baseline is not None:
        mfu = decode_stats(baseline.stats).get("mfu")
        median = mfu.median if mfu is not None else None
        if median:
            return float(median), f"baseline {baseline.fingerprint[:8]} median"
    return target_mfu(job.dtype, settings.TARGET_MFU, settings.TARGET_MFU_FP8)


def reference_mfu(job: Job) -> float:
    """The reference MFU of the job's stored evaluation; the dtype's target before the first one."""
    evaluated = job.evaluated
    if evaluated is not None and evaluated.reference_mfu:
        return evaluated.reference_mfu
    return target_mfu(job.dtype, settings.TARGET_MFU, settings.TARGET_MFU_FP8)[0]


def sharing_for(job: Job, lookup: SharingLookup, now: datetime) -> GpuSharing | None:
    """The job's share of GPUs other jobs also used, or of its MIG slices (jobs.evaluation.sharing), from
    what the driver looked up (`Readings.sharing`); None when its GPUs were its own."""
    spec = gpu_by_name(job.gpu_model.name) if job.gpu_model is not None else None
    return summarise(attribute_shares(job, lookup, now), job.gpu_count, spec)


def load_context(
    job: Job,
    sigs: JobSignals | None,
    readings: Readings,
    now: datetime,
    cycle: CycleContext | None = None,
) -> EvaluationContext:
    """Everything `evaluate` needs about `job`, with `sigs` the signals to evaluate on (fresh or archived)
    and `readings` what the driver read for it first (jobs.pipeline.reads: the grid, the throughput, the
    sharing look-up); `cycle`: the poll cycle's shared reads (jobs.evaluation.cycle: memoised prices,
    baselines and GPU models)."""
    if cycle is not None and job.gpu_model_id is not None:
        job.gpu_model = cycle.lookups.get(("gpu_model", job.gpu_model_id), lambda: job.gpu_model)
    ts, step, end = readings.timestamps, readings.step_s, readings.end
    tps, source = throughput_of(job, ts, readings.throughput)
    # Uploaded nvidia-smi logs fill the signals DCGM lacks (DCGM wins where both have samples).
    logs = with_monitoring_logs(job, sigs, ts, step, end.timestamp(), cycle)
    prices, label = prices_for(job, cycle)
    reference, ref_source = reference_for(job, cycle)
    gpu = job.gpu_model
    return EvaluationContext(
        start=job.started_at,
        end=end,
        gpu_count=job.gpu_count,
        shape=ModelShape.from_config(job.model_config or {}, job.recompute, job.kind),
        dtype=job.dtype,
        gpu_known=gpu is not None,
        gpu_name=job.gpu_model_name,
        peak_flops_per_gpu=gpu.peak_flops(job.dtype) if gpu else None,
        peak_clock_mhz=float(gpu.peak_clock_mhz) if gpu and gpu.peak_clock_mhz else None,
        signals=logs.signals,
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
        sharing=sharing_for(job, readings.sharing, now),
        signal_sources=logs.sources,
        source_notes=tuple(logs.notes),
        signal_intervals_s=logs.intervals_s,
    )
