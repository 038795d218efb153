"""A poll cycle's per-job rows read once for all its jobs (#26 item 2, jobs.evaluation.cycle): each job's
rows handed out once, a shard reading its own jobs'."""

from __future__ import annotations

from datetime import UTC, datetime

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


def test_rows_are_read_once_for_every_job_of_the_context_and_each_jobs_taken_once():
    ctx, read = _context(3, 1, 4), _Reader()
    assert ctx.rows("findings", read).pop(1, None) == ["row of 1"]
    assert ctx.rows("findings", read).pop(4, None) == []  # read, none found: not None (no read of its own)
    assert ctx.rows("findings", read).pop(3, None) == ["row of 3"]
    assert read.calls == [[3, 1, 4]]  # one read for the context's jobs, in the cycle's order
    # Taken already (a second evaluation in the same context) or not a job of the context: the caller reads.
    assert ctx.rows("findings", read).pop(1, None) is None
    assert ctx.rows("findings", read).pop(9, None) is None
    assert read.calls == [[3, 1, 4]]
    assert ctx.rows("incidents", read).pop(4, None) == [] and len(read.calls) == 2  # each kind read once


def test_a_shard_reads_its_own_jobs_rows_not_the_cycles():
    shared, read = _context(1, 2, 3), _Reader()
    mine = context_for(shared, [2, 3])
    assert mine is not None
    assert mine.rows("findings", read).pop(3, None) == ["row of 3"]
    assert read.calls == [[2, 3]]
    assert shared.per_job == {}  # the cycle's context is not filled by its shard
