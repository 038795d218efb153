"""The level an archive read assembles (`read._one_step`): the finest step covering (almost) as many coarse
windows as the best level, computed for all steps at once; checked against the per-step rule it replaced."""

from __future__ import annotations

import numpy as np
import pytest

from jobs.metrics.archive.layout import _EPS
from jobs.metrics.archive.read import _COVERAGE_SLACK, Chunk, _coverage, _decoded, _one_step

T0 = 1_780_000_000 // 21600 * 21600


def _chunk(step: int, first: float, values: np.ndarray, signal: str = "gpu_util") -> Chunk:
    data = np.asarray(values, dtype="<f4").tobytes()
    return Chunk(signal, "mean", "", step, first, len(values), data)


def _per_step_rule(chunks: list[Chunk], window: tuple[float, float] | None) -> int:
    """The rule as it read before: each step's chunks decoded on their own, coverage by np.unique."""
    by_step: dict[int, list[Chunk]] = {}
    for c in chunks:
        by_step.setdefault(c.step, []).append(c)
    coarsest = max(by_step)
    covered = {}
    for step, cs in by_step.items():
        values, times, _ = _decoded(cs)
        ok = np.isfinite(values)
        if window is not None:
            ok &= (times > window[0]) & (times - step < window[1])
        covered[step] = np.unique(np.ceil(times[ok] / coarsest - _EPS)).size
    best = max(covered.values())
    return min(s for s, c in covered.items() if c >= _COVERAGE_SLACK * best)


def _levels(rng: np.random.Generator, hour_gone: dict[int, float]) -> list[Chunk]:
    """Eight hours of two signals at each step (30 s rows in 2 h chunks), each hour missing from a level with
    that level's probability and a few single points missing anywhere."""
    chunks = []
    for step, share in hour_gone.items():
        gone = rng.random(8) < share
        for signal in ("gpu_util", "sm_active"):
            values = rng.random(8 * 3600 // step)
            values[np.repeat(gone, 3600 // step)] = np.nan
            values[rng.random(values.size) < 0.02] = np.nan
            per_chunk = min(240, values.size)
            for i in range(0, values.size, per_chunk):
                chunks.append(_chunk(step, T0 + step * (i + 1), values[i : i + per_chunk], signal))
    return chunks


@pytest.mark.parametrize("seed", range(40))
def test_the_level_chosen_is_the_one_the_per_step_rule_chooses(seed):
    rng = np.random.default_rng(seed)
    shares = {30: float(rng.choice([0.0, 0.2, 0.5, 1.0])), 300: float(rng.choice([0.0, 0.3])), 3600: 0.0}
    chunks = _levels(rng, shares)
    lo = T0 + float(rng.integers(0, 14400))
    for window in (None, (lo, lo + float(rng.integers(600, 14400)))):
        step, picked = _one_step(chunks, window)
        assert step == _per_step_rule(chunks, window)
        assert picked == [c for c in chunks if c.step == step]


def test_a_level_without_values_is_never_chosen_over_one_with_them():
    chunks = [_chunk(30, T0 + 30, np.full(20, np.nan)), _chunk(300, T0 + 300, np.ones(3))]
    assert _one_step(chunks)[0] == 300


def test_the_finer_level_wins_when_it_misses_under_five_percent_of_the_windows():
    fine = np.ones(240)
    fine[:12] = np.nan  # the first 12 of 240 30-s points: 1 of the 2 coarse (3600 s) windows only partly
    chunks = [_chunk(30, T0 + 30, fine), _chunk(3600, T0 + 3600, np.ones(2))]
    assert _one_step(chunks)[0] == 30
    gone = np.ones(240)
    gone[:120] = np.nan  # the whole first hour missing at 30 s: 1 of 2 windows covered
    assert _one_step([_chunk(30, T0 + 30, gone), _chunk(3600, T0 + 3600, np.ones(2))])[0] == 3600


@pytest.mark.parametrize("spread", [1, 10**9])  # windows of a few hours (the table), of decades (the sort)
def test_coverage_counts_each_steps_distinct_windows_by_either_route(spread: int) -> None:
    rng = np.random.default_rng(spread)
    steps = [30, 300, 3600, 21600]
    rank = rng.integers(0, 3, 5000)  # the last step has no values: it counts 0
    windows = 493_000 + rng.integers(0, 40, 5000) * spread
    expected = {
        s: len({w for r, w in zip(rank, windows, strict=True) if r == i}) for i, s in enumerate(steps)
    }
    assert _coverage(rank, windows, steps) == expected
    assert expected[21600] == 0 and min(expected[s] for s in steps[:3]) == 40


def test_coverage_of_no_values_is_zero_for_every_step() -> None:
    empty = np.array([], dtype=np.int64)
    assert _coverage(empty, empty, [30, 300]) == {30: 0, 300: 0}
