"""Faithful simulator of dcgm-exporter output for a cluster of jobs (pure: numpy only, no Django).

    from jobs.simulate import SimSpec, simulate, write_openmetrics, backfill
    res = simulate(SimSpec(scenario="false_saturation", gpus=16, seed=1))
    write_openmetrics([res], "demo.om")
    backfill("demo.om", "var/tsdb")         # then start prometheus over var/tsdb

Scenarios (one per diagnosis code metrics can show) are listed in `SCENARIOS`; `SimResult.truth` says
what each one planted (straggler GPU, idle GPUs, XID window, MFU) so tests can check detectors.
"""

from jobs.simulate.core import (
    CLUSTER_MIX,
    DEFAULT_START,
    SimGpu,
    SimResult,
    SimSpec,
    Throughput,
    cluster_specs,
    simulate,
    simulate_cluster,
)
from jobs.simulate.gpus import GPU_MODELS, GpuModel, gpu_model
from jobs.simulate.registration import registration_body
from jobs.simulate.scenarios import SCENARIOS, Scenario
from jobs.simulate.writers import (
    TOKENS_METRIC,
    BackfillError,
    backfill,
    exporter_text,
    openmetrics_lines,
    write_openmetrics,
)

__all__ = [
    "CLUSTER_MIX",
    "DEFAULT_START",
    "GPU_MODELS",
    "SCENARIOS",
    "TOKENS_METRIC",
    "BackfillError",
    "GpuModel",
    "Scenario",
    "SimGpu",
    "SimResult",
    "SimSpec",
    "Throughput",
    "backfill",
    "cluster_specs",
    "exporter_text",
    "gpu_model",
    "openmetrics_lines",
    "registration_body",
    "simulate",
    "simulate_cluster",
    "write_openmetrics",
]
