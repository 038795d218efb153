"""The archive of a job's series in Postgres: aligned chunks written whole, read back as JobSignals.

Chunk boundaries are aligned to multiples of (step x CHUNK_POINTS) on the Unix clock, so any re-read of a
window rewrites exactly the same rows: repeated or overlapping polls never duplicate data.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime

import numpy as np
from django.db.models import Q

from jobs.metrics.sampling import lattice_point, place_on_grid
from jobs.metrics.signals import SIGNALS, GpuKey, JobSignals, SignalSeries, grid
from jobs.models import Job, JobSeries

CHUNK_POINTS = 240  # points per archived row: 2 h at the 30 s poll step
THROUGHPUT = "tokens_per_second"
MFU = "mfu"


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def _chunk_rows(
    job: Job, signal: str, stat: str, gpu_key: str, step: int, ts: np.ndarray, values: np.ndarray
) -> list[JobSeries]:
    rows: list[JobSeries] = []
    if ts.size == 0:
        return rows
    span = step * CHUNK_POINTS
    chunk_ids = np.floor(ts / span).astype(np.int64)
    for chunk in np.unique(chunk_ids):
        mask = chunk_ids == chunk
        vals = values[mask]
        if np.isnan(vals).all():
            continue
        t = ts[mask]
        rows.append(
            JobSeries(
                job=job,
                signal=signal,
                stat=stat,
                gpu_key=gpu_key,
                step_seconds=step,
                start=utc(float(chunk * span)),
                end=utc(float(t[-1])),
                timestamps=t.tolist(),
                values=[None if math.isnan(v) else float(v) for v in vals],
            )
        )
    return rows


def rows_for(job: Job, sigs: JobSignals, extra: dict[str, np.ndarray]) -> list[JobSeries]:
    step = int(sigs.step)
    rows: list[JobSeries] = []
    for key, series in sigs.signals.items():
        for stat, values in series.stats.items():
            rows += _chunk_rows(job, key, stat, "", step, series.timestamps, values)
        if (
            series.per_gpu is not None
            and series.gpu_timestamps is not None
            and len(series.gpu_timestamps) > 1
        ):
            gstep = round(series.gpu_timestamps[1] - series.gpu_timestamps[0])
            for gpu, row in zip(series.gpus, series.per_gpu, strict=True):
                rows += _chunk_rows(job, key, "gpu", str(gpu), gstep, series.gpu_timestamps, row)
    for name, values in extra.items():
        rows += _chunk_rows(job, name, "mean", "", step, sigs.timestamps, values)
    return rows


def upsert(rows: list[JobSeries]) -> None:
    JobSeries.objects.bulk_create(
        rows,
        batch_size=500,
        update_conflicts=True,
        unique_fields=["job", "signal", "stat", "gpu_key", "start"],
        update_fields=["step_seconds", "end", "timestamps", "values"],
    )


def load_job_signals(job: Job, *, per_gpu: bool | Iterable[str] = True) -> JobSignals | None:
    """The archived signals of a job as a JobSignals on one grid (None when nothing is archived).

    `per_gpu=False` skips the per-GPU rows, by far the bulk of a large job's archive, when only the
    cross-GPU statistics are needed; a list of signal keys loads per-GPU rows of those signals only (the
    evaluation after each poll needs GPU_UTIL per GPU for the exact idle share, nothing else).
    """
    rows_qs = JobSeries.objects.filter(job=job)
    if per_gpu is False:
        rows_qs = rows_qs.exclude(stat="gpu")
    elif per_gpu is not True:
        rows_qs = rows_qs.exclude(Q(stat="gpu") & ~Q(signal__in=list(per_gpu)))
    rows = list(rows_qs.values_list("signal", "stat", "gpu_key", "step_seconds", "timestamps", "values"))
    if not rows:
        return None
    agg_steps = [r[3] for r in rows if r[1] != "gpu"]
    if not agg_steps:
        return None
    step = max(set(agg_steps), key=agg_steps.count)
    start = min(min(r[4]) for r in rows if r[1] != "gpu" and r[3] == step)
    end = max(max(r[4]) for r in rows if r[1] != "gpu" and r[3] == step)
    ts = grid(start, end, step)
    result = JobSignals(start, end, step, ts)
    agg: dict[str, dict[str, np.ndarray]] = defaultdict(dict)
    gpu_rows: dict[str, dict[str, list[tuple[list[float], list[float | None]]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    gpu_step_counts: dict[str, Counter[int]] = defaultdict(Counter)
    for signal, stat, _key, row_step, times, values in rows:
        if stat == "gpu":
            gpu_step_counts[signal][row_step] += 1
            continue
        if row_step != step:
            continue
        target = agg[signal].setdefault(stat, np.full(ts.shape, np.nan))
        placed = place_on_grid(times, _floats(values), start, step, len(ts))
        # Chunks of one series do not overlap: each fills its own columns of the grid.
        target[:] = np.where(np.isnan(placed), target, placed)
    # One per-GPU step per signal (the most common), like the aggregate step: rows of another step would
    # leave holes between their columns or pile several samples into one.
    gpu_steps = {signal: counts.most_common(1)[0][0] for signal, counts in gpu_step_counts.items()}
    gpu_last = end
    for signal, stat, gpu_key, row_step, times, values in rows:
        if stat == "gpu" and row_step == gpu_steps[signal]:
            gpu_rows[signal][gpu_key].append((times, values))
            gpu_last = max(gpu_last, max(times))
    for signal, stats in agg.items():
        unit = (
            SIGNALS[signal].unit if signal in SIGNALS else ("tokens/s" if signal == THROUGHPUT else "ratio")
        )
        series = SignalSeries(signal, unit, ts, stats)
        if signal in gpu_rows:
            gstep = gpu_steps[signal]
            # The per-GPU grid lies on multiples of its step (as fetch_job_signals reads it) from the one
            # closing the window that holds the job's first aggregate point, through the point closing
            # the window of the last per-GPU sample: every archived row, whatever grid it was read on
            # (older archives used start + k*step), maps one sample to one column (`grid_columns`).
            g0 = lattice_point(start, gstep)
            gts = grid(g0, lattice_point(gpu_last, gstep), gstep)
            keys = sorted(gpu_rows[signal], key=_gpu_sort_key)
            matrix = np.full((len(keys), len(gts)), np.nan)
            for i, key in enumerate(keys):
                for times, values in gpu_rows[signal][key]:
                    placed = place_on_grid(times, _floats(values), g0, gstep, len(gts))
                    matrix[i] = np.where(np.isnan(placed), matrix[i], placed)
            series.gpus = tuple(GpuKey(*k.rsplit("/", 1)) for k in keys)
            series.gpu_timestamps, series.per_gpu = gts, matrix
        result.signals[signal] = series
    result.missing = dict(job.missing_reasons or {})
    return result


def _floats(values: list[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def _gpu_sort_key(key: str) -> tuple[str, int, str]:
    host, _, gpu = key.rpartition("/")
    return host, int(gpu) if gpu.isdigit() else -1, gpu
