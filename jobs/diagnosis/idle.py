"""The one idle computation: which GPUs sat idle, over which stretches (pure numpy).

The idle_gpus finding (jobs.diagnosis.rules.idle_gpus) and the idle alert (jobs.alerts.rules.gpus_idle)
both read it, so the alert and the finding of the same job name the same GPUs and the same durations.

A sample of a GPU is idle when its GPU_UTIL is at or below IDLE_UTIL_MAX (NVML: no kernel resident in ~all
of its 1/6-1 s window) and, where GR_ENGINE_ACTIVE is exported, that collect-interval average reads idle
too (GPU_UTIL is a point sample: when the step divides the collect interval it can land in the same idle
phase of every step; the average cannot). A missing sample is never idle: NaN samples no longer than
`bridge_s` inside a stretch join it (its length, its window) but count neither as idle GPU-time nor in
the share. A stretch of samples first..last lasts ts[last] - ts[first] + step (one step per sample);
its window is [ts[first], ts[last] + step] as every finding window is (detectors.run_windows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jobs.diagnosis import detectors as D
from jobs.diagnosis import thresholds as T


@dataclass(frozen=True, slots=True)
class Stretch:
    """One idle stretch of one GPU: sample indexes [start, stop) and its window in unix seconds."""

    gpu: int  # row index
    start: int
    stop: int
    window: tuple[float, float]
    idle_samples: int  # observed idle samples inside it (bridged holes excluded)

    @property
    def seconds(self) -> float:
        """Length of the stretch's window."""
        return self.window[1] - self.window[0]


@dataclass(frozen=True, slots=True)
class IdleStretches:
    """Every GPU's idle stretches of at least the minimum length, and the observed GPU-samples."""

    stretches: tuple[Stretch, ...]
    known_samples: int  # observed (finite) GPU-samples of all GPUs
    last_seen: tuple[int, ...]  # each GPU's last observed sample index (-1: never observed)
    step: float

    @property
    def gpus(self) -> list[int]:
        """Rows with at least one stretch, in order."""
        return sorted({s.gpu for s in self.stretches})

    @property
    def idle_samples(self) -> int:
        """Observed idle GPU-samples inside the stretches."""
        return sum(s.idle_samples for s in self.stretches)

    @property
    def share(self) -> float:
        """Idle observed GPU-time over observed GPU-time (a subset over its set: never above 1)."""
        return self.idle_samples / self.known_samples if self.known_samples else 0.0

    def trailing(self) -> list[Stretch]:
        """Stretches still going: they end at their GPU's last observed sample (the GPUs idle now)."""
        return [s for s in self.stretches if s.stop - 1 == self.last_seen[s.gpu]]


def idle_stretches(
    util: np.ndarray,
    timestamps: np.ndarray,
    step: float,
    *,
    busy_average: np.ndarray | None = None,
    min_len_s: float = T.IDLE_MIN_STRETCH_S,
    bridge_s: float = T.IDLE_MAX_BRIDGE_S,
    threshold: float = T.IDLE_UTIL_MAX,
) -> IdleStretches:
    """Idle stretches of each GPU in a (GPUs x time) utilisation matrix (see the module docstring).

    `busy_average`: GR_ENGINE_ACTIVE on the same grid (same shape), or None. `min_len_s`: the shortest
    stretch kept (0 keeps every idle run: the alert decides how long is long enough by its own minutes)."""
    u = np.atleast_2d(np.asarray(util, dtype=np.float64))
    if step <= 0:
        raise ValueError(f"grid step must be positive, got {step}")
    if busy_average is not None:
        avg = np.atleast_2d(np.asarray(busy_average, dtype=np.float64))
        if avg.shape != u.shape:
            raise ValueError(f"GR_ENGINE_ACTIVE {avg.shape} and GPU_UTIL {u.shape} are not on one grid")
        u = np.fmax(u, avg)  # idle only when both read idle; either alone where the other is missing
    ts = np.asarray(timestamps, dtype=np.float64)
    min_len = max(int(np.ceil(min_len_s / step)), 1)
    bridge = int(bridge_s // step)
    stretches: list[Stretch] = []
    last_seen: list[int] = []
    for i, row in enumerate(u):
        finite = np.flatnonzero(np.isfinite(row))
        last_seen.append(int(finite[-1]) if finite.size else -1)
        for a, b in D.idle_gaps(row, threshold=threshold, bridge=bridge):
            if b - a < min_len:
                continue
            (window,) = D.run_windows([(a, b)], ts, step)
            stretches.append(Stretch(i, a, b, window, int(np.isfinite(row[a:b]).sum())))
    return IdleStretches(tuple(stretches), int(np.isfinite(u).sum()), tuple(last_seen), float(step))
