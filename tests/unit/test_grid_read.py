"""A query's values on an evaluation grid (jobs.metrics.grid_read.read_on_grid): the whole grid in one query,
or in a poll cycle the archived earlier part spliced with the new window, and the whole grid read again
(with its earlier part to repair the archive) when the archive cannot vouch for it. Pure: a stand-in
client, no Django, no Prometheus."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from jobs.metrics.grid_read import read_on_grid
from jobs.metrics.prometheus import PrometheusQueryError, Series

STEP = 30.0
TS = np.arange(0.0, 300.0, STEP)  # 10 grid points
SINCE = 150.0  # the new window: the last 5 points


class Client:
    """Answers every range query with one series whose value at t is t / 10, and records the windows."""

    def __init__(self, series: bool = True) -> None:
        self.timeout_s = 10.0
        self.series = series
        self.ranges: list[tuple[float, float]] = []

    def range(self, query: str, start: float, end: float, step: float) -> list[Series]:
        self.ranges.append((start, end))
        if not self.series:
            return []
        ts = np.arange(start, end + step / 2, step)
        return [Series({}, ts, ts / 10.0)]


@dataclass(frozen=True)
class Recent:
    timestamps: np.ndarray
    values: np.ndarray | None = None
    error: Exception | None = None


def _read(
    client: Client,
    since: float | None = None,
    earlier: np.ndarray | None = None,
    recent: Recent | None = None,
) -> tuple[np.ndarray | None, tuple[np.ndarray, np.ndarray] | None]:
    got = read_on_grid(client, "q", TS, STEP, timeout_s=2.0, since=since, earlier=earlier, recent=recent)  # type: ignore[arg-type]
    return got.values, got.repair


def test_without_a_new_window_the_whole_grid_is_one_query() -> None:
    client = Client()
    values, repair = _read(client)
    np.testing.assert_allclose(values, TS / 10.0)
    assert client.ranges == [(0.0, 270.0)] and repair is None
    assert client.timeout_s == 10.0  # the query's own timeout applied only while it ran


def test_the_earlier_part_comes_from_the_archive_and_the_new_window_from_the_cycles_read() -> None:
    client = Client()
    earlier = np.full(TS.size, 7.0)  # what the archive holds (a different value, to see where it lands)
    recent = Recent(TS[TS >= SINCE], TS[TS >= SINCE] / 10.0)
    values, repair = _read(client, since=SINCE, earlier=earlier, recent=recent)
    assert values is not None and client.ranges == [] and repair is None
    np.testing.assert_allclose(values[TS < SINCE], 7.0)
    np.testing.assert_allclose(values[TS >= SINCE], TS[TS >= SINCE] / 10.0)


def test_a_new_window_the_cycle_did_not_read_is_read_alone() -> None:
    client = Client()
    values, _ = _read(client, since=SINCE, earlier=np.full(TS.size, 7.0), recent=None)
    assert client.ranges == [(150.0, 270.0)]
    np.testing.assert_allclose(values[TS >= SINCE], TS[TS >= SINCE] / 10.0)


def test_an_archive_that_cannot_vouch_makes_one_whole_read_and_a_repair_of_its_earlier_part() -> None:
    client = Client()
    values, repair = _read(client, since=SINCE, earlier=None, recent=Recent(TS[TS >= SINCE], TS[TS >= SINCE]))
    assert client.ranges == [(0.0, 270.0)]
    np.testing.assert_allclose(values, TS / 10.0)
    assert repair is not None
    np.testing.assert_array_equal(repair[0], TS[TS < SINCE])
    np.testing.assert_allclose(repair[1], TS[TS < SINCE] / 10.0)


def test_an_archive_on_another_grid_cannot_vouch_either() -> None:
    client = Client()
    _read(client, since=SINCE, earlier=np.full(TS.size - 1, 7.0))
    assert client.ranges == [(0.0, 270.0)]


def test_no_series_anywhere_is_none_not_zero() -> None:
    values, repair = _read(Client(series=False), since=SINCE, earlier=np.full(TS.size, np.nan))
    assert values is None and repair is None


def test_the_cycles_error_for_the_new_window_is_raised_as_the_query_would() -> None:
    error = PrometheusQueryError("bad_data: parse error")
    with pytest.raises(PrometheusQueryError):
        _read(Client(), since=SINCE, earlier=np.full(TS.size, 7.0), recent=Recent(TS, error=error))
