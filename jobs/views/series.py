"""Read just what a page draws from a job's archived series.

jobs.ingest.load_job_signals reads every archived row of a job (all signals, all stats, every GPU); for a
256-GPU week that is millions of numbers. Pages need the cross-GPU mean of the charted signals and the
per-GPU rows of one signal, optionally only inside a zoom window; this module reads exactly that, in one
query per kind, and returns the same jobs.signals types (NaN = missing sample).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime

import numpy as np

from jobs.models import Job, JobSeries
from jobs.signals import SIGNALS, GpuKey, JobSignals, SignalSeries, grid

_UNITS = {"tokens_per_second": "tokens/s", "mfu": "ratio"}


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def _rows(job: Job, signals: Iterable[str], stat: str, window: tuple[float, float] | None):
    qs = JobSeries.objects.filter(job_id=job.pk, signal__in=list(signals), stat=stat)
    if window is not None:
        # Chunks start at an aligned time and end at their last sample: overlap test on both ends.
        qs = qs.filter(start__lte=_utc(window[1]), end__gte=_utc(window[0]))
    return qs


def _place(
    target: np.ndarray, start: float, step: float, times: list[float], values: list[float | None]
) -> None:
    idx = np.rint((np.asarray(times, dtype=np.float64) - start) / step).astype(np.int64)
    vals = np.array(values, dtype=np.float64)  # None -> NaN
    ok = (idx >= 0) & (idx < target.shape[-1])
    target[..., idx[ok]] = vals[ok]


def load_means(
    job: Job, signals: Iterable[str], window: tuple[float, float] | None = None
) -> JobSignals | None:
    """Cross-GPU means of `signals` on one time grid (the most common archive step), or None when nothing
    is archived. One query."""
    rows = list(
        _rows(job, signals, "mean", window).values_list("signal", "step_seconds", "timestamps", "values")
    )
    if not rows:
        return None
    step = Counter(r[1] for r in rows).most_common(1)[0][0]
    same = [r for r in rows if r[1] == step and r[2]]
    if not same:
        return None
    start = min(r[2][0] for r in same)
    end = max(r[2][-1] for r in same)
    ts = grid(start, end, step)
    result = JobSignals(start, end, step, ts)
    for signal, _, times, values in same:
        series = result.signals.get(signal)
        if series is None:
            unit = SIGNALS[signal].unit if signal in SIGNALS else _UNITS.get(signal, "")
            series = result.signals[signal] = SignalSeries(
                signal, unit, ts, {"mean": np.full(ts.shape, np.nan)}
            )
        _place(series.stats["mean"], start, step, times, values)
    return result


def load_per_gpu(job: Job, signal: str, window: tuple[float, float] | None = None) -> SignalSeries | None:
    """One signal per GPU as a (GPUs x time) matrix on its own grid, or None when not archived. One query."""
    rows = list(
        _rows(job, [signal], "gpu", window).values_list("gpu_key", "step_seconds", "timestamps", "values")
    )
    rows = [r for r in rows if r[2]]
    if not rows:
        return None
    step = Counter(r[1] for r in rows).most_common(1)[0][0]
    rows = [r for r in rows if r[1] == step]
    start = math.floor(min(r[2][0] for r in rows) / step) * step
    end = max(r[2][-1] for r in rows)
    gts = grid(start, end, step)
    keys = sorted({r[0] for r in rows}, key=_gpu_sort_key)
    position = {k: i for i, k in enumerate(keys)}
    matrix = np.full((len(keys), gts.size), np.nan)
    for key, _, times, values in rows:
        _place(matrix[position[key]], start, step, times, values)
    unit = SIGNALS[signal].unit if signal in SIGNALS else ""
    series = SignalSeries(signal, unit, gts, {})
    series.gpus = tuple(GpuKey(*k.rsplit("/", 1)) if "/" in k else GpuKey(k, "") for k in keys)
    series.gpu_timestamps, series.per_gpu = gts, matrix
    return series


def _gpu_sort_key(key: str) -> tuple[str, int, str]:
    host, _, gpu = key.rpartition("/")
    return host, int(gpu) if gpu.isdigit() else -1, gpu


def heatmap_signal(job: Job) -> str:
    """The signal the per-GPU heatmap shows: SM active, or nvidia-smi util when SM active is not collected."""
    return "gpu_util" if "sm_active" in (job.missing_signals or []) else "sm_active"
