"""A GPU roofline per job from DCGM activities: where each GPU, and the job over time, sits against the
GPU's compute roof (dense peak FLOP/s of the job's dtype) and memory roof (HBM bandwidth).

Pure (no Django): the job page and the API load the archived series (jobs.outputs.roofline) and call
`job_roofline`. Definitions of the fields read (DCGM user guide, "Profiling Metrics"; reference/dcgm.md):

- ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`` (field 1004): ratio of cycles the tensor (HMMA/IMMA/DMMA) pipe is
  active, averaged over all SMs and the collect interval; 1.0 is a tensor instruction every other cycle,
  i.e. the pipe at its peak issue rate;
- ``DCGM_FI_PROF_PIPE_FP64_ACTIVE`` / ``_FP32_ACTIVE`` / ``_FP16_ACTIVE`` (1006 / 1007 / 1008): the same
  ratio for the non-tensor FP64, FMA (FP32, also integer) and FP16 pipes;
- ``DCGM_FI_PROF_DRAM_ACTIVE`` (1005): ratio of cycles the device memory interface is active sending or
  receiving data; NVIDIA gives ~0.8 as the practical maximum.

What these ratios can say: how much of the time each roof's hardware was busy, so whether a roof can be
what limits the job. What they cannot say: they are shares of cycles, not FLOP or byte counts. A pipe
active 50 % of cycles is not 50 % of peak FLOPs when the instruction mix differs (narrower MMA shapes,
FP8 vs BF16, 2:4 sparse MMA doing twice the nominal work per cycle), and 0.2 can be 20 % of the SMs at
full rate or all of them at 20 %. DRAM active counts cycles the interface is busy, not bytes: partial
bursts and read/write turnarounds occupy cycles without moving a full line. So the FLOP/s and bytes/s here
are activity-based UPPER estimates (activity x roof), and their ratio, the "arithmetic intensity", is an
estimate of FLOPs per byte that only holds when the tensor pipe does the job's FLOPs at the dtype's rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from jobs.evaluation.checks import non_negative, positive
from jobs.evaluation.flops import cross_check_mfu, tensor_flops_upper_estimate

SOURCE = 'DCGM user guide, "Profiling Metrics" (fields 1004-1008; reference/dcgm.md)'

#: Archive signal keys (jobs.metrics.signals) of the activities read, and the DCGM field each one is.
TENSOR = "tensor_active"
DRAM = "dram_active"
FP_PIPES: tuple[str, ...] = ("fp16_active", "fp32_active", "fp64_active")
PIPES: tuple[str, ...] = (TENSOR, *FP_PIPES)
SM_CLOCK = "sm_clock"
SIGNALS: tuple[str, ...] = (*PIPES, DRAM, SM_CLOCK)
FIELD_NAMES = {
    TENSOR: "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "fp16_active": "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    "fp32_active": "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "fp64_active": "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    DRAM: "DCGM_FI_PROF_DRAM_ACTIVE",
}
PIPE_LABELS = {TENSOR: "tensor", "fp16_active": "FP16", "fp32_active": "FP32", "fp64_active": "FP64"}

#: A roof is "near" when its hardware is busy at least half of the cycles: it then limits the job at least
#: half the time, and doubling the other side's speed cannot double the job's. Below that on both sides
#: neither roof binds: the time goes to latency (dependent kernels, small grids), launches, or waiting
#: for input and communication.
NEAR_COMPUTE = 0.5
#: DCGM: DRAM_ACTIVE reaches about 0.8 in practice (reference/dcgm.md), so 0.5 is ~60 % of what a purely
#: bandwidth-bound kernel shows: a memory-bound job at half its reachable bandwidth is still memory-bound.
NEAR_MEMORY = 0.5
DRAM_PRACTICAL_MAX = 0.8
#: A non-tensor pipe busier than this while MFU exceeds the tensor estimate explains the excess: FLOPs
#: on FP16/FP32/FP64 pipes are not in tensor_active x peak.
BUSY_FP_PIPE = 0.1
#: Inputs are DCGM ratios 0-1; above this they were passed as percentages.
_RATIO_LIMIT = 1.05

Verdict = Literal["compute", "memory", "under_both", "unknown"]

CAVEATS: tuple[str, ...] = (
    "Activities are shares of cycles, not FLOP or byte counts (DCGM Profiling Metrics): a pipe active 50 % "
    "of cycles is not 50 % of peak FLOPs when the instruction mix differs (MMA shape, FP8 vs BF16, 2:4 "
    "sparsity), and 0.2 can be 20 % of the SMs at full rate or every SM at 20 %.",
    "DRAM active is the share of cycles the memory interface is busy, not bytes moved; its practical "
    "maximum is about 0.8.",
    "FLOP/s = tensor active x dense peak of the job's dtype and bytes/s = DRAM active x bandwidth are "
    "upper estimates; their ratio estimates arithmetic intensity only when the tensor pipe does the "
    "job's FLOPs at the dtype's rate.",
    "Means over the DCGM collect interval and the archive's step hide phases: a job alternating "
    "compute-bound and memory-bound kernels faster than the samples sits between the roofs.",
)


# ------------------------------------------------------------------------------------------------ roofs


@dataclass(frozen=True)
class Roofs:
    """The GPU's two roofs for the job's dtype; None (with ``reasons``) when the catalog has no figure."""

    gpu: str | None
    dtype: str
    peak_flops: float | None
    bandwidth_bytes_per_s: float | None
    peak_clock_mhz: float | None = None
    reasons: tuple[str, ...] = ()

    @property
    def ridge(self) -> float | None:
        """FLOPs per byte where the roofs meet (peak / bandwidth): below it the memory roof is the lower."""
        if self.peak_flops is None or self.bandwidth_bytes_per_s is None:
            return None
        return self.peak_flops / self.bandwidth_bytes_per_s


def roofs_for(
    gpu: str | None,
    dtype: str,
    peak_tflops: Mapping[str, Any] | None,
    bandwidth_tbps: float | None,
    peak_clock_mhz: float | None = None,
) -> Roofs:
    """Roofs from a catalog row (GpuModel or catalog.GpuSpec fields): dense TFLOP/s per dtype, HBM TB/s.

    TB/s are decimal (1e12 bytes/s), as NVIDIA's datasheets quote them (H100 SXM 3.35 TB/s).
    """
    reasons = []
    peak = None
    bandwidth = None
    if gpu is None:
        reasons.append("unknown GPU model: no roofs in the catalog (an admin can add it)")
    else:
        value = (peak_tflops or {}).get(dtype)
        if value:
            peak = positive("peak TFLOP/s", value) * 1e12
        else:
            reasons.append(f"the catalog has no dense {dtype} peak for {gpu}: compute roof unknown")
        if bandwidth_tbps:
            bandwidth = positive("bandwidth TB/s", bandwidth_tbps) * 1e12
        else:
            reasons.append(f"the catalog has no memory bandwidth for {gpu}: memory roof unknown")
    clock = positive("peak clock", peak_clock_mhz) if peak_clock_mhz else None
    return Roofs(gpu, dtype, peak, bandwidth, clock, tuple(reasons))


# ------------------------------------------------------------------------------------------ activities


@dataclass(frozen=True)
class Activities:
    """Mean activities (DCGM ratios 0-1) of one GPU or the job over some time; None = not collected.

    ``missing`` gives the reason per signal key when one is None (the ingestion's reason, or "no samples").
    """

    tensor: float | None = None
    fp16: float | None = None
    fp32: float | None = None
    fp64: float | None = None
    dram: float | None = None
    sm_clock_mhz: float | None = None
    missing: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("tensor", "fp16", "fp32", "fp64", "dram"):
            value = getattr(self, name)
            if value is not None and non_negative(name, value) > _RATIO_LIMIT:
                raise ValueError(f"{name} must be a DCGM ratio 0-1, got {value!r} (a percentage?)")
        if self.sm_clock_mhz is not None:
            non_negative("sm_clock_mhz", self.sm_clock_mhz)

    @classmethod
    def from_means(
        cls, means: Mapping[str, float | None], missing: Mapping[str, str] | None = None
    ) -> Activities:
        """From archive keys (``tensor_active`` ...); NaN (no samples) becomes None."""

        def get(key: str) -> float | None:
            value = means.get(key)
            return None if value is None or not math.isfinite(value) else float(value)

        return cls(
            tensor=get(TENSOR),
            fp16=get("fp16_active"),
            fp32=get("fp32_active"),
            fp64=get("fp64_active"),
            dram=get(DRAM),
            sm_clock_mhz=get(SM_CLOCK),
            missing=dict(missing or {}),
        )

    def pipe(self, key: str) -> float | None:
        """The activity of a pipe by its archive key."""
        return {TENSOR: self.tensor, "fp16_active": self.fp16, "fp32_active": self.fp32,
                "fp64_active": self.fp64}[key]  # fmt: skip

    def reason(self, key: str) -> str:
        """Why a signal is None: the stored reason, else that it was not collected."""
        return self.missing.get(key) or f"{FIELD_NAMES.get(key, key)} not collected"


# ----------------------------------------------------------------------------------------------- place


@dataclass(frozen=True)
class Placement:
    """One GPU, or the job over some time, against the roofs. None = unknown (``unknown`` says why)."""

    label: str
    compute_share: float | None
    busiest_pipe: str | None
    memory_share: float | None
    flops_per_s: float | None
    bytes_per_s: float | None
    intensity: float | None
    roof_at_intensity: float | None
    verdict: Verdict
    text: str
    unknown: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON fields with units in their names."""
        return {
            "label": self.label,
            "compute_roof_share": self.compute_share,
            "busiest_pipe": self.busiest_pipe,
            "memory_roof_share": self.memory_share,
            "flops_per_s_upper": self.flops_per_s,
            "bytes_per_s_upper": self.bytes_per_s,
            "intensity_flop_per_byte": self.intensity,
            "roof_at_intensity_flops_per_s": self.roof_at_intensity,
            "verdict": self.verdict,
            "verdict_text": self.text,
            "unknown": list(self.unknown),
            "notes": list(self.notes),
        }


def place(acts: Activities, roofs: Roofs, label: str = "job") -> Placement:
    """Place mean activities against the roofs: the share of each roof used, the activity-based FLOP/s and
    bytes/s, their ratio against the ridge point, and which roof (if any) binds.

    Compute roof share: the busiest of the tensor and FP16/32/64 pipes, each as a share of its own issue
    rate. The tensor pipe is required (it is where the dtype's peak applies); FP pipes are off in a default
    dcgm-exporter and their absence is a note, not an unknown. Memory roof share: DRAM active.
    """
    unknown: list[str] = []
    notes: list[str] = []
    compute: float | None = None
    busiest: str | None = None
    if acts.tensor is None:
        unknown.append(f"compute roof share unknown: {acts.reason(TENSOR)}")
    else:
        known = {k: v for k in PIPES if (v := acts.pipe(k)) is not None}
        busiest = max(known, key=lambda k: known[k])
        compute = known[busiest]
        if busiest != TENSOR and compute >= NEAR_COMPUTE:
            # The dtype's dense peak is a tensor-core figure: a busy FP16/32/64 pipe is near a far lower
            # roof (H100 SXM FP32 non-tensor: 67 TFLOP/s in NVIDIA's H100 datasheet, against 989.5 BF16
            # dense). The FLOP/s estimate (tensor pipe only) understates the work; the fix is tensor math.
            notes.append(
                f"the busiest pipe is {PIPE_LABELS[busiest]}, not the tensor pipe: that pipe's roof is far "
                f"below the dense {roofs.dtype} tensor peak; math moved to the tensor cores (AMP, TF32) "
                "raises the roof"
            )
        absent = [PIPE_LABELS[k] for k in FP_PIPES if k not in known]
        if absent:
            notes.append(
                f"{'/'.join(absent)} pipe activity not collected: math on those pipes is not in the compute "
                "share"
            )
    memory = acts.dram
    if memory is None:
        unknown.append(f"memory roof share unknown: {acts.reason(DRAM)}")
    flops = bytes_ = intensity = at_roof = None
    if acts.tensor is not None and roofs.peak_flops is not None:
        estimate = tensor_flops_upper_estimate(
            acts.tensor, roofs.peak_flops, acts.sm_clock_mhz, roofs.peak_clock_mhz
        )
        flops = estimate.flops_per_s
    if memory is not None and roofs.bandwidth_bytes_per_s is not None:
        bytes_ = memory * roofs.bandwidth_bytes_per_s
    if flops is not None and bytes_ is not None:
        if bytes_ > 0:
            intensity = flops / bytes_
            assert roofs.peak_flops is not None and roofs.bandwidth_bytes_per_s is not None
            at_roof = min(roofs.peak_flops, intensity * roofs.bandwidth_bytes_per_s)
        else:
            notes.append("DRAM idle in these samples: arithmetic intensity unbounded, not placed")
    verdict, text = _verdict(compute, busiest, memory, intensity, roofs.ridge, unknown)
    return Placement(label, compute, busiest, memory, flops, bytes_, intensity, at_roof, verdict, text,
                     tuple(unknown), tuple(notes))  # fmt: skip


def _verdict(
    compute: float | None,
    busiest: str | None,
    memory: float | None,
    intensity: float | None,
    ridge: float | None,
    unknown: Sequence[str],
) -> tuple[Verdict, str]:
    near_c = compute is not None and compute >= NEAR_COMPUTE
    near_m = memory is not None and memory >= NEAR_MEMORY
    pipe = PIPE_LABELS.get(busiest or "", "")
    side = ""
    if intensity is not None and ridge is not None:
        where = "above" if intensity >= ridge else "below"
        side = f"; estimated intensity {intensity:,.0f} FLOP/byte, {where} the ridge at {ridge:,.0f}"
    if near_c and near_m:
        assert compute is not None and memory is not None
        # Both busy: the closer roof, DRAM judged against what it reaches in practice.
        if compute >= memory / DRAM_PRACTICAL_MAX:
            return "compute", (
                f"near both roofs, closer to the compute roof: {pipe} pipe active {compute:.0%} of cycles, "
                f"DRAM {memory:.0%}{side}"
            )
        return "memory", (
            f"near both roofs, closer to the memory roof: DRAM active {memory:.0%} of cycles (practical "
            f"maximum ~{DRAM_PRACTICAL_MAX:.0%}), {pipe} pipe {compute:.0%}{side}"
        )
    if near_c:
        assert compute is not None
        other = f", DRAM {memory:.0%}" if memory is not None else ", DRAM unknown"
        return "compute", f"near the compute roof: {pipe} pipe active {compute:.0%} of cycles{other}{side}"
    if near_m:
        assert memory is not None
        other = f", busiest pipe ({pipe}) {compute:.0%}" if compute is not None else ", pipes unknown"
        return "memory", f"near the memory roof: DRAM active {memory:.0%} of cycles{other}{side}"
    if compute is not None and memory is not None:
        return "under_both", (
            f"under both roofs (busiest pipe {pipe} {compute:.0%}, DRAM {memory:.0%} of cycles): neither "
            "roof binds; the time goes to latency, kernel launches, or waiting for input or communication"
        )
    return "unknown", "unknown: " + "; ".join(unknown)


# ---------------------------------------------------------------------------------------- MFU check


@dataclass(frozen=True)
class MfuCheck:
    """MFU against the tensor-active estimate (flops.cross_check_mfu) with the roofline's reading of it."""

    mfu: float
    tensor_estimate: float
    direction: str
    flagged: bool
    explanation: str

    def to_dict(self) -> dict[str, Any]:
        """JSON fields."""
        return {
            "mfu": self.mfu,
            "tensor_estimate_share_of_peak": self.tensor_estimate,
            "direction": self.direction,
            "flagged": self.flagged,
            "explanation": self.explanation,
        }


def check_mfu(mfu: float | None, acts: Activities, roofs: Roofs) -> MfuCheck | None:
    """MFU (a share of the same dense peak) against tensor active x SM clock / peak clock: MFU above the
    estimate, or more than 2x below it, is flagged with the likely reason. None when either is unknown."""
    if mfu is None or acts.tensor is None:
        return None
    cc = cross_check_mfu(mfu, acts.tensor, acts.sm_clock_mhz, roofs.peak_clock_mhz)
    text = cc.explanation
    if cc.direction == "mfu_above_hardware":
        busy = [
            (PIPE_LABELS[k], v) for k in FP_PIPES if (v := acts.pipe(k)) is not None and v >= BUSY_FP_PIPE
        ]
        if busy:
            pipes = ", ".join(f"{name} {value:.0%}" for name, value in busy)
            text += (
                f". The non-tensor pipes are busy ({pipes}): FLOPs there are not in the tensor estimate, so "
                "the model's math may run outside the tensor cores (AMP off, TF32 disabled)"
            )
        else:
            text += ". A 2:4-sparse kernel also does twice the nominal FLOPs per tensor cycle"
    elif cc.direction == "mfu_far_below_hardware" and acts.dram is not None and acts.dram >= NEAR_MEMORY:
        text += (
            f". DRAM is also busy ({acts.dram:.0%}): tensor cycles stalled on memory still count as active"
        )
    return MfuCheck(cc.mfu, cc.tensor_estimate, cc.direction, cc.disagrees, text)


# ------------------------------------------------------------------------------------------ the job


@dataclass(frozen=True)
class Roofline:
    """The job's roofline: the roofs, the job's mean placement, each GPU's, the job over time, MFU check."""

    roofs: Roofs
    job: Placement
    gpus: tuple[Placement, ...]
    over_time: tuple[tuple[float, Placement], ...]
    mfu_check: MfuCheck | None
    gpu_note: str = ""

    def time_shares(self) -> dict[str, float] | None:
        """Share of the job-over-time windows with a verdict that are near each roof or under both (the
        windows are equal runs of archive points, so shares of time up to the last, shorter one); None when
        no window has a verdict."""
        known = [p.verdict for _, p in self.over_time if p.verdict != "unknown"]
        if not known:
            return None
        return {v: known.count(v) / len(known) for v in ("compute", "memory", "under_both")}

    def to_dict(self) -> dict[str, Any]:
        """The API's `roofline` object: units in key names, unknowns as null with the reason beside them."""
        r = self.roofs
        return {
            "gpu_model": r.gpu,
            "dtype": r.dtype,
            "peak_flops_per_s": r.peak_flops,
            "bandwidth_bytes_per_s": r.bandwidth_bytes_per_s,
            "ridge_flop_per_byte": r.ridge,
            "roof_unknown": list(r.reasons),
            "job": self.job.to_dict(),
            "gpus": [p.to_dict() for p in self.gpus],
            "gpu_note": self.gpu_note or None,
            "over_time": [
                {
                    "t": t,
                    "compute_roof_share": p.compute_share,
                    "memory_roof_share": p.memory_share,
                    "intensity_flop_per_byte": p.intensity,
                    "flops_per_s_upper": p.flops_per_s,
                    "verdict": p.verdict,
                }
                for t, p in self.over_time
            ],
            "time_shares": self.time_shares(),
            "time_windows_unknown": sum(1 for _, p in self.over_time if p.verdict == "unknown"),
            "mfu_check": self.mfu_check.to_dict() if self.mfu_check else None,
            "thresholds": {
                "near_compute": NEAR_COMPUTE,
                "near_memory": NEAR_MEMORY,
                "dram_practical_max": DRAM_PRACTICAL_MAX,
            },
            "source": SOURCE,
            "caveats": list(CAVEATS),
        }


def job_roofline(
    roofs: Roofs,
    job: Activities,
    gpus: Sequence[tuple[str, Activities]] = (),
    over_time: Sequence[tuple[float, Activities]] = (),
    mfu: float | None = None,
    gpu_note: str = "",
) -> Roofline:
    """Place the job's mean, each GPU's time-mean and each time point of the cross-GPU mean series."""
    return Roofline(
        roofs=roofs,
        job=place(job, roofs, "job"),
        gpus=tuple(place(a, roofs, label) for label, a in gpus),
        over_time=tuple((t, place(a, roofs, "t")) for t, a in over_time),
        mfu_check=check_mfu(mfu, job, roofs),
        gpu_note=gpu_note,
    )


def bin_means(
    times: Sequence[float], columns: Mapping[str, Sequence[float]], max_points: int
) -> tuple[list[float], dict[str, list[float]]]:
    """Thin aligned series to at most ``max_points`` by averaging consecutive runs (NaN = no sample,
    ignored; a run without samples stays NaN). Times are each run's mean time. Pure Python on purpose:
    a few thousand points."""
    if max_points < 1:
        raise ValueError(f"max_points must be at least 1, got {max_points!r}")
    n = len(times)
    for key, values in columns.items():
        if len(values) != n:
            raise ValueError(f"{key} has {len(values)} values for {n} times")
    size = max(1, math.ceil(n / max_points))
    out_t: list[float] = []
    out: dict[str, list[float]] = {k: [] for k in columns}
    for start in range(0, n, size):
        chunk = range(start, min(n, start + size))
        out_t.append(sum(times[i] for i in chunk) / len(chunk))
        for key, values in columns.items():
            seen = [float(values[i]) for i in chunk if math.isfinite(values[i])]
            out[key].append(sum(seen) / len(seen) if seen else math.nan)
    return out_t, out
