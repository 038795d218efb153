"""Blocks several kinds of stored analysis share: the capture block, named times, tensor-core shares.

Units as the parsers write them: `*_pct` percentages (0-100), `*_ms` milliseconds, `*_unix` seconds
since the epoch. Pure: no Django.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from jobs.profiling.schema.common import Num, lenient


class Capture(msgspec.Struct, frozen=True, kw_only=True):
    """What an artifact captured and when (jobs.profiling.capture contract); None/[] = unknown."""

    gpu_names: list[str] = []
    start_unix: Num | None = None
    end_unix: Num | None = None
    ranks: list[int] = []
    world_size: int | None = None
    source: str | None = None
    hosts: list[str] = []
    pids: list[int] = []
    commands: list[str] = []

    @property
    def window(self) -> tuple[float, float] | None:
        """(start_unix, end_unix) when both are known and in order."""
        if self.start_unix is None or self.end_unix is None or self.end_unix < self.start_unix:
            return None
        return self.start_unix, self.end_unix


class NamedTime(msgspec.Struct, frozen=True, kw_only=True):
    """A named kernel or call with its count and total time (ms)."""

    name: str | None = None
    count: Num | None = None
    time_ms: Num | None = None


class TensorCores(msgspec.Struct, frozen=True, kw_only=True):
    """Tensor-core vs SIMT (FP32 pipe) compute (trace, nsys stats and ncu analyses; % of compute time,
    `tensor_core_time_pct` of all kernel time).

    `tensor_pipe_active_pct` is ncu's measured tensor pipe utilisation; the rest are classified by
    kernel name (jobs.profiling.kernel_classes.math_class).
    """

    tensor_core_time_pct: Num | None = None
    tensor_core_compute_time_pct: Num | None = None
    simt_compute_time_pct: Num | None = None
    compute_share_of_kernel_time_pct: Num | None = None
    tensor_pipe_active_pct: Num | None = None
    top_simt_kernels: list[NamedTime] = []


def decode_capture(payload: Any) -> Capture | None:
    """The `capture` block of an analysis, or None when the analysis has none (or it is not a mapping).

    Monitoring logs write none: jobs.diagnosis.artifacts.capture derives theirs from their own columns.
    """
    block = payload.get("capture") if isinstance(payload, Mapping) else None
    return lenient(block, Capture) if isinstance(block, Mapping) else None
