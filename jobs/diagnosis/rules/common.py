"""Small helpers shared by the rules: formatting, busy share, the "GPU reads busy" level."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jobs.diagnosis import detectors as D
from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import Evidence
from jobs.diagnosis.features import Features


def busy_share(f: Features) -> float:
    """Share of the job's samples (with a utilisation reading) in which the job's GPUs were busy."""
    if f.util is None:
        return 1.0
    known = np.isfinite(f.util)
    return float(f.busy[known].mean()) if known.any() else 1.0


def util_level(f: Features) -> float | None:
    """Median utilisation over all GPU-samples (busy or not): what nvidia-smi mostly showed."""
    return f.level(f.util_key, busy_only=False) if f.util_key else None


def saturated(f: Features) -> bool:
    """GPU_UTIL (or GR_ENGINE_ACTIVE) reads busy at the job level."""
    u = util_level(f)
    return u is not None and u >= T.UTIL_SATURATED_MIN


def ratio_ev(label: str, value: float | None) -> Evidence:
    """Evidence line for a 0-1 ratio, shown as a percentage."""
    return Evidence(label, None if value is None else round(100.0 * value, 1), "%")


def util_ev(f: Features, value: float | None) -> Evidence:
    """Evidence line for the utilisation level, naming the field it came from."""
    name = "GPU_UTIL (nvidia-smi)" if f.util_key == "gpu_util" else "GR_ENGINE_ACTIVE"
    return ratio_ev(f"{name}, median", value)


def pct(value: float | None) -> str:
    """A 0-1 ratio as "42 %" (or "?" when unknown)."""
    return "?" if value is None else f"{100.0 * value:.0f} %"


def mean_over(series: np.ndarray | None, mask: np.ndarray | None = None) -> float | None:
    """NaN-aware mean of a series (optionally over a mask), None when nothing is finite."""
    if series is None:
        return None
    s = series if mask is None else series[mask]
    s = s[np.isfinite(s)]
    return float(s.mean()) if s.size else None


class IdleGaps(NamedTuple):
    """Short stalls of the job's mean utilisation (see `short_idle_gaps`)."""

    runs: list[D.Run]
    share: float  # of the known samples
    mask: np.ndarray  # samples inside a gap
    known: np.ndarray  # samples with a value


def short_idle_gaps(f: Features) -> IdleGaps | None:
    """Stalls of the job's mean utilisation: runs at ~0 % shorter than an idle stretch (longer ones are
    idle_gpus), at least `STALL_MIN_GAPS` of them, with the share of known samples they cover. None
    without utilisation or with too few gaps."""
    if f.util is None:
        return None
    long_run = max(int(T.IDLE_MIN_STRETCH_S // f.step), 2)
    rs = [r for r in D.idle_gaps(f.util, threshold=T.STALL_UTIL_MAX) if r[1] - r[0] < long_run]
    known = np.isfinite(f.util)
    if len(rs) < T.STALL_MIN_GAPS or not known.any():
        return None
    mask = np.zeros(f.util.size, dtype=bool)
    for a, b in rs:
        mask[a:b] = True
    return IdleGaps(rs, float(mask[known].mean()), mask, known)
