"""false_saturation: nvidia-smi says busy (GPU_UTIL high) while the SMs are mostly idle inside kernels.

A symptom, not a cause: the engine keeps it as context when a cause finding explains the low SM active.
Without SM_ACTIVE (off in dcgm-exporter's default counters) the rule falls back to "busy, yet tensor and
DRAM both quiet", at a much lower confidence.

Resolution: a level check (medians over the job), valid in both regimes: GPU_UTIL's point samples and
the profiling averages agree on levels even when steps are far shorter than a sample. It cannot see *why*
the SMs are empty (tiny kernels, waits, memory): the cause rules say that.

Samples (jobs.diagnosis.regimes): GPU_UTIL is NVML's share of a 1/6-1 s window with any kernel resident, so
a GPU whose kernels run back to back reads ~100 % at either window and any scrape, however few SMs each
kernel fills; SM_ACTIVE is the collect-interval average (30 s by default) of the SMs' busy share. Both are
levels over many steps: their gap (busy yet SMs idle) does not depend on the window or the 5-60 s scrape.
"""

from __future__ import annotations

import numpy as np

from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity, clamp01, confidence
from jobs.diagnosis.features import Features
from jobs.diagnosis.rules.common import busy_share, pct, ratio_ev, saturated, util_ev, util_level

CODE = "false_saturation"
RECOMMENDATION = (
    "nvidia-smi's utilisation only says that some kernel was running; it ignores how much of the GPU the "
    "kernel used. Judge this job by MFU, SM active and tensor active instead, and fix the cause findings "
    "listed with it (tiny kernels, communication waits, memory-bound or non-tensor math). Without such a "
    "finding, upload a PyTorch profiler or Nsight Systems trace of a few steps to see which kernels leave "
    "the SMs empty."
)


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Fire when the job reads busy but SM active (or, without it, tensor and DRAM) stays low."""
    if not saturated(f):
        return None
    util = util_level(f)
    sm = f.level("sm_active")
    tensor = f.level("tensor_active")
    dram = f.level("dram_active")
    missing: list[str] = []
    if sm is not None:
        if sm >= T.SM_ACTIVE_LOW:
            return None
        base, used = 0.9, sm
        severity = Severity.CRITICAL if sm < T.SM_ACTIVE_VERY_LOW else Severity.WARNING
        title = f"nvidia-smi shows {pct(util)} busy, but the SMs are active only {pct(sm)} of the time"
        mask = _window_mask(f, "sm_active", T.SM_ACTIVE_LOW)
    else:
        missing.append("sm_active")
        if tensor is None or dram is None or tensor >= T.PROXY_TENSOR_QUIET or dram >= T.PROXY_DRAM_QUIET:
            return None
        # A proxy: tensor and memory pipes both quiet while "busy" suggests mostly-empty kernels.
        base, used = 0.5, None
        severity = Severity.WARNING
        title = (
            f"nvidia-smi shows {pct(util)} busy, but tensor ({pct(tensor)}) and DRAM ({pct(dram)}) "
            "activity are low: the SMs are probably mostly idle"
        )
        mask = _window_mask(f, "tensor_active", T.PROXY_TENSOR_QUIET)
    if used is not None:
        missing += f.missing(["sm_occupancy"])
    occupancy = f.level("sm_occupancy")
    evidence = [util_ev(f, util), ratio_ev("SM active while busy, median", sm)]
    evidence += [ratio_ev("tensor active while busy, median", tensor), ratio_ev("DRAM active, median", dram)]
    if occupancy is not None:
        evidence.append(ratio_ev("SM occupancy, median", occupancy))
    # Without SM active, scale tensor activity to an SM-active equivalent for the impact estimate.
    level = used if used is not None else (tensor or 0.0) / T.TENSOR_ACTIVE_HEALTHY * T.SM_ACTIVE_HEALTHY
    impact = busy_share(f) * clamp01(1.0 - level / T.SM_ACTIVE_HEALTHY)
    if mask is not None and mask.size:
        evidence.append(Evidence("time in this state", round(float(mask.mean()) * 100, 1), "%"))
    windows = f.windows_where(mask, min_len=2) if mask is not None else []
    # sm_active's absence is already priced into the proxy's base confidence.
    penalised = [m for m in missing if m != "sm_active"]
    main = "sm_active" if used is not None else "tensor_active"
    return Finding(
        code=CODE,
        severity=severity,
        confidence=confidence(base, missing=penalised, coverage=f.coverage(main)),
        title=title,
        recommendation=RECOMMENDATION,
        evidence=evidence,
        windows=windows or f.whole_window,
        impact=impact,
        missing_signals=missing,
        sources=["metrics"],
    )


def _window_mask(f: Features, key: str, below: float) -> np.ndarray | None:
    series = f.mean(key)
    if series is None or f.util is None:
        return None
    return np.isfinite(series) & (series < below) & np.isfinite(f.util) & (f.util >= T.UTIL_SATURATED_MIN)
