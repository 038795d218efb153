"""Which GPU each row of an nvidia-smi log is, when the log has no `index`, `uuid` or `pci.bus_id` column.

Pure (numpy only). `nvidia-smi --query-gpu=... --format=csv -l N` (or `-lms N`) prints one *sweep* per
interval: one row per GPU, always in the same order (the device enumeration order), each row stamped when
that GPU was queried. With `-lms` the rows of one sweep carry their own millisecond timestamps a few ms
apart (`...31.703`, `...31.708`), so "same timestamp = same sweep" is wrong; what holds is that the gaps
inside a sweep (the query time of one GPU: milliseconds) are much shorter than the gaps between sweeps
(the interval the user asked for). The evidence used here:

1. Gaps between consecutive rows fall into two groups, short (inside a sweep: at most MAX_IN_SWEEP_GAP_S)
   and long (between sweeps), split where the two groups separate best on a log scale (Otsu's
   criterion). Groups at least SEPARATION times apart must form sweeps (else the log is refused); groups
   WEAK_SEPARATION to SEPARATION apart are kept only when they do form regular sweeps (else they are one
   GPU's jittered samples); otherwise every gap is of one kind (one GPU, or one sweep).
2. Sweeps are the runs of rows between long gaps; the GPU count is the most common sweep size, and
   nearly all rows (at least MIN_REGULAR_SHARE) must sit in sweeps of exactly that size.
3. Rows of a sweep are the GPUs in order 0..n-1. A short last sweep (the file was cut mid-sweep) keeps its
   first GPUs; any other irregular sweep cannot be placed (which GPU is missing?) and its rows are left
   out and counted; too many of those and the grouping is refused.
4. Every GPU must end with the same number of samples, within SAMPLE_COUNT_TOLERANCE.

When the evidence does not hold, `assign_by_sweeps` raises AmbiguousSweeps with what it saw, so the user
can add `index` to --query-gpu instead of getting rows assigned to GPUs at random.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

#: nvidia-smi prints milliseconds; custom loggers may print whole seconds. Gaps are compared above this.
TIME_RESOLUTION_S = 0.001
#: Short and long gaps must be at least this many times apart to be told apart (a 2-GPU `-lms 100` log:
#: ~5 ms inside a sweep, ~95 ms between sweeps, 19x; whole-second stamps of a `-l 1` log: 0 s vs 1 s).
SEPARATION = 3.0
#: Below SEPARATION, short and long gaps at least this many times apart are still tried as sweeps, and
#: kept only when nearly all rows form sweeps of one size (a 4-GPU `-lms 100` log whose GPUs take 40 ms
#: each to query: 40 ms inside a sweep, 100 ms between, 2.5x); otherwise the rows are one GPU's samples
#: with jitter.
WEAK_SEPARATION = 1.5
#: Share of the rows that must sit in complete sweeps of the GPU count.
MIN_REGULAR_SHARE = 0.95
#: GPUs may end with sample counts this far apart (absolute, or this share of the largest count).
SAMPLE_COUNT_TOLERANCE = 3
SAMPLE_COUNT_TOLERANCE_SHARE = 0.01
#: More GPUs than this in one sweep is not a GPU count (HGX/DGX hosts have 8, DGX-2 16; GB200 NVL72
#: trays show 4 per host).
MAX_SWEEP_GPUS = 16
#: Gaps inside a sweep are the time nvidia-smi takes to query one GPU (milliseconds); a "short" gap longer
#: than this is a logging interval, so the rows are one GPU's samples with some longer pauses between.
MAX_IN_SWEEP_GAP_S = 0.5
#: Short gaps at least this long (median) are a logging interval rather than query time (`-lms 50` is
#: about the fastest anyone logs).
MIN_INTERVAL_S = 0.05

ADD_INDEX = (
    "add `index` (or `uuid`, `pci.bus_id`) to --query-gpu, e.g. "
    "nvidia-smi --query-gpu=timestamp,index,utilization.gpu,power.draw,memory.used --format=csv -lms 100"
)


class AmbiguousSweeps(ValueError):
    """The rows cannot be told apart by GPU from their timestamps; the message says why and what to do."""


@dataclass
class Sweeps:
    """Each row's GPU position (-1: left out) and the evidence behind the grouping."""

    positions: np.ndarray
    gpu_count: int
    sweeps: int
    method: str
    split_s: float | None = None
    short_gap_max_s: float | None = None
    long_gap_min_s: float | None = None
    unplaced_rows: int = 0
    irregular_sweeps: int = 0
    truncated_last_sweep: bool = False
    samples_per_gpu: list[int] = field(default_factory=list)

    def describe(self) -> dict[str, object]:
        """The analysis' `gpu_assignment` block."""
        return {
            "method": self.method,
            "gpu_count": self.gpu_count,
            "sweeps": self.sweeps,
            "split_s": _r(self.split_s),
            "short_gap_max_s": _r(self.short_gap_max_s),
            "long_gap_min_s": _r(self.long_gap_min_s),
            "unplaced_rows": self.unplaced_rows,
            "irregular_sweeps": self.irregular_sweeps,
            "truncated_last_sweep": self.truncated_last_sweep,
            "samples_per_gpu": self.samples_per_gpu,
        }


def _r(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)


def _otsu_split(gaps: np.ndarray) -> tuple[float, float, float] | None:
    """(threshold, largest short gap, smallest long gap) of the best two-group split of `gaps` on a log
    scale, or None when there are fewer than two distinct gaps."""
    logs = np.sort(np.log10(np.maximum(gaps, 0.0) + TIME_RESOLUTION_S))
    n = logs.size
    if n < 2 or logs[0] == logs[-1]:
        return None
    csum = np.cumsum(logs)
    total = csum[-1]
    k = np.arange(1, n)  # the first k values are the short group
    w0, w1 = k / n, (n - k) / n
    mu0 = csum[:-1] / k
    mu1 = (total - csum[:-1]) / (n - k)
    score = w0 * w1 * (mu0 - mu1) ** 2
    # Only split between distinct values.
    score[logs[1:] == logs[:-1]] = -1.0
    best = int(np.argmax(score))
    lo, hi = logs[best], logs[best + 1]
    short_max = 10**lo - TIME_RESOLUTION_S
    long_min = 10**hi - TIME_RESOLUTION_S
    return float(10 ** ((lo + hi) / 2) - TIME_RESOLUTION_S), float(short_max), float(long_min)


def assign_by_sweeps(times: np.ndarray) -> Sweeps:
    """The GPU position of each row (file order) of a log without a GPU column, from its timestamps.

    Raises AmbiguousSweeps when the timestamps do not group into sweeps of one size (see the module
    docstring for the evidence and the limits).
    """
    t = np.asarray(times, dtype=np.float64)
    n = t.size
    if n == 0:
        return Sweeps(np.zeros(0, dtype=np.int64), 0, 0, "empty")
    if n == 1:
        return Sweeps(np.zeros(1, dtype=np.int64), 1, 1, "one row", samples_per_gpu=[1])
    gaps = np.diff(t)
    if (gaps < -TIME_RESOLUTION_S).sum() > max(2, 0.001 * n):
        raise AmbiguousSweeps(
            f"the timestamps go backwards {(gaps < -TIME_RESOLUTION_S).sum()} times (several logs appended, "
            f"or rows out of order), so rows cannot be grouped into sweeps by time; {ADD_INDEX}"
        )
    split = _otsu_split(gaps)
    ratio = (split[2] + TIME_RESOLUTION_S) / (split[1] + TIME_RESOLUTION_S) if split is not None else 1.0
    if split is not None and split[1] <= MAX_IN_SWEEP_GAP_S and ratio >= WEAK_SEPARATION:
        try:
            return _group(t, gaps, split)
        except AmbiguousSweeps:
            if ratio >= SEPARATION:
                raise
            # Weakly two-sided gaps that form no regular sweeps: one GPU's samples with jitter.
    typical = float(np.median(gaps))
    if typical <= TIME_RESOLUTION_S:
        # Every row at (nearly) the same time: one sweep of n GPUs.
        if n > MAX_SWEEP_GPUS:
            raise AmbiguousSweeps(
                f"all {n} rows carry (nearly) the same timestamp, more than a sweep of GPUs; {ADD_INDEX}"
            )
        return Sweeps(
            np.arange(n, dtype=np.int64), n, 1, "one sweep (every row at the same time)",
            samples_per_gpu=[1] * n,
        )  # fmt: skip
    # No sweep structure and gaps longer than a GPU query: one row per sweep, one GPU.
    return Sweeps(
        np.zeros(n, dtype=np.int64), 1, n,
        f"one GPU: every row is a sweep (no gap between rows short enough to be inside a sweep; "
        f"median {typical:.3f} s)",
        short_gap_max_s=None, long_gap_min_s=float(np.min(gaps)), samples_per_gpu=[n],
    )  # fmt: skip


def _group(t: np.ndarray, gaps: np.ndarray, split: tuple[float, float, float]) -> Sweeps:
    """Sweeps split at the gap threshold of `split`; AmbiguousSweeps unless nearly all rows form sweeps
    of one size and every GPU ends with the same number of samples."""
    n = t.size
    threshold, short_max, long_min = split
    # A backwards step is a boundary too (a restarted logger appends a new first sweep).
    boundary = (gaps > threshold) | (gaps < -TIME_RESOLUTION_S)
    starts = np.concatenate(([0], np.nonzero(boundary)[0] + 1))
    ends = np.concatenate((starts[1:], [n]))
    sizes = ends - starts
    # The GPU count: the most common size among the complete-looking sweeps (the last may be cut short).
    counted = Counter(sizes[:-1].tolist() if sizes.size > 1 else sizes.tolist())
    gpus, _ = max(counted.items(), key=lambda kv: (kv[1] * kv[0], kv[0]))
    short = gaps[(gaps >= 0) & (gaps <= threshold)]
    if gpus > MAX_SWEEP_GPUS and short.size and float(np.median(short)) >= MIN_INTERVAL_S:
        # Runs of many rows at a logging interval between a few longer pauses: one GPU's samples.
        return Sweeps(
            np.zeros(n, dtype=np.int64), 1, n,
            f"one GPU: rows {float(np.median(short)):.3f} s apart (a logging interval) with "
            f"{int(boundary.sum())} longer pauses",
            long_gap_min_s=float(np.min(gaps)), samples_per_gpu=[n],
        )  # fmt: skip
    if gpus > MAX_SWEEP_GPUS:
        raise AmbiguousSweeps(
            f"the rows group into sweeps of {gpus} rows, more GPUs than one host has: the timestamps are "
            f"too coarse for the logging interval; {ADD_INDEX}"
        )
    positions = np.full(n, -1, dtype=np.int64)
    irregular = 0
    truncated = False
    regular_rows = 0
    last = sizes.size - 1
    for i, (a, size) in enumerate(zip(starts.tolist(), sizes.tolist(), strict=True)):
        if size == gpus:
            positions[a : a + size] = np.arange(size)
            regular_rows += size
        elif size % gpus == 0 and size // gpus <= 3:
            # Two or three sweeps with a short gap between them (a late query): whole sweeps still.
            positions[a : a + size] = np.tile(np.arange(gpus), size // gpus)
            regular_rows += size
            irregular += 1
        elif i == last and size < gpus:
            positions[a : a + size] = np.arange(size)  # the file ends mid-sweep: its first GPUs
            truncated = True
            regular_rows += size
        else:
            irregular += 1
    unplaced = int((positions < 0).sum())
    share = regular_rows / n
    if share < MIN_REGULAR_SHARE:
        sizes_seen = ", ".join(f"{s} rows x{c}" for s, c in Counter(sizes.tolist()).most_common(4))
        raise AmbiguousSweeps(
            f"the rows do not group into sweeps of one size by their timestamps (gaps split at "
            f"{threshold:.3f} s; sweeps seen: {sizes_seen}; only {share:.0%} of rows in sweeps of {gpus}), "
            f"so which row is which GPU is ambiguous; {ADD_INDEX}"
        )
    counts = np.bincount(positions[positions >= 0], minlength=gpus).tolist()
    tolerance = max(SAMPLE_COUNT_TOLERANCE, int(SAMPLE_COUNT_TOLERANCE_SHARE * max(counts)))
    if max(counts) - min(counts) > tolerance:
        raise AmbiguousSweeps(
            f"grouping the rows into sweeps of {gpus} gives GPUs {min(counts)} to {max(counts)} samples "
            f"(more than {tolerance} apart), so the grouping is not trustworthy; {ADD_INDEX}"
        )
    return Sweeps(
        positions,
        gpus,
        int(sizes.size),
        "sweeps by time gaps (rows of one sweep are the GPUs in enumeration order)",
        split_s=threshold,
        short_gap_max_s=short_max,
        long_gap_min_s=long_min,
        unplaced_rows=unplaced,
        irregular_sweeps=irregular,
        truncated_last_sweep=truncated,
        samples_per_gpu=[int(c) for c in counts],
    )
