"""One read of a job's archive per poll (`Snapshot`): the summary's and the alert rules' later reads answered
from it as the database would, a write merged into it as `upsert` merges it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
from django.db import connection

from jobs.metrics.archive.layout import (
    _F4,
    CHUNK_POINTS,
    EXTREMES,
    GPU_STAT,
    Points,
    _padded,
    utc,
)
from jobs.metrics.archive.read import (
    Chunk,
    _assemble,
    _per_gpu_series,
)
from jobs.metrics.archive.write import _chunk_level, _coarser_level, _Level
from jobs.metrics.signals import JobSignals, SignalSeries
from jobs.models import Job, JobSeries

_HeldKey = tuple[str, str, str, int, int]  # signal, stat, GPU, step, chunk start (Unix s)
#: One archive row as a Snapshot reads it: job, signal, stat, GPU, step (s), start and end (Unix s), values.
#: The job's id stays in: the row is the database driver's tuple as fetched, not a copy without it.
SnapshotRow = tuple[int, str, str, str, int, float, float, bytes]


class _Held(NamedTuple):
    """One chunk a Snapshot holds, with its row's start and end as stored (the window filter's columns).
    A named tuple: cheaper to build than a frozen dataclass (one per archive row, see `Chunk`)."""

    chunk: Chunk
    start: float  # Unix s
    end: float


class Snapshot:
    """A job's archive read once (one query) for every read a poll makes of it afterwards: the cross-GPU
    chunks of every signal and level, and the per-GPU chunks of `per_gpu` signals. Its readers answer what
    `load_job_signals` / `load_per_gpu` (without point budgets) would read from the database, from the same
    chunks filtered in Python by the same predicates; `merge(rows)` applies a write to it as `upsert`
    merges it, so later reads see the archive as it is after that write without reading it again (the
    poll cycle writes every job's derived series in one upsert after all jobs, #14)."""

    def __init__(
        self, job: Job, per_gpu: Iterable[str] = (), rows: Sequence[SnapshotRow] | None = None
    ) -> None:
        """Read the job's archive (one query), or hold `rows`: what `rows_of` read for it with the same
        `per_gpu` (the poll cycle reads a batch of jobs' snapshots in one query, #26 item 2)."""
        self.job = job
        self.gpu_signals = frozenset(per_gpu)
        # The cross-GPU and the per-GPU chunks apart: each read wants one kind only.
        self._agg: dict[_HeldKey, _Held] = {}
        self._gpu: dict[_HeldKey, _Held] = {}
        # Signals a `merge` skipped (`only`): the held chunks no longer show the archive for them.
        self._stale: set[str] = set()
        if rows is None:
            rows = Snapshot.rows_of([job.pk], self.gpu_signals)[job.pk]
        agg, gpu = self._agg, self._gpu
        new = tuple.__new__  # what Chunk(...) and _Held(...) call, without their __new__'s Python frame
        for _, signal, stat, gpu_key, step, start, end, blob in rows:
            data = bytes(blob)
            count = len(data) // 4
            if count:
                chunk = new(Chunk, (signal, stat, gpu_key, step, start + step, count, data))
                table = gpu if stat == GPU_STAT else agg
                table[(signal, stat, gpu_key, step, round(start))] = new(_Held, (chunk, start, end))

    @staticmethod
    def rows_of(job_ids: Sequence[int], per_gpu: Iterable[str] = ()) -> dict[int, list[SnapshotRow]]:
        """The archive rows a Snapshot with `per_gpu` holds, for each of `job_ids` (an empty list for a
        job without any), in one query."""
        table = connection.ops.quote_name(JobSeries._meta.db_table)
        # Start and end as epoch seconds (float8: exact for the whole microseconds stored; cheaper to parse
        # than timestamptz, and the window test below compares them as the database compares the columns).
        sql = (
            f"SELECT job_id, signal, stat, gpu_key, step_seconds, extract(epoch from start)::float8, "
            f'extract(epoch from "end")::float8, "values" FROM {table} WHERE job_id = ANY(%s) '
            f"AND ((stat <> %s AND stat <> ALL(%s)) OR (stat = %s AND signal = ANY(%s)))"
        )
        out: dict[int, list[SnapshotRow]] = {pk: [] for pk in job_ids}
        with connection.cursor() as cursor:
            cursor.execute(sql, [list(job_ids), GPU_STAT, list(EXTREMES), GPU_STAT, sorted(set(per_gpu))])
            # Each row as fetched: unpacking and re-packing 380 rows per 8-GPU job cost more than the loop.
            for row in cursor.fetchall():
                out[row[0]].append(row)
        return out

    def _chunks(
        self, *, per_gpu: bool, signals: Iterable[str] | None, window: tuple[float, float] | None
    ) -> list[Chunk]:
        """`_fetch`'s WHERE clause (without stats or steps) on the held chunks."""
        wanted = None if signals is None else set(signals)
        if self._stale and (wanted is None or wanted & self._stale):
            asked = "every signal" if wanted is None else sorted(wanted & self._stale)
            raise ValueError(f"{asked}: a write of {sorted(self._stale)} was not merged into this snapshot")
        if per_gpu and (wanted is None or not wanted <= self.gpu_signals):
            raise ValueError(
                f"per-GPU rows of {sorted(wanted or ())} were not read (held: {self.gpu_signals})"
            )
        # The bounds as the query would pass them (microseconds, `utc`), so the comparisons are the same.
        lo, hi = (utc(window[0]).timestamp(), utc(window[1]).timestamp()) if window is not None else (0, 0)
        out = []
        for held in (self._gpu if per_gpu else self._agg).values():
            c = held.chunk
            if wanted is not None and c.signal not in wanted:
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

    def merge(self, rows: Sequence[Points], only: Iterable[str] | None = None) -> None:
        """Apply `upsert(rows)` to the held chunks (the same chunking, merge and tier refresh), so the
        snapshot shows the archive after that write. Levels it does not hold (the extremes, per-GPU rows
        of other signals) are skipped: nothing it holds is computed from them. `only`: merge the rows of
        these signals alone (what later reads ask for: the poll's alert rules read MFU, not throughput, and
        the merge's chunking and tiers cost in proportion to the lines, #26 item 2); a later read of a
        skipped signal, or of every signal, raises ValueError instead of answering from the old chunks."""
        level = [r for r in rows if r.times.size and r.job_id == self.job.pk]
        if only is not None:
            keep = frozenset(only)
            self._stale |= {r.signal for r in level if r.signal not in keep}
            level = [r for r in level if r.signal in keep]
        chunks = _chunk_level(level)
        while chunks.keys:
            # New values over the held ones: a NaN (nothing written there) keeps the held value, as `upsert`.
            merged = chunks.values.copy()
            for i, key in enumerate(chunks.keys):
                held = self._get(key[1:])
                if held is not None:
                    merged[i] = np.where(np.isnan(merged[i]), _padded(held.chunk.blob), merged[i])
                self._put(key[1:], merged[i])
            coarse = _coarser_level(chunks.keys, merged, chunks.mask)
            kept = [i for i, key in enumerate(coarse.keys) if key[2] not in EXTREMES]
            chunks = _Level([coarse.keys[i] for i in kept], coarse.values[kept], coarse.mask[kept])

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
        table = self._gpu if stat == GPU_STAT else self._agg
        table[key] = _Held(chunk, float(start), utc(start + end * step).timestamp())

    def _get(self, key: _HeldKey) -> _Held | None:
        return (self._gpu if key[1] == GPU_STAT else self._agg).get(key)
