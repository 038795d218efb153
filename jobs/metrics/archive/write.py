"""Writing the archive: merge points into their chunks (`upsert`), refresh the tiers of the windows a write
touched, the per-job advisory lock, and pruning raw per-GPU rows past their retention (`prune_raw`)."""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

import numpy as np
from django.db import connection, transaction

from jobs.metrics.archive.layout import (
    _EPS,
    _F4,
    AGG_TIERS,
    CHUNK_POINTS,
    EXTREMES,
    GPU_STAT,
    GPU_TIERS,
    Points,
    _Key,
    utc,
)
from jobs.metrics.downsample import MEAN_HIGH, MEAN_LOW
from jobs.metrics.signals import COUNT, MAX, MIN, SAMPLED
from jobs.models import JobSeries

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


def _existing(keys: list[_Key]) -> dict[_Key, np.ndarray]:
    """The stored values of the chunks `keys` name (one query), padded to CHUNK_POINTS."""
    if not keys:
        return {}
    table = connection.ops.quote_name(JobSeries._meta.db_table)
    # Each key column as its own = ANY list, which the (job, signal, stat, start) index answers, GPU keys
    # included: a cycle writes the per-GPU rows of the fifth of its jobs due for them (ingest.per_gpu_due),
    # and without the GPU list this read fetched every listed job's per-GPU chunks too, to drop them
    # below. The rows of other combinations still returned are few (all jobs of a write share its chunk
    # starts) and dropped below. (A join on the whole key tuples, unnest(...) JOIN on the unique key,
    # fetches only the wanted rows but cost more CPU, in Python and Postgres, on 3,300 keys: 40-70 ms
    # against 21-25 ms; see benchmarks/poll_cost.py.)
    jobs, signals, stats, gpus, steps, starts = (sorted(set(c)) for c in zip(*keys, strict=True))
    sql = (
        f'SELECT job_id, signal, stat, gpu_key, step_seconds, extract(epoch from start)::bigint, "values" '
        f"FROM {table} WHERE job_id = ANY(%s) AND signal = ANY(%s) AND stat = ANY(%s) "
        f"AND gpu_key = ANY(%s) AND step_seconds = ANY(%s) AND start = ANY(%s)"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [jobs, signals, stats, gpus, steps, [utc(t) for t in starts]])
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
            # seconds for a 4k-GPU cycle's per-GPU rows): times as Unix seconds (whole seconds: chunk
            # starts lie on the clock), the values as bytea hex (its backslash escaped for COPY).
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


#: Chunks `_merge_all` merges per numpy pass (bounds its matrices when a 4k-GPU cycle writes per-GPU rows).
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
