"""gpu_errors: XID errors reported during the job (DCGM_FI_DEV_XID_ERRORS: the last XID code, 0 = none).

Any non-zero code in the window matters; codes that point at hardware (ECC, fallen off the bus, NVLink,
GSP, row remapping) are critical.

Resolution: XID is the last code seen; one sample is enough (no minimum of samples), but an error that
clears between two samples is missed.
"""

from __future__ import annotations

import numpy as np

from jobs.diagnosis import detectors as D
from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity, clamp01, confidence
from jobs.diagnosis.features import Features

CODE = "gpu_errors"
RECOMMENDATION = (
    "The GPU driver reported XID errors. Look each code up in NVIDIA's XID catalogue; hardware codes (48, "
    "63/64, 74, 79, 92, 94/95, 119/120) mean the node needs a health check (dcgmi diag -r 3, ECC and "
    "row-remapping counters) before it runs more jobs; restart from the last checkpoint on healthy nodes."
)


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Fire when any GPU of the job reported a non-zero XID code."""
    data = f.gpu_data(("xid_errors",))
    codes: set[int] = set()
    evidence: list[Evidence] = []
    windows: list[tuple[float, float]] = []
    share = 0.0
    missing: list[str] = []
    if data is not None:
        x = data.values["xid_errors"]
        hit = np.isfinite(x) & (x != 0)
        if not hit.any():
            return None
        for i, gpu in enumerate(data.gpus):
            if hit[i].any():
                gpu_codes = sorted({int(c) for c in x[i][hit[i]]})
                codes.update(gpu_codes)
                evidence.append(Evidence(f"{gpu}: XID", ", ".join(map(str, gpu_codes)), "XID code"))
                windows += D.run_windows(D.runs(hit[i]), data.timestamps, data.step)
        share = float(hit.sum()) / max(int(np.isfinite(x).sum()), 1)
    else:
        missing.append("per-GPU series")  # the codes are known, not which GPU reported them
        top, nonzero = f.stat("xid_errors", "max"), f.stat("xid_errors", "nonzero")
        if top is None:
            return None
        hit1 = np.isfinite(top) & (top != 0)
        if not hit1.any():
            return None
        codes.update(int(c) for c in np.unique(top[hit1]))
        evidence.append(Evidence("highest XID code", int(np.nanmax(top[hit1])), "XID code"))
        if nonzero is not None:
            evidence.append(Evidence("GPUs with an XID at once, max", int(np.nanmax(nonzero)), "count"))
        windows = D.run_windows(D.runs(hit1), f.timestamps, f.step)
        share = float(hit1.mean()) / max(inp.gpu_count, 1)
    seconds = sum(b - a for a, b in D.merge_windows(windows))
    evidence.append(Evidence("time with an XID reported", round(seconds), "s"))
    hardware = sorted(c for c in codes if c in T.XID_HARDWARE)
    return Finding(
        code=CODE,
        severity=Severity.CRITICAL if hardware else Severity.WARNING,
        confidence=confidence(0.95, missing=missing, coverage=max(f.coverage("xid_errors"), 0.5)),
        title=f"XID error{'s' if len(codes) > 1 else ''} {', '.join(map(str, sorted(codes)))} during the job"
        + (" (hardware)" if hardware else ""),
        recommendation=RECOMMENDATION,
        evidence=evidence,
        windows=D.merge_windows(windows, gap_s=f.step),
        impact=clamp01(share),
        missing_signals=missing,
        sources=["metrics"],
    )
