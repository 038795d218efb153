"""data_pipeline_stall: the GPUs wait for input: regular idle gaps, host-side waits, a hot DataLoader.

Metrics (the seed's "four looks": long GPU idle -> data or CPU side): the job's utilisation drops to ~0 at
regular intervals, short each time (long idle stretches are idle_gpus). Stalls shorter than a scrape
interval average out into a flat partial utilisation: that alone is only a hint (info). A trace shows GPU
idle time whose gaps start when the host launches late (HTA's host wait) and a DataLoader share of the
step; py-spy shows the input pipeline hot in the training process.
"""

from __future__ import annotations

import numpy as np

from jobs.diagnosis import artifacts as A
from jobs.diagnosis import detectors as D
from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity, clamp01, confidence
from jobs.diagnosis.features import Features
from jobs.diagnosis.rules.common import pct, ratio_ev, util_level

CODE = "data_pipeline_stall"
RECOMMENDATION = (
    "The GPUs wait for the next batch. Tokenise/decode offline into a memory-mapped format, raise "
    "DataLoader num_workers and prefetch_factor, set pin_memory=True (and non_blocking copies) and "
    "persistent_workers=True, and read the data from local NVMe instead of network storage; then check "
    "py-spy for what the workers do."
)


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Fire on regular synchronised idle gaps (metrics), or trace/py-spy evidence of waiting for input."""
    evidence: list[Evidence] = []
    sources: list[str] = []
    base, impact = 0.0, 0.0
    severity = Severity.INFO
    windows: list[tuple[float, float]] = []
    gaps = _gaps(f)
    if gaps is not None:
        rs, share, period, cv = gaps
        base, severity = 0.8, Severity.WARNING
        evidence += [
            Evidence("idle gaps (all GPUs at ~0 %)", len(rs), "count"),
            Evidence("time in idle gaps", round(100 * share, 1), "%"),
            Evidence("typical gap length", round(float(np.median([b - a for a, b in rs])) * f.step), "s"),
        ]
        if period is not None:
            evidence.append(Evidence("gap period", round(period.period_s), "s"))
        if cv is not None:
            evidence.append(Evidence("variation of the interval between gaps", round(cv, 2), "CV"))
        windows = D.merge_windows(D.run_windows(rs, f.timestamps, f.step), gap_s=0.0)
        impact = share
        sources.append("metrics")
    else:
        partial = _partial(f)
        if partial is not None:
            base, impact = 0.35, partial
            util = _working_util(f)
            evidence.append(ratio_ev("GPU utilisation, median (flat, no idle gaps at this resolution)", util))
            sources.append("metrics")
            windows = f.whole_window
    trace_idle = _trace(inp, evidence, sources)
    py = _pyspy(inp, evidence, sources)
    if not sources:
        return None
    if trace_idle is not None:
        impact = max(impact, trace_idle)
        base = max(base, 0.6) + (0.1 if "metrics" in sources else 0.0)
    if py:
        base = min(base + 0.15, 0.95) if base else 0.5
        if gaps is not None or (trace_idle or 0.0) >= T.TRACE_IDLE_PCT / 100:
            severity = Severity.WARNING
    if trace_idle is not None and any(e.label.endswith("DataLoader share of step") for e in evidence):
        severity = Severity.WARNING
    title = (
        f"The GPUs idle together every {round(gaps[2].period_s)} s waiting for input"
        if gaps is not None and gaps[2] is not None
        else f"The GPUs idle together {pct(gaps[1])} of the time waiting for input"
        if gaps is not None
        else "GPU time is lost waiting on the host / input pipeline"
    )
    # GR_ENGINE_ACTIVE stands in for a missing GPU_UTIL; say so and trust it a little less.
    missing = f.missing(["gpu_util"]) if "metrics" in sources else []
    return Finding(
        code=CODE,
        severity=severity,
        confidence=confidence(
            min(base, 0.95),
            missing=missing,
            coverage=f.coverage(f.util_key) if f.util_key and "metrics" in sources else 1.0,
        ),
        title=title,
        recommendation=RECOMMENDATION,
        evidence=evidence,
        windows=windows,
        impact=impact,
        missing_signals=missing,
        sources=sources,
    )


def _gaps(f: Features) -> tuple[list[D.Run], float, D.Periodicity | None, float | None] | None:
    if f.util is None:
        return None
    long_run = max(int(T.IDLE_MIN_STRETCH_S // f.step), 2)
    rs = [r for r in D.idle_gaps(f.util, threshold=T.STALL_UTIL_MAX) if r[1] - r[0] < long_run]
    known = np.isfinite(f.util)
    if len(rs) < T.STALL_MIN_GAPS or not known.any():
        return None
    in_gaps = np.zeros(f.util.size, dtype=bool)
    for a, b in rs:
        in_gaps[a:b] = True
    share = float(in_gaps[known].mean())
    if share < T.STALL_MIN_IDLE_SHARE:
        return None
    period = D.find_periodicity(f.util, f.step)
    cv = D.interval_cv([a for a, _ in rs])
    regular = (period is not None and period.swing >= T.SAWTOOTH_MIN_SWING) or (
        cv is not None and cv <= T.STALL_MAX_INTERVAL_CV
    )
    if not regular:
        return None
    lost = float(np.nansum(np.clip(1.0 - f.util[in_gaps], 0.0, 1.0))) / max(int(known.sum()), 1)
    return rs, clamp01(lost), period, cv


def _partial(f: Features) -> float | None:
    util = _working_util(f)
    if util is None or not T.PARTIAL_UTIL_LOW <= util <= T.PARTIAL_UTIL_HIGH:
        return None
    pcie = max(f.level("pcie_rx_bytes") or 0.0, f.level("pcie_tx_bytes") or 0.0)
    if pcie >= T.PCIE_HEAVY_BPS:
        return None  # host-device copies explain the partial utilisation
    return clamp01(1.0 - util)


def _working_util(f: Features) -> float | None:
    """Median utilisation of the GPUs that work at all (GPUs idle most of the job are idle_gpus)."""
    data = f.gpu_data((f.util_key,)) if f.util_key else None
    if data is None or f.util_key is None:
        return util_level(f)
    per_gpu = [D.nanmedian(row) for row in data.values[f.util_key]]
    working = [u for u in per_gpu if u is not None and u > T.IDLE_UTIL_MAX]
    return float(np.median(working)) if working else None


def _trace(inp: DiagnosisInput, evidence: list[Evidence], sources: list[str]) -> float | None:
    worst: float | None = None
    for r in A.trace_ranks(inp):
        idle = r.n("temporal_breakdown", "idle_pct")
        host = r.n("idle_breakdown", "host_wait_pct")
        loader = r.n("step_breakdown", "dataloader_pct")
        waits = idle is not None and idle >= T.TRACE_IDLE_PCT and host is not None and host >= T.HOST_WAIT_PCT
        hot_loader = loader is not None and loader >= T.DATALOADER_PCT
        if not waits and not hot_loader:
            continue
        if waits:
            evidence += [
                Evidence(f"{r.label}: GPU idle", round(idle or 0.0, 2), "% of span"),
                Evidence(f"{r.label}: idle time waiting on the host", round(host or 0.0, 2), "%"),
            ]
        if hot_loader:
            evidence.append(Evidence(f"{r.label}: DataLoader share of step", round(loader or 0.0, 2), "%"))
        share = max((idle or 0.0) * (host or 0.0) / 1e4 if waits else 0.0, (loader or 0.0) / 100.0)
        worst = max(worst or 0.0, share)
        if r.source not in sources:
            sources.append(r.source)
    return worst


def _pyspy(inp: DiagnosisInput, evidence: list[Evidence], sources: list[str]) -> bool:
    hit = False
    for art in A.pyspy(inp):
        share = A.getnum(art.analysis, "input_pipeline_pct")
        if share is None or share < T.PYSPY_INPUT_PCT:
            continue
        hit = True
        evidence.append(Evidence(f"{A.source_label(art)}: Python samples in the input pipeline", share, "%"))
        hot = [
            h
            for h in A.items(art.analysis, "hot_inclusive")
            if h.get("class") in ("data_loading", "tokenization", "collate")
        ][:3]
        for h in hot:
            evidence.append(
                Evidence(f"hot: {str(h.get('label', '?'))[:120]}", A.num(h.get("inclusive_pct")), "%")
            )
        if "py-spy" not in sources:
            sources.append("py-spy")
    return hit
