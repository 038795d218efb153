"""Interval arithmetic: the binary-search intersection and difference give exactly what the boundary sweep
(`intervals._combine`, the reference every analysis used before) gives, on sets of every shape."""

from __future__ import annotations

import numpy as np
import pytest

from jobs.profiling import intervals as iv

EPOCH_NS = 1_669_783_687_464_181_000  # a real trace's clock: values near int64's top third


def _random_set(rng: np.random.Generator, n: int, shape: str) -> iv.Intervals:
    """A set of `n` intervals: "union" (as analyses build them), "touching" (ends equal to the next start,
    zero-length ones among them), or "raw" (overlapping, unsorted: not a set, the sweep decides)."""
    starts = EPOCH_NS + rng.integers(0, 50 * n + 1, size=n)
    lengths = rng.integers(0, 40, size=n)
    if shape == "union":
        return iv.union(starts, starts + lengths)
    if shape == "touching":
        edges = np.sort(EPOCH_NS + rng.integers(0, 30 * n + 1, size=2 * n))
        s, e = edges[0::2], edges[1::2]
        e[:-1] = np.where(rng.random(n - 1) < 0.3, s[1:], e[:-1])  # some end exactly where the next starts
        return s.astype(np.int64), e.astype(np.int64)
    return starts.astype(np.int64), (starts + lengths - 5).astype(np.int64)  # negative lengths too


@pytest.mark.parametrize("seed", range(40))
def test_intersect_and_subtract_equal_the_boundary_sweep(seed: int) -> None:
    rng = np.random.default_rng(seed)
    shapes = ("union", "touching", "raw")
    a = _random_set(rng, int(rng.integers(1, 400)), shapes[seed % 3])
    b = _random_set(rng, int(rng.integers(1, 400)), shapes[(seed // 3) % 3])
    for got, want in ((iv.intersect(a, b), iv._combine(a, b, 3)), (iv.subtract(a, b), iv._combine(a, b, 1))):
        assert got[0].dtype == want[0].dtype == np.int64
        assert got[0].tolist() == want[0].tolist()
        assert got[1].tolist() == want[1].tolist()


def test_intersection_pieces_touching_across_intervals_merge_as_union_does() -> None:
    # [0,10) and [10,20) in a meet [5,15) in b: one piece [5,15), not two touching ones.
    a = (np.array([0, 10]), np.array([10, 20]))
    b = (np.array([5]), np.array([15]))
    inter = iv.intersect(a, b)
    assert (inter[0].tolist(), inter[1].tolist()) == ([5], [15])
    diff = iv.subtract(a, b)
    assert (diff[0].tolist(), diff[1].tolist()) == ([0, 15], [5, 20])
    assert iv.subtract(a, (np.array([0]), np.array([20])))[0].size == 0


@pytest.mark.parametrize("seed", range(20))
def test_coverage_by_code_sums_each_combination_of_sets_like_a_per_nanosecond_count(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sets = []
    for _ in range(int(rng.integers(1, 5))):
        starts = rng.integers(0, 2000, size=int(rng.integers(1, 60)))
        sets.append(iv.union(starts, starts + rng.integers(0, 80, size=starts.size)))
    code = np.zeros(2100, dtype=np.int64)  # which sets cover each nanosecond [t, t+1)
    for i, (s, e) in enumerate(sets):
        for lo, hi in zip(s.tolist(), e.tolist(), strict=True):
            code[lo:hi] |= 1 << i
    expected = {int(c): int((code == c).sum()) for c in np.unique(code) if c}
    assert iv.coverage_by_code(sets) == expected
