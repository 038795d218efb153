"""`events.unique_inverse` (counting for small non-negative codes) returns exactly `np.unique(...,
return_inverse=True)`, for every integer dtype and for values it must hand back to numpy."""

from __future__ import annotations

import numpy as np
import pytest

from jobs.profiling.events import unique_inverse


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.uint64])
@pytest.mark.parametrize("high", [1, 40, 5000, 10**9])  # dense codes, sparse codes, far beyond the size
def test_unique_inverse_equals_numpys(dtype: type, high: int) -> None:
    rng = np.random.default_rng(high)
    for low in (0, -3):
        values: np.ndarray = rng.integers(low, high + 1, size=700).astype(dtype)  # int8 wraps: negatives
        got, want = unique_inverse(values), np.unique(values, return_inverse=True)
        assert got[0].dtype == want[0].dtype and got[1].dtype == want[1].dtype
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()


def test_unique_inverse_of_nothing_floats_and_masks_is_numpys() -> None:
    for values in (np.zeros(0, dtype=np.int32), np.array([2.5, 1.0, 2.5]), np.array([True, False, True])):
        got, want = unique_inverse(values), np.unique(values, return_inverse=True)
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
