"""Cutting a cycle's jobs into shards and each shard's part of the cycle's shared reads (no database)."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from jobs.evaluation.cycle import CycleContext, RecentThroughput
from jobs.pipeline.shards import ShardSpec, batches, context_for


def test_batches_cover_every_job_once_in_order_and_refuse_an_empty_shard():
    assert batches([5, 1, 9, 7, 3], 2) == [(5, 1), (9, 7), (3,)]
    assert batches([], 3) == []
    with pytest.raises(ValueError, match="at least one job"):
        batches([1], 0)


def test_a_shards_context_holds_only_its_jobs_reads_and_no_repairs():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    ts = np.array([0.0, 30.0])
    throughput = {1: RecentThroughput(ts), 2: RecentThroughput(ts)}
    shared = CycleContext(now, recent_start={1: 0.0, 2: 30.0}, mig={2: {"g": ("0", "1")}},
                          throughput=throughput, progress=frozenset({1, 2}),
                          repairs={1: (ts, ts, 30.0)})  # fmt: skip
    mine = context_for(shared, [2])
    assert mine is not None and mine.now == now
    assert mine.recent_start == {2: 30.0} and set(mine.throughput) == {2} and mine.mig == shared.mig
    assert mine.progress == frozenset({2}) and mine.repairs == {}
    assert mine.lookups is shared.lookups  # the memo (GPU models, prices) is shared, it is small
    assert shared.recent_start == {1: 0.0, 2: 30.0}  # the cycle's own context is left whole
    assert context_for(None, [1]) is None


def test_a_shard_spec_travels_as_json_arguments():
    spec = ShardSpec("abc", 3, (4, 5), datetime(2026, 1, 1, 0, 1, tzinfo=UTC))
    assert spec.args() == ["abc", 3, [4, 5], "2026-01-01T00:01:00+00:00"]
    assert datetime.fromisoformat(spec.args()[3]) == spec.now
