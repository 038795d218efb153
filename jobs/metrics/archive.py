"""The archive of a job's series in Postgres: aligned chunks written whole, read back as JobSignals.

Chunk boundaries are aligned to multiples of (step x CHUNK_POINTS) on the Unix clock, so any re-read of a
window rewrites exactly the same rows: repeated or overlapping polls never duplicate data.

One reader for everyone (ingestion, the evaluation, the diagnosis, the pages): `load_job_signals` (the
cross-GPU stats on one grid, optionally per-GPU rows and a zoom window) and `load_per_gpu` (one signal's
per-GPU matrix for a heatmap) share one fetch and one placement.

Speed: Postgres turning float8[] into text and psycopg parsing it back costs more than everything else on
a page (a running 7-day, 256-GPU job has ~0.5 M per-GPU samples). So values travel in Postgres' binary
array format (`array_send`, NULL replaced by NaN so every element has the same width) and are decoded with
one numpy call; timestamps are not read at all: each chunk is written as a contiguous run of its step
ending at `end`, so its times follow from `end` and the count (a chunk that does not fit its aligned
`start` has its timestamps read after all).
"""

from __future__ import annotations

import math
import struct
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
from django.db import connection

from jobs.evaluation.schema import DERIVED_MFU, DERIVED_THROUGHPUT
from jobs.metrics.sampling import grid_columns, lattice_point
from jobs.metrics.signals import SIGNALS, GpuKey, JobSignals, SignalSeries, grid
from jobs.models import Job, JobSeries

CHUNK_POINTS = 240  # points per archived row: 2 h at the 30 s poll step
THROUGHPUT = DERIVED_THROUGHPUT
MFU = DERIVED_MFU
_UNITS = {THROUGHPUT: "tokens/s", MFU: "ratio"}
_FLOAT8_OID = 701
_HEADER = struct.Struct(">iiiii")  # ndim, has-nulls flag, element type oid, size, lower bound
_HEADER_BYTES = _HEADER.size
_ELEMENT = np.dtype([("length", ">i4"), ("value", ">f8")])


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


def derived_rows(job: Job, sigs: JobSignals, derived: dict[str, np.ndarray]) -> list[JobSeries]:
    """Rows of the evaluation's derived series (throughput, MFU) on the grid of `sigs`, not its signals."""
    return rows_for(job, JobSignals(sigs.start, sigs.end, sigs.step, sigs.timestamps), derived)


def upsert(rows: list[JobSeries]) -> None:
    JobSeries.objects.bulk_create(
        rows,
        batch_size=500,
        update_conflicts=True,
        unique_fields=["job", "signal", "stat", "gpu_key", "start"],
        update_fields=["step_seconds", "end", "timestamps", "values"],
    )


# ---------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class Chunk:
    """One archived row as read: its keys, step, first sample time, sample count and binary values."""

    pk: int
    signal: str
    stat: str
    gpu_key: str
    step: int
    first: float
    count: int
    blob: bytes
    aligned_start: float

    @property
    def last(self) -> float:
        """Time of the chunk's last sample."""
        return self.first + (self.count - 1) * self.step

    @property
    def plausible(self) -> bool:
        """Whether the derived first time fits the chunk's aligned start (else its timestamps are read)."""
        offset = self.first - self.aligned_start
        return offset >= -1e-6 and abs(offset / self.step - round(offset / self.step)) < 1e-6


def decode_float8_array(data: bytes | memoryview) -> np.ndarray:
    """Postgres' binary float8[] (array_send of a 1-D array without NULLs) as a float64 numpy array."""
    buf = bytes(data)
    size = _array_size(buf)
    return np.frombuffer(buf, dtype=_ELEMENT, offset=_HEADER_BYTES, count=size)["value"].astype(np.float64)


def _array_size(buf: bytes) -> int:
    if len(buf) < _HEADER_BYTES:  # an empty array: a 12-byte header without dimensions
        return 0
    ndim, flags, oid, size, _ = _HEADER.unpack_from(buf, 0)
    if ndim != 1 or flags != 0 or oid != _FLOAT8_OID or len(buf) != _HEADER_BYTES + size * _ELEMENT.itemsize:
        raise ValueError("expected a 1-D float8 array without NULLs")
    return size


def _fetch(
    job: Job,
    *,
    per_gpu: bool,
    signals: Iterable[str] | None = None,
    stats: Iterable[str] | None = None,
    window: tuple[float, float] | None = None,
) -> list[Chunk]:
    """The job's aggregate (or per-GPU) chunks, optionally of some signals/stats and overlapping a window."""
    where = "job_id = %s AND " + ("stat = 'gpu'" if per_gpu else "stat <> 'gpu'")
    params: list[Any] = [job.pk]
    if signals is not None:
        where += " AND signal = ANY(%s)"
        params.append(list(signals))
    if stats is not None:
        where += " AND stat = ANY(%s)"
        params.append(list(stats))
    if window is not None:
        # Chunks start at an aligned time and end at their last sample: overlap test on both ends.
        where += ' AND start <= %s AND "end" >= %s'
        params += [utc(window[1]), utc(window[0])]
    table = connection.ops.quote_name(JobSeries._meta.db_table)
    sql = (
        f"SELECT id, signal, stat, gpu_key, step_seconds, extract(epoch from start), "
        f'extract(epoch from "end"), array_send(array_replace("values", NULL, \'NaN\'::float8)) '
        f"FROM {table} WHERE {where}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    chunks = []
    for pk, signal, stat, gpu_key, step, start, end, blob in rows:
        count = _array_size(blob)
        if count:
            first = float(end) - (count - 1) * step
            chunks.append(Chunk(pk, signal, stat, gpu_key, step, first, count, blob, float(start)))
    return chunks


def _one_step(chunks: list[Chunk]) -> tuple[int, list[Chunk]]:
    """The most common step and the chunks of that step: rows of another step would leave holes between
    their columns or pile several samples into one."""
    step = Counter(c.step for c in chunks).most_common(1)[0][0]
    return step, [c for c in chunks if c.step == step]


def _place(
    rows: int, cols: int, origin: float, step: float, chunks: list[Chunk], line_of: list[int]
) -> np.ndarray:
    """All chunks into a (lines x time) matrix on the grid origin + k*step, at once: one decode and one
    scatter (per-chunk numpy calls would cost more than the query on a 256-GPU week). Each sample goes to
    the point closing its window (`grid_columns`); two samples in one cell are averaged (`place_on_grid`'s
    rule), so the result never depends on the order rows were read in."""
    out = np.full((rows, cols), np.nan)
    if not chunks or cols == 0:
        return out
    counts = np.fromiter((c.count for c in chunks), dtype=np.int64, count=len(chunks))
    joined = b"".join(memoryview(c.blob)[_HEADER_BYTES:] for c in chunks)
    values = np.frombuffer(joined, dtype=_ELEMENT)["value"].astype(np.float64)
    begins = np.cumsum(counts) - counts
    position = np.arange(values.size, dtype=np.int64) - np.repeat(begins, counts)
    firsts = np.fromiter((c.first for c in chunks), dtype=np.float64, count=len(chunks))
    steps = np.fromiter((c.step for c in chunks), dtype=np.float64, count=len(chunks))
    times = np.repeat(firsts, counts) + np.repeat(steps, counts) * position
    odd = [c.pk for c in chunks if not c.plausible]
    if odd:  # some other writer: read those chunks' timestamps (one more query, only then)
        stored = dict(JobSeries.objects.filter(pk__in=odd).values_list("pk", "timestamps"))
        for i, c in enumerate(chunks):
            if c.pk in stored:
                times[begins[i] : begins[i] + counts[i]] = np.asarray(stored[c.pk], dtype=np.float64)[
                    : counts[i]
                ]
    col = grid_columns(times, origin, step)
    line = np.repeat(np.asarray(line_of, dtype=np.int64), counts)
    ok = (col >= 0) & (col < cols) & np.isfinite(values)
    cell = line[ok] * cols + col[ok]
    sums = np.bincount(cell, weights=values[ok], minlength=rows * cols)
    n = np.bincount(cell, minlength=rows * cols)
    np.divide(sums, n, out=out.reshape(-1), where=n > 0)
    return out


def _unit(signal: str) -> str:
    return SIGNALS[signal].unit if signal in SIGNALS else _UNITS.get(signal, "ratio")


def load_job_signals(
    job: Job,
    *,
    per_gpu: bool | Iterable[str] = True,
    signals: Iterable[str] | None = None,
    stats: Iterable[str] | None = None,
    window: tuple[float, float] | None = None,
) -> JobSignals | None:
    """The archived signals of a job as a JobSignals on one grid (None when nothing is archived).

    `per_gpu=False` skips the per-GPU rows, by far the bulk of a large job's archive; a list of signal keys
    loads per-GPU rows of those signals only (the evaluation after each poll needs GPU_UTIL per GPU for the
    exact idle share, nothing else). `signals`/`stats` limit what is read (a page draws the means of a few
    signals) and `window` (Unix seconds) the chunks to those overlapping a zoom. One query for the
    aggregates, one for the per-GPU rows.
    """
    wanted = None if signals is None else list(signals)
    agg = _fetch(job, per_gpu=False, signals=wanted, stats=stats, window=window)
    if not agg:
        return None
    step, agg = _one_step(agg)
    start = min(c.first for c in agg)
    end = max(c.last for c in agg)
    ts = grid(start, end, step)
    result = JobSignals(start, end, step, ts)
    lines = sorted({(c.signal, c.stat) for c in agg})
    line = {key: i for i, key in enumerate(lines)}
    matrix = _place(len(lines), ts.size, start, step, agg, [line[(c.signal, c.stat)] for c in agg])
    by_signal: dict[str, dict[str, np.ndarray]] = defaultdict(dict)
    for (signal, stat), i in line.items():
        by_signal[signal][stat] = matrix[i]
    for signal, stat_rows in by_signal.items():
        result.signals[signal] = SignalSeries(signal, _unit(signal), ts, stat_rows)
    if per_gpu is not False:
        names = set(by_signal) if per_gpu is True else set(by_signal) & set(per_gpu)
        if names:
            _attach_per_gpu(job, result, sorted(names), start, end, window)
    result.missing = dict(job.missing_reasons or {})
    return result


def _attach_per_gpu(
    job: Job,
    result: JobSignals,
    names: list[str],
    start: float,
    end: float,
    window: tuple[float, float] | None,
) -> None:
    chunks = _fetch(job, per_gpu=True, signals=names, window=window)
    grouped: dict[str, list[Chunk]] = defaultdict(list)
    for c in chunks:
        grouped[c.signal].append(c)
    chosen = {signal: _one_step(cs) for signal, cs in grouped.items()}
    gpu_last = max([end, *(c.last for _, cs in chosen.values() for c in cs)])
    for signal, (gstep, cs) in chosen.items():
        # The per-GPU grid lies on multiples of its step (as fetch_job_signals reads it) from the one
        # closing the window that holds the job's first aggregate point, through the point closing the
        # window of the last per-GPU sample: every archived row, whatever grid it was read on, maps one
        # sample to one column (`grid_columns`).
        g0 = lattice_point(start, gstep)
        gts = grid(g0, lattice_point(gpu_last, gstep), gstep)
        keys = sorted({c.gpu_key for c in cs}, key=_gpu_sort_key)
        position = {k: i for i, k in enumerate(keys)}
        series = result.signals[signal]
        series.per_gpu = _place(len(keys), gts.size, g0, gstep, cs, [position[c.gpu_key] for c in cs])
        series.gpus = tuple(_gpu_key(k) for k in keys)
        series.gpu_timestamps = gts


def load_per_gpu(job: Job, signal: str, window: tuple[float, float] | None = None) -> SignalSeries | None:
    """One signal per GPU as a (GPUs x time) matrix on its own grid (a heatmap), or None when not archived.
    One query."""
    chunks = _fetch(job, per_gpu=True, signals=[signal], window=window)
    if not chunks:
        return None
    step, chunks = _one_step(chunks)
    # Multiples of the step on the Unix clock, through the point closing the last sample's window: the
    # grid fetch_job_signals reads per-GPU rows on, so every sample keeps its own column.
    start = lattice_point(min(c.first for c in chunks), step)
    end = lattice_point(max(c.last for c in chunks), step)
    gts = grid(start, end, step)
    keys = sorted({c.gpu_key for c in chunks}, key=_gpu_sort_key)
    position = {k: i for i, k in enumerate(keys)}
    matrix = _place(len(keys), gts.size, start, step, chunks, [position[c.gpu_key] for c in chunks])
    series = SignalSeries(signal, _unit(signal) if signal in SIGNALS else "", gts, {})
    series.gpus = tuple(_gpu_key(k) for k in keys)
    series.gpu_timestamps, series.per_gpu = gts, matrix
    return series


def load_means(
    job: Job, signals: Iterable[str], window: tuple[float, float] | None = None
) -> JobSignals | None:
    """Cross-GPU means of `signals` on one time grid (what a page draws), or None when nothing is archived."""
    return load_job_signals(job, per_gpu=False, signals=signals, stats=["mean"], window=window)


def _gpu_key(key: str) -> GpuKey:
    return GpuKey(*key.rsplit("/", 1)) if "/" in key else GpuKey(key, "")


def _gpu_sort_key(key: str) -> tuple[str, int, str]:
    host, _, gpu = key.rpartition("/")
    return host, int(gpu) if gpu.isdigit() else -1, gpu
