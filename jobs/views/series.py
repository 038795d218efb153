"""Read just what a page draws from a job's archived series, fast.

jobs.metrics.ingest.load_job_signals reads every archived row of a job (all signals, all stats, every GPU);
for a
256-GPU week that is millions of numbers. Pages need the cross-GPU mean of the charted signals and the
per-GPU rows of one signal, optionally only inside a zoom window; this module reads exactly that, in one
query per kind, and returns the same jobs.metrics.signals types (NaN = missing sample).

Speed: Postgres turning float8[] into text and psycopg parsing it back costs more than everything else on
the page (a running 7-day, 256-GPU job has ~0.5 M per-GPU samples). So the values travel in Postgres'
binary array format (`array_send`, NULL replaced by NaN so every element has the same width) and are read
with one numpy call; timestamps are not read at all: ingestion writes each chunk as a contiguous run of
its step ending at `end`, so the times follow from `end` and the count (a chunk that does not fit its
aligned `start` has its timestamps read after all).
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
from django.db import connection

from jobs.metrics.sampling import grid_columns, lattice_point
from jobs.metrics.signals import SIGNALS, GpuKey, JobSignals, SignalSeries, grid
from jobs.models import Job, JobSeries

_UNITS = {"tokens_per_second": "tokens/s", "mfu": "ratio"}
_FLOAT8_OID = 701
_HEADER = struct.Struct(">iiiii")  # ndim, has-nulls flag, element type oid, size, lower bound
_HEADER_BYTES = _HEADER.size
_ELEMENT = np.dtype([("length", ">i4"), ("value", ">f8")])


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


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
    job: Job, key_column: str, signals: list[str], stat: str, window: tuple[float, float] | None
) -> list[Chunk]:
    """The chunks of one job and stat for some signals, optionally only those overlapping a window."""
    where = "job_id = %s AND signal = ANY(%s) AND stat = %s"
    params: list[Any] = [job.pk, signals, stat]
    if window is not None:
        # Chunks start at an aligned time and end at their last sample: overlap test on both ends.
        where += ' AND start <= %s AND "end" >= %s'
        params += [_utc(window[1]), _utc(window[0])]
    table = connection.ops.quote_name(JobSeries._meta.db_table)
    # Timestamps are not read (decompressing them costs as much as the values): ingestion writes each
    # chunk as a contiguous run of its step ending at `end`, so times follow from `end` and the count.
    sql = (
        f'SELECT id, {key_column}, step_seconds, extract(epoch from start), extract(epoch from "end"), '
        f"array_send(array_replace(\"values\", NULL, 'NaN'::float8)) FROM {table} WHERE {where}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    chunks = []
    for pk, key, step, start, end, blob in rows:
        count = _array_size(blob)
        if count:
            first = float(end) - (count - 1) * step
            chunks.append(Chunk(pk, key, step, first, count, blob, float(start)))
    return chunks


@dataclass(frozen=True, slots=True)
class Chunk:
    """One archived row as read here: its key (signal or GPU), step, first sample time, sample count and
    the binary values."""

    pk: int
    key: str
    step: int
    first: float
    count: int
    blob: bytes
    aligned_start: float

    @property
    def plausible(self) -> bool:
        """Whether the derived first time fits the chunk's aligned start (else its timestamps are read)."""
        offset = self.first - self.aligned_start
        return offset >= -1e-6 and abs(offset / self.step - round(offset / self.step)) < 1e-6


def _odd_times(chunks: list[Chunk]) -> dict[int, np.ndarray]:
    """Full timestamps of chunks whose layout is not the contiguous one (some other writer): one more query,
    only then."""
    odd = [c.pk for c in chunks if not c.plausible]
    if not odd:
        return {}
    rows = JobSeries.objects.filter(pk__in=odd).values_list("pk", "timestamps")
    return {pk: np.asarray(ts, dtype=np.float64) for pk, ts in rows}


def _place_all(
    target: np.ndarray, start: float, step: float, chunks: list[Chunk], line_of: list[int]
) -> None:
    """Write every chunk into `target` (lines x time) at once: one numpy decode for all chunks and one
    scatter; per-chunk numpy calls would cost more than the query on a 256-GPU week."""
    counts = np.fromiter((c.count for c in chunks), dtype=np.int64, count=len(chunks))
    joined = b"".join(memoryview(c.blob)[_HEADER_BYTES:] for c in chunks)
    values = np.frombuffer(joined, dtype=_ELEMENT)["value"].astype(np.float64)
    begins = np.cumsum(counts) - counts
    position = np.arange(values.size, dtype=np.int64) - np.repeat(begins, counts)
    firsts = np.fromiter((c.first for c in chunks), dtype=np.float64, count=len(chunks))
    steps = np.fromiter((c.step for c in chunks), dtype=np.float64, count=len(chunks))
    times = np.repeat(firsts, counts) + np.repeat(steps, counts) * position
    for i, times_of_chunk in _odd_positions(chunks, _odd_times(chunks)):
        times[begins[i] : begins[i] + counts[i]] = times_of_chunk[: counts[i]]
    # The point closing each sample's window, as everywhere (`jobs.metrics.sampling.grid_columns`):
    # rounding put
    # two samples of a half-step-offset row into one column and left the next one empty.
    col = grid_columns(times, start, step)
    line = np.repeat(np.asarray(line_of, dtype=np.int64), counts)
    ok = (col >= 0) & (col < target.shape[1]) & np.isfinite(values)
    target[line[ok], col[ok]] = values[ok]


def _odd_positions(chunks: list[Chunk], odd: dict[int, np.ndarray]) -> list[tuple[int, np.ndarray]]:
    return [(i, odd[c.pk]) for i, c in enumerate(chunks) if c.pk in odd]


def load_means(
    job: Job, signals: Iterable[str], window: tuple[float, float] | None = None
) -> JobSignals | None:
    """Cross-GPU means of `signals` on one time grid (the most common archive step), or None when nothing
    is archived. One query (two if a chunk is not contiguous)."""
    chunks = _fetch(job, "signal", list(signals), "mean", window)
    if not chunks:
        return None
    step = Counter(c.step for c in chunks).most_common(1)[0][0]
    chunks = [c for c in chunks if c.step == step]
    start = min(c.first for c in chunks)
    end = max(c.first + (c.count - 1) * step for c in chunks)
    ts = grid(start, end, step)
    result = JobSignals(start, end, step, ts)
    names = sorted({c.key for c in chunks})
    line = {name: i for i, name in enumerate(names)}
    matrix = np.full((len(names), ts.size), np.nan)
    _place_all(matrix, start, step, chunks, [line[c.key] for c in chunks])
    for name in names:
        unit = SIGNALS[name].unit if name in SIGNALS else _UNITS.get(name, "")
        result.signals[name] = SignalSeries(name, unit, ts, {"mean": matrix[line[name]]})
    return result


def load_per_gpu(job: Job, signal: str, window: tuple[float, float] | None = None) -> SignalSeries | None:
    """One signal per GPU as a (GPUs x time) matrix on its own grid, or None when not archived. One query."""
    chunks = _fetch(job, "gpu_key", [signal], "gpu", window)
    if not chunks:
        return None
    step = Counter(c.step for c in chunks).most_common(1)[0][0]
    chunks = [c for c in chunks if c.step == step]
    # Multiples of the step on the Unix clock, through the point closing the last sample's window: the
    # grid jobs.metrics.signals.fetch_job_signals reads per-GPU rows on, so every sample keeps its own column.
    start = lattice_point(min(c.first for c in chunks), step)
    end = lattice_point(max(c.first + (c.count - 1) * step for c in chunks), step)
    gts = grid(start, end, step)
    keys = sorted({c.key for c in chunks}, key=_gpu_sort_key)
    position = {k: i for i, k in enumerate(keys)}
    matrix = np.full((len(keys), gts.size), np.nan)
    _place_all(matrix, start, step, chunks, [position[c.key] for c in chunks])
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
