"""`evaluate(context)`: every number of a job from its context. Pure: no ORM, no Prometheus, no settings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from jobs.evaluation.context import EvaluationContext
from jobs.evaluation.kpis import compute_kpis
from jobs.evaluation.monitoring_signals import LOG_SOURCE
from jobs.evaluation.schema import DERIVED_MFU, DERIVED_THROUGHPUT, CrossCheckResult, Evaluation, WasteSplit

#: Signals whose means the pages show, and so whose coverage the evaluation keeps.
COVERAGE_SIGNALS = ("gpu_util", "sm_active", "tensor_active", "power_usage")


@dataclass(frozen=True)
class Evaluated:
    """The stored evaluation and the derived series to archive next to the signals (throughput, MFU)."""

    evaluation: Evaluation
    derived: dict[str, np.ndarray] = field(default_factory=dict)


_IDLE_SIGNALS = {
    "gpu_util": "GPU_UTIL",
    "gr_engine_active": "GR_ENGINE_ACTIVE (MIG instances have no GPU_UTIL)",
}


def evaluate(ctx: EvaluationContext) -> Evaluated:
    """KPIs, waste split, cross-check and peak memory of one job (definitions: reference/formulas.md)."""
    sigs = ctx.signals

    def stat(key: str, name: str) -> np.ndarray | None:
        series = sigs.get(key) if sigs is not None else None
        return series.stats.get(name) if series is not None else None

    # Idle share from GPU_UTIL (DCGM field 203: share of the sample period a kernel ran). MIG instances have
    # no GPU_UTIL (dcgm-exporter reports it per physical GPU only), so a job on MIG slices is judged idle
    # from GR_ENGINE_ACTIVE (field 1001: share of time the graphics/compute engine was active, averaged
    # over the collect interval, per instance) instead: same 0-1 ratio, same ~0 % threshold.
    idle_key = "gpu_util"
    if stat("gpu_util", "mean") is None and stat("gr_engine_active", "mean") is not None:
        idle_key = "gr_engine_active"
    util = sigs.get(idle_key) if sigs is not None else None
    # Per-GPU rows give the exact idle share, but only when they span the same window as the aggregates
    # (finalize, or a poll that loaded the whole archive); otherwise the cross-GPU bound is used.
    util_per_gpu = None
    gts = util.gpu_timestamps if util is not None else None
    if util is not None and util.per_gpu is not None and gts is not None and gts.size and ctx.timestamps.size:
        # A monitoring log's rows are its own samples inside the job's window (monitoring_signals): they
        # span the part of the window the log covers, as its cross-GPU statistics do.
        from_log = ctx.signal_sources.get(idle_key, "").startswith(LOG_SOURCE)
        util_per_gpu = util.per_gpu if from_log or gts[0] <= ctx.timestamps[0] + ctx.step_s else None
    idle_signal = _IDLE_SIGNALS[idle_key]
    if idle_key in ctx.signal_sources:
        source = ctx.signal_sources[idle_key]
        idle_signal = (
            f"utilization.gpu {source}" if source.startswith(LOG_SOURCE) else f"{idle_signal} ({source})"
        )
    power = sigs.get("power_usage") if sigs is not None else None
    k = compute_kpis(
        start=ctx.start,
        end=ctx.end,
        gpu_count=ctx.gpu_count,
        shape=ctx.shape,
        peak_flops_per_gpu=ctx.peak_flops_per_gpu,
        peak_clock_mhz=ctx.peak_clock_mhz,
        grid_step_s=ctx.step_s,
        tokens_per_second=ctx.tokens_per_second,
        throughput_source=ctx.throughput_source,
        gpu_util=stat("gpu_util", "mean"),
        sm_active=stat("sm_active", "mean"),
        tensor_active=stat("tensor_active", "mean"),
        sm_clock=stat("sm_clock", "mean"),
        prices=list(ctx.prices),
        price_label=ctx.price_label,
        reference_mfu=ctx.reference_mfu,
        reference_source=ctx.reference_source,
        energy_increase_j=ctx.energy_j,
        power_w=power.mean if power is not None else None,
        power_times=power.timestamps if power is not None else None,
        usd_per_kwh=ctx.usd_per_kwh,
        gpu_util_per_gpu=util_per_gpu,
        gpu_util_min=stat(idle_key, "min"),
        gpu_util_max=stat(idle_key, "max"),
        idle_mean=stat(idle_key, "mean"),
        idle_signal=idle_signal,
        flops_convention=ctx.flops_convention,
        gpu_equivalents=ctx.sharing.gpu_equivalents if ctx.sharing is not None else None,
        peak_equivalents=ctx.sharing.peak_equivalents if ctx.sharing is not None else None,
        engine_flops_per_gpu=stat("engine_flops", "mean"),
        engine_missing_reason=sigs.missing.get("engine_flops", "") if sigs is not None else "",
    )
    notes = [*ctx.source_notes, *k.notes]
    if ctx.sharing is not None:
        notes.append(
            f"shared GPUs: charged for {ctx.sharing.label}; MFU against {ctx.sharing.peak_equivalents:.2f} "
            "GPU peaks" + (f" ({ctx.sharing.peak_source})" if ctx.sharing.peak_source else "")
        )
    if not ctx.gpu_known:
        notes.insert(0, f"unknown GPU model {ctx.gpu_name!r}: an admin can add it to the GPU catalog")
    fb = stat("fb_used", "max")
    peak_mib = float(np.nanmax(fb)) if fb is not None and np.isfinite(fb).any() else None
    cc = k.cross_check
    waste = k.waste
    coverage: dict[str, float] = {}
    for key in COVERAGE_SIGNALS:
        value = sigs.coverage(key) if sigs is not None else None
        if value is not None and math.isfinite(value):
            coverage[key] = value
    evaluation = Evaluation(
        duration_s=k.duration_s,
        gpu_hours=k.gpu_hours,
        mfu=k.mfu,
        hfu=k.hfu,
        tokens_per_second=k.tokens_per_second,
        gpu_util_mean=k.gpu_util_mean,
        sm_active_mean=k.sm_active_mean,
        tensor_active_mean=k.tensor_active_mean,
        cost_usd=k.cost_usd,
        cost_per_day_usd=k.cost_per_day_usd,
        waste=WasteSplit(
            total_per_day_usd=waste.total_per_day,
            lower_bound_per_day_usd=waste.lower_bound_per_day,
            idle_per_day_usd=waste.idle_per_day,
            efficiency_per_day_usd=waste.efficiency_per_day,
            unknown_reason=waste.reason,
        )
        if waste is not None
        else WasteSplit(unknown_reason="not evaluated"),
        idle_share=k.idle_share,
        idle_share_exact=k.idle_share_exact,
        reference_mfu=k.reference_mfu,
        reference_source=k.reference_source,
        flops_variant=k.variants.get("mfu", ""),
        mfu_fallback=k.flops_fallback,
        mfu_source=k.mfu_source,
        engine_mfu=k.engine_mfu,
        engine_flops_per_gpu=k.engine_flops_per_gpu,
        engine_mfu_reason=k.engine_mfu_reason,
        flops_mfu=k.flops_mfu,
        energy_kwh=k.energy_kwh,
        energy_cost_usd=k.energy_cost_usd,
        peak_memory_mib=peak_mib,
        cross_check=CrossCheckResult(
            tensor_upper_mfu=cc.tensor_estimate,
            disagrees=cc.disagrees,
            direction=cc.direction,
            explanation=cc.explanation,
        )
        if cc is not None
        else None,
        coverage=coverage,
        price_note=k.variants.get("cost", ""),
        variants=dict(k.variants),
        notes=notes,
        sharing=ctx.sharing,
        signal_sources=dict(ctx.signal_sources),
        signal_intervals_s=dict(ctx.signal_intervals_s),
    )
    derived: dict[str, np.ndarray] = {}
    if ctx.tokens_per_second is not None:
        derived[DERIVED_THROUGHPUT] = ctx.tokens_per_second
    if k.mfu_series is not None:
        derived[DERIVED_MFU] = k.mfu_series
    return Evaluated(evaluation, derived)
