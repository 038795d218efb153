"""Reading the archive: one fetch and one placement for every reader (`load_job_signals`, `load_per_gpu`,
`load_means`, `load_for_evaluation`), at the coarsest level that still gives the reader's pixel budget."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from itertools import compress
from typing import Any, NamedTuple

import numpy as np
from django.db import connection

from jobs.metrics.archive.layout import (
    _EPS,
    _F4,
    _UNITS,
    AGG_TIERS,
    EXTREMES,
    GPU_TIERS,
    decode,
    utc,
)
from jobs.metrics.engine_signals import ENGINE_SIGNALS
from jobs.metrics.host_signals import HOST_SIGNALS
from jobs.metrics.sampling import grid_columns, lattice_point
from jobs.metrics.signals import SIGNALS, GpuKey, JobSignals, SignalSeries, grid
from jobs.models import Job, JobSeries


class Chunk(NamedTuple):
    """One archived row as read: its keys, step, first grid point, value count and stored values. A named
    tuple rather than a frozen dataclass: as immutable, and about a third of the cost to build (a poll's
    snapshot builds one per archive row: 380 for an 8-GPU job, #26 item 2)."""

    signal: str
    stat: str
    gpu_key: str
    step: int
    first: float
    count: int  # type: ignore[assignment]  # the field hides tuple.count (a Chunk is never searched)
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


def _columns(chunks: list[Chunk]) -> tuple[tuple[Any, ...], ...]:
    """The chunks' fields as columns (signal, stat, gpu_key, step, first, count, blob), transposed in C:
    a poll assembles a few hundred chunks several times, and one generator pass per field cost more than
    the numpy work on them (#26 item 2)."""
    return tuple(zip(*chunks, strict=True)) if chunks else ((),) * len(Chunk._fields)


def _decoded(
    chunks: list[Chunk], columns: tuple[tuple[Any, ...], ...] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All chunks' values and times at once (one join, one decode) and each chunk's value count;
    `columns`: `_columns(chunks)` when the caller has them already."""
    _, _, _, chunk_steps, chunk_firsts, chunk_counts, blobs = columns or _columns(chunks)
    counts = np.array(chunk_counts, dtype=np.int64)
    values = decode(b"".join(blobs))
    begins = np.cumsum(counts) - counts
    position = np.arange(values.size, dtype=np.int64) - np.repeat(begins, counts)
    firsts = np.array(chunk_firsts, dtype=np.float64)
    steps = np.array(chunk_steps, dtype=np.float64)
    times = np.repeat(firsts, counts) + np.repeat(steps, counts) * position
    return values, times, counts


#: A finer level is read when it has values in at least this share of the windows (of the coarsest level
#: present) that the best-covering level has: the polled rows hold the job's full resolution, but where
#: polling missed a stretch that finalize (at its own, coarser step) filled, or where per-GPU rows past
#: their retention are gone, the complete level wins.
_COVERAGE_SLACK = 0.95


_PAIR = 2**40  # (step, window) pairs packed into one int64: steps < 2**22 s


def _one_step(chunks: list[Chunk], window: tuple[float, float] | None = None) -> tuple[int, list[Chunk]]:
    """The step to read and its chunks: the finest step with values in (almost) as many windows of the
    coarsest step (within `window`) as the best-covering one. Rows of several steps would leave holes
    between their columns or pile several samples into one."""
    columns = _columns(chunks)
    chunk_steps = columns[3]
    distinct = set(chunk_steps)
    if len(distinct) == 1:
        return chunk_steps[0], list(chunks)
    coarsest = max(distinct)
    # Every step's coverage from one decode and one unique over (step, coarse window) pairs: a poll assembles
    # each job's three cross-GPU levels twice, and per-step decodes were most of that assembly's numpy calls.
    values, times, counts = _decoded(chunks, columns)
    order = sorted(distinct)
    # Each value's step as its index in `order` (looked up per chunk, then repeated).
    rank = np.repeat(np.searchsorted(np.asarray(order, dtype=np.int64), np.asarray(chunk_steps)), counts)
    ok = np.isfinite(values)
    if window is not None:
        steps = np.asarray(order, dtype=np.float64)[rank]
        ok &= (times > window[0]) & (times - steps < window[1])
    windows = np.ceil(times[ok] / coarsest - _EPS).astype(np.int64)
    covered = _coverage(rank[ok], windows, order)
    best = max(covered.values())
    step = min(s for s, c in covered.items() if c >= _COVERAGE_SLACK * best)
    return step, list(compress(chunks, [s == step for s in chunk_steps]))  # no attribute read per Chunk


#: `_coverage` marks (step, window) cells in a table while it has at most this many cells per value (or
#: this many in all): a dense table of a few kilobytes; a sparse one (values scattered over a long span)
#: counts through a sort instead.
_TABLE_CELLS_PER_VALUE = 8
_TABLE_CELLS_MIN = 1 << 16


def _coverage(rank: np.ndarray, windows: np.ndarray, steps: list[int]) -> dict[int, int]:
    """How many distinct coarse `windows` each of `steps` (sorted) has values in (`rank[i]`: the index in
    `steps` of the step of the value in window `windows[i]`). A boolean table over the windows' span when
    it is small next to the values (the poll's case: a running job's hours), else one unique over packed
    pairs; the same counts either way (#26 item 2: the unique's sort was most of `_one_step`)."""
    covered = dict.fromkeys(steps, 0)
    if windows.size == 0:
        return covered
    low = int(windows.min())
    span = int(windows.max()) - low + 1
    if span * len(steps) <= max(_TABLE_CELLS_PER_VALUE * windows.size, _TABLE_CELLS_MIN):
        seen = np.zeros(len(steps) * span, dtype=bool)
        seen[rank * span + (windows - low)] = True
        covered.update(zip(steps, seen.reshape(len(steps), span).sum(axis=1).tolist(), strict=True))
        return covered
    pairs = np.unique(rank * _PAIR + (windows - low))  # windows - low < span < 2**40
    ranked, covers = np.unique(pairs // _PAIR, return_counts=True)
    covered.update(zip([steps[i] for i in ranked.tolist()], covers.tolist(), strict=True))
    return covered


def _first(chunks: list[Chunk], decoded: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> float:
    """Time of the earliest value (a chunk starts on the clock, its leading points may be gaps);
    `decoded`: `_decoded(chunks)` when the caller has it already."""
    values, times, _ = decoded if decoded is not None else _decoded(chunks)
    finite = np.isfinite(values)
    return float(times[finite].min()) if finite.any() else min(c.first for c in chunks)


def _last(chunks: list[Chunk], decoded: tuple[np.ndarray, np.ndarray, np.ndarray]) -> float:
    """`max(c.last for c in chunks)` from `_decoded(chunks)`: each chunk's last time is its last decoded
    time (first + (count - 1) x step, the same double), without a property call per chunk (#26 item 2)."""
    _, times, counts = decoded
    if counts.size == 0 or counts.min() < 1:  # an empty chunk has no decoded time of its own
        return max(c.last for c in chunks)
    return float(times[np.cumsum(counts) - 1].max())


def _place(
    rows: int,
    cols: int,
    origin: float,
    step: float,
    chunks: list[Chunk],
    line_of: list[int],
    decoded: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """All chunks into a (lines x time) matrix on the grid origin + k*step, at once: one decode and one
    scatter (per-chunk numpy calls would cost more than the query on a 256-GPU week). Each value goes to
    the point closing its window (`grid_columns`); two values in one cell are averaged (`place_on_grid`'s
    rule), so the result never depends on the order rows were read in. `decoded`: `_decoded(chunks)` when
    the caller has it already."""
    out = np.full((rows, cols), np.nan)
    if not chunks or cols == 0:
        return out
    values, times, counts = decoded if decoded is not None else _decoded(chunks)
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
    wide = np.repeat(np.array(_columns(chunks)[3], dtype=np.float64), counts)
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
    if signal in HOST_SIGNALS:  # node_exporter's host signals (B/s or ratio)
        return HOST_SIGNALS[signal].unit
    if signal in ENGINE_SIGNALS:  # a serving engine's FLOP/s and B/s per GPU
        return ENGINE_SIGNALS[signal].unit
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
    decoded = _decoded(agg)  # one decode for the start and the placement
    start = _first(agg, decoded)
    end = _last(agg, decoded)
    ts = grid(start, end, step)
    result = JobSignals(start, end, step, ts)
    lines = sorted({(c.signal, c.stat) for c in agg})
    line = {key: i for i, key in enumerate(lines)}
    matrix = _place(len(lines), ts.size, start, step, agg, [line[(c.signal, c.stat)] for c in agg], decoded)
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
