"""The stored evaluation of a job: a typed, versioned structure (msgspec), encoded into Job.evaluation.

Pure: no Django. `decode` refuses another schema version or a malformed payload by returning None (the
job then reads as "not evaluated yet" until the next evaluation rewrites it), never by guessing.
"""

from __future__ import annotations

from typing import Any

import msgspec

from jobs.profiling.safe_json import make_storable

SCHEMA_VERSION = 1
#: Names under which the evaluation's derived series are archived next to the DCGM signals.
DERIVED_THROUGHPUT = "tokens_per_second"
DERIVED_MFU = "mfu"


class CrossCheckResult(msgspec.Struct, frozen=True, kw_only=True):
    """MFU against the tensor-pipe upper estimate (fractions of the same dense peak)."""

    tensor_upper_mfu: float
    disagrees: bool
    direction: str
    explanation: str


class WasteSplit(msgspec.Struct, frozen=True, kw_only=True):
    """Waste per day by what each part needs (jobs.evaluation.costs.split_waste); None = not computable."""

    total_per_day_usd: float | None = None
    lower_bound_per_day_usd: float | None = None
    idle_per_day_usd: float | None = None
    efficiency_per_day_usd: float | None = None
    unknown_reason: str = ""


class SharedWith(msgspec.Struct, frozen=True, kw_only=True):
    """Another job on one of this job's physical GPUs ("host/index" or UUID) over [start, end] (unix s)."""

    gpu: str
    other_job: str
    start: float
    end: float
    mig: bool = False
    #: The other job is another team's: pages, findings and labels do not name it (read policy; its id
    #: stays here for re-evaluating it, jobs.evaluation.sharing.stale_neighbours).
    other_team: bool = False

    @property
    def shown(self) -> str:
        """The other job as this job's readers may see it: its id, or "another team's job"."""
        return "another team's job" if self.other_team else self.other_job


class GpuSharing(msgspec.Struct, frozen=True, kw_only=True):
    """How much of its GPUs a job held when they were shared (time-slicing) or sliced (MIG).

    `share` = the job's attributed GPU-time / the GPU-time it held
    (jobs.evaluation.gpu_attribution.attribute);
    `gpu_equivalents` = GPUs x share: what cost, GPU-hours, energy and waste are charged for;
    `peak_equivalents` = whole-GPU dense peaks the job could reach (MFU's capacity): the same as
    `gpu_equivalents` on time-sliced GPUs, a MIG slice's SMs / the GPU's SMs on a slice (catalog.mig_slice).
    `mig` maps each MIG GPU of the job to [GPU_I_ID, GPU_I_PROFILE] as dcgm-exporter labelled its series.
    """

    share: float
    gpu_equivalents: float
    peak_equivalents: float
    label: str = ""
    mig: dict[str, list[str]] = {}
    shared: list[SharedWith] = []
    peak_source: str = ""


class Evaluation(msgspec.Struct, frozen=True, kw_only=True):
    """Every number of one job and the definition behind it. None = cannot be computed (see `notes`)."""

    schema_version: int = SCHEMA_VERSION
    duration_s: float
    gpu_hours: float
    mfu: float | None = None
    hfu: float | None = None
    tokens_per_second: float | None = None
    gpu_util_mean: float | None = None
    sm_active_mean: float | None = None
    tensor_active_mean: float | None = None
    cost_usd: float | None = None
    cost_per_day_usd: float | None = None
    waste: WasteSplit = WasteSplit()
    idle_share: float | None = None
    idle_share_exact: bool = False
    reference_mfu: float | None = None
    reference_source: str = ""
    flops_variant: str = ""
    mfu_fallback: bool = False
    #: Which MFU `mfu` is: "engine" (a serving engine's own FLOP counter, vLLM/SGLang
    #: estimated_flops_per_gpu_total) or "flops" (FLOPs per token from the config x tokens/s); "" unknown.
    mfu_source: str = ""
    #: A serving job's engine-reported MFU, its mean FLOP/s per GPU, or why it is absent (never 0).
    engine_mfu: float | None = None
    engine_flops_per_gpu: float | None = None
    engine_mfu_reason: str = ""
    #: The forward-FLOPs MFU kept beside the engine's when the engine's is the job's MFU (the cross-check).
    flops_mfu: float | None = None
    energy_kwh: float | None = None
    energy_cost_usd: float | None = None
    peak_memory_mib: float | None = None
    cross_check: CrossCheckResult | None = None
    #: Share of the job's GPU-time with samples behind each mean (jobs.metrics.sampling), per signal key.
    coverage: dict[str, float] = {}
    price_note: str = ""
    variants: dict[str, str] = {}
    notes: list[str] = []
    #: None = the job's GPUs were its own (or sharing could not be checked); see GpuSharing.
    sharing: GpuSharing | None = None
    #: Signal key -> where its values came from when not (only) DCGM, e.g. "from the uploaded nvidia-smi
    #: log 'gpu.csv' (2 GPU(s), 1 s samples)" (jobs.evaluation.monitoring_signals); empty = all DCGM.
    signal_sources: dict[str, str] = {}
    #: Signal key -> the sampling interval (s) of the uploaded log its values came from (the resolution
    #: the page states for them); empty = DCGM's.
    signal_intervals_s: dict[str, float] = {}


def encode(evaluation: Evaluation) -> dict[str, Any]:
    """JSON-safe dict for the database (jobs.profiling.safe_json.make_storable: non-finite floats become
    None, NUL and lone surrogates from user input are cleaned; Postgres refuses them otherwise)."""
    out = msgspec.to_builtins(evaluation)
    return make_storable(out)[0]


def decode(payload: Any) -> Evaluation | None:
    """The stored evaluation, or None when there is none, it is of another schema version, or malformed."""
    if not isinstance(payload, dict) or payload.get("schema_version") != SCHEMA_VERSION:
        return None
    try:
        return msgspec.convert(payload, Evaluation)
    except msgspec.ValidationError:
        return None
