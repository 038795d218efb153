"""idle_gpus: allocated GPUs at ~0 % for long stretches (paid for, unused).

Per GPU, runs of samples with GPU_UTIL at or below IDLE_UTIL_MAX, at least IDLE_MIN_STRETCH_S long. Missing
samples are not idle (a short hole inside an idle stretch is bridged for the stretch's length but counts
neither as idle GPU-time nor in the share, which is idle over *observed* GPU-time), and a blank stretch of
profiling fields while GPU_UTIL stays up (an Nsight capture) is never read as idle because only
utilisation counts.

The share printed is the evaluation's idle share (`DiagnosisInput.idle_share`, the number the job page,
leaderboard and waste use) whenever the Django side passes it; the rule still finds the idle GPUs, their
stretches and windows itself, and falls back to its own observed share only when that number is unknown.
Serving jobs (`kind == "inference"`) get serving advice (right-size, autoscale, batch requests); with fewer
than MIN_SAMPLES_TO_WARN samples per GPU the finding is context (info), never a warning.

Resolution: stretches of at least IDLE_MIN_STRETCH_S (10 min) are many samples long at 15-60 s, so this is
a resolved-regime rule at any usual scrape interval; idle time shorter than a sample is invisible here. A
GPU_UTIL point sample that aliases onto the idle phase of every step is not idle time: with
GR_ENGINE_ACTIVE (a collect-interval average) exported, a sample is idle only when both read idle.
"""

from __future__ import annotations

import numpy as np

from jobs.diagnosis import detectors as D
from jobs.diagnosis import kinds as K
from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity, clamp01, confidence
from jobs.diagnosis.features import Features, GpuData
from jobs.diagnosis.idle import idle_stretches

CODE = "idle_gpus"
SERVING_RECOMMENDATION = (
    "These serving GPUs are allocated but receive no work. Right-size the deployment (fewer replicas or "
    "smaller GPUs), autoscale replicas on request load (queue depth, requests in flight) with scale-to-zero "
    "where latency allows, and batch requests (continuous batching) so the replicas that stay get the work."
)
RECOMMENDATION = (
    "These GPUs are allocated but do nothing. Release them (request fewer GPUs, end the job when training "
    "finishes), or fix the placement: check the launcher's world size, CUDA_VISIBLE_DEVICES / device ids "
    "per rank, and ranks that crashed or finished early."
)


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Fire when some GPUs (or all) sit idle for at least IDLE_MIN_STRETCH_S at a time."""
    if f.util_key is None:
        return None
    data = f.gpu_data((f.util_key,))
    if data is not None:
        return _per_gpu(inp, f, data)
    return _aggregate(inp, f)


def _reported_share(inp: DiagnosisInput, own: float, *, estimate: bool = False) -> tuple[float, str]:
    """The evaluation's idle share when known (one number on every channel), else the rule's own."""
    if inp.idle_share is not None and np.isfinite(inp.idle_share):
        return clamp01(float(inp.idle_share)), "share of the job's GPU time idle (the job's evaluation)"
    suffix = " (estimate)" if estimate else ""
    return own, f"share of the job's GPU time idle{suffix}"


def _recommendation(inp: DiagnosisInput) -> str:
    return SERVING_RECOMMENDATION if K.is_serving(inp.kind) else RECOMMENDATION


def _per_gpu(inp: DiagnosisInput, f: Features, data: GpuData) -> Finding | None:
    assert f.util_key is not None
    u = data.values[f.util_key]
    average = None
    if f.util_key == "gpu_util" and f.has("gr_engine_active"):
        # GPU_UTIL is a point sample of a <= 1 s window: when the step time divides the collect interval
        # it can land in the same idle phase of every step for hours. GR_ENGINE_ACTIVE averages the whole
        # collect interval: a GPU is idle only when both read idle (jobs.diagnosis.idle).
        both = f.gpu_data(("gpu_util", "gr_engine_active"))
        if both is not None and both.gpus == data.gpus and both.values["gr_engine_active"].shape == u.shape:
            average = both.values["gr_engine_active"]
    step = data.step
    # The one idle computation the idle alert reads too (jobs.alerts.rules.gpus_idle).
    found = idle_stretches(u, data.timestamps, step, busy_average=average)
    if not found.stretches:
        return None
    idle_gpus = [data.gpus[i] for i in found.gpus]
    idle_cells = found.idle_samples
    windows = [s.window for s in found.stretches]
    # Idle observed GPU-time over observed GPU-time: a subset over its set, so never above 1.
    share = found.share
    assert 0.0 <= share <= 1.0, f"idle share {share} outside [0, 1]"
    share, share_label = _reported_share(inp, share)
    fb = f.gpu_data(("fb_used",))
    fb_note: list[Evidence] = []
    if fb is not None:
        idx = [fb.gpus.index(g) for g in idle_gpus if g in fb.gpus]
        if idx:
            with np.errstate(invalid="ignore"):
                med = (
                    float(np.nanmedian(fb.values["fb_used"][idx]))
                    if np.isfinite(fb.values["fb_used"][idx]).any()
                    else None
                )
            fb_note.append(Evidence("frame buffer used on the idle GPUs, median", med and round(med), "MiB"))
    gpu_hours = idle_cells * step / 3600.0
    all_idle = len(idle_gpus) == len(data.gpus)
    who = "All GPUs" if all_idle else f"{len(idle_gpus)} of {len(data.gpus)} GPUs"
    return Finding(
        code=CODE,
        severity=_severity(share, f),
        confidence=confidence(0.9, coverage=f.coverage(f.util_key)),
        title=f"{who} idle (~0 % utilisation) for {_dur(max(b - a for a, b in windows))} or more",
        recommendation=_recommendation(inp),
        evidence=[
            Evidence("idle GPUs", ", ".join(idle_gpus[:8]) + (" ..." if len(idle_gpus) > 8 else "")),
            Evidence("idle GPU-hours", round(gpu_hours, 2), "GPU-h"),
            Evidence(share_label, round(100 * share, 1), "%"),
            *fb_note,
        ],
        windows=D.merge_windows(windows, gap_s=step),
        impact=clamp01(share),
        missing_signals=[],
        sources=["metrics"],
    )


def _aggregate(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Without per-GPU data: stretches where the least busy GPU reads idle; the count is estimated."""
    assert f.util_key is not None
    low, mean = f.stat(f.util_key, "min"), f.util
    if low is None or mean is None:
        return None
    min_len = max(int(np.ceil(T.IDLE_MIN_STRETCH_S / f.step)), 1)
    rs = [r for r in D.idle_gaps(low, bridge=int(T.IDLE_MAX_BRIDGE_S // f.step)) if r[1] - r[0] >= min_len]
    if not rs:
        return None
    mask = np.zeros(low.size, dtype=bool)
    for a, b in rs:
        mask[a:b] = True
    peak = f.stat(f.util_key, "max")
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = (
            np.nanmean(np.clip(1.0 - mean[mask] / np.where(peak[mask] > 0, peak[mask], np.nan), 0, 1))
            if (peak is not None)
            else 0.5
        )
    frac = float(frac) if np.isfinite(frac) else 0.5
    share, share_label = _reported_share(inp, frac * float(mask.mean()), estimate=True)
    return Finding(
        code=CODE,
        severity=_severity(share, f),
        confidence=confidence(0.6, missing=["per-GPU series"], coverage=f.coverage(f.util_key)),
        title=f"About {frac:.0%} of the GPUs idle for {_dur(max(b - a for a, b in rs) * f.step)} or more",
        recommendation=_recommendation(inp),
        evidence=[
            Evidence("estimated share of GPUs idle in those stretches", round(100 * frac, 1), "%"),
            Evidence(share_label, round(100 * share, 1), "%"),
        ],
        windows=D.merge_windows(D.run_windows(rs, f.timestamps, f.step)),
        impact=clamp01(share),
        missing_signals=["per-GPU series"],
        sources=["metrics"],
    )


def _severity(share: float, f: Features) -> Severity:
    if f.samples_per_gpu < T.MIN_SAMPLES_TO_WARN:
        return Severity.INFO  # too few samples to warn (a short pod)
    if share >= T.IDLE_MIN_SHARE:
        return Severity.CRITICAL
    return Severity.WARNING if share >= T.IDLE_WARN_SHARE else Severity.INFO


def _dur(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"
