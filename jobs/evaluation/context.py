"""What `evaluate` reads about one job, as plain values (pure: no Django, no Prometheus client)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from jobs.evaluation.kpis import ModelShape
from jobs.evaluation.schema import GpuSharing
from jobs.metrics.signals import JobSignals


@dataclass(frozen=True)
class EvaluationContext:
    """Everything one evaluation needs; built by jobs.evaluation.load.load_context from the database."""

    start: datetime
    end: datetime
    gpu_count: int
    shape: ModelShape
    dtype: str
    gpu_known: bool
    gpu_name: str
    peak_flops_per_gpu: float | None
    peak_clock_mhz: float | None
    signals: JobSignals | None
    timestamps: np.ndarray
    step_s: float
    tokens_per_second: np.ndarray | None
    throughput_source: str
    prices: tuple[tuple[datetime, float], ...]
    price_label: str
    reference_mfu: float
    reference_source: str
    flops_convention: str
    energy_j: float | None
    usd_per_kwh: float
    #: The job's share of GPUs other jobs also used, or of MIG slices (None = its GPUs were its own).
    sharing: GpuSharing | None = None
    #: Signal key -> where its values came from, for signals (partly) from an uploaded monitoring log
    #: (jobs.evaluation.monitoring_signals); absent keys are DCGM's.
    signal_sources: dict[str, str] = field(default_factory=dict)
    #: What the page says about those sources (which log, which GPUs, a log not used and why).
    source_notes: tuple[str, ...] = ()
    #: Signal key -> the sampling interval (s) of the log those values came from.
    signal_intervals_s: dict[str, float] = field(default_factory=dict)
