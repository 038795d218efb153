"""One module per finding code; `RULES` maps each code to its `check(inp, features)` function. `common` and
`data_pipeline_artifacts` (data_pipeline_stall's artifact evidence) are helpers, not rules."""

from __future__ import annotations

from collections.abc import Callable

from jobs.diagnosis.base import CODES, DiagnosisInput, Finding
from jobs.diagnosis.features import Features
from jobs.diagnosis.rules import (
    baseline_regression,
    communication_wait,
    data_pipeline_stall,
    false_saturation,
    gpu_errors,
    host_device_copy,
    host_sync,
    idle_gpus,
    launch_overhead,
    memory_bound,
    memory_headroom,
    shared_gpu,
    straggler,
    tensor_cores_idle,
    throttling,
    unexplained_waste,
)

Rule = Callable[[DiagnosisInput, Features], Finding | None]

RULES: dict[str, Rule] = {
    m.CODE: m.check
    for m in (
        false_saturation,
        data_pipeline_stall,
        launch_overhead,
        communication_wait,
        throttling,
        tensor_cores_idle,
        memory_bound,
        host_device_copy,
        host_sync,
        straggler,
        idle_gpus,
        shared_gpu,
        memory_headroom,
        baseline_regression,
        gpu_errors,
        unexplained_waste,
    )
}
assert tuple(RULES) == CODES, "every code in base.CODES needs exactly one rule module"
