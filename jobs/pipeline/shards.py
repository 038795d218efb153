"""Shards of a poll cycle (#26 item 1): the cycle reads Prometheus once for the cluster and archives what
it read (jobs.pipeline.poll), then hands each batch of jobs' evaluation, diagnosis and alert rules to the
`poll` queue as a `jobs.tasks.poll_shard` task, so N worker processes (on one machine or many) share the
per-job work through Celery.

Safe against a worker dying mid-shard:
- inputs: the cycle stores each shard's Prometheus reads (the jobs' `JobSignals`, window ends, the cycle's
  shared reads for them) in the cache (Redis in deployments) for POLL_SHARD_TTL_S, where a redelivered
  task finds them; past that TTL the shard re-reads its jobs' windows per job (`poll_job`);
- delivery: tasks are acks_late with reject-on-worker-lost (efficiency/settings.py), so a shard whose
  process died is delivered again;
- writes: a shard's per-job writes are idempotent (the archive merges, the job row is recomputed from the
  archive under its row lock, `diagnosed_at` makes a second run skip the diagnosis), so running a shard
  twice leaves the state one run leaves; a job a newer cycle already polled is left alone;
- completion: each shard writes a done marker (with its polled and stale jobs) when its work is stored;
  the cycle waits for all markers under its heartbeat lock (jobs.runtime.locks), at most POLL_SHARD_WAIT_S.
  If the
  cycle's own process dies while waiting, its lock expires within POLL_CYCLE_LOCK_TTL_S and the shards
  already queued still run: the next cycle re-reads from each job's `data_until`, so nothing is lost.

Why Celery and not threads or a home-made scheduler: the per-job work is Python and Postgres bound (one
core per process), and the poll queue's workers already exist, scale by processes or machines, and
redeliver lost tasks.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.cache import cache

from jobs.evaluation.cycle import CycleContext
from jobs.metrics.signals import JobSignals

#: The Celery task a shard runs as (sent by name: the pipeline does not import the task layer).
SHARD_TASK = "jobs.tasks.poll_shard"
_PREFIX = "efficiency:poll_shard"


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """One shard of one cycle: what the task's arguments carry (JSON: ids and an ISO time)."""

    cycle_id: str
    index: int
    job_ids: tuple[int, ...]
    now: datetime

    def args(self) -> list[Any]:
        """The task's positional arguments."""
        return [self.cycle_id, self.index, list(self.job_ids), self.now.isoformat()]


@dataclass(slots=True)
class ShardInput:
    """What the cycle read for a shard's jobs: per job pk its signals and window end, whether the cycle's
    archive write already holds their rows, and the cycle's shared reads restricted to these jobs."""

    signals: dict[int, tuple[JobSignals, float]]
    archived_rows: bool
    context: CycleContext | None


def new_cycle_id() -> str:
    """A random id for one cycle's shards (their cache keys)."""
    return uuid.uuid4().hex


def batches(keys: Sequence[int], size: int) -> list[tuple[int, ...]]:
    """`keys` cut into consecutive batches of at most `size` (size >= 1)."""
    if size < 1:
        raise ValueError(f"a shard holds at least one job, got {size}")
    ordered = list(keys)
    return [tuple(ordered[i : i + size]) for i in range(0, len(ordered), size)]


def context_for(shared: CycleContext | None, keys: Sequence[int]) -> CycleContext | None:
    """The cycle's shared reads for a shard's jobs only (each shard stores its own part, not the whole
    cycle's throughput and MIG reads)."""
    if shared is None:
        return None
    mine = set(keys)
    return replace(
        shared,
        recent_start={k: v for k, v in shared.recent_start.items() if k in mine},
        mig={k: v for k, v in shared.mig.items() if k in mine},
        throughput={k: v for k, v in shared.throughput.items() if k in mine},
        progress=None if shared.progress is None else frozenset(shared.progress & mine),
        repairs={},
        per_job={},  # rows read for the cycle's jobs: each shard reads its own jobs' (CycleContext.take)
    )


def _input_key(cycle_id: str, index: int) -> str:
    return f"{_PREFIX}:{cycle_id}:{index}:input"


def _done_key(cycle_id: str, index: int) -> str:
    return f"{_PREFIX}:{cycle_id}:{index}:done"


def store_input(spec: ShardSpec, data: ShardInput) -> None:
    """Keep a shard's inputs where a (re)delivered task finds them, for POLL_SHARD_TTL_S."""
    cache.set(_input_key(spec.cycle_id, spec.index), data, settings.POLL_SHARD_TTL_S)


def load_input(spec: ShardSpec) -> ShardInput | None:
    """A shard's inputs, or None when they expired (the shard then re-reads its jobs)."""
    found = cache.get(_input_key(spec.cycle_id, spec.index))
    return found if isinstance(found, ShardInput) else None


def mark_done(spec: ShardSpec, polled: Sequence[str], stale: Sequence[str]) -> None:
    """Record that a shard's work is stored (the cycle waits for these markers)."""
    cache.set(_done_key(spec.cycle_id, spec.index), {"polled": list(polled), "stale": list(stale)},
              settings.POLL_SHARD_TTL_S)  # fmt: skip


def send(spec: ShardSpec) -> None:
    """Queue a shard as a Celery task (routed to the poll queue by efficiency.queues)."""
    from celery import current_app

    current_app.send_task(SHARD_TASK, args=spec.args())


def wait(
    specs: Sequence[ShardSpec], timeout_s: float, *, poll_s: float = 0.05
) -> tuple[dict[int, Mapping[str, list[str]]], list[int]]:
    """The done markers of `specs` (by shard index) once all are there or `timeout_s` passed, and the
    indexes still pending then."""
    keys = {_done_key(s.cycle_id, s.index): s.index for s in specs}
    deadline = time.monotonic() + timeout_s
    found: dict[int, Mapping[str, list[str]]] = {}
    while True:
        missing = [k for k, i in keys.items() if i not in found]
        for key, value in cache.get_many(missing).items():
            found[keys[key]] = value
        if len(found) == len(keys) or time.monotonic() >= deadline:
            return found, sorted(i for i in keys.values() if i not in found)
        time.sleep(poll_s)


#: How a cycle hands a shard to the workers: `send` (Celery) unless a caller passes its own (tests run
#: shards in-process, simulating a worker's death and the broker's redelivery).
Dispatch = Callable[[ShardSpec], None]
