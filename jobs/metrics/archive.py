"""The archive of a job's series in Postgres: compact float32 chunks, merged on write, read as JobSignals.

Layout (jobs.models.JobSeries): one row per (job, signal, stat, GPU, step, chunk). A chunk of step s
starts at C, a multiple of CHUNK_POINTS x s on the Unix clock, and holds the grid points C + s, ...,
C + CHUNK_POINTS x s: a point p stands for the window (p - s, p] (jobs.metrics.sampling), so a chunk owns
the windows (C, C + CHUNK_POINTS x s]. Values are little-endian float32 (no per-value timestamps: they
were 59 % of the old rows), NaN for a gap, trailing gaps trimmed. float32 keeps ~7 significant digits:
far finer than any DCGM reading (percentages, W, MHz, bytes/s rates).

Writes merge (`upsert`): a window's points go into the existing chunk at their offsets, the window need not
be chunk-aligned, points outside it are kept and a NaN never overwrites a value, so a poll can write only
its new window and finalize can add to what polling archived without deleting what Prometheus no longer
holds. Rows travel by COPY into a temporary staging table plus one INSERT ... ON CONFLICT DO UPDATE; the
merge itself is numpy on the chunks it touches, under a per-job advisory lock.

Tiers: every write also refreshes downsampled copies of the windows it touched (AGG_TIERS for the cross-GPU
stats, GPU_TIERS for per-GPU rows), each from the next finer level. Pages read the coarsest level that still
gives their pixel budget (`max_points`), so a page's work does not grow with the job's GPU-hours; per-GPU
rows finer than the first GPU tier are dropped after ARCHIVE_RAW_RETENTION_DAYS (`prune_raw`) while the
tiers stay forever.

Size (benchmarks/pages.py, a running 256-GPU x 7-day job: 30 s cross-GPU stats of the charted signals,
300 s per-GPU rows of two signals; pg_column_size of the stored rows per GPU-hour): the polled rows take
924 B in the old layout (float8[] timestamps + float8[] values, measured on equivalent rows) and 247 B
compact; the tiers add 26 B (cross-GPU, with the extremes) + 44 B (per GPU); after the retention the
per-GPU polled rows (118 B) go, so ~199 B per GPU-hour stay forever.

One reader for everyone (ingestion, the evaluation, the diagnosis, the pages): `load_job_signals` (the
cross-GPU stats on one grid, optionally per-GPU rows and a zoom window) and `load_per_gpu` (one signal's
per-GPU matrix for a heatmap) share one fetch and one placement; values are decoded with one numpy call.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from django.db import connection, transaction

from jobs.downsample import MEAN_HIGH, MEAN_LOW
from jobs.evaluation.schema import DERIVED_MFU, DERIVED_THROUGHPUT
from jobs.metrics.sampling import grid_columns, lattice_point
from jobs.metrics.signals import COUNT, MAX, MIN, SAMPLED, SIGNALS, GpuKey, JobSignals, SignalSeries, grid
from jobs.models import Job, JobSeries

CHUNK_POINTS = 240  # points per archived row: 2 h at the 30 s poll step
THROUGHPUT = DERIVED_THROUGHPUT
MFU = DERIVED_MFU
_UNITS = {THROUGHPUT: "tokens/s", MFU: "ratio"}
_F4 = np.dtype("<f4")
_EPS = 1e-6  # in steps: float noise of millisecond timestamps
GPU_STAT = "gpu"
#: Lowest and highest cross-GPU mean inside each window of a downsampled level (jobs.downsample): a chart
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
    """The lines of `sigs` (cross-GPU stats, per-GPU rows) and of `extra` (derived means) to `upsert`."""
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
            gstep = round(series.gpu_timestamps[1] - series.gpu_timestamps[0])
            for gpu, row in zip(series.gpus, series.per_gpu, strict=True):
                rows += _line(job, key, GPU_STAT, str(gpu), gstep, series.gpu_timestamps, row)
    for name, values in extra.items():
        rows += _line(job, name, "mean", "", step, sigs.timestamps, values)
    return rows


def derived_rows(job: Job, sigs: JobSignals, derived: dict[str, np.ndarray]) -> list[Points]:
    """Rows of the evaluation's derived series (throughput, MFU) on the grid of `sigs`, not its signals."""
    return rows_for(job, JobSignals(sigs.start, sigs.end, sigs.step, sigs.timestamps), derived)


# ---------------------------------------------------------------------------------------------- writing

_Key = tuple[int, str, str, str, int, int]  # job, signal, stat, GPU, step, chunk start (Unix s)


#: Lines `_chunked` places per numpy pass: bounds its (chunks x CHUNK_POINTS) matrices on a 4k-GPU cycle.
_CHUNK_BATCH = 2048


def _chunked(rows: Iterable[Points]) -> tuple[dict[_Key, np.ndarray], dict[_Key, np.ndarray]]:
    """New chunk values (float32, CHUNK_POINTS long, NaN where the write has nothing) and, per chunk, the
    mask of points the write brings. A sample goes to the grid point closing its window; two samples of
    one point are averaged (`place_on_grid`'s rule). Lines are placed a batch at a time with one bincount
    (per-line numpy calls dominated a cycle's merge), in order, so a later line still wins."""
    out: dict[_Key, np.ndarray] = {}
    written: dict[_Key, np.ndarray] = {}
    listed = list(rows)
    for b in range(0, len(listed), _CHUNK_BATCH):
        _chunk_batch(listed[b : b + _CHUNK_BATCH], out, written)
    return out, written


def _chunk_batch(rows: list[Points], out: dict[_Key, np.ndarray], written: dict[_Key, np.ndarray]) -> None:
    sizes = np.fromiter((r.values.size for r in rows), dtype=np.int64, count=len(rows))
    if not sizes.sum():
        return
    values = np.concatenate([r.values for r in rows])
    times = np.concatenate([r.times for r in rows])
    steps = np.repeat(np.fromiter((r.step for r in rows), dtype=np.float64, count=len(rows)), sizes)
    line = np.repeat(np.arange(len(rows), dtype=np.int64), sizes)
    ok = np.isfinite(values)
    if not ok.any():
        return
    k = np.ceil(times[ok] / steps[ok] - _EPS).astype(np.int64)
    v, line = values[ok], line[ok]
    chunk = (k - 1) // CHUNK_POINTS
    c0 = int(chunk.min())
    # One id per (line, chunk), sorted by line then chunk: the order the per-line pass visited them in.
    ids, inverse = np.unique(line * 2**32 + (chunk - c0), return_inverse=True)
    size = ids.size * CHUNK_POINTS
    cell = inverse.reshape(-1) * CHUNK_POINTS + (k - 1) % CHUNK_POINTS
    sums = np.bincount(cell, weights=v, minlength=size)
    counts = np.bincount(cell, minlength=size)
    flat = np.full(size, np.nan)
    np.divide(sums, counts, out=flat, where=counts > 0)
    means = flat.reshape(-1, CHUNK_POINTS).astype(_F4)
    has = counts.reshape(-1, CHUNK_POINTS) > 0
    for j, (li, ci) in enumerate(zip((ids >> 32).tolist(), ((ids & (2**32 - 1)) + c0).tolist(), strict=True)):
        r = rows[li]
        key = (r.job_id, r.signal, r.stat, r.gpu_key, r.step, ci * CHUNK_POINTS * r.step)
        arr = means[j]
        if key in out:  # the same line twice in one write: the later values win where they exist
            arr = np.where(has[j], arr, out[key])
            written[key] = written[key] | has[j]
        else:
            written[key] = has[j]
        out[key] = arr


def decode(blob: bytes | memoryview) -> np.ndarray:
    """A chunk's stored values (little-endian float32 bytes) as float64, NaN for gaps."""
    return np.frombuffer(blob, dtype=_F4).astype(np.float64)


def _existing(keys: list[_Key]) -> dict[_Key, np.ndarray]:
    """The stored values of the chunks `keys` name (one query), padded to CHUNK_POINTS."""
    if not keys:
        return {}
    table = connection.ops.quote_name(JobSeries._meta.db_table)
    # Each key's columns as = ANY lists, which the (job, signal, stat, start) index answers; the few
    # rows of other combinations this also returns are dropped below.
    jobs, signals, stats, _, steps, starts = (sorted(set(c)) for c in zip(*keys, strict=True))
    sql = (
        f'SELECT job_id, signal, stat, gpu_key, step_seconds, extract(epoch from start)::bigint, "values" '
        f"FROM {table} WHERE job_id = ANY(%s) AND signal = ANY(%s) AND stat = ANY(%s) "
        f"AND step_seconds = ANY(%s) AND start = ANY(%s)"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [jobs, signals, stats, steps, [utc(t) for t in starts]])
        found = cursor.fetchall()
    wanted = set(keys)
    hits: list[_Key] = []
    blobs: list[bytes] = []
    for job_id, signal, stat, gpu_key, step, start, blob in found:
        key = (job_id, signal, stat, gpu_key, step, int(start))
        if key in wanted:
            hits.append(key)
            blobs.append(bytes(blob)[: CHUNK_POINTS * _F4.itemsize])
    if not hits:
        return {}
    # All chunks padded with NaN into one matrix at once (per-chunk numpy calls cost more on a cycle).
    counts = np.fromiter((len(b) // _F4.itemsize for b in blobs), dtype=np.int64, count=len(blobs))
    flat = np.frombuffer(b"".join(blobs), dtype=_F4)
    matrix = np.full((len(hits), CHUNK_POINTS), np.nan, dtype=_F4)
    begins = np.cumsum(counts) - counts
    matrix[np.repeat(np.arange(len(hits)), counts), np.arange(flat.size) - np.repeat(begins, counts)] = flat
    return dict(zip(hits, matrix, strict=True))


_STAGE = "archive_stage_text"  # (a new name: a connection may still hold the old layout)
_COLUMNS = 'job_id, signal, stat, gpu_key, step_seconds, start, "end", "values"'


def _store(chunks: dict[_Key, np.ndarray]) -> int:
    """COPY the merged chunks into a staging table and upsert them with one statement; returns rows."""
    rows: list[str] = []
    if chunks:
        # All chunks at once (each is CHUNK_POINTS long): gaps as NaN, trailing gaps trimmed.
        matrix = np.stack(list(chunks.values())).astype(_F4)
        finite = np.isfinite(matrix)
        filled: list[bool] = np.asarray(finite.any(axis=1), dtype=bool).tolist()
        ends = (matrix.shape[1] - np.argmax(finite[:, ::-1], axis=1)).tolist()
        data = np.where(finite, matrix, np.float32("nan")).astype(_F4)
        for i, (job_id, signal, stat, gpu_key, step, start) in enumerate(chunks):
            if not filled[i]:
                continue
            end = ends[i]
            # COPY's text format, built here in one pass (psycopg's write_row per row cost ~17 us a row,
            # seconds on a per-GPU cycle): times as Unix seconds (whole seconds: chunk starts lie on the
            # clock), the values as bytea hex (its backslash escaped for COPY).
            rows.append(
                f"{job_id}\t{_copy_text(signal)}\t{_copy_text(stat)}\t{_copy_text(gpu_key)}\t{step}\t"
                f"{start}\t{start + end * step}\t\\\\x{data[i, :end].tobytes().hex()}\n"
            )
    if not rows:
        return 0
    table = connection.ops.quote_name(JobSeries._meta.db_table)
    with connection.cursor() as cursor:
        # ON COMMIT DELETE ROWS: the table stays per connection, its rows never outlive the transaction.
        cursor.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {_STAGE} (job_id bigint, signal text, stat text, gpu_key text, "
            f'step_seconds int, start_s float8, end_s float8, "values" bytea) ON COMMIT DELETE ROWS'
        )
        cursor.execute(f"TRUNCATE {_STAGE}")
        with cursor.cursor.copy(f"COPY {_STAGE} FROM STDIN") as copy:
            for b in range(0, len(rows), _COPY_BATCH):
                copy.write("".join(rows[b : b + _COPY_BATCH]))
        cursor.execute(
            f"INSERT INTO {table} ({_COLUMNS}) SELECT job_id, signal, stat, gpu_key, step_seconds, "
            f'to_timestamp(start_s), to_timestamp(end_s), "values" FROM {_STAGE} '
            f"ON CONFLICT (job_id, signal, stat, gpu_key, step_seconds, start) "
            f'DO UPDATE SET "end" = EXCLUDED."end", "values" = EXCLUDED."values"'
        )
    return len(rows)


_COPY_BATCH = 10_000  # rows per write to the COPY stream


def _copy_text(value: str) -> str:
    """A text column in COPY's text format: backslash, tab, newline and carriage return escaped."""
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        value = value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return value


def _reduce(stat: str, values: np.ndarray, starts: np.ndarray, ratio: float) -> np.ndarray:
    """One coarse value per group of fine values (groups begin at `starts`; NaN = no sample) with the
    stat's own rule, so a coarse level answers the question its stat asks: min of minima, max of maxima,
    the most GPUs reporting; `sampled` (GPUs' worth of the window covered) is the sum over the fine
    windows divided by how many fit in a coarse one (a missing fine window covers nothing), which keeps
    `coverage_from_stats` exact; means (cross-GPU means, per-GPU values, derived series) average the fine
    windows that have a value, as `avg_over_time` over the coarse window would. NaN where a group has
    no value. Along the last axis: a matrix reduces each row alike."""
    finite = np.isfinite(values)
    n = np.add.reduceat(finite.astype(np.int64), starts, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        if stat in (MIN, MEAN_LOW):
            out = np.fmin.reduceat(values, starts, axis=-1)
        elif stat in (MAX, COUNT, MEAN_HIGH):
            out = np.fmax.reduceat(values, starts, axis=-1)
        else:
            total = np.add.reduceat(np.where(finite, values, 0.0), starts, axis=-1)
            out = total / ratio if stat == SAMPLED else total / np.maximum(n, 1)
    return np.where(n > 0, out, np.nan)


def _tier_above(stat: str, step: int) -> int | None:
    """The next downsampled level above `step` for this stat, when its windows tile a chunk of `step`."""
    ladder = GPU_TIERS if stat == GPU_STAT else AGG_TIERS
    coarse = next((t for t in ladder if t > step), None)
    if coarse is None or (CHUNK_POINTS * step) % coarse:
        return None
    return coarse


def _coarser(merged: dict[_Key, np.ndarray], written: dict[_Key, np.ndarray]) -> list[Points]:
    """The next tier's values for the coarse windows a write touched, from the merged fine chunks. Each
    coarse window (P - T, P] lies inside one fine chunk (`_tier_above`), so it is computed whole.

    A chunk starts on a multiple of CHUNK_POINTS x step, which the coarse step divides, so every chunk of
    one (stat, step) splits into coarse windows at the same offsets: those chunks are reduced as one
    (chunks x CHUNK_POINTS) matrix, a few numpy calls per (stat, step) rather than per chunk (the cycle
    writes thousands)."""
    groups: dict[tuple[str, int], list[_Key]] = defaultdict(list)
    for key in merged:
        groups[(key[2], key[4])].append(key)
    out: list[Points] = []
    for (stat, step), keys in groups.items():
        coarse = _tier_above(stat, step)
        if coarse is None:
            continue
        mask = np.stack([written[k] for k in keys])
        live = np.asarray(mask.any(axis=1), dtype=bool)
        if not live.any():
            continue
        keys = [k for k, ok in zip(keys, live.tolist(), strict=True) if ok]
        mask = mask[live]
        fine = np.stack([merged[k] for k in keys]).astype(np.float64)
        # The coarse point closing each fine window, counted from the chunk's start (a multiple of coarse).
        times = step * np.arange(1, CHUNK_POINTS + 1, dtype=np.float64)
        local = np.ceil(times / coarse - _EPS).astype(np.int64)
        starts = np.flatnonzero(np.r_[True, local[1:] != local[:-1]])
        touched = np.logical_or.reduceat(mask, starts, axis=1)
        ratio = coarse / step
        reduced = {stat: _reduce(stat, fine, starts, ratio)}
        if stat == "mean" and step not in AGG_TIERS:  # the polled (or finalized) means: start the extremes
            for extreme in EXTREMES:
                reduced[extreme] = _reduce(extreme, fine, starts, ratio)
        offsets = (local[starts] * coarse).astype(np.float64)
        for i, (job_id, signal, _, gpu_key, _, start) in enumerate(keys):
            hit = touched[i]
            points = start + offsets[hit]
            for name, values in reduced.items():
                out.append(Points(job_id, signal, name, gpu_key, coarse, points, values[i][hit]))
    return out


def upsert(rows: Sequence[Points]) -> int:
    """Merge `rows` into the archive and refresh the downsampled tiers of the windows they touch.

    Each point goes into its chunk at its offset; the chunk's other points are kept and a NaN (no sample)
    never overwrites a stored value, so overlapping, repeated, partial or out-of-order writes of any
    window converge to the union of what was read. Idempotent. Returns the rows written (all levels).
    """
    rows = [r for r in rows if r.times.size]
    if not rows:
        return 0
    written = 0
    with transaction.atomic():
        # Two writers of one job (a poll and a finalize, two workers) must not merge the same chunk from the
        # same old value: one waits for the other's commit.
        lock_jobs(sorted({r.job_id for r in rows}))
        level: list[Points] = list(rows)
        while level:
            new, mask = _chunked(level)
            old = _existing(list(new))
            merged, changed = _merge_all(new, old)
            # A chunk the write leaves as it was (a repeated window, a tier whose windows' min/max/count did
            # not move) is not rewritten: an UPDATE of an equal row still costs a new row version and WAL.
            written += _store({k: merged[k] for k in changed})
            level = _coarser(merged, mask)
    return written


def cursor_lock(job_id: int) -> None:
    """Take the job's archive lock for the rest of the transaction (pg_advisory_xact_lock)."""
    lock_jobs([job_id])


def lock_jobs(job_ids: Sequence[int]) -> None:
    """Take the archive locks of `job_ids` for the rest of the transaction, in ascending order (so two
    writers of overlapping sets cannot deadlock), with one statement: a cycle writes hundreds of jobs."""
    keys = sorted({job_id % 2**31 for job_id in job_ids})
    if not keys:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_advisory_xact_lock(%s, k)) "
            "FROM (SELECT unnest(%s::int[]) AS k ORDER BY 1) AS ks",
            [_LOCK_CLASS, keys],
        )


_LOCK_CLASS = zlib.crc32(b"jobs.archive") % 2**31


def prune_raw(now: datetime, retention_days: int) -> int:
    """Delete per-GPU chunks finer than the first GPU tier whose last value is older than the retention,
    where that tier holds the same GPU's window (so a downsampled copy always stays). Returns rows deleted.
    """
    table = connection.ops.quote_name(JobSeries._meta.db_table)
    tier = GPU_TIERS[0]
    cutoff = now - timedelta(days=retention_days)
    sql = (
        f'DELETE FROM {table} s WHERE s.stat = %s AND s.step_seconds < %s AND s."end" < %s AND EXISTS ('
        f"SELECT 1 FROM {table} t WHERE t.job_id = s.job_id AND t.signal = s.signal AND t.stat = s.stat "
        f"AND t.gpu_key = s.gpu_key AND t.step_seconds = %s AND t.start <= s.start "
        f'AND t.start + make_interval(secs => %s) >= s."end")'
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [GPU_STAT, tier, cutoff, tier, float(CHUNK_POINTS * tier)])
        return int(cursor.rowcount)


# ---------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class Chunk:
    """One archived row as read: its keys, step, first grid point, value count and stored values."""

    signal: str
    stat: str
    gpu_key: str
    step: int
    first: float
    count: int
    blob: bytes

    @property
    def last(self) -> float:
        """Time of the chunk's last value."""
        return self.first + (self.count - 1) * self.step


def _fetch(
    job: Job,
    *,
    per_gpu: bool,
    signals: Iterable[str] | None = None,
    stats: Iterable[str] | None = None,
    window: tuple[float, float] | None = None,
    steps: tuple[float, float | None] | None = None,
) -> list[Chunk]:
    """The job's aggregate (or per-GPU) chunks, optionally of some signals/stats, overlapping a window and
    with a step in [steps[0], steps[1]] (an open upper end when None)."""
    where = "job_id = %s AND " + ("stat = 'gpu'" if per_gpu else "stat <> 'gpu'")
    params: list[Any] = [job.pk]
    if signals is not None:
        where += " AND signal = ANY(%s)"
        params.append(list(signals))
    if stats is not None:
        where += " AND stat = ANY(%s)"
        params.append(list(stats))
    else:
        where += " AND stat <> ALL(%s)"
        params.append(list(EXTREMES))
    if window is not None:
        # A chunk owns (start, end]: overlap test on both ends.
        where += ' AND start < %s AND "end" >= %s'
        params += [utc(window[1]), utc(window[0])]
    if steps is not None:
        where += " AND step_seconds >= %s"
        params.append(steps[0])
        if steps[1] is not None:
            where += " AND step_seconds <= %s"
            params.append(steps[1])
    table = connection.ops.quote_name(JobSeries._meta.db_table)
    sql = (
        f'SELECT signal, stat, gpu_key, step_seconds, extract(epoch from start), "values" '
        f"FROM {table} WHERE {where}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    chunks = []
    for signal, stat, gpu_key, step, start, blob in rows:
        data = bytes(blob)
        count = len(data) // _F4.itemsize
        if count:
            chunks.append(Chunk(signal, stat, gpu_key, step, float(start) + step, count, data))
    return chunks


def _decoded(chunks: list[Chunk]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All chunks' values and times at once (one join, one decode) and each chunk's value count."""
    counts = np.fromiter((c.count for c in chunks), dtype=np.int64, count=len(chunks))
    values = decode(b"".join(c.blob for c in chunks))
    begins = np.cumsum(counts) - counts
    position = np.arange(values.size, dtype=np.int64) - np.repeat(begins, counts)
    firsts = np.fromiter((c.first for c in chunks), dtype=np.float64, count=len(chunks))
    steps = np.fromiter((c.step for c in chunks), dtype=np.float64, count=len(chunks))
    times = np.repeat(firsts, counts) + np.repeat(steps, counts) * position
    return values, times, counts


#: A finer level is read when it has values in at least this share of the windows (of the coarsest level
#: present) that the best-covering level has: the polled rows hold the job's full resolution, but where
#: polling missed a stretch that finalize (at its own, coarser step) filled, or where per-GPU rows past
#: their retention are gone, the complete level wins.
_COVERAGE_SLACK = 0.95


def _one_step(chunks: list[Chunk], window: tuple[float, float] | None = None) -> tuple[int, list[Chunk]]:
    """The step to read and its chunks: the finest step with values in (almost) as many windows of the
    coarsest step (within `window`) as the best-covering one. Rows of several steps would leave holes
    between their columns or pile several samples into one."""
    by_step: dict[int, list[Chunk]] = defaultdict(list)
    for c in chunks:
        by_step[c.step].append(c)
    if len(by_step) == 1:
        step = next(iter(by_step))
        return step, by_step[step]
    coarsest = max(by_step)
    covered = {}
    for step, cs in by_step.items():
        values, times, _ = _decoded(cs)
        ok = np.isfinite(values)
        if window is not None:
            ok &= (times > window[0]) & (times - step < window[1])
        covered[step] = np.unique(np.ceil(times[ok] / coarsest - _EPS)).size
    best = max(covered.values())
    step = min(s for s, c in covered.items() if c >= _COVERAGE_SLACK * best)
    return step, by_step[step]


def _first(chunks: list[Chunk]) -> float:
    """Time of the earliest value (a chunk starts on the clock, its leading points may be gaps)."""
    values, times, _ = _decoded(chunks)
    finite = np.isfinite(values)
    return float(times[finite].min()) if finite.any() else min(c.first for c in chunks)


def _place(
    rows: int, cols: int, origin: float, step: float, chunks: list[Chunk], line_of: list[int]
) -> np.ndarray:
    """All chunks into a (lines x time) matrix on the grid origin + k*step, at once: one decode and one
    scatter (per-chunk numpy calls would cost more than the query on a 256-GPU week). Each value goes to
    the point closing its window (`grid_columns`); two values in one cell are averaged (`place_on_grid`'s
    rule), so the result never depends on the order rows were read in."""
    out = np.full((rows, cols), np.nan)
    if not chunks or cols == 0:
        return out
    values, times, counts = _decoded(chunks)
    col = grid_columns(times, origin, step)
    line = np.repeat(np.asarray(line_of, dtype=np.int64), counts)
    ok = (col >= 0) & (col < cols) & np.isfinite(values)
    cell = line[ok] * cols + col[ok]
    sums = np.bincount(cell, weights=values[ok], minlength=rows * cols)
    n = np.bincount(cell, minlength=rows * cols)
    np.divide(sums, n, out=out.reshape(-1), where=n > 0)
    return out


def _only_coarser(chunks: list[Chunk], step: int, have: set[tuple[str, str]]) -> list[Chunk]:
    """Chunks of the lines that have nothing at `step` but are archived coarser (the derived series of a
    long running job are evaluated on its tier), each line at its finest such step."""
    best: dict[tuple[str, str], int] = {}
    for c in chunks:
        key = (c.signal, c.stat)
        if key not in have and c.step > step and c.step < best.get(key, 2**31):
            best[key] = c.step
    return [c for c in chunks if best.get((c.signal, c.stat)) == c.step]


def _spread(
    rows: int, cols: int, origin: float, step: float, chunks: list[Chunk], line_of: list[int]
) -> np.ndarray:
    """Coarse values onto a finer grid: each coarse point p of step S stands for the window (p - S, p], so
    every fine point inside that window shows it (a step line at the coarse resolution, not a value per
    fine window that was never measured at that resolution)."""
    out = np.full((rows, cols), np.nan)
    if not chunks or cols == 0:
        return out
    values, times, counts = _decoded(chunks)
    wide = np.repeat(np.fromiter((c.step for c in chunks), dtype=np.float64, count=len(chunks)), counts)
    line = np.repeat(np.asarray(line_of, dtype=np.int64), counts)
    ok = np.isfinite(values)
    values, times, wide, line = values[ok], times[ok], wide[ok], line[ok]
    lo = np.ceil((times - wide - origin) / step + _EPS).astype(np.int64)  # first fine point after p - S
    hi = np.floor((times - origin) / step + _EPS).astype(np.int64)  # last fine point at or before p
    n = np.maximum(hi - lo + 1, 0)
    col = np.repeat(lo, n) + (np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n))
    keep = (col >= 0) & (col < cols)
    out[np.repeat(line, n)[keep], col[keep]] = np.repeat(values, n)[keep]
    return out


def _level(
    ladder: tuple[int, ...], span_s: float, max_points: int | None
) -> tuple[float, float | None] | None:
    """Steps to read for a span drawn with at most `max_points` points: from the finest step that fits
    up to the first tier that fits (a finalized job's own step may lie between), or everything (None)
    when no budget is given."""
    if max_points is None or not span_s > 0:
        return None
    finest = span_s / max_points
    tier = next((t for t in ladder if t >= finest), None)
    return finest, tier


def _unit(signal: str) -> str:
    return SIGNALS[signal].unit if signal in SIGNALS else _UNITS.get(signal, "ratio")


def _span_s(job: Job, window: tuple[float, float] | None) -> float:
    """Seconds a read covers: the zoom window, else the job from its start to its end or latest data."""
    if window is not None:
        return window[1] - window[0]
    last = job.ended_at or job.data_until or job.last_polled_at
    return (last - job.started_at).total_seconds() if last is not None else 0.0


def _fetch_level(
    job: Job,
    ladder: tuple[int, ...],
    max_points: int | None,
    *,
    per_gpu: bool,
    signals: Iterable[str] | None = None,
    stats: Iterable[str] | None = None,
    window: tuple[float, float] | None = None,
) -> list[Chunk]:
    """`_fetch` limited to the level a budget of `max_points` needs; everything when the archive has no
    such level yet (rows written before the tiers existed) or no budget is given."""
    wanted = None if signals is None else list(signals)
    steps = _level(ladder, _span_s(job, window), max_points)
    chunks = _fetch(job, per_gpu=per_gpu, signals=wanted, stats=stats, window=window, steps=steps)
    if not chunks and steps is not None:
        chunks = _fetch(job, per_gpu=per_gpu, signals=wanted, stats=stats, window=window)
    return chunks


def load_job_signals(
    job: Job,
    *,
    per_gpu: bool | Iterable[str] = True,
    signals: Iterable[str] | None = None,
    stats: Iterable[str] | None = None,
    window: tuple[float, float] | None = None,
    max_points: int | None = None,
    max_gpu_points: int | None = None,
) -> JobSignals | None:
    """The archived signals of a job as a JobSignals on one grid (None when nothing is archived).

    `per_gpu=False` skips the per-GPU rows, by far the bulk of a large job's archive; a list of signal keys
    loads per-GPU rows of those signals only (the evaluation after each poll needs GPU_UTIL per GPU for the
    exact idle share, nothing else). `signals`/`stats` limit what is read (a page draws the means of a few
    signals) and `window` (Unix seconds) the chunks to those overlapping a zoom. `max_points` /
    `max_gpu_points` read the coarsest archived level that still gives that many points over the window
    (the downsampled tiers): the cost then depends on the budget, not on the job's length. One query for
    the aggregates, one for the per-GPU rows (two when a level is not archived yet).
    """
    agg = _fetch_level(job, AGG_TIERS, max_points, per_gpu=False, signals=signals, stats=stats, window=window)

    def gpu_chunks(names: list[str]) -> list[Chunk]:
        return _fetch_level(job, GPU_TIERS, max_gpu_points, per_gpu=True, signals=names, window=window)

    return _assemble(job, agg, per_gpu, window, gpu_chunks)


def _assemble(
    job: Job,
    agg: list[Chunk],
    per_gpu: bool | Iterable[str],
    window: tuple[float, float] | None,
    gpu_chunks: Callable[[list[str]], list[Chunk]],
) -> JobSignals | None:
    """`load_job_signals`' result from the chunks read: the cross-GPU ones, and `gpu_chunks(names)` giving
    the per-GPU chunks of those signals (read only when asked for)."""
    if not agg:
        return None
    every = agg
    step, agg = _one_step(agg, window)
    start = _first(agg)
    end = max(c.last for c in agg)
    ts = grid(start, end, step)
    result = JobSignals(start, end, step, ts)
    lines = sorted({(c.signal, c.stat) for c in agg})
    line = {key: i for i, key in enumerate(lines)}
    matrix = _place(len(lines), ts.size, start, step, agg, [line[(c.signal, c.stat)] for c in agg])
    coarser = _only_coarser(every, step, set(lines))
    if coarser:
        extra = sorted({(c.signal, c.stat) for c in coarser})
        at = {key: i for i, key in enumerate(extra)}
        spread = _spread(len(extra), ts.size, start, step, coarser, [at[(c.signal, c.stat)] for c in coarser])
        matrix = np.vstack([matrix, spread])
        line |= {key: len(lines) + i for key, i in at.items()}
    by_signal: dict[str, dict[str, np.ndarray]] = defaultdict(dict)
    for (signal, stat), i in line.items():
        by_signal[signal][stat] = matrix[i]
    for signal, stat_rows in by_signal.items():
        result.signals[signal] = SignalSeries(signal, _unit(signal), ts, stat_rows)
    if per_gpu is not False:
        names = set(by_signal) if per_gpu is True else set(by_signal) & set(per_gpu)
        if names:
            _attach_per_gpu(result, gpu_chunks(sorted(names)), start, end, window)
    result.missing = dict(job.missing_reasons or {})
    return result


def _attach_per_gpu(
    result: JobSignals, chunks: list[Chunk], start: float, end: float, window: tuple[float, float] | None
) -> None:
    grouped: dict[str, list[Chunk]] = defaultdict(list)
    for c in chunks:
        grouped[c.signal].append(c)
    chosen = {signal: _one_step(cs, window) for signal, cs in grouped.items()}
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


def load_per_gpu(
    job: Job, signal: str, window: tuple[float, float] | None = None, max_points: int | None = None
) -> SignalSeries | None:
    """One signal per GPU as a (GPUs x time) matrix on its own grid (a heatmap), or None when not archived.
    `max_points` (columns) reads the coarsest GPU tier that still gives them. One query."""
    chunks = _fetch_level(job, GPU_TIERS, max_points, per_gpu=True, signals=[signal], window=window)
    return _per_gpu_series(signal, chunks, window)


def _per_gpu_series(
    signal: str, chunks: list[Chunk], window: tuple[float, float] | None
) -> SignalSeries | None:
    """`load_per_gpu`'s result from the chunks read."""
    if not chunks:
        return None
    step, chunks = _one_step(chunks, window)
    # Multiples of the step on the Unix clock, through the point closing the last sample's window: the
    # grid fetch_job_signals reads per-GPU rows on, so every sample keeps its own column.
    start = lattice_point(_first(chunks), step)
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
    job: Job,
    signals: Iterable[str],
    window: tuple[float, float] | None = None,
    max_points: int | None = None,
) -> JobSignals | None:
    """Cross-GPU means of `signals` on one time grid (what a page draws), or None when nothing is archived.
    `max_points`: read the coarsest level that still gives that many points (see `load_job_signals`);
    a downsampled level comes with its windows' lowest and highest mean (MEAN_LOW, MEAN_HIGH)."""
    return load_job_signals(
        job, per_gpu=False, signals=signals, stats=["mean", *EXTREMES], window=window, max_points=max_points
    )


#: The resolution a job is evaluated and diagnosed at from its archive: what finalize archives a job of that
#: length at (jobs.metrics.ingest.FINALIZE_MAX_POINTS per cross-GPU line, FINALIZE_MAX_GPU_POINTS per GPU
#: row), read from the downsampled tiers. A running 256-GPU week is then 2,016 x 300 s cross-GPU points and
#: 336 x 1800 s per-GPU columns instead of 20,160 x 30 s and 2,016 x 300 s: the numbers keep their
#: definitions (jobs.evaluation, jobs.diagnosis) but for jobs longer than ~1.4 days their windows are the
#: tier's (300 s means of 30 s means; per-GPU idle shares of 1800 s windows), as a finalized job's always
#: were. Shorter jobs read their polled rows unchanged.
EVALUATION_MAX_POINTS = 4000
EVALUATION_MAX_GPU_POINTS = 500


def load_for_evaluation(job: Job, *, per_gpu: bool | Iterable[str] = True) -> JobSignals | None:
    """The job's archive at the resolution the evaluation and the diagnosis read it (see
    EVALUATION_MAX_POINTS): cost bounded by the point budgets, not by the job's GPU-hours."""
    return load_job_signals(
        job, per_gpu=per_gpu, max_points=EVALUATION_MAX_POINTS, max_gpu_points=EVALUATION_MAX_GPU_POINTS
    )


def _gpu_key(key: str) -> GpuKey:
    return GpuKey(*key.rsplit("/", 1)) if "/" in key else GpuKey(key, "")


def _gpu_sort_key(key: str) -> tuple[str, int, str]:
    host, _, gpu = key.rpartition("/")
    return host, int(gpu) if gpu.isdigit() else -1, gpu


# ------------------------------------------------------------------------------------ one read per poll

_HeldKey = tuple[str, str, str, int, int]  # signal, stat, GPU, step, chunk start (Unix s)


@dataclass(frozen=True, slots=True)
class _Held:
    """One chunk a Snapshot holds, with its row's start and end as stored (the window filter's columns)."""

    chunk: Chunk
    start: float  # Unix s
    end: float


def _padded(blob: bytes) -> np.ndarray:
    """A stored chunk's float32 values padded with NaN to CHUNK_POINTS (the merge works on whole chunks)."""
    arr = np.full(CHUNK_POINTS, np.nan, dtype=_F4)
    old = np.frombuffer(blob, dtype=_F4)[:CHUNK_POINTS]
    arr[: old.size] = old
    return arr


#: Chunks `_merge_all` merges per numpy pass (bounds its matrices on a 4k-GPU per-GPU cycle).
_MERGE_BATCH = 4096


def _merge_all(
    new: dict[_Key, np.ndarray], old: dict[_Key, np.ndarray]
) -> tuple[dict[_Key, np.ndarray], list[_Key]]:
    """`_merge` of a whole write, a batch of chunks per numpy pass (per-chunk calls cost seconds on a
    cycle), and the keys whose merged values differ from the stored ones (new chunks included): NaN gaps
    in the same places count as equal."""
    both = [k for k in new if k in old]
    done: dict[_Key, np.ndarray] = {}
    same: set[_Key] = set()
    for b in range(0, len(both), _MERGE_BATCH):
        keys = both[b : b + _MERGE_BATCH]
        fresh = np.stack([new[k] for k in keys])
        prev = np.stack([old[k] for k in keys])
        out = np.where(np.isnan(fresh), prev, fresh).astype(_F4)
        equal = ((out == prev) | (np.isnan(out) & np.isnan(prev))).all(axis=1).tolist()
        for key, row, unchanged in zip(keys, out, equal, strict=True):
            done[key] = row
            if unchanged:
                same.add(key)
    merged = {k: done.get(k, arr) for k, arr in new.items()}
    return merged, [k for k in new if k not in same]


def _merge(new: dict[_Key, np.ndarray], old: dict[_Key, np.ndarray]) -> dict[_Key, np.ndarray]:
    """New chunk values over the stored ones: a NaN (nothing written there) keeps the stored value."""
    merged = {}
    for key, arr in new.items():
        prev = old.get(key)
        merged[key] = arr if prev is None else np.where(np.isnan(arr), prev, arr).astype(_F4)
    return merged


class Snapshot:
    """A job's archive read once (one query) for every read a poll makes of it afterwards: the cross-GPU
    chunks of every signal and level, and the per-GPU chunks of `per_gpu` signals. Its readers answer what
    `load_job_signals` / `load_per_gpu` (without point budgets) would read from the database, from the same
    chunks filtered in Python by the same predicates; `merge(rows)` applies a write to it as `upsert`
    merges it, so later reads see the archive as it is after that write without reading it again (the
    poll cycle writes every job's derived series in one upsert after all jobs, #14)."""

    def __init__(self, job: Job, per_gpu: Iterable[str] = ()) -> None:
        self.job = job
        self.gpu_signals = frozenset(per_gpu)
        self._held: dict[_HeldKey, _Held] = {}
        table = connection.ops.quote_name(JobSeries._meta.db_table)
        # Start and end as epoch seconds (float8: exact for the whole microseconds stored; cheaper to parse
        # than timestamptz, and the window test below compares them as the database compares the columns).
        sql = (
            f"SELECT signal, stat, gpu_key, step_seconds, extract(epoch from start)::float8, "
            f'extract(epoch from "end")::float8, "values" FROM {table} '
            f"WHERE job_id = %s AND ((stat <> %s AND stat <> ALL(%s)) OR (stat = %s AND signal = ANY(%s)))"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [job.pk, GPU_STAT, list(EXTREMES), GPU_STAT, sorted(self.gpu_signals)])
            rows = cursor.fetchall()
        held = self._held
        for signal, stat, gpu_key, step, start, end, blob in rows:
            data = bytes(blob)
            count = len(data) // 4
            if count:
                chunk = Chunk(signal, stat, gpu_key, step, start + step, count, data)
                held[(signal, stat, gpu_key, step, round(start))] = _Held(chunk, start, end)

    def _chunks(
        self, *, per_gpu: bool, signals: Iterable[str] | None, window: tuple[float, float] | None
    ) -> list[Chunk]:
        """`_fetch`'s WHERE clause (without stats or steps) on the held chunks."""
        wanted = None if signals is None else set(signals)
        if per_gpu and (wanted is None or not wanted <= self.gpu_signals):
            raise ValueError(
                f"per-GPU rows of {sorted(wanted or ())} were not read (held: {self.gpu_signals})"
            )
        # The bounds as the query would pass them (microseconds, `utc`), so the comparisons are the same.
        lo, hi = (utc(window[0]).timestamp(), utc(window[1]).timestamp()) if window is not None else (0, 0)
        out = []
        for held in self._held.values():
            c = held.chunk
            if (c.stat == GPU_STAT) != per_gpu or (wanted is not None and c.signal not in wanted):
                continue
            if window is not None and not (held.start < hi and held.end >= lo):
                continue
            out.append(c)
        return out

    def load_job_signals(
        self,
        *,
        per_gpu: bool | Iterable[str] = True,
        signals: Iterable[str] | None = None,
        window: tuple[float, float] | None = None,
    ) -> JobSignals | None:
        """What `load_job_signals(job, per_gpu=..., signals=..., window=...)` reads, from this snapshot."""
        agg = self._chunks(per_gpu=False, signals=signals, window=window)

        def gpu_chunks(names: list[str]) -> list[Chunk]:
            return self._chunks(per_gpu=True, signals=names, window=window)

        return _assemble(self.job, agg, per_gpu, window, gpu_chunks)

    def load_per_gpu(self, signal: str, window: tuple[float, float] | None = None) -> SignalSeries | None:
        """What `load_per_gpu(job, signal, window)` reads, from this snapshot."""
        return _per_gpu_series(signal, self._chunks(per_gpu=True, signals=[signal], window=window), window)

    def merge(self, rows: Sequence[Points]) -> None:
        """Apply `upsert(rows)` to the held chunks (the same chunking, merge and tier refresh), so the
        snapshot shows the archive after that write. Levels it does not hold (the extremes, per-GPU rows
        of other signals) are skipped: nothing it holds is computed from them."""
        level = [r for r in rows if r.times.size and r.job_id == self.job.pk]
        while level:
            new, mask = _chunked(level)
            old = {k: _padded(held.chunk.blob) for k in new if (held := self._held.get(k[1:])) is not None}
            merged = _merge(new, old)
            for key, arr in merged.items():
                self._put(key[1:], arr)
            level = [p for p in _coarser(merged, mask) if p.stat not in EXTREMES]

    def _put(self, key: _HeldKey, arr: np.ndarray) -> None:
        signal, stat, gpu_key, step, start = key
        if stat in EXTREMES or (stat == GPU_STAT and signal not in self.gpu_signals):
            return
        values = np.asarray(arr, dtype=_F4)
        finite = np.isfinite(values)
        if not finite.any():  # `_store` writes no row (and a stored one had values, which the merge keeps)
            return
        end = int(CHUNK_POINTS - np.argmax(finite[::-1]))
        data = np.where(finite, values, np.float32("nan")).astype(_F4)[:end].tobytes()
        chunk = Chunk(signal, stat, gpu_key, step, float(start) + step, end, data)
        self._held[key] = _Held(chunk, float(start), utc(start + end * step).timestamp())
