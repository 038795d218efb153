"""Writing the archive: merge points into their chunks (`upsert`), refresh the tiers of the windows a write
touched, the per-job advisory lock, and pruning raw per-GPU rows past their retention (`prune_raw`)."""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

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

#: Lines `_chunk_level` places per numpy pass: bounds its (chunks x CHUNK_POINTS) matrices on a 4k-GPU cycle.
_CHUNK_BATCH = 2048


@dataclass(frozen=True, slots=True)
class _Level:
    """The chunks one level of a write touches, as matrices rather than a dict of arrays per chunk (the
    per-chunk numpy calls and dict look-ups were most of a cycle's write CPU, #26 item 2): chunk i is
    `keys[i]` (unique), its values `values[i]` (float32, CHUNK_POINTS long, NaN where nothing) and the
    points the write brings `mask[i]`."""

    keys: list[_Key]
    values: np.ndarray
    mask: np.ndarray


def _level(keys: list[_Key], values: list[np.ndarray], masks: list[np.ndarray]) -> _Level:
    if not keys:
        return _Level([], np.empty((0, CHUNK_POINTS), dtype=_F4), np.empty((0, CHUNK_POINTS), dtype=bool))
    return _Level(keys, np.concatenate(values), np.concatenate(masks))


def _chunk_level(rows: Iterable[Points]) -> _Level:
    """New chunk values (NaN where the write has nothing) and, per chunk, the mask of points the write
    brings. A sample goes to the grid point closing its window; two samples of one point of one line are
    averaged (`place_on_grid`'s rule). Lines are placed a batch at a time with one bincount (per-line numpy
    calls dominated a cycle's merge), in order, so where two lines write one chunk the later one's values
    win where it has them."""
    listed = list(rows)
    index: dict[_Key, int] = {}
    keys: list[_Key] = []
    values: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    later: list[tuple[int, np.ndarray, np.ndarray]] = []  # (chunk, values, mask) of a line writing it again
    for b in range(0, len(listed), _CHUNK_BATCH):
        _chunk_batch(listed[b : b + _CHUNK_BATCH], index, keys, values, masks, later)
    level = _level(keys, values, masks)
    for i, arr, has in later:  # rare: the same chunk from two lines of one write
        level.values[i] = np.where(has, arr, level.values[i])
        level.mask[i] |= has
    return level


def _chunk_batch(
    rows: list[Points],
    index: dict[_Key, int],
    keys: list[_Key],
    values: list[np.ndarray],
    masks: list[np.ndarray],
    later: list[tuple[int, np.ndarray, np.ndarray]],
) -> None:
    sizes = np.fromiter((r.values.size for r in rows), dtype=np.int64, count=len(rows))
    if not sizes.sum():
        return
    v = np.concatenate([r.values for r in rows])
    times = np.concatenate([r.times for r in rows])
    steps = np.repeat(np.fromiter((r.step for r in rows), dtype=np.float64, count=len(rows)), sizes)
    line = np.repeat(np.arange(len(rows), dtype=np.int64), sizes)
    ok = np.isfinite(v)
    if not ok.any():
        return
    k = np.ceil(times[ok] / steps[ok] - _EPS).astype(np.int64)
    v, line = v[ok], line[ok]
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
    first: list[int] = []
    for j, (li, ci) in enumerate(zip((ids >> 32).tolist(), ((ids & (2**32 - 1)) + c0).tolist(), strict=True)):
        r = rows[li]
        key = (r.job_id, r.signal, r.stat, r.gpu_key, r.step, ci * CHUNK_POINTS * r.step)
        at = index.get(key)
        if at is None:
            index[key] = len(keys)
            keys.append(key)
            first.append(j)
        else:
            later.append((at, means[j], has[j]))
    values.append(means[first])
    masks.append(has[first])


def _existing(keys: list[_Key]) -> tuple[np.ndarray, np.ndarray]:
    """The stored chunks of `keys` (one query): their positions in `keys` and their values, padded with
    NaN to CHUNK_POINTS, one row per position."""
    none = (np.empty(0, dtype=np.int64), np.empty((0, CHUNK_POINTS), dtype=_F4))
    if not keys:
        return none
    table = connection.ops.quote_name(JobSeries._meta.db_table)
    # One = ANY list per key column within each (step, chunk start) of the write, OR-ed: the unique key's
    # index (or the (job, signal, stat, start) one) answers each. A write's keys share a few (step, start)
    # pairs (a cycle: the 30 s chunk of the cross-GPU stats, the 300 s one of the per-GPU rows of the fifth
    # of its jobs due for them, ingest.per_gpu_due), and the lists of one pair keep the other pairs' stats
    # and GPU keys out: one set of lists for the whole write also fetched, e.g., every job's 300 s tier
    # chunk starting where the per-GPU chunks start (25,120 rows for 14,320 wanted on an 800-GPU cycle),
    # and the planner answered it with a parallel scan of the table. The rows of other combinations of
    # one pair's lists are few and dropped below. Measured on that cycle's write (3 levels, ~37,000 keys,
    # no parallel workers): Postgres 0.30 -> 0.27 CPU-s, Python 0.09 -> 0.07. (A join on the whole key
    # tuples, unnest(...) JOIN on the unique key, cost more, in Python and Postgres, on 3,300 keys: 40-70
    # ms against 21-25 ms for one set of lists.)
    groups: dict[tuple[int, int], list[_Key]] = defaultdict(list)
    for key in keys:
        groups[(key[4], key[5])].append(key)
    clauses: list[str] = []
    params: list[Any] = []
    for (step, start), members in groups.items():
        jobs, signals, stats, gpus = (sorted(set(c)) for c in list(zip(*members, strict=True))[:4])
        clauses.append(
            "(step_seconds = %s AND start = %s AND job_id = ANY(%s) AND signal = ANY(%s) AND stat = ANY(%s) "
            "AND gpu_key = ANY(%s))"
        )
        params += [step, utc(start), jobs, signals, stats, gpus]
    sql = (
        f'SELECT job_id, signal, stat, gpu_key, step_seconds, extract(epoch from start)::bigint, "values" '
        f"FROM {table} WHERE {' OR '.join(clauses)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    if not found:
        return none
    index = {key: i for i, key in enumerate(keys)}
    # Column-wise, so the per-row work (the key tuple, its look-up) runs in C: a cycle reads ~50,000 chunks.
    *columns, blobs = zip(*found, strict=True)
    positions = list(map(index.get, zip(*columns, strict=True)))
    if None in positions:  # another combination of the lists' values: not asked for
        keep = [i for i, at in enumerate(positions) if at is not None]
        positions = [positions[i] for i in keep]
        blobs = tuple(blobs[i] for i in keep)
        if not keep:
            return none
    raw = [bytes(blob)[:_CHUNK_BYTES] for blob in blobs]
    counts = np.fromiter(map(len, raw), dtype=np.int64, count=len(raw)) // _F4.itemsize
    # Every chunk padded with NaN to CHUNK_POINTS at once: row-major, the mask's cells take the values in
    # order.
    matrix = np.full((len(raw), CHUNK_POINTS), np.nan, dtype=_F4)
    matrix[np.arange(CHUNK_POINTS) < counts[:, None]] = np.frombuffer(b"".join(raw), dtype=_F4)
    return np.asarray(positions, dtype=np.int64), matrix


_CHUNK_BYTES = CHUNK_POINTS * _F4.itemsize

_STAGE = "archive_stage_text"  # (a new name: a connection may still hold the old layout)
_COLUMNS = 'job_id, signal, stat, gpu_key, step_seconds, start, "end", "values"'


def _store(keys: list[_Key], values: np.ndarray, which: np.ndarray) -> int:
    """COPY the chunks `which` (positions in `keys` and rows of `values`) into a staging table and upsert
    them with one statement; returns rows."""
    rows: list[str] = []
    if which.size:
        # All chunks at once (each is CHUNK_POINTS long): gaps as NaN, trailing gaps trimmed.
        matrix = values[which]
        finite = np.isfinite(matrix)
        filled: list[bool] = np.asarray(finite.any(axis=1), dtype=bool).tolist()
        ends: list[int] = (matrix.shape[1] - np.argmax(finite[:, ::-1], axis=1)).tolist()
        data = np.where(finite, matrix, np.float32("nan")).astype(_F4)  # (an infinity is stored as a gap)
        # One hex string for all chunks, sliced per row (a tobytes().hex() per row cost more).
        hexed = data.tobytes().hex()
        width = 2 * _CHUNK_BYTES
        # The few distinct (signal, stat, GPU) columns of a write, escaped and joined once each.
        names: dict[tuple[str, str, str], str] = {}
        for n, i in enumerate(which.tolist()):
            if not filled[n]:
                continue
            job_id, signal, stat, gpu_key, step, start = keys[i]
            middle = names.get((signal, stat, gpu_key))
            if middle is None:
                middle = names[(signal, stat, gpu_key)] = "\t".join(map(_copy_text, (signal, stat, gpu_key)))
            end = ends[n]
            # COPY's text format, built here in one pass (psycopg's write_row per row cost ~17 us a row,
            # seconds for a 4k-GPU cycle's per-GPU rows): times as Unix seconds (whole seconds: chunk
            # starts lie on the clock), the values as bytea hex (its backslash escaped for COPY).
            at = n * width
            blob = hexed[at : at + 8 * end]
            rows.append(f"{job_id}\t{middle}\t{step}\t{start}\t{start + end * step}\t\\\\x{blob}\n")
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


def _coarser_level(keys: list[_Key], merged: np.ndarray, written: np.ndarray) -> _Level:
    """The next tier's chunks for the coarse windows a write touched, from the merged fine chunks (rows of
    `merged`; `written`: the points the write brought). Each coarse window (P - T, P] lies inside one fine
    chunk (`_tier_above`), so it is computed whole; a fine chunk's windows lie in one coarse chunk when the
    coarse step is a multiple of the fine one, and in two when it is not (120 s under 300 s).

    A chunk starts on a multiple of CHUNK_POINTS x step, which the coarse step divides, so every chunk of
    one (stat, step) splits into coarse windows at the same offsets: those chunks are reduced as one
    (chunks x CHUNK_POINTS) matrix, a few numpy calls per (stat, step) rather than per chunk (the cycle
    writes thousands), and their values land in the coarse chunks' matrix with one scatter. Only finite
    values of touched windows are written (a NaN never overwrites); where two fine chunks give one coarse
    point (two fine steps of one stat in one write), the later (stat, step) group wins, as a later line
    does in `_chunk_level`."""
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, key in enumerate(keys):
        groups[(key[2], key[4])].append(i)
    index: dict[_Key, int] = {}  # the coarse chunks, in the order first written
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # rows, columns, values
    for (stat, step), members in groups.items():
        coarse = _tier_above(stat, step)
        if coarse is None:
            continue
        rows = np.asarray(members, dtype=np.int64)
        mask = written[rows]
        live = np.asarray(mask.any(axis=1), dtype=bool)
        if not live.any():
            continue
        rows, mask = rows[live], mask[live]
        fine = merged[rows].astype(np.float64)
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
        fine_keys = [keys[i] for i in rows.tolist()]
        jobs, signals, gpus = [k[0] for k in fine_keys], [k[1] for k in fine_keys], [k[3] for k in fine_keys]
        fine_starts = np.asarray([k[5] for k in fine_keys], dtype=np.int64)
        # The coarse point index k (its time k x coarse) closing each window of each fine chunk; it sits
        # in coarse chunk (k - 1) // CHUNK_POINTS at column (k - 1) % CHUNK_POINTS, as `_chunk_batch` places
        # points. A fine chunk's windows usually lie in one coarse chunk, but not when the coarse step is
        # not a multiple of the fine one (a finalize's 120 s grid under the 300 s tier: 2.5 fine chunks a
        # coarse one), so the cells are keyed per (fine row, coarse chunk), not per fine row.
        point = (fine_starts // coarse)[:, None] + local[starts][None, :]
        chunk = (point - 1) // CHUNK_POINTS
        columns = (point - 1) % CHUNK_POINTS
        c0 = int(chunk.min())
        for name, values in reduced.items():
            ok = touched & np.isfinite(values)
            r, c = np.nonzero(ok)
            if not r.size:
                continue
            cell_chunk = chunk[r, c]
            pairs, inverse = np.unique(r * 2**32 + (cell_chunk - c0), return_inverse=True)
            # A new key gets the next position (setdefault's default is read before it inserts).
            target = np.fromiter(
                (
                    index.setdefault(
                        (jobs[j], signals[j], name, gpus[j], coarse, (q + c0) * CHUNK_POINTS * coarse),
                        len(index),
                    )
                    for j, q in zip((pairs >> 32).tolist(), (pairs & (2**32 - 1)).tolist(), strict=True)
                ),
                dtype=np.int64,
                count=pairs.size,
            )
            parts.append((target[inverse.reshape(-1)], columns[r, c], values[r, c]))
    out_keys = list(index)
    values_out = np.full((len(out_keys), CHUNK_POINTS), np.nan, dtype=_F4)
    mask_out = np.zeros((len(out_keys), CHUNK_POINTS), dtype=bool)
    for target_rows, cols, vals in parts:  # in order: a later group's point wins
        values_out[target_rows, cols] = vals.astype(_F4)
        mask_out[target_rows, cols] = True
    return _Level(out_keys, values_out, mask_out)


def upsert(rows: Sequence[Points], *, tiers_of_changes: bool = False) -> int:
    """Merge `rows` into the archive and refresh the downsampled tiers of the windows they touch.

    Each point goes into its chunk at its offset; the chunk's other points are kept and a NaN (no sample)
    never overwrites a stored value, so overlapping, repeated, partial or out-of-order writes of any
    window converge to the union of what was read. Idempotent. Returns the rows written (all levels).

    `tiers_of_changes`: refresh only the coarse windows in which a finer stored value changed, not every
    window the write touched. The same rows wherever each tier window already holds the reduction of its
    finer window as stored (every write that changes a finer value refreshes its window): true of what
    polls write, which is why the poll cycle asks for it (`ingest.archive_cycle`: a poll re-reads its
    overlap and per-GPU lookback, most of whose values are already stored, #26 item 2). Not for a write
    that must rebuild tiers that may be missing (rows archived before the tiers existed) or that other
    writes replaced (a finalize at a tier's step).
    """
    rows = [r for r in rows if r.times.size]
    if not rows:
        return 0
    written = 0
    with transaction.atomic():
        # Two writers of one job (a poll and a finalize, two workers) must not merge the same chunk from the
        # same old value: one waits for the other's commit.
        lock_jobs(sorted({r.job_id for r in rows}))
        level = _chunk_level(rows)
        while level.keys:
            merged, moved = _merge_all(level)
            # A chunk the write leaves as it was (a repeated window, a tier whose windows' min/max/count did
            # not move) is not rewritten: an UPDATE of an equal row still costs a new row version and WAL.
            written += _store(level.keys, merged, np.flatnonzero(moved.any(axis=1)))
            level = _coarser_level(level.keys, merged, moved if tiers_of_changes else level.mask)
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


#: Chunks `_merge_all` merges per numpy pass (bounds its temporaries when a 4k-GPU cycle writes per-GPU rows).
_MERGE_BATCH = 4096


def _merge_all(level: _Level) -> tuple[np.ndarray, np.ndarray]:
    """The level's new values over the stored ones (a NaN, nothing written there, keeps the stored value),
    a batch of chunks per numpy pass, and the points whose merged value differs from the stored one (all
    the written points of a chunk not stored yet): NaN where NaN was stored counts as equal."""
    at, old = _existing(level.keys)
    merged = level.values.copy()
    moved = level.mask.copy()
    for b in range(0, at.size, _MERGE_BATCH):
        rows, prev = at[b : b + _MERGE_BATCH], old[b : b + _MERGE_BATCH]
        fresh = merged[rows]
        out = np.where(np.isnan(fresh), prev, fresh)
        moved[rows] = ~((out == prev) | (np.isnan(out) & np.isnan(prev)))
        merged[rows] = out
    return merged, moved
