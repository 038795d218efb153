"""Scenarios: one per diagnosis code that DCGM metrics can show, each a `Profile` of busy-time levels.

A profile says, per GPU and sample, how busy the GPU is (`activity`, the share of time a kernel runs,
which is what GPU_UTIL measures) and what the busy time looks like inside the GPU (SM active, occupancy,
DRAM, pipes, interconnect, clocks, throttling). `core.simulate` turns it into exporter fields.
Levels imitate the AcmeTrace distributions (`reference/acme`): a busy GPU reads ~99 % util; healthy
LLM training keeps SM active around 0.9; the cluster-wide median SM active of 0.5 with occupancy 0.14
is what false saturation looks like.

Exporter samples are 30 s apart while training steps take seconds, so a sample sees the phase of the
step it lands in. Regular patterns (a stall every few samples, a sawtooth over a few minutes) are
modelled on the sample grid so that they are visible at the exporter's resolution.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jobs.simulate.gpus import GpuModel

Level = float | np.ndarray  # scalar, (G, 1), (1, T) or (G, T); broadcast to (G, T)

HEALTHY_MFU = 0.45  # a well-run bf16 LLM job (formulas.md: 40-55 %)


@dataclass(slots=True)
class Ctx:
    """What a scenario builder may use: shapes, host of each GPU, the job's RNG."""

    rng: np.random.Generator
    n_gpus: int
    n_samples: int
    step_s: float
    host_index: np.ndarray  # (G,) host number of each GPU
    model: GpuModel
    params: dict[str, Any]

    def ones(self) -> np.ndarray:
        """A (G, T) array of ones."""
        return np.ones((self.n_gpus, self.n_samples))

    def window(self, start_frac: float, end_frac: float) -> np.ndarray:
        """(T,) bool mask of samples between two fractions of the job's duration."""
        k = np.arange(self.n_samples)
        return (k >= int(start_frac * self.n_samples)) & (k < int(np.ceil(end_frac * self.n_samples)))


@dataclass(slots=True)
class Profile:
    """Busy-time levels of one job; fields left at defaults describe a healthy bf16 LLM job."""

    activity: np.ndarray  # (G, T) share of time a kernel runs (GPU_UTIL / 100)
    mfu: float = HEALTHY_MFU  # target MFU over the job; tensor activity and tokens/s follow from it
    sm: Level = 0.90  # SM active while busy
    occupancy: Level = 0.35  # occupancy as a share of SM active
    tensor_shape: np.ndarray | None = None  # relative tensor activity (default: activity)
    dram: Level = 0.40
    fp32: Level = 0.06
    fp16: Level = 0.03
    pcie_rx: Level = 1.5e9  # bytes/s while busy
    pcie_tx: Level = 0.4e9
    nvlink: Level = 40e9  # bytes/s per direction while busy
    clock: Level = 0.98  # SM clock / max boost clock while busy
    throttle: Level = 0  # clock event reason bits while busy
    power_share: Level = 0.01  # share of time power-capped (POWER_VIOLATION rate)
    thermal_share: Level = 0.0  # share of time thermally capped (THERMAL_VIOLATION rate)
    power_extra: Level = 0.0  # added to the power fraction (hot, inefficient silicon)
    ambient_c: Level = 28.0  # inlet-ish temperature the GPU settles above
    fb: Level = 0.82  # FB used / capacity, per GPU
    xid: np.ndarray | None = None  # (G, T) XID code, 0 = none
    truth: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named scenario, the diagnosis code it exhibits, and its profile builder."""

    name: str
    code: str
    description: str
    build: Callable[[Ctx], Profile]


def _healthy(ctx: Ctx) -> Profile:
    return Profile(activity=ctx.ones())


def _false_saturation(ctx: Ctx) -> Profile:
    # AcmeTrace medians: util 99 %, SM active 0.50, occupancy 0.14; stay just below 0.5.
    return Profile(activity=ctx.ones(), mfu=0.22, sm=0.42, occupancy=0.33, dram=0.28, nvlink=20e9, fb=0.6)


def _data_pipeline_stall(ctx: Ctx) -> Profile:
    every = int(ctx.params.get("stall_every", 4))
    k = np.arange(ctx.n_samples)
    idle = (k % every) == every - 1
    act = ctx.ones()
    # Data-parallel ranks wait for each other, so every GPU idles in the same samples.
    act[:, idle] = ctx.rng.uniform(0.0, 0.05, size=(ctx.n_gpus, int(idle.sum())))
    return Profile(
        activity=act,
        mfu=HEALTHY_MFU * float(act.mean()),
        pcie_rx=0.8e9,
        truth={"stall_period_s": every * ctx.step_s, "idle_fraction": float(idle.mean())},
    )


def _launch_overhead(ctx: Ctx) -> Profile:
    # Thousands of tiny kernels: the GPU always has one running, but few warps on few SMs.
    return Profile(
        activity=ctx.ones() * 0.97,
        mfu=0.09,
        sm=0.28,
        occupancy=0.25,
        dram=0.12,
        fp32=0.10,
        nvlink=10e9,
        clock=1.0,
        fb=0.55,
    )


def _communication_wait(ctx: Ctx) -> Profile:
    period = int(ctx.params.get("period_samples", 8))
    k = np.arange(ctx.n_samples)
    saw = (k % period) / period  # the same phase on every GPU: ranks block in the same collective
    comm = saw < 0.25
    sm = np.broadcast_to(0.2 + 0.65 * saw, (ctx.n_gpus, ctx.n_samples)).copy()
    nvl = np.where(comm, 0.35 * ctx.model.nvlink_gbps * 1e9, 0.02 * ctx.model.nvlink_gbps * 1e9)
    return Profile(
        activity=ctx.ones(),  # NCCL kernels spin while waiting: GPU_UTIL stays at ~100 %
        mfu=0.24,
        sm=sm,
        tensor_shape=np.broadcast_to(np.where(comm, 0.05, saw), (ctx.n_gpus, ctx.n_samples)).copy(),
        nvlink=np.broadcast_to(nvl, (ctx.n_gpus, ctx.n_samples)).copy(),
        truth={"sawtooth_period_s": period * ctx.step_s},
    )


def _throttling(ctx: Ctx) -> Profile:
    shape = (ctx.n_gpus, ctx.n_samples)
    combos = np.array([0x4 | 0x40, 0x20 | 0x40, 0x4 | 0x20 | 0x40, 0x40, 0x4])
    return Profile(
        activity=ctx.ones(),
        mfu=0.30,
        sm=0.80,
        dram=0.35,
        clock=np.clip(0.68 + 0.05 * ctx.rng.standard_normal(shape), 0.5, 0.8),
        throttle=ctx.rng.choice(combos, size=shape),
        power_share=0.35,
        thermal_share=0.55,
        power_extra=0.25,
        ambient_c=36.0,
    )


def _tensor_cores_idle(ctx: Ctx) -> Profile:
    # AMP off or odd matrix shapes: the work runs on the FP32 pipe instead of the tensor cores.
    return Profile(activity=ctx.ones(), mfu=0.08, sm=0.86, occupancy=0.40, fp32=0.55, fp16=0.02, dram=0.35)


def _memory_bound(ctx: Ctx) -> Profile:
    return Profile(activity=ctx.ones(), mfu=0.17, sm=0.85, occupancy=0.45, dram=0.78, fp32=0.12)


def _host_device_copy(ctx: Ctx) -> Profile:
    pcie = ctx.model.pcie_gbps * 1e9
    act = np.clip(0.80 + 0.06 * ctx.rng.standard_normal((ctx.n_gpus, ctx.n_samples)), 0.6, 0.95)
    return Profile(
        activity=act, mfu=0.18, sm=0.50, dram=0.30, pcie_rx=0.45 * pcie, pcie_tx=0.18 * pcie, nvlink=15e9
    )


def _straggler(ctx: Ctx) -> Profile:
    scope = ctx.params.get("straggler_scope", "gpu")
    if scope == "node":
        slow = ctx.host_index == ctx.host_index.max()
    else:
        slow = np.zeros(ctx.n_gpus, dtype=bool)
        slow[-1] = True
    s = slow[:, None]
    return Profile(
        activity=ctx.ones(),
        mfu=0.28,
        sm=np.where(s, 0.55, 0.72),  # peers wait at the collective; the slow one is throttled
        tensor_shape=np.where(s, 0.8, 1.0) * ctx.ones(),
        clock=np.where(s, 0.70, 0.98),
        throttle=np.where(s, 0x40, 0),
        thermal_share=np.where(s, 0.4, 0.0),
        ambient_c=np.where(s, 40.0, 28.0),
        truth={"straggler_gpus": [int(i) for i in np.flatnonzero(slow)], "scope": scope},
    )


def _idle_gpus(ctx: Ctx) -> Profile:
    n_idle = max(1, ctx.n_gpus // 4)
    idle = np.arange(ctx.n_gpus) >= ctx.n_gpus - n_idle
    start = float(ctx.params.get("idle_from", 0.1))
    act = ctx.ones()
    act[np.ix_(idle, ctx.window(start, 1.0))] = 0.0
    fb = np.where(idle, 0.004, 0.82)[:, None]  # a CUDA context and nothing else
    return Profile(
        activity=act,
        mfu=HEALTHY_MFU * float(act.mean()),
        fb=fb,
        truth={"idle_gpus": [int(i) for i in np.flatnonzero(idle)], "idle_from_fraction": start},
    )


def _memory_headroom(ctx: Ctx) -> Profile:
    return Profile(activity=ctx.ones(), mfu=0.40, fb=0.22)


def _gpu_errors(ctx: Ctx) -> Profile:
    code = int(ctx.params.get("xid", 94))  # 94: contained uncorrectable ECC error (Ampere and newer)
    length = max(3 / ctx.n_samples, 600 / (ctx.n_samples * ctx.step_s))
    win = ctx.window(0.5, 0.5 + length)
    xid = np.zeros((ctx.n_gpus, ctx.n_samples))
    xid[-1, win] = code
    idx = np.flatnonzero(win)
    return Profile(
        activity=ctx.ones(),
        xid=xid,
        truth={"xid": code, "xid_gpu": ctx.n_gpus - 1, "xid_samples": (int(idx[0]), int(idx[-1]))},
    )


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("healthy", "", "well-run bf16 training: SM active ~0.9, MFU ~45 %", _healthy),
        Scenario(
            "false_saturation",
            "false_saturation",
            "GPU_UTIL ~99 % while SM active ~0.42 and occupancy ~0.14 (the AcmeTrace median)",
            _false_saturation,
        ),
        Scenario(
            "data_pipeline_stall",
            "data_pipeline_stall",
            "every GPU drops to ~0 % util in the same samples at a regular period (input starvation)",
            _data_pipeline_stall,
        ),
        Scenario(
            "launch_overhead",
            "launch_overhead",
            "busy util, SM active ~0.28, tensor ~0.1: many tiny kernels",
            _launch_overhead,
        ),
        Scenario(
            "communication_wait",
            "communication_wait",
            "sawtooth in SM/tensor active synchronised across all GPUs, NVLink bursts in the troughs",
            _communication_wait,
        ),
        Scenario(
            "throttling",
            "throttling",
            "SM clock ~68 % of boost, thermal/power violation counters rising, hot, at the power cap",
            _throttling,
        ),
        Scenario(
            "tensor_cores_idle",
            "tensor_cores_idle",
            "SM active high but tensor active ~0.1, FP32 pipe busy (AMP off)",
            _tensor_cores_idle,
        ),
        Scenario("memory_bound", "memory_bound", "DRAM active ~0.78, tensor ~0.2", _memory_bound),
        Scenario(
            "host_device_copy",
            "host_device_copy",
            "PCIe RX ~45 % and TX ~18 % of the link, util ~80 %",
            _host_device_copy,
        ),
        Scenario(
            "straggler",
            "straggler",
            "one GPU (or node) throttled with lower SM active; its peers wait",
            _straggler,
        ),
        Scenario(
            "idle_gpus",
            "idle_gpus",
            "a quarter of the GPUs at 0 % from 10 % of the job onwards",
            _idle_gpus,
        ),
        Scenario(
            "memory_headroom",
            "memory_headroom",
            "healthy compute with frame buffer ~22 % used",
            _memory_headroom,
        ),
        Scenario("gpu_errors", "gpu_errors", "one GPU reports XID 94 for ~10 minutes mid-job", _gpu_errors),
    )
}
