"""A poll cycle's per-job rows read once for all its jobs (#26 item 2, jobs.evaluation.cycle): each job's
rows handed out once, snapshots read in bounded batches in the cycle's order, a shard reading its own."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from jobs.evaluation import cycle as cycle_module
from jobs.evaluation.cycle import CycleContext
from jobs.pipeline.shards import context_for

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class _Reader:
    """A bulk read that records the job ids of each call and answers rows for each id."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def __call__(self, ids: list[int]) -> dict[int, list[str]]:
        self.calls.append(list(ids))
        return {pk: [f"row of {pk}"] if pk % 2 else [] for pk in ids}


def _context(*pks: int) -> CycleContext:
    return CycleContext(NOW, recent_start={pk: 0.0 for pk in pks})


def test_take_reads_every_jobs_rows_in_one_call_and_hands_each_out_once():
    ctx, read = _context(3, 1, 4), _Reader()
    assert ctx.take("findings", 1, read) == ["row of 1"]
    assert ctx.take("findings", 4, read) == []  # read, and none found: not None (no read of its own)
    assert ctx.take("findings", 3, read) == ["row of 3"]
    assert read.calls == [[3, 1, 4]]  # one read for the context's jobs, in the cycle's order
    # Taken already (a second evaluation in the same context) or not a job of the context: the caller reads.
    assert ctx.take("findings", 1, read) is None
    assert ctx.take("findings", 9, read) is None
    assert read.calls == [[3, 1, 4]]
    assert ctx.take("incidents", 4, read) == [] and len(read.calls) == 2  # each kind read once


def test_snapshots_are_read_in_batches_from_the_asked_job_on(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(cycle_module, "SNAPSHOT_BATCH", 2)
    ctx, read = _context(5, 6, 7, 8, 9), _Reader()
    assert ctx.snapshots_from(5, read) == ["row of 5"]
    assert ctx.snapshots_from(6, read) == []
    assert read.calls == [[5, 6]]  # at most SNAPSHOT_BATCH jobs held at once
    assert ctx.snapshots_from(8, read) == []  # a job asked out of order starts its own batch
    assert read.calls == [[5, 6], [8, 9]]
    assert ctx.snapshots_from(7, read) == ["row of 7"]  # 7 was skipped: read alone, 8 and 9 not again
    assert read.calls == [[5, 6], [8, 9], [7]]
    assert ctx.snapshots_from(9, read) == ["row of 9"]
    assert ctx.snapshots_from(9, read) is None  # taken already
    assert ctx.snapshots_from(42, read) is None  # not a job of this context
    assert len(read.calls) == 3


def test_a_shard_reads_its_own_jobs_rows_not_the_cycles():
    shared, read = _context(1, 2, 3), _Reader()
    mine = context_for(shared, [2, 3])
    assert mine is not None
    assert mine.take("findings", 3, read) == ["row of 3"]
    assert read.calls == [[2, 3]]
    assert shared.per_job == {}  # the cycle's context is not filled by its shard
