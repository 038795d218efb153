"""Every threshold the diagnosis rules use, named and documented in one place.

Ratios are 0-1 (DCGM profiling fields; GPU_UTIL normalised from percent). "Level" means a robust level over
the job: the median over busy samples (see `features.Features.level`), so short bursts, stalls and
missing samples do not move it. Sources: NVIDIA's DCGM profiling-metrics guidance (reference/dcgm.md),
the seed articles' "four looks" table (seeds/) and the AcmeTrace cluster distributions (reference/acme);
where a number is our own choice the comment says why.
"""

from __future__ import annotations

# ------------------------------------------------------------------------------------------ busy / idle

#: A GPU (or the job's mean) counts as busy in a sample when GPU_UTIL is at least this. Levels of the pipe
#: ratios are taken over busy samples only, so input stalls do not drag "SM active while busy" down.
BUSY_UTIL_MIN = 0.5
#: GPU_UTIL at or below this is idle (no kernel ran in ~all of the sample period).
IDLE_UTIL_MAX = 0.05
#: "GPU_UTIL reads busy" for false saturation. DESIGN says >= 90 %; exporter samples of a fully busy GPU
#: under load jitter read 85-100 %, so the job level (a median) is compared with 0.85.
UTIL_SATURATED_MIN = 0.85

# ------------------------------------------------------------------------------------- false saturation

#: NVIDIA: SM active below 0.5 likely means ineffective use of the GPU (reference/dcgm.md).
SM_ACTIVE_LOW = 0.5
#: Below this SM active the GPU is mostly empty inside its kernels (critical).
SM_ACTIVE_VERY_LOW = 0.3
#: SM active a well-run dense job reaches (AcmeTrace healthy LLM training ~0.9); impacts are measured
#: against it.
SM_ACTIVE_HEALTHY = 0.85
#: Without SM_ACTIVE, "the GPU is busy but its pipes are quiet": tensor and DRAM both below these.
PROXY_TENSOR_QUIET = 0.3
PROXY_DRAM_QUIET = 0.35

# -------------------------------------------------------------------------------------- launch overhead

#: Launch overhead from metrics: busy GPU, SM active below this, and every pipe quiet.
LAUNCH_SM_ACTIVE_MAX = 0.35
LAUNCH_TENSOR_MAX = 0.15
LAUNCH_DRAM_MAX = 0.22
#: From a trace: share of kernels shorter than 10 us (HTA's tiny kernels) at or above this ...
TINY_KERNEL_COUNT_PCT = 50.0
#: ... together with the GPU waiting on launches: idle time that is kernel-to-kernel wait (HTA), or
#: kernels shorter than their own CPU launch call.
KERNEL_WAIT_SHARE_PCT = 30.0
GPU_SHORTER_THAN_LAUNCH_PCT = 50.0
#: The trace must show some idle GPU time for launch overhead to cost anything.
TRACE_IDLE_MIN_PCT = 10.0

# ------------------------------------------------------------------------------------ tensor cores idle

#: Seed: a bf16 job whose tensor active stays below 30 % wastes its compute (info level) ...
TENSOR_ACTIVE_LOW = 0.30
#: ... and below 15 % the tensor cores are essentially unused (warning).
TENSOR_ACTIVE_VERY_LOW = 0.15
#: Tensor active per unit of SM active: healthy bf16 LLM training keeps ~0.5; below this the SMs are busy
#: with something other than tensor work. Keeps a merely slow job (low SM and low tensor) out.
TENSOR_PER_SM_MAX = 0.35
#: SM active at least this for "the SMs are busy but not on tensor cores".
SM_BUSY_MIN = 0.6
#: Without SM_ACTIVE: DRAM at least this shows the SMs are working, just not on tensor pipes.
PROXY_DRAM_WORKING = 0.25
#: FP32 pipe at least this while tensor is idle: the math runs in FP32 (AMP off).
FP32_BUSY = 0.3
#: Trace: share of compute kernel time in tensor-core kernels below this.
TRACE_TENSOR_CORE_PCT_LOW = 10.0
#: Tensor active a healthy bf16 job reaches while busy; impacts are measured against it.
TENSOR_ACTIVE_HEALTHY = 0.5

# ----------------------------------------------------------------------------------------- memory bound

#: DRAM active at or above this is high (NVIDIA: practical maximum ~0.8).
DRAM_HIGH = 0.6
#: ncu: share of kernel time in memory-bound kernels at or above this.
NCU_MEMORY_BOUND_PCT = 50.0

# ------------------------------------------------------------------------------------------- throttling

#: SM clock below this share of the GPU's max boost clock while busy is throttled. H100 SXM: 0.85 x 1980 =
#: 1683 MHz, below the 1830 MHz its quoted peak assumes; a GPU at the peak's clock is not throttled.
CLOCK_RATIO_LOW = 0.85
#: ... below this, badly throttled (critical).
CLOCK_RATIO_VERY_LOW = 0.7
#: Share of GPUs (per sample) reporting a power/thermal throttle reason bit, or share of time in a
#: violation counter, at or above this counts as throttled.
THROTTLE_REASON_SHARE = 0.3
VIOLATION_SHARE = 0.1
#: Temperatures at which thermal slowdown is close (H100/A100 slow down around 87-90 C).
GPU_TEMP_HOT_C = 83.0
MEMORY_TEMP_HOT_C = 90.0
#: Board power at or above this share of TDP is at the cap.
POWER_AT_CAP = 0.95
#: The majority of GPUs must be throttled for a job-level finding; a minority is a straggler.
THROTTLED_GPU_SHARE = 0.5

# ----------------------------------------------------------------------------------- communication wait

#: Patterns are looked for with periods between these (exporter samples are 15-30 s apart; a pattern
#: must span at least two samples to be seen at all).
PERIOD_MIN_SAMPLES = 2
PERIOD_MAX_S = 1800.0
#: At least this many repetitions in the data.
PERIOD_MIN_CYCLES = 4
#: Autocorrelation at the period at or above this (noise on 100+ samples stays below ~0.2) ...
PERIOD_MIN_ACF = 0.35
#: ... and its peak must rise this far above the lowest autocorrelation at shorter lags (a step or a
#: drift decays without a dip; a cycle dips and comes back).
PERIOD_MIN_PROMINENCE = 0.4
#: Peak-to-trough swing of the periodic pattern relative to its level at or above this.
SAWTOOTH_MIN_SWING = 0.2
#: Per-GPU series correlated with their peers at or above this are synchronised (ranks in lock-step).
SYNC_MIN_CORR = 0.5
#: During a communication sawtooth GPU_UTIL stays high (NCCL kernels spin), unlike an input stall.
COMM_UTIL_MIN = 0.8
#: Trace: communication time not overlapped with compute, as a share of the traced span.
EXPOSED_COMM_PCT = 5.0
EXPOSED_COMM_HIGH_PCT = 15.0
#: Trace: comm/compute overlap below this is poor.
OVERLAP_LOW_PCT = 50.0

# ------------------------------------------------------------------------ unresolved regime (regimes.py)

#: NVLink traffic per GPU and direction at or above this is collective-sized. Data-parallel gradients of a
#: 7B bf16 model (14 GB, ring all-reduce ~2x per GPU) over a 10 s step average ~3 GB/s; a sustained
#: 50 GB/s (~11 % of an H100's ~450 GB/s per direction, ~17 % of an A100's 300 GB/s) means collectives
#: move data a large share of the time (tensor/sequence parallelism or exposed all-reduces).
NVLINK_BUSY_BPS = 50e9
#: A GPU_UTIL point sample at or below this saw (almost) no kernel in its NVML window.
UNRESOLVED_TROUGH_UTIL = 0.10
#: Mean utilisation at or below this is "well below 100 %" (a busy GPU's samples read 85-100 %).
UNRESOLVED_UTIL_PARTIAL_MAX = 0.80
#: Mean utilisation at or below this: no kernel resident at least half of the time, whatever the spread of
#: the point samples (their mean is the duty at any NVML window; regimes' docstring). Tiny kernels do not
#: idle a GPU that long (the seed's launch-bound run reads 68 %, field launch-bound jobs ~95 % with low SM
#: activity): the GPU waits on the host side.
UNRESOLVED_UTIL_IDLE_MAX = 0.50
#: p90 - p10 of the GPU_UTIL point samples at or above this: the GPU alternates between idle stretches at
#: least an NVML window (1/6-1 s) long and busy ones. At or below the narrow value every window reads the
#: same: the idle time comes in gaps much shorter than a window (between kernels). NVML's integer percent
#: and step-to-step jitter spread a uniform duty by a few percent only.
UNRESOLVED_SPREAD_WIDE = 0.30
UNRESOLVED_SPREAD_NARROW = 0.20
#: SM active (or tensor active) per unit of busy time below these: the resident kernels leave most SMs
#: empty (tiny kernels); a healthy GEMM-dominated step keeps ~0.9 SM and ~0.5 tensor while resident.
UNRESOLVED_SMALL_KERNEL_SM = 0.65
UNRESOLVED_SMALL_KERNEL_TENSOR = 0.35
#: Collective wait at unresolved resolution, per unit of busy time, while the links are busy: tensor
#: active below a healthy bf16 step's level (~0.5-0.55 while resident: TENSOR_ACTIVE_HEALTHY) -- the tensor
#: pipes idle while NCCL waits -- or, without the tensor field, SM active below a healthy step's (0.85).
#: No SM ceiling with the tensor field: NCCL runs one CTA per channel on a few dozen SMs (~0.1-0.2 SM active
#: in the wait), so the mean SM activity of a comm-bound step lands anywhere in 20-80 % (seed case 2: 64.5 %).
COMM_SM_MAX = 0.85
COMM_TENSOR_MAX = 0.50
#: Base confidence of a finding read from levels (no shape, no phase): honest, lower than a pattern's.
UNRESOLVED_CONFIDENCE = 0.5
#: Below this many utilisation samples per GPU (or, for a periodic pattern, this many cycles) a finding is
#: context (info), never a warning: a 14-minute pod with 15 samples shows 4 cycles of anything.
MIN_SAMPLES_TO_WARN = 30
MIN_CYCLES_TO_WARN = 6

# ------------------------------------------------------------------------------------ unexplained waste

#: Unexplained waste at or above this share of the job's cost/day is a warning (below: info context).
UNEXPLAINED_WARN_SHARE = 0.25

# ---------------------------------------------------------------------------------- data pipeline stall

#: A sample is an idle gap when the job's mean GPU_UTIL is at or below this (all ranks waiting).
STALL_UTIL_MAX = 0.2
#: Idle gaps must take at least this share of the job to matter.
STALL_MIN_IDLE_SHARE = 0.05
#: Regular gaps: the coefficient of variation of the intervals between gaps at or below this.
STALL_MAX_INTERVAL_CV = 0.5
#: At least this many gaps.
STALL_MIN_GAPS = 4
#: Gap samples whose collect-interval averages (GR_ENGINE_ACTIVE, SM or tensor active) keep at least this
#: share of their level in the other samples are point samples of a sub-second wait (a 1/6 s NVML window on
#: short steps), not stalls a sample long: a real 15-30 s stall caught at a random point leaves ~half of
#: the 30 s average, aliasing leaves all of it.
STALL_ALIAS_AVG_RATIO = 0.8
#: Traffic per GPU in idle-gap samples at or above this (and at least twice the busy samples'): the links
#: move data while the GPUs read idle, a collective behind a host-side barrier rather than an input stall.
NVLINK_TROUGH_MIN_BPS = 10e9
#: Trace: idle share of the span and host-wait share of idle time at or above these.
TRACE_IDLE_PCT = 20.0
HOST_WAIT_PCT = 50.0
#: Trace step breakdown / py-spy: DataLoader or input-pipeline share at or above this.
DATALOADER_PCT = 10.0
PYSPY_INPUT_PCT = 25.0

# ------------------------------------------------------------------------------------- host-device copy

#: Sustained PCIe traffic per GPU at or above this (bytes/s) is heavy: ~20 % of a PCIe Gen4 x16 link,
#: ~10 % of Gen5; a training step that keeps its data on the GPU moves far less.
PCIE_HEAVY_BPS = 6e9
#: Trace: memcpy time (host<->device) as a share of GPU busy time, and pageable share of host bytes.
MEMCPY_SHARE_PCT = 10.0
PAGEABLE_PCT = 50.0

# ------------------------------------------------------------------------------------------- host sync

#: Trace: CPU-blocking synchronisations per profiler step at or above this ...
SYNC_CALLS_PER_STEP = 2.0
#: ... or, without steps, in the whole trace.
SYNC_CALLS_MIN = 10
#: Trace: time the CPU spent blocked in synchronisation as a share of the traced span (warning).
SYNC_TIME_PCT = 10.0

# ------------------------------------------------------------------------------------------- straggler

#: A GPU is a straggler when its robust z-score against its peers is at or below this ...
STRAGGLER_Z = -3.5
#: ... and it is at least this far below the peers' median (relative) on SM active / tensor active when a
#: clock deficit or throttle reason corroborates it ...
STRAGGLER_MIN_DEFICIT = 0.15
#: ... or this far below on every activity signal without such support (silicon and placement already
#: spread healthy GPUs by several percent; with few peers the robust spread is itself uncertain) ...
STRAGGLER_ACTIVITY_ONLY_DEFICIT = 0.25
#: ... or on SM clock (clocks barely differ between healthy GPUs).
STRAGGLER_MIN_CLOCK_DEFICIT = 0.08
#: Floor of the robust spread, relative to the median: a near-zero MAD must not make tiny differences
#: look like outliers.
STRAGGLER_MIN_SPREAD_REL = 0.03
#: The GPU must be below its peers in at least this share of its busy samples (persistently slower).
STRAGGLER_PERSISTENCE = 0.6
#: Node stragglers: a host's median at least this far below the other hosts' median.
NODE_MIN_DEFICIT = 0.15
#: Peers needed for a meaningful comparison.
STRAGGLER_MIN_GPUS = 4

# ------------------------------------------------------------------------------------------- idle GPUs

#: A GPU idle for a continuous stretch at least this long ...
IDLE_MIN_STRETCH_S = 600.0
#: ... or idle in at least this share of the job is an idle allocated GPU.
IDLE_MIN_SHARE = 0.25
#: Idle GPU-time at or above this share of the job's GPU-time is a warning (below: info).
IDLE_WARN_SHARE = 0.05
#: NaN samples inside an idle stretch no longer than this still count as the same stretch.
IDLE_MAX_BRIDGE_S = 300.0

# ------------------------------------------------------------------------------------- memory headroom

#: Peak frame-buffer use below this share of capacity leaves room for a larger micro-batch (info) ...
HEADROOM_USED_MAX = 0.5
#: ... below this, a lot of room (warning).
HEADROOM_USED_LOW = 0.35
#: Memory use a well-packed job reaches; impacts are measured against it.
HEADROOM_TARGET = 0.8
#: The most a larger micro-batch is assumed to recover (a share of GPU time).
HEADROOM_MAX_IMPACT = 0.1

# ---------------------------------------------------------------------------------- baseline regression

#: Metrics compared with the baseline, whether higher is better, and the aliases baselines may use.
BASELINE_METRICS: dict[str, tuple[bool, tuple[str, ...]]] = {
    "mfu": (True, ("mfu",)),
    "tokens_per_second_per_gpu": (
        True,
        ("tokens_per_second_per_gpu", "tokens_per_s_per_gpu", "tokens_per_gpu_per_s"),
    ),
    "step_time_ms": (False, ("step_time_ms", "step_ms")),
    "sm_active": (True, ("sm_active", "sm_active_mean")),
    "tensor_active": (True, ("tensor_active", "tensor_active_mean")),
}
#: Deviation from the baseline median beyond which a regression is critical.
BASELINE_CRITICAL_PCT = 30.0

# ------------------------------------------------------------------------------------------ GPU errors

#: XID codes that point at hardware (ECC, fallen off the bus, NVLink, GSP, row remapping): critical.
#: Others (13, 31, 43: usually the application) are warnings.
XID_HARDWARE = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 121, 140})

# ------------------------------------------------------------------------------------- confidence / $

#: Each missing optional signal multiplies a finding's confidence by this (each rule may override).
MISSING_SIGNAL_FACTOR = 0.85
#: Confidence never drops below this for a finding that fired (it would not be shown otherwise).
MIN_CONFIDENCE = 0.2
#: Share of samples with data below which the coverage starts to lower confidence.
FULL_COVERAGE = 0.9
#: Severity at or above which a finding counts as a diagnosis (evaluation, healthy false-warning rate).
DIAGNOSIS_SEVERITIES = frozenset({"warning", "critical"})
