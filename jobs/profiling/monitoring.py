"""Host monitoring logs: nvidia-smi `--query-gpu ... --format=csv` and dstat `--output` CSV.

The parsers live in their own modules (jobs.profiling.nvidia_smi, jobs.profiling.dstat, with what they
share in jobs.profiling.monitoring_common and the sweep grouping of index-less nvidia-smi logs in
jobs.profiling.smi_sweeps); this module keeps the names importers have always used.
"""

from __future__ import annotations

from jobs.profiling.dstat import analyze_dstat
from jobs.profiling.monitoring_common import IDLE_UTIL_PCT, MAX_POINTS
from jobs.profiling.nvidia_smi import MAX_GPUS, analyze_nvidia_smi

__all__ = ["IDLE_UTIL_PCT", "MAX_GPUS", "MAX_POINTS", "analyze_dstat", "analyze_nvidia_smi"]
