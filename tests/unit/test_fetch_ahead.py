"""fetch_job_signals with its range queries sent ahead (a finalize's `fetcher`) against one by one: the
same signals, and every aggregate query sent before the first answer is read. No Prometheus, no database:
a canned client whose values depend on time and GPU, so a wrongly cut or joined range shows."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import numpy as np

from jobs.metrics.prometheus import Series
from jobs.metrics.promql import Selector
from jobs.metrics.signal_queries import fetch_job_signals, range_parts
from jobs.metrics.signals import COUNT, MAX, MEAN, MIN, grid

JOB = Selector.from_labels({"hpc_job": "7"})
PRESENT = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK"}
KEYS = ["gpu_util", "power_usage", "sm_clock", "sm_active"]  # sm_active absent, sm_clock without samples


class Canned:
    """Presence look-up and range answers from formulas of (time, GPU); SM_CLOCK answers no series."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def label_values(self, label: str, match: Any = (), start: Any = None, end: Any = None) -> list[str]:
        return sorted(PRESENT)

    def range(self, query: str, start: Any, end: Any, step: float | None = None) -> list[Series]:
        self.log.append(f"sent {query[:40]} {start:g}")
        if "SM_CLOCK" in query:
            return []
        ts = grid(float(start), float(end), float(step or 30))
        scale = 2.0 if "POWER" in query else 1.0
        if query.startswith(("avg by", "max by")):
            return [Series({"Hostname": "n", "gpu": str(g)}, ts, scale * (ts % 997) + g) for g in range(3)]
        stats = {MEAN: ts % 101, MIN: ts % 7, MAX: ts % 13, COUNT: np.full(ts.size, 3.0)}
        return [Series({"stat": k}, ts, scale * v) for k, v in stats.items()]


class _Logged(Future[Any]):
    def __init__(self, log: list[str], answer: Any) -> None:
        super().__init__()
        self.log = log
        self.set_result(answer)

    def result(self, timeout: float | None = None) -> Any:
        self.log.append("read")
        return super().result(timeout)


class Ahead:
    """A Submitter that answers at once but logs when an answer is read."""

    def __init__(self, client: Canned, log: list[str]) -> None:
        self.client = client
        self.log = log

    def submit(self, query: str, start: float, end: float, step: float) -> Future[Any]:
        return _Logged(self.log, self.client.range(query, start, end, step))


def _read(ahead: bool, log: list[str]) -> Any:
    client = Canned(log)
    return fetch_job_signals(
        client, JOB, 0.0, 7200.0, 60.0, keys=KEYS, per_gpu_step=300.0, max_samples=40, gpus_hint=3,
        fetcher=Ahead(client, log) if ahead else None,
    )  # fmt: skip


def test_signals_read_with_queries_sent_ahead_equal_those_read_one_by_one() -> None:
    one, ahead = _read(False, []), _read(True, [])
    assert list(ahead.signals) == list(one.signals) == ["gpu_util", "power_usage"]
    assert list(ahead.missing.items()) == list(one.missing.items())
    assert set(one.missing) == {"sm_clock", "sm_active"}
    for key, series in one.signals.items():
        mine = ahead.signals[key]
        assert series.stats.keys() == mine.stats.keys()
        for stat, values in series.stats.items():
            np.testing.assert_array_equal(mine.stats[stat], values, err_msg=f"{key} {stat}")
        assert mine.gpus == series.gpus and len(series.gpus) == 3
        np.testing.assert_array_equal(mine.per_gpu, series.per_gpu)
        np.testing.assert_array_equal(mine.gpu_timestamps, series.gpu_timestamps)
    # The values came through the cut: 121 points of 60 s in parts of 40 // (3 GPUs x 2 samples) = 6.
    np.testing.assert_array_equal(one.signals["gpu_util"].mean, grid(0.0, 7200.0, 60.0) % 101)


def test_every_aggregate_query_is_sent_before_the_first_answer_is_read() -> None:
    log: list[str] = []
    _read(True, log)
    first_read = log.index("read")
    aggregates = [i for i, line in enumerate(log) if line.startswith("sent") and "by (" not in line]
    per_gpu = [i for i, line in enumerate(log) if line.startswith("sent avg by")]
    assert len(aggregates) == 3 * 21  # 3 present signals x ceil(121 / 6) parts
    assert max(aggregates) < first_read < min(per_gpu)
    # Per-GPU rows only for the 2 signals with data: 25 points of 300 s, 3 GPUs x 10 samples per point,
    # so parts of max(2, 40 // 30) = 2 points: 13 parts each.
    assert len(per_gpu) == 2 * 13


def test_range_parts_cover_the_grid_once_in_parts_of_at_most_max_points() -> None:
    full = grid(100.0, 100.0 + 60.0 * 120, 60.0)
    parts = range_parts(100.0, 100.0 + 60.0 * 120, 60.0, 7)
    points = np.concatenate([grid(a, b, 60.0) for a, b in parts])
    np.testing.assert_array_equal(points, full)
    assert max(len(grid(a, b, 60.0)) for a, b in parts) == 7
