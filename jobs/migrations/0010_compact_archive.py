"""Compact archive: each JobSeries chunk holds `start`, `step_seconds` and its values as little-endian
float32 bytes (NaN for gaps), no per-value timestamps.

Layout (jobs.metrics.archive): a chunk of step s starting at C (a multiple of 240 s on the Unix clock)
holds the grid points C + s, ..., C + 240 s, value i at C + (i + 1) s, trailing gaps trimmed; `end` is the
time of its last value. Existing rows are converted: every sample goes to the grid point (a multiple of
its row's step) closing the window that holds it, the same placement the readers used, and rows are
regrouped into the new chunks (a chunk now owns the windows (C, C + 240 s], so the old row's first
point moves to the chunk before). The unique key gains `step_seconds`: a finalize at a coarser step and
the downsampled tiers live next to the polled rows instead of replacing them.

Written as explicit SQL plus a conversion in numpy, not through app code, so the migration keeps
working whatever the archive module becomes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from django.db import migrations, models

CHUNK_POINTS = 240
_EPS = 1e-6
_TABLE = "jobs_jobseries"


def _chunks(times: np.ndarray, values: np.ndarray, step: int) -> dict[int, np.ndarray]:
    """{chunk start (Unix s): float32 values} of one line: samples on the points closing their windows,
    two samples of one point averaged, gaps NaN, trailing gaps trimmed, all-NaN chunks dropped."""
    k = np.ceil(times / step - _EPS).astype(np.int64)  # grid point index: the point closing the window
    ok = np.isfinite(values)
    k, v = k[ok], values[ok]
    out: dict[int, np.ndarray] = {}
    if k.size == 0:
        return out
    lo = int(k.min())
    sums = np.bincount(k - lo, weights=v)
    counts = np.bincount(k - lo)
    mean = np.full(counts.size, np.nan)
    np.divide(sums, counts, out=mean, where=counts > 0)
    for chunk in np.unique((k - 1) // CHUNK_POINTS):
        first = int(chunk) * CHUNK_POINTS + 1 - lo  # position of the chunk's first point in `mean`
        arr = np.full(CHUNK_POINTS, np.nan, dtype=np.float32)
        a, b = max(first, 0), min(first + CHUNK_POINTS, mean.size)
        arr[a - first : b - first] = mean[a:b]
        filled = np.flatnonzero(np.isfinite(arr))
        if filled.size:
            out[int(chunk) * CHUNK_POINTS * step] = arr[: filled[-1] + 1]
    return out


def convert(apps: Any, schema_editor: Any) -> None:
    """Rewrite every (job, signal, stat, GPU, step) line from timestamp/value arrays into compact chunks."""
    conn = schema_editor.connection
    with conn.cursor() as cursor:
        # Inserts queue deferred FK checks; the ALTER TABLEs after this step refuse pending trigger events.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(
            f"SELECT DISTINCT job_id, signal, stat, gpu_key, step_seconds FROM {_TABLE} WHERE data IS NULL"
        )
        for job_id, signal, stat, gpu_key, step in cursor.fetchall():
            cursor.execute(
                f'SELECT id, timestamps, "values" FROM {_TABLE} WHERE job_id = %s AND signal = %s '
                f"AND stat = %s AND gpu_key = %s AND step_seconds = %s AND data IS NULL",
                [job_id, signal, stat, gpu_key, step],
            )
            rows = cursor.fetchall()
            times: list[float] = []
            values: list[float] = []
            for _, ts, vals in rows:
                n = min(len(ts), len(vals))
                times += ts[:n]
                values += [np.nan if v is None else v for v in vals[:n]]
            chunks = _chunks(np.asarray(times, dtype=np.float64), np.asarray(values, dtype=np.float64), step)
            cursor.execute(f"DELETE FROM {_TABLE} WHERE id = ANY(%s)", [[r[0] for r in rows]])
            for start, arr in chunks.items():
                cursor.execute(
                    f'INSERT INTO {_TABLE} (job_id, signal, stat, gpu_key, step_seconds, start, "end", data) '
                    f"VALUES (%s, %s, %s, %s, %s, to_timestamp(%s), to_timestamp(%s), %s)",
                    [job_id, signal, stat, gpu_key, step, start, start + arr.size * step, arr.astype("<f4").tobytes()],
                )
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")


class Migration(migrations.Migration):
    dependencies = [("jobs", "0009_team_budget_promotion_override")]

    operations = [
        migrations.RemoveConstraint(model_name="jobseries", name="series_chunk_unique"),
        migrations.AddField(model_name="jobseries", name="data", field=models.BinaryField(null=True)),
        migrations.RunSQL(
            f'ALTER TABLE {_TABLE} ALTER COLUMN timestamps DROP NOT NULL, ALTER COLUMN "values" DROP NOT NULL',
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.RunPython(convert, migrations.RunPython.noop),
        migrations.RemoveField(model_name="jobseries", name="timestamps"),
        migrations.RemoveField(model_name="jobseries", name="values"),
        migrations.RenameField(model_name="jobseries", old_name="data", new_name="values"),
        migrations.AlterField(
            model_name="jobseries",
            name="values",
            field=models.BinaryField(
                help_text="little-endian float32; value i is the grid point start + (i + 1) x step; NaN = no sample"
            ),
        ),
        migrations.AlterField(
            model_name="jobseries",
            name="start",
            field=models.DateTimeField(help_text="chunk start: a multiple of 240 x step (exclusive)"),
        ),
        migrations.AlterField(
            model_name="jobseries",
            name="end",
            field=models.DateTimeField(help_text="time of the chunk's last value"),
        ),
        migrations.AddConstraint(
            model_name="jobseries",
            constraint=models.UniqueConstraint(
                fields=("job", "signal", "stat", "gpu_key", "step_seconds", "start"), name="series_chunk_unique"
            ),
        ),
    ]
