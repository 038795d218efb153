"""What one poll cycle reads once for all its evaluations, instead of once per job in `load_context`.

`jobs.pipeline.poll._poll_cycle` builds a `CycleContext` (`jobs.pipeline.reads.prepare_cycle`) after the
cycle's signals are read and passes it down store_poll -> evaluate_and_store -> read_inputs and
load_context. It holds

- `mig`: each job's MIG instances, read in one query per batch of jobs (`mig.mig_instances_of`);
- `throughput`: each job's throughput on its new window, one query per distinct groupable template (and
  batch of ids) instead of one query per job over its whole window (`reads.read_recent_throughput`);
- `recent_start`: where each job's new window starts; `reads.read_inputs` takes the earlier part of the
  grid from the archived derived series, and records in `repairs` the earlier part it had to read in
  full (the archive did not hold it from the same query), for the cycle to archive;
- `lookups`: a memo of the database look-ups whose answer depends on a key shared by many jobs (price
  book entries per GPU model and tier, the active baseline per team and config fingerprint, GPU models by id);
- `per_job`: rows of the context's jobs read in one query per kind instead of one per job (#26 item 2: the
  alert rules' open incidents, findings and baseline bands, jobs.alerts.incidents). A job's entry is
  removed when it is used (`rows`): a second evaluation of the same job in the same context reads its own.

It lives for one cycle only: prices, baselines and MIG layouts can change between cycles, and nothing
here is global. The per-job paths (poll_job, finalize, re-evaluation) pass no context and read as before.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import numpy as np

from jobs.evaluation.schema import DERIVED_THROUGHPUT
from jobs.metrics.prometheus import PrometheusError
from jobs.metrics.signals import JobSignals
from jobs.models import Job

T = TypeVar("T")


class Lookups:
    """Memo of look-ups keyed by what their answer depends on, for one cycle (`get` computes a key once)."""

    def __init__(self) -> None:
        self._values: dict[Hashable, Any] = {}
        self.misses = 0

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The value for `key`, computed by `compute` the first time it is asked for."""
        if key not in self._values:
            self.misses += 1
            self._values[key] = compute()
        value: T = self._values[key]
        return value

    def put(self, key: Hashable, value: Any) -> None:
        """Prime the memo with a value already at hand (the cycle's jobs come with their GPU models)."""
        self._values.setdefault(key, value)


@dataclass(frozen=True, slots=True)
class RecentThroughput:
    """A job's throughput read for the cycle on `timestamps` (its new window's grid): `values` (None when
    the query returned no series for the job), or the `error` the query raised."""

    timestamps: np.ndarray
    values: np.ndarray | None = None
    error: PrometheusError | None = None


@dataclass
class CycleContext:
    """One poll cycle's shared reads (see the module docstring)."""

    now: datetime
    recent_start: dict[int, float] = field(default_factory=dict)
    mig: dict[int, dict[str, tuple[str, str]]] = field(default_factory=dict)
    throughput: dict[int, RecentThroughput] = field(default_factory=dict)
    progress: frozenset[int] | None = None
    lookups: Lookups = field(default_factory=Lookups)
    repairs: dict[int, tuple[np.ndarray, np.ndarray, float]] = field(default_factory=dict)
    per_job: dict[str, dict[int, Any]] = field(default_factory=dict)

    def job_ids(self) -> list[int]:
        """The context's jobs (those with a new window), in the order the cycle stores them."""
        return list(self.recent_start)

    def rows(self, kind: str, read: Callable[[list[int]], dict[int, T]]) -> dict[int, T]:
        """The context's rows of `kind` by job pk, read for all its jobs by `read(job ids)` (which answers
        for each id it is given) the first time they are asked for. A caller pops its job's entry when it
        uses it: a job without one (outside the context, or taken already by an earlier evaluation in the
        same context) reads its own, as without a cycle."""
        held: dict[int, T] | None = self.per_job.get(kind)
        if held is None:
            held = self.per_job[kind] = dict(read(self.job_ids()))
        return held

    def repair_rows(self, jobs: dict[int, Job]) -> list[Any]:
        """Archive rows of the derived throughput read in full for a job whose archive did not hold the
        earlier part from its current query: written with the cycle's derived rows, so the next cycle can
        take that part from the archive."""
        from jobs.metrics import archive  # the archive writer only where rows are written

        rows: list[Any] = []
        for pk, (ts, values, step) in self.repairs.items():
            if pk in jobs and ts.size:
                part = JobSignals(float(ts[0]), float(ts[-1]), step, ts)
                rows += archive.derived_rows(jobs[pk], part, {DERIVED_THROUGHPUT: values})
        return rows
