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
merge itself is numpy on the chunks it touches, under a per-job advisory lock: each level of a write is one
(chunks x CHUNK_POINTS) matrix of values and one of the points written, read back, merged, compared and
reduced to the next tier as matrices (a cycle writes tens of thousands of chunks).

Tiers: every write also refreshes downsampled copies of the windows it touched (AGG_TIERS for the cross-GPU
stats, GPU_TIERS for per-GPU rows), each from the next finer level; the poll cycle's write refreshes only the
windows in which a finer value changed (`upsert(tiers_of_changes=True)`: the others already hold it). Pages
read the coarsest level that still gives their pixel budget (`max_points`), so a page's work does not grow
with the job's GPU-hours; per-GPU rows finer than the first GPU tier are dropped after
ARCHIVE_RAW_RETENTION_DAYS (`prune_raw`) while the tiers stay forever.

Size (benchmarks/pages.py, a running 256-GPU x 7-day job: 30 s cross-GPU stats of the charted signals,
300 s per-GPU rows of two signals; pg_column_size of the stored rows per GPU-hour): the polled rows take
924 B in the old layout (float8[] timestamps + float8[] values, measured on equivalent rows) and 247 B
compact; the tiers add 26 B (cross-GPU, with the extremes) + 44 B (per GPU); after the retention the
per-GPU polled rows (118 B) go, so ~199 B per GPU-hour stay forever.

One reader for everyone (ingestion, the evaluation, the diagnosis, the pages): `load_job_signals` (the
cross-GPU stats on one grid, optionally per-GPU rows and a zoom window) and `load_per_gpu` (one signal's
per-GPU matrix for a heatmap) share one fetch and one placement; values are decoded with one numpy call.

Modules: `layout` (chunk keys, tiers, `Points`), `write` (`upsert`, locks, `prune_raw`), `read` (the
loaders), `snapshot` (one read per poll). Everything a caller uses is importable from `jobs.metrics.archive`.
"""

from jobs.metrics.archive.layout import (
    AGG_TIERS,
    CHUNK_POINTS,
    EXTREMES,
    GPU_STAT,
    GPU_TIERS,
    MFU,
    THROUGHPUT,
    Points,
    decode,
    derived_rows,
    rows_for,
    utc,
)
from jobs.metrics.archive.read import (
    EVALUATION_MAX_GPU_POINTS,
    EVALUATION_MAX_POINTS,
    Chunk,
    load_for_evaluation,
    load_job_signals,
    load_means,
    load_per_gpu,
)
from jobs.metrics.archive.snapshot import Snapshot, SnapshotRow
from jobs.metrics.archive.write import cursor_lock, lock_jobs, prune_raw, upsert

__all__ = [
    "AGG_TIERS",
    "CHUNK_POINTS",
    "EVALUATION_MAX_GPU_POINTS",
    "EVALUATION_MAX_POINTS",
    "EXTREMES",
    "GPU_STAT",
    "GPU_TIERS",
    "MFU",
    "THROUGHPUT",
    "Chunk",
    "Points",
    "Snapshot",
    "SnapshotRow",
    "cursor_lock",
    "decode",
    "derived_rows",
    "load_for_evaluation",
    "load_job_signals",
    "load_means",
    "load_per_gpu",
    "lock_jobs",
    "prune_raw",
    "rows_for",
    "upsert",
    "utc",
]
