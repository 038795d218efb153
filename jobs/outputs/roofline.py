"""A job's roofline (jobs.evaluation.roofline) from its archive and its GPU's catalog row: the `roofline`
object of the API's job detail and the job page's roofline section and figure.

Derived on read, not stored: the archive already holds the activities (cross-GPU means and per-GPU rows),
and the result is cached until the job changes (each poll saves it) or the cache entry expires.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

import numpy as np
from django.core.cache import cache

from jobs.charts.roofline import roofline_figure
from jobs.evaluation.catalog import normalise_dtype
from jobs.evaluation.roofline import (
    DRAM,
    FIELD_NAMES,
    PIPE_LABELS,
    SIGNALS,
    Activities,
    Roofline,
    Roofs,
    bin_means,
    job_roofline,
    roofs_for,
)
from jobs.metrics.archive import load_job_signals
from jobs.metrics.archive.read import EVALUATION_MAX_POINTS
from jobs.models import Job

#: Points of the job-over-time series on the figure and in the API: the cross-GPU means thinned to this
#: many windows (means of consecutive windows), enough to show phases without burying the GPUs' points.
TIME_POINTS = 120
#: Per-GPU rows are read at the coarsest tier with this many columns: only their time-means are used.
GPU_COLUMNS = 100
CACHE_S = 600
VERDICT_LABELS = {
    "compute": "near the compute roof",
    "memory": "near the memory roof",
    "under_both": "under both roofs",
    "unknown": "unknown",
}


def roofs_of(job: Job) -> Roofs:
    """The job's GPU's roofs for its dtype, from the (admin-editable) GpuModel row."""
    dtype = normalise_dtype(job.dtype) or job.dtype
    gpu = job.gpu_model
    if gpu is None:
        return roofs_for(None, dtype, None, None)
    return roofs_for(gpu.name, dtype, gpu.peak_tflops, gpu.bandwidth_tbps, gpu.peak_clock_mhz)


def _mean(values: np.ndarray | None) -> float | None:
    if values is None or values.size == 0 or np.isnan(values).all():
        return None
    return float(np.nanmean(values))


def build_roofline(job: Job) -> Roofline:
    """Read the activities (one query for the cross-GPU means, one for the per-GPU rows) and place them."""
    reasons = {k: v for k, v in (job.missing_reasons or {}).items() if k in SIGNALS and v}
    sigs = load_job_signals(
        job, per_gpu=list(SIGNALS), signals=SIGNALS, stats=["mean"], max_points=EVALUATION_MAX_POINTS,
        max_gpu_points=GPU_COLUMNS,
    )  # fmt: skip
    roofs = roofs_of(job)
    if sigs is None:
        nothing = {k: reasons.get(k, "nothing archived yet") for k in SIGNALS}
        return job_roofline(roofs, Activities(missing=nothing), mfu=job.mfu)
    series = {k: sigs.get(k) for k in SIGNALS}
    job_means = {k: _mean(s.mean) if s is not None else None for k, s in series.items()}
    # Per GPU: the time-mean of each GPU's row; a GPU without rows of a signal the job has is "no samples".
    per_gpu: dict[str, dict[str, float | None]] = {}
    for key, s in series.items():
        if s is None or s.per_gpu is None:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN row is a GPU without samples
            means = np.nanmean(s.per_gpu, axis=1)
        for gpu, value in zip(s.gpus, means.tolist(), strict=True):
            per_gpu.setdefault(str(gpu), {})[key] = value
    gpus = []
    for label, means in per_gpu.items():
        absent = {k: f"no {FIELD_NAMES.get(k, k)} samples from this GPU" for k in SIGNALS if k not in means}
        gpus.append((label, Activities.from_means(means, {**absent, **reasons})))
    nan = np.full(sigs.timestamps.size, np.nan)
    columns = {k: (s.mean if s is not None and s.mean is not None else nan) for k, s in series.items()}
    times, binned = bin_means(
        sigs.timestamps.tolist(), {k: v.tolist() for k, v in columns.items()}, TIME_POINTS
    )
    over_time = [
        (t, Activities.from_means({k: binned[k][i] for k in SIGNALS}, reasons)) for i, t in enumerate(times)
    ]
    note = ""
    evaluated = job.evaluated
    sharing = evaluated.sharing if evaluated is not None else None
    if sharing is not None and sharing.mig:
        # DCGM reports profiling fields per MIG instance (the labels carry GPU_I_ID, reference/dcgm.md):
        # shares of the slice's cycles, while the roofs are the whole GPU's.
        note = (
            "MIG slices: the activities are the slice's, the roofs the whole GPU's, so FLOP/s and bytes/s "
            "estimates overstate what a slice can reach; the shares and verdicts are the slice's"
        )
    elif sharing is not None and sharing.shared:
        note = (
            "these GPUs are time-sliced with other jobs: DCGM's activities are per physical GPU and include "
            "their work"
        )
    if not gpus and series.get(DRAM) is not None:
        note = note or "no per-GPU rows archived (past their retention, or not yet written): job means only"
    return job_roofline(roofs, Activities.from_means(job_means, reasons), gpus, over_time, job.mfu, note)


def _key(job: Job) -> str:
    parts = (job.pk, job.updated_at, job.data_until, job.mfu, job.dtype, job.gpu_model_id)
    return "job-roofline:" + hashlib.sha256(repr(parts).encode()).hexdigest()


def job_roofline_data(job: Job) -> dict[str, Any]:
    """{"summary": the API's `roofline` object, "figure": the page's plotly figure or None}, cached: the
    archive read costs two queries and only changes when the job is saved (each poll, each evaluation)."""
    key = _key(job)
    data = cache.get(key)
    if data is None:
        result = build_roofline(job)
        data = {"summary": result.to_dict(), "figure": roofline_figure(result)}
        cache.set(key, data, CACHE_S)
    return dict(data)


def _rate(value: float | None, unit: str, digits: int = 1) -> str:
    return f"{value / 1e12:,.{digits}f} {unit}" if value is not None else "unknown"


def page_lines(summary: dict[str, Any]) -> dict[str, Any]:
    """What the job page writes about the roofline, from the API's `roofline` object: the roofs, the
    job's placement in words, and one row per GPU (busiest first among the memory- and compute-side)."""
    job = summary["job"]
    roofs = (
        f"{summary['gpu_model']}, {summary['dtype']}: compute roof "
        f"{_rate(summary['peak_flops_per_s'], 'TFLOP/s')} dense, memory roof "
        f"{_rate(summary['bandwidth_bytes_per_s'], 'TB/s', 2)}"
        + (
            f", ridge {summary['ridge_flop_per_byte']:,.0f} FLOP/byte"
            if summary["ridge_flop_per_byte"]
            else ""
        )
        if summary["gpu_model"]
        else "GPU model unknown"
    )
    intensity = job["intensity_flop_per_byte"]
    estimate = (
        f"at most {_rate(job['flops_per_s_upper'], 'TFLOP/s')} and "
        f"{_rate(job['bytes_per_s_upper'], 'TB/s', 2)}"
        + (f", about {intensity:,.1f} FLOP/byte" if intensity is not None else "")
    )
    counts: dict[str, int] = {}
    rows = []
    for gpu in summary["gpus"]:
        counts[gpu["verdict"]] = counts.get(gpu["verdict"], 0) + 1
        pipe = PIPE_LABELS.get(gpu["busiest_pipe"] or "", "")
        rows.append({**gpu, "verdict_label": VERDICT_LABELS[gpu["verdict"]], "pipe_label": pipe})
    shares = summary.get("time_shares")
    over_time = (
        "Over time (cross-GPU means in "
        + f"{len(summary['over_time'])} windows): "
        + ", ".join(f"{VERDICT_LABELS[v]} {share:.0%}" for v, share in shares.items())
        + (f"; {summary['time_windows_unknown']} windows unknown" if summary["time_windows_unknown"] else "")
        if shares
        else ""
    )
    return {
        "roofs": roofs,
        "estimate": estimate,
        "over_time": over_time,
        "gpu_counts": [(VERDICT_LABELS[v], n) for v, n in sorted(counts.items())],
        "gpu_rows": rows,
    }
