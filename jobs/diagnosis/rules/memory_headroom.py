"""memory_headroom: the frame buffer stays well below capacity: room for a larger micro-batch.

Per busy GPU, the 95th percentile of FB_USED over its samples; the job's use is the highest of those (the
fullest GPU limits the micro-batch). Capacity is FB_USED + FB_FREE as the exporter reports them, else the
GPU catalog's memory size.

Serving jobs (`kind == "inference"`) get serving advice: memory headroom there means room for a larger
request batch / KV cache or a smaller (cheaper) GPU, not a larger micro-batch. Fewer than
MIN_SAMPLES_TO_WARN samples per GPU give context (info), never a warning. Resolution: frame-buffer use
changes slowly, so the 95th percentile is resolved at any usual scrape interval; a short allocation peak
between two samples is not seen (the headroom may be smaller than it reads).
Kind unknown (jobs.diagnosis.kinds): whether the headroom means a larger micro-batch or more sequences per
batch depends on the kind, so the finding is info.
"""

from __future__ import annotations

import numpy as np

from jobs.diagnosis import kinds as K
from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity, clamp01, confidence
from jobs.diagnosis.features import Features
from jobs.diagnosis.rules.common import pct

CODE = "memory_headroom"
SERVING_RECOMMENDATION = (
    "The serving GPUs use little of their memory. Batch more requests per forward pass (raise the server's "
    "max batch size / max_num_seqs and the KV-cache share, continuous batching), or right-size: serve "
    "this model on a smaller GPU, or pack several replicas per GPU (MIG or multiple models) and autoscale "
    "the replica count on load."
)
RECOMMENDATION = (
    "The GPUs use little of their memory. Raise the micro-batch (or sequence packing) until memory use "
    "reaches ~80-90 %, which makes kernels larger and MFU higher; if activation checkpointing is on, turn "
    "it off or make it selective, and reduce gradient accumulation steps to keep the global batch."
)


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Fire when even the fullest busy GPU uses less than HEADROOM_USED_MAX of its memory."""
    used, capacity, source, missing = _usage(inp, f)
    if used is None or not capacity:
        return None
    share = used / capacity
    if share >= T.HEADROOM_USED_MAX:
        return None
    severity = Severity.WARNING if share < T.HEADROOM_USED_LOW else Severity.INFO
    if f.samples_per_gpu < T.MIN_SAMPLES_TO_WARN:
        severity = Severity.INFO
    finding = Finding(
        code=CODE,
        severity=severity,
        confidence=confidence(
            0.85 if source == "exporter" else 0.7, missing=missing, coverage=f.coverage("fb_used")
        ),
        title=f"GPU memory mostly unused: at most {pct(share)} of the frame buffer in use",
        recommendation=SERVING_RECOMMENDATION if K.is_serving(inp.kind) else RECOMMENDATION,
        evidence=[
            Evidence("frame buffer used, busiest GPU, 95th percentile", round(used), "MiB"),
            Evidence(
                f"capacity ({'FB_USED + FB_FREE' if source == 'exporter' else 'GPU catalog'})",
                round(capacity),
                "MiB",
            ),
            Evidence("share used", round(100 * share, 1), "%"),
        ],
        windows=f.whole_window,
        impact=T.HEADROOM_MAX_IMPACT * clamp01((T.HEADROOM_TARGET - share) / T.HEADROOM_TARGET),
        missing_signals=missing,
        sources=["metrics"],
    )
    # A larger micro-batch (training) or more sequences per batch (serving): with the kind unknown, info.
    return K.gate_unknown(finding, inp.kind)


def _usage(inp: DiagnosisInput, f: Features) -> tuple[float | None, float | None, str, list[str]]:
    missing = f.missing(["fb_free"])
    if not f.has("fb_used"):
        return None, None, "", missing
    used: float | None = None
    lv = f.per_gpu_level("fb_used", 0.95)
    if lv is not None:
        _, levels = lv
        used = float(np.nanmax(levels)) if np.isfinite(levels).any() else None
    if used is None:
        used = f.level("fb_used", 0.95)
    capacity, source = None, ""
    free_max = f.stat("fb_free", "max")
    used_max = f.stat("fb_used", "max")
    if free_max is not None and used_max is not None:
        # Per GPU used + free is constant; across GPUs the largest sum is the capacity.
        total = f.stat("fb_used", "mean")
        free = f.stat("fb_free", "mean")
        if total is not None and free is not None:
            both = total + free
            if np.isfinite(both).any():
                capacity, source = float(np.nanmax(both)), "exporter"
    if capacity is None and inp.gpu_memory_mib:
        capacity, source = float(inp.gpu_memory_mib), "catalog"
    return used, capacity, source, missing
