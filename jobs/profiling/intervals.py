"""Vectorised interval arithmetic on [start, end) nanosecond intervals.

An "interval set" is a pair of int64 arrays (starts, ends), sorted and disjoint once `union` made it so.
Everything is O(n log n) numpy: the 20k-kernel traces we see take milliseconds.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
Intervals = tuple[I64, I64]

EMPTY: Intervals = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def union(starts: I64, ends: I64, *, keep_empty: bool = False) -> Intervals:
    """Merge possibly overlapping intervals into a sorted, disjoint set.

    Touching intervals (one ends where the next starts) merge, as HTA's `merge_kernel_intervals` does.
    Zero- and negative-length intervals are dropped (they cover no time) unless `keep_empty`, which
    reproduces HTA exactly: it keeps them, so a lone negative-length interval (an artefact of its
    microsecond rounding) becomes a "merged" interval of negative length.
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if not keep_empty:
        keep = ends > starts
        if not keep.all():
            starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    running_end = np.maximum.accumulate(e)
    # A new merged interval begins where the start is beyond every earlier end.
    new_group = np.empty(s.size, dtype=bool)
    new_group[0] = True
    new_group[1:] = s[1:] > running_end[:-1]
    first = np.flatnonzero(new_group)
    return s[first], np.maximum.reduceat(e, first)


def total(intervals: Intervals) -> int:
    """Summed length of a disjoint interval set (negative lengths count, see `union(keep_empty=True)`)."""
    s, e = intervals
    return int((e - s).sum()) if s.size else 0


def _combine(a: Intervals, b: Intervals, want: int) -> Intervals:
    """Sweep two disjoint sets; keep time where the coverage code equals `want` (1: only a, 3: both)."""
    if a[0].size == 0 and b[0].size == 0:
        return EMPTY
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    deltas = np.concatenate(
        [
            np.full(a[0].size, 1, dtype=np.int64),
            np.full(a[1].size, -1, dtype=np.int64),
            np.full(b[0].size, 2, dtype=np.int64),
            np.full(b[1].size, -2, dtype=np.int64),
        ]
    )
    order = np.argsort(times, kind="stable")
    times, deltas = times[order], deltas[order]
    code = np.cumsum(deltas)
    seg_start, seg_end, seg_code = times[:-1], times[1:], code[:-1]
    mask = (seg_code == want) & (seg_end > seg_start)
    if not mask.any():
        return EMPTY
    return union(seg_start[mask], seg_end[mask])


def _is_set(a: Intervals) -> bool:
    """Sorted, non-overlapping (touching allowed) and no negative length: what `union` returns. Then the
    sweep's coverage count of `a` is 0 or 1 everywhere, so set arithmetic gives what the sweep gives."""
    s, e = a
    return bool((e >= s).all() and (s[1:] >= e[:-1]).all())


def _merge_touching(s: I64, e: I64) -> Intervals:
    """Sorted, non-overlapping, positive-length intervals with the touching ones merged (`union`'s form)."""
    if s.size == 0:
        return EMPTY
    first = np.flatnonzero(np.concatenate(([True], s[1:] > e[:-1])))
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], e[last]


def _overlaps(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two sets (`_is_set`): each interval of `a` against the run of `b` it overlaps,
    found by binary search, so no sort of the merged boundaries (4x faster than the sweep at 50k)."""
    a_s, a_e = a
    b_s, b_e = b
    lo = np.searchsorted(b_e, a_s, side="right")  # first b ending after the a interval starts
    hi = np.searchsorted(b_s, a_e, side="left")  # first b starting at or after it ends
    counts = np.maximum(hi - lo, 0)
    pieces = int(counts.sum())
    if pieces == 0:
        return EMPTY
    ai = np.repeat(np.arange(a_s.size), counts)
    bi = lo[ai] + (np.arange(pieces) - np.repeat(np.cumsum(counts) - counts, counts))
    s = np.maximum(a_s[ai], b_s[bi])
    e = np.minimum(a_e[ai], b_e[bi])
    # Pieces come sorted and apart (both inputs are); empty ones (touching ends) are dropped.
    keep = e > s
    return _merge_touching(s[keep], e[keep])


_INT64 = np.iinfo(np.int64)


def _gaps(b: Intervals) -> Intervals:
    """The complement of a set (`_is_set`), from -inf to +inf as the int64 extremes."""
    b_s, b_e = b
    return np.concatenate(([_INT64.min], b_e)), np.concatenate((b_s, [_INT64.max]))


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Time covered by both disjoint sets."""
    if a[0].size == 0 or b[0].size == 0:
        return EMPTY
    if _is_set(a) and _is_set(b):
        return _overlaps(a, b)
    return _combine(a, b, 3)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """Time covered by `a` but not by `b` (both disjoint sets)."""
    if a[0].size == 0:
        return EMPTY
    if b[0].size == 0:
        return a
    if _is_set(a) and _is_set(b):
        return _overlaps(a, _gaps(b))
    return _combine(a, b, 1)


def clip(a: Intervals, lo: int, hi: int) -> Intervals:
    """The part of a disjoint set inside [lo, hi)."""
    s, e = a
    if s.size == 0 or hi <= lo:
        return EMPTY
    s2 = np.maximum(s, lo)
    e2 = np.minimum(e, hi)
    keep = e2 > s2
    return s2[keep], e2[keep]


def overlap_with_bins(a: Intervals, edges: I64) -> I64:
    """Covered time of a disjoint set inside each bin [edges[i], edges[i+1]).

    Uses the cumulative coverage function: covered(t) = time covered before t, evaluated at the edges.
    """
    s, e = a
    if s.size == 0:
        return np.zeros(max(edges.size - 1, 0), dtype=np.int64)
    cum_len = np.concatenate([[0], np.cumsum(e - s)])

    def covered_before(t: I64) -> I64:
        # Index of the last interval starting at or before t.
        idx = np.searchsorted(s, t, side="right") - 1
        out = np.zeros(t.size, dtype=np.int64)
        valid = idx >= 0
        iv = idx[valid]
        out[valid] = cum_len[iv] + np.minimum(t[valid], e[iv]) - s[iv]
        return out

    cov = covered_before(np.asarray(edges, dtype=np.int64))
    return np.diff(cov)


def coverage_by_code(sets: list[Intervals]) -> dict[int, int]:
    """Time covered by each combination of disjoint sets: {bitmask of the sets covering: ns}.

    Set i contributes bit 1 << i, so with [compute, comm] the key 3 is "compute overlapping comm".
    Time covered by none of the sets is not reported.
    """
    parts_t: list[I64] = []
    parts_d: list[I64] = []
    for i, (s, e) in enumerate(sets):
        parts_t += [s, e]
        parts_d += [np.full(s.size, 1 << i, dtype=np.int64), np.full(e.size, -(1 << i), dtype=np.int64)]
    if not parts_t:
        return {}
    times = np.concatenate(parts_t)
    if times.size == 0:
        return {}
    deltas = np.concatenate(parts_d)
    order = np.argsort(times, kind="stable")
    times, deltas = times[order], deltas[order]
    code = np.cumsum(deltas)[:-1]
    lengths = np.diff(times)
    keep = (code > 0) & (lengths > 0)
    out: dict[int, int] = {}
    if keep.any():
        # The codes are small bitmasks: bin by code directly (np.unique sorted them all first). Each bin
        # still sums its lengths in timeline order, so the float sums are the same as before.
        kept = code[keep]
        sums = np.bincount(kept, weights=lengths[keep].astype(np.float64))
        present = np.flatnonzero(np.bincount(kept))
        out = {int(c): round(v) for c, v in zip(present.tolist(), sums[present].tolist(), strict=True)}
    return out
