"""What an archived chunk is: its key, its grid and tiers, and the points a poll or finalize writes into it
(`Points`, `rows_for`, `derived_rows`). See the package docstring for the layout."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from jobs.evaluation.schema import DERIVED_MFU, DERIVED_THROUGHPUT
from jobs.metrics.downsample import MEAN_HIGH, MEAN_LOW
from jobs.metrics.signals import JobSignals
from jobs.models import Job

CHUNK_POINTS = 240  # points per archived row: 2 h at the 30 s poll step
THROUGHPUT = DERIVED_THROUGHPUT
MFU = DERIVED_MFU
_UNITS = {THROUGHPUT: "tokens/s", MFU: "ratio"}
_F4 = np.dtype("<f4")
_EPS = 1e-6  # in steps: float noise of millisecond timestamps
GPU_STAT = "gpu"
#: Lowest and highest cross-GPU mean inside each window of a downsampled level (jobs.metrics.downsample): a
#: chart
#: drawn from a tier keeps the short dips and spikes its means average away. Read only on request.
EXTREMES = (MEAN_LOW, MEAN_HIGH)

#: Downsampled levels of the cross-GPU stats (s): 300 s keeps a week within ~2,000 points per line, 3600 s
#: a quarter. Each divides a 240-point chunk of the level below (30 s x 240 = 7,200 s; 300 s x 240 =
#: 72,000 s), so every coarse window is computed from one finer chunk.
AGG_TIERS = (300, 3600)
#: Downsampled levels of per-GPU rows (s), kept forever; the polled 300 s rows are kept for
#: ARCHIVE_RAW_RETENTION_DAYS. 1800 divides 300 s x 240, 21,600 divides 1800 s x 240.
GPU_TIERS = (1800, 21600)


def utc(ts: float) -> datetime:
    """A Unix time as an aware UTC datetime."""
    return datetime.fromtimestamp(ts, tz=UTC)


@dataclass(frozen=True, slots=True)
class Points:
    """One line to archive: (signal, stat, GPU) of one job at `step`, samples at `times` (NaN = none)."""

    job_id: int
    signal: str
    stat: str
    gpu_key: str
    step: int
    times: np.ndarray
    values: np.ndarray


def _line(
    job: Job, signal: str, stat: str, gpu_key: str, step: int, ts: np.ndarray, values: np.ndarray
) -> list[Points]:
    if ts.size == 0 or step <= 0:
        return []
    v = np.asarray(values, dtype=np.float64)
    if not np.isfinite(v).any():
        return []
    return [Points(job.pk, signal, stat, gpu_key, int(step), np.asarray(ts, dtype=np.float64), v)]


def rows_for(job: Job, sigs: JobSignals, extra: dict[str, np.ndarray]) -> list[Points]:
    """The lines of `sigs` (cross-GPU stats, per-GPU rows) and of `extra` (derived means) to `upsert`: one
    per (signal, stat) and per (signal, GPU) with at least one value (`_line`)."""
    step = int(sigs.step)
    rows: list[Points] = []
    for key, series in sigs.signals.items():
        for stat, values in series.stats.items():
            rows += _line(job, key, stat, "", step, series.timestamps, values)
        if (
            series.per_gpu is not None
            and series.gpu_timestamps is not None
            and len(series.gpu_timestamps) > 1
        ):
            rows += _gpu_lines(job, key, series.gpus, series.gpu_timestamps, series.per_gpu)
    for name, values in extra.items():
        rows += _line(job, name, "mean", "", step, sigs.timestamps, values)
    return rows


def _gpu_lines(
    job: Job, signal: str, gpus: tuple[object, ...], ts: np.ndarray, matrix: np.ndarray
) -> list[Points]:
    """`_line` of each GPU's row of `matrix` at the step of `ts`, with the finiteness test done once for the
    whole matrix and one timestamps array shared by all rows (per-row numpy calls were most of a cycle's
    row building: every job due for per-GPU rows brings ~22 signals x its GPUs)."""
    step = round(ts[1] - ts[0])
    times = np.asarray(ts, dtype=np.float64)
    values = np.asarray(matrix, dtype=np.float64)
    if times.size == 0 or step <= 0:
        return []
    live: list[bool] = np.asarray(np.isfinite(values).any(axis=1), dtype=bool).tolist()
    return [
        Points(job.pk, signal, GPU_STAT, str(gpu), int(step), times, row)
        for gpu, row, ok in zip(gpus, values, live, strict=True)
        if ok
    ]


def derived_rows(job: Job, sigs: JobSignals, derived: dict[str, np.ndarray]) -> list[Points]:
    """Rows of the evaluation's derived series (throughput, MFU) on the grid of `sigs`, not its signals."""
    return rows_for(job, JobSignals(sigs.start, sigs.end, sigs.step, sigs.timestamps), derived)


_Key = tuple[int, str, str, str, int, int]  # job, signal, stat, GPU, step, chunk start (Unix s)


def decode(blob: bytes | memoryview) -> np.ndarray:
    """A chunk's stored values (little-endian float32 bytes) as float64, NaN for gaps."""
    return np.frombuffer(blob, dtype=_F4).astype(np.float64)


def _padded(blob: bytes) -> np.ndarray:
    """A stored chunk's float32 values padded with NaN to CHUNK_POINTS (the merge works on whole chunks)."""
    arr = np.full(CHUNK_POINTS, np.nan, dtype=_F4)
    old = np.frombuffer(blob, dtype=_F4)[:CHUNK_POINTS]
    arr[: old.size] = old
    return arr
