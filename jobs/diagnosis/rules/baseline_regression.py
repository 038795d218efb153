"""baseline_regression: MFU or tokens/s per GPU below the band of this model + config's healthy baseline.

The band is jobs.evaluation.robust's (median +- BAND_Z robust sigmas and at least BAND_MIN_PCT). A symptom:
the engine keeps it as context when cause findings explain the drop. The window is where the job's MFU series
sits below the band; a change point in that series says when it started.

Resolution: MFU comes from throughput over windows of minutes, valid in both regimes; it says how much
is lost, never why (the cause rules do).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from jobs.diagnosis import detectors as D
from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity, clamp01, confidence
from jobs.diagnosis.features import Features
from jobs.evaluation.baseline_stats import MetricStats, decode_stats
from jobs.evaluation.robust import RegressionCheck, Summary, check_regression

CODE = "baseline_regression"
RECOMMENDATION = (
    "This run is slower than healthy runs of the same model and config. Compare its config, software "
    "versions and nodes with the baseline runs, and read the other findings for the cause."
)
_PRIMARY = ("mfu", "tokens_per_second_per_gpu", "step_time_ms")
#: How a primary metric is named in a title (a sentence: "MFU 51 % worse", not "mfu 51 % worse").
METRIC_TITLES = {"mfu": "MFU", "tokens_per_second_per_gpu": "Tokens/s per GPU", "step_time_ms": "Step time"}


def _metric_title(metric: str) -> str:
    return METRIC_TITLES.get(metric, metric.replace("_", " "))


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Fire when a primary metric (MFU, tokens/s/GPU, step time) is outside the baseline band, worse side."""
    if not inp.baseline:
        return None
    values = _job_values(inp, f)
    evidence: list[Evidence] = []
    worst: tuple[str, RegressionCheck] | None = None
    secondary = False
    stats = decode_stats(inp.baseline)
    for metric, (higher_better, aliases) in T.BASELINE_METRICS.items():
        summary = _summary(stats, aliases)
        value = values.get(metric)
        if summary is None or value is None or summary.median is None:
            continue
        result = check_regression(value, summary, higher_is_better=higher_better)
        if result.verdict != "regression":
            continue
        unit = "ms" if metric == "step_time_ms" else ("tokens/s" if "tokens" in metric else "%")
        scale = 100.0 if unit == "%" else 1.0
        evidence += [
            Evidence(
                f"{metric} (baseline median {round(result.median * scale, 2)} {unit})",
                round(value * scale, 3),
                unit,
            ),
            Evidence(f"{metric} vs baseline", round(result.deviation_pct or 0.0, 1), "%"),
        ]
        if metric in _PRIMARY:
            if worst is None or abs(result.deviation_pct or 0) > abs(worst[1].deviation_pct or 0):
                worst = (metric, result)
        else:
            secondary = True
    if worst is None and not secondary:
        return None
    missing = ["mfu"] if inp.mfu is None else []
    if worst is None:
        # Only hardware activity is below the band: context for the engineer, not a verdict on speed.
        return Finding(
            code=CODE,
            severity=Severity.INFO,
            confidence=confidence(0.5, missing=missing),
            title="Hardware activity below this config's baseline"
            + (" (MFU unknown)" if missing else " while MFU is within its band"),
            recommendation=RECOMMENDATION,
            evidence=evidence,
            windows=f.whole_window,
            impact=0.0,
            missing_signals=missing,
            sources=["baseline"],
        )
    metric, result = worst
    shortfall = abs(result.deviation_pct or 0.0) / 100.0
    severity = Severity.CRITICAL if shortfall * 100 >= T.BASELINE_CRITICAL_PCT else Severity.WARNING
    windows, onset = _windows(f, result if metric == "mfu" else None)
    if onset is not None:
        evidence.append(Evidence("MFU level shift at", onset, "unix s"))
    return Finding(
        code=CODE,
        severity=severity,
        confidence=confidence(0.9, missing=missing),
        title=f"{_metric_title(metric)} {100 * shortfall:.0f} % worse than this config's baseline",
        recommendation=RECOMMENDATION,
        evidence=evidence,
        windows=windows or f.whole_window,
        impact=clamp01(shortfall),
        missing_signals=missing,
        sources=["baseline"],
    )


def _job_values(inp: DiagnosisInput, f: Features) -> dict[str, float | None]:
    def time_mean(key: str) -> float | None:
        s = f.mean(key)
        return float(np.nanmean(s)) if s is not None and np.isfinite(s).any() else None

    per_gpu = inp.tokens_per_second / inp.gpu_count if inp.tokens_per_second and inp.gpu_count else None
    return {
        "mfu": inp.mfu,
        "tokens_per_second_per_gpu": per_gpu,
        "step_time_ms": inp.step_time_ms,
        "sm_active": time_mean("sm_active"),
        "tensor_active": time_mean("tensor_active"),
    }


def _summary(stats: Mapping[str, MetricStats], aliases: tuple[str, ...]) -> Summary | None:
    for name in aliases:
        entry = stats.get(name)
        # A stored summary without its run count is read as one run (the band then rests on its spread).
        summary = entry.summary(n_unknown=1) if entry is not None else None
        if summary is not None:
            return summary
    return None


def _windows(f: Features, result: RegressionCheck | None) -> tuple[list[tuple[float, float]], float | None]:
    series = f.mean("mfu")
    if series is None or result is None:
        return [], None
    mask = np.isfinite(series) & (series < result.band_low)
    windows = f.windows_where(mask, min_len=2)
    cps = D.change_points(series)
    onset = None
    for cp in cps:
        before, after = np.nanmean(series[:cp]), np.nanmean(series[cp:])
        if np.isfinite(before) and np.isfinite(after) and after < before:
            onset = float(f.timestamps[cp])
            break
    return windows, onset
