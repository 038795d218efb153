"""A PromQL query's values on an evaluation's grid, read before the evaluation runs (the driver's read
step, jobs.pipeline.reads): in one range query over the whole grid, or, in a poll cycle, only from the
new window on, the part before it taken from the archive where earlier polls stored this query's values.

Why the splice equals the whole-grid query: a range query's value at a grid time depends only on that
time, and each earlier poll archived its own window of the same query's values (float32 in the archive:
the earlier part agrees to ~1e-7 relative). The caller decides whether the archive holds this query's
values (`earlier`); when it cannot vouch for them, the whole grid is read and its earlier part returned as
a `repair` for the caller to archive."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from jobs.metrics.prometheus import PrometheusClient, read_summed
from jobs.metrics.sampling import positions_on_grid


class RecentRead(Protocol):
    """The new window already read for a poll cycle (jobs.evaluation.cycle.RecentThroughput): its grid,
    its values (None: no series) or the error its query raised."""

    @property
    def timestamps(self) -> np.ndarray: ...

    @property
    def values(self) -> np.ndarray | None: ...

    @property
    def error(self) -> Exception | None: ...


@dataclass(frozen=True, slots=True)
class GridRead:
    """What `read_on_grid` found: `values` on the grid (None when the query returned no series), and
    `repair`, the (timestamps, values) of the earlier part it had to read in full (None when it did not)."""

    values: np.ndarray | None
    repair: tuple[np.ndarray, np.ndarray] | None = None


def read_on_grid(
    client: PrometheusClient,
    query: str,
    ts: np.ndarray,
    step: float,
    *,
    timeout_s: float,
    since: float | None = None,
    earlier: np.ndarray | None = None,
    recent: RecentRead | None = None,
) -> GridRead:
    """`query` summed on the grid `ts` (`read_summed`, within `timeout_s`).

    `since` None: the whole grid in one query. Otherwise (a poll cycle) the grid before `since` comes from
    `earlier` (the archived values on `ts`, NaN where the archive says the query had no series) and the
    rest from `recent` (the cycle's grouped read of the new window) or, when that does not cover it, one
    query over the new window. `earlier` None or not on `ts`: the whole grid is read, and its earlier part
    returned as `repair`. An error `recent` holds is raised as the query's own would be."""
    if since is None:
        return GridRead(read_summed(client, query, ts, step, timeout_s=timeout_s))
    before = ts < since
    if before.any() and (earlier is None or earlier.size != ts.size):
        values = read_summed(client, query, ts, step, timeout_s=timeout_s)
        return GridRead(values, (ts[before], values[before]) if values is not None else None)
    tail_ts = ts[~before]
    tail: np.ndarray | None = None
    if tail_ts.size:
        idx = positions_on_grid(recent.timestamps, tail_ts) if recent is not None else None
        if recent is not None and recent.error is not None:
            raise recent.error
        if recent is not None and idx is not None:
            tail = recent.values[idx] if recent.values is not None else None
        else:
            tail = read_summed(client, query, tail_ts, step, timeout_s=timeout_s)
    out = np.full(ts.size, np.nan)
    if earlier is not None and before.any():
        out[before] = earlier[before]
    if tail is not None:
        out[~before] = tail
    return GridRead(out if tail is not None or np.isfinite(out).any() else None)
