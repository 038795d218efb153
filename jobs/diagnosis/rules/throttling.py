"""throttling: most of the job's GPUs run below their max boost clock because of power or heat.

The reference is the MAX boost clock (reference/gpus.md: "Throttling is judged against the max clock (or
the reported max)"): the GPU's own DCGM_FI_DEV_MAX_SM_CLOCK when the job has it, else the catalog's max.
Not the clock behind the quoted peak (H100 SXM: 1830 of 1980 MHz), which only the MFU cross-check uses.

Clock below max boost while busy is the effect; throttle reason bits, the violation counters, temperature near
the slowdown point and power at the cap are the causes that corroborate it. A minority of slow GPUs is a
straggler (its own rule), not a job-wide throttle.

Resolution: clocks, reasons and violation counters are levels and rates over the job, valid in both
regimes; throttling bursts shorter than a sample are averaged (violation counters still count them).
Samples: DCGM_FI_DEV_SM_CLOCK is the clock when the exporter collects (a point value); only busy GPUs are
judged (per GPU over its busy samples; without per-GPU rows, the mean only where every GPU is busy), since
an idle GPU parks its clock far below boost.
"""

from __future__ import annotations

import numpy as np

from jobs.diagnosis import detectors as D
from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity, clamp01, confidence
from jobs.diagnosis.features import Features
from jobs.diagnosis.rules.common import busy_share, mean_over, pct
from jobs.metrics.signals import THROTTLE_BITS

CODE = "throttling"
RECOMMENDATION = (
    "The GPUs are slowed by power or temperature limits. Check the nodes' cooling (inlet temperature, fans, "
    "airflow), the power cap (nvidia-smi -q -d POWER: enforced vs default limit) and the rack's power "
    "budget; a node that throttles while its neighbours do not is faulty and should be drained."
)
_POWER_BITS = ("sw_power_cap", "hw_power_brake")
_THERMAL_BITS = ("sw_thermal", "hw_thermal", "hw_slowdown")


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Fire when the majority of GPUs run below CLOCK_RATIO_LOW of their max boost clock while busy."""
    if not f.has("sm_clock"):
        return None
    boost, boost_source = _max_clock(inp, f)
    if not boost:
        return None
    per_gpu = f.per_gpu_level("sm_clock")
    if per_gpu is not None and np.isfinite(per_gpu[1]).sum() >= 1:
        ratios = per_gpu[1][np.isfinite(per_gpu[1])] / boost
        throttled_share = float((ratios < T.CLOCK_RATIO_LOW).mean())
        ratio = float(np.median(ratios))
    else:
        # Without per-GPU rows the cross-GPU mean clock is the busy GPUs' only where every GPU is busy
        # (the least busy GPU's utilisation at least BUSY_UTIL_MIN): an idle GPU parks its clock (~200-400
        # MHz on an H100) and drags the mean of a job with idle GPUs below the throttle line.
        level = _all_busy_clock(f)
        if level is None:
            return None
        ratio = level / boost
        throttled_share = 1.0 if ratio < T.CLOCK_RATIO_LOW else 0.0
    if throttled_share < T.THROTTLED_GPU_SHARE or ratio >= T.CLOCK_RATIO_LOW:
        return None
    causes, evidence, missing = _causes(inp, f)
    evidence = [
        Evidence("SM clock while busy, median", round(ratio * boost), "MHz"),
        Evidence(f"max boost clock ({boost_source})", round(boost), "MHz"),
        Evidence("clock / max boost", round(100 * ratio, 1), "%"),
        Evidence("GPUs below the throttle line", round(100 * throttled_share, 1), "%"),
        *evidence,
    ]
    corroborators = ("clock_throttle_reasons", "power_violation", "thermal_violation", "gpu_temp")
    silent = not causes and not f.missing(list(corroborators))
    base = 0.9 if causes else 0.6
    if boost_source == _SEEN:
        base -= 0.15  # the highest clock seen is only a lower bound of the max: ratios read too high
    if silent:
        severity = Severity.INFO  # clocks low yet every cause signal is quiet: app clocks or a setting
    elif ratio < T.CLOCK_RATIO_VERY_LOW:
        severity = Severity.CRITICAL
    else:
        severity = Severity.WARNING
    clock = f.mean("sm_clock")
    mask = f.busy & np.isfinite(clock) & (clock / boost < T.CLOCK_RATIO_LOW) if clock is not None else None
    why = f" ({', '.join(causes)})" if causes else ""
    return Finding(
        code=CODE,
        severity=severity,
        confidence=confidence(base, missing=missing, coverage=f.coverage("sm_clock")),
        title=f"GPUs throttled to {pct(ratio)} of their max boost clock{why}",
        recommendation=RECOMMENDATION,
        evidence=evidence,
        windows=(f.windows_where(mask, min_len=2) if mask is not None else []) or f.whole_window,
        impact=busy_share(f) * throttled_share * clamp01(1.0 - ratio),
        missing_signals=missing,
        sources=["metrics"],
    )


def _all_busy_clock(f: Features) -> float | None:
    """Median of the cross-GPU mean SM clock over the samples in which every GPU is busy (None: none)."""
    clock = f.mean("sm_clock")
    low = f.stat(f.util_key, "min") if f.util_key else None
    if clock is None:
        return None
    if low is None:
        return f.level("sm_clock")  # no utilisation spread to tell: the busy samples of the job's mean
    return D.nanquantile(clock[np.nan_to_num(low) >= T.BUSY_UTIL_MIN], 0.5)


_REPORTED = "reported by the GPUs, DCGM_FI_DEV_MAX_SM_CLOCK"
_CATALOG = "GPU catalog"
_SEEN = "highest clock seen in the job"


def _max_clock(inp: DiagnosisInput, f: Features) -> tuple[float | None, str]:
    """The max boost clock to judge against, and where it came from."""
    # The GPU's own report beats the catalog: it is the part actually installed (a catalog row can be a
    # sibling SKU, e.g. an H100 PCIe matched as SXM) and needs no admin to keep it right.
    reported = f.stat("max_sm_clock", "mean")
    if reported is not None and np.isfinite(reported).any():
        value = float(np.nanmedian(reported))
        if value > 0:
            return value, _REPORTED
    if inp.max_clock_mhz:
        return float(inp.max_clock_mhz), _CATALOG
    # Unknown max: the highest clock the job's GPUs reached is a (low) stand-in.
    peak = f.stat("sm_clock", "max")
    top = float(np.nanmax(peak)) if peak is not None and np.isfinite(peak).any() else None
    return top, _SEEN


def _causes(inp: DiagnosisInput, f: Features) -> tuple[list[str], list[Evidence], list[str]]:
    causes: list[str] = []
    evidence: list[Evidence] = []
    missing = f.missing(["clock_throttle_reasons", "power_violation", "thermal_violation"])
    if f.has("clock_throttle_reasons"):
        shares = {b: mean_over(f.stat("clock_throttle_reasons", b), f.busy) or 0.0 for b in THROTTLE_BITS}
        power = max(shares[b] for b in _POWER_BITS)
        thermal = max(shares[b] for b in _THERMAL_BITS)
        evidence += [
            Evidence("GPUs reporting a power-cap reason", round(100 * power, 1), "% of GPU-samples"),
            Evidence("GPUs reporting a thermal/slowdown reason", round(100 * thermal, 1), "% of GPU-samples"),
        ]
        if power >= T.THROTTLE_REASON_SHARE:
            causes.append("power cap")
        if thermal >= T.THROTTLE_REASON_SHARE:
            causes.append("thermal")
    for key, label in (("power_violation", "power cap"), ("thermal_violation", "thermal")):
        share = mean_over(f.mean(key), f.busy)
        if share is not None:
            evidence.append(Evidence(f"time in {label} violation", round(100 * share, 1), "%"))
            if share >= T.VIOLATION_SHARE and label not in causes:
                causes.append(label)
    temp, mem_temp = f.level("gpu_temp", 0.9), f.level("memory_temp", 0.9)
    if temp is not None:
        evidence.append(Evidence("GPU temperature, 90th percentile", round(temp, 1), "C"))
        if temp >= T.GPU_TEMP_HOT_C and "thermal" not in causes:
            causes.append("hot")
    if mem_temp is not None and mem_temp >= T.MEMORY_TEMP_HOT_C:
        evidence.append(Evidence("memory temperature, 90th percentile", round(mem_temp, 1), "C"))
        if "thermal" not in causes and "hot" not in causes:
            causes.append("hot memory")
    board = f.level("power_usage", 0.9)
    if board is not None and inp.tdp_w:
        evidence.append(
            Evidence("board power, 90th percentile", round(100 * board / inp.tdp_w, 1), "% of TDP")
        )
        if board >= T.POWER_AT_CAP * inp.tdp_w and "power cap" not in causes:
            causes.append("at the power limit")
    return causes, evidence, missing
