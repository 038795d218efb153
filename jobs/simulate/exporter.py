"""Step-level workloads recorded the way dcgm-exporter and Prometheus really record them (pure numpy).

The scenario profiles in `scenarios.py` are levels on the sample grid: a pattern is visible only because
it was drawn at the exporter's resolution. Here the truth is a training *step* (0.1-120 s) made of phases
(compute, waiting for input, an exposed collective, tiny kernels) on a fine time base, and the exporter's
chain of windows is applied to it (reference/sampling.md):

* GPU_UTIL is NVML's utilisation: "percent of time over the past sample period during which one or more
  kernels was executing"; "each sample period may be between 1 second and 1/6 second, depending on the
  product" (NVML API reference, nvmlUtilization_t / nvmlDeviceGetUtilizationRates). The exporter reads it
  when it collects: a point sample of a <= 1 s window, integer percent.
* DCGM profiling fields (SM_ACTIVE, TENSOR_ACTIVE, DRAM_ACTIVE, GR_ENGINE_ACTIVE, PCIe and NVLink bytes)
  are averages over the watch interval: DCGM samples them at a finer rate and "samples will be aggregated
  to updateFreq intervals in DCGM's internal cache" (DCGM API reference, dcgmProfWatchFields updateFreq).
* dcgm-exporter collects every `-c`/`--collect-interval` milliseconds, default 30000 (NVIDIA/dcgm-exporter
  pkg/cmd/app.go, CLICollectInterval Value 30000: "Interval of time at which point metrics are collected.
  Unit is milliseconds (ms)"), and serves the latest collection until the next: "a scrape does not force
  DCGM to query the hardware, so scraping more frequently than the effective DCGM watch cadence can
  return the same cached sample more than once" (NVIDIA DCGM docs, "Configure Prometheus for DCGM
  Exporter").
* Prometheus scrapes every `scrape_interval` at a per-target offset inside the interval; a failed scrape
  leaves a hole (about 1 % here); a node can be lost for minutes.

The result is an ordinary `SimResult` on the scrape grid with `sample_offsets` (the per-target offset of
each GPU's samples after the grid time), so the writers, `signals_from_sim`
(benchmarks/diagnosis_inputs.py) and the diagnosis read it like any other simulated job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

PhaseKind = Literal["compute", "input_wait", "host", "collective", "tiny_kernels", "barrier"]


@dataclass(frozen=True, slots=True)
class Phase:
    """One part of a training step on one rank.

    `duty` is the share of the phase with a kernel resident (what GPU_UTIL counts); `sm`, `tensor` and
    `dram` are SM active, tensor-pipe active and DRAM active *while a kernel is resident* (DCGM's fields
    are these times `duty`); `nvlink_bps` and `pcie_bps` are link traffic per direction during the phase.
    """

    kind: PhaseKind
    seconds: float
    duty: float = 1.0
    sm: float = 0.9
    tensor: float = 0.55
    dram: float = 0.4
    nvlink_bps: float = 0.0
    pcie_bps: float = 0.3e9


@dataclass(frozen=True, slots=True)
class Workload:
    """A training step repeated for the whole job, and which finding code it plants ("" = healthy).

    `sync`: "synchronised" ranks run the step in lock-step (the same phase at the same time on every node);
    "staggered" shifts each node's step by its own phase (input pipelines out of phase across machines).
    `jitter`: relative step-to-step variation of the step time, which makes the phase at which the
    exporter samples drift (a step that divides the collect interval exactly would otherwise be sampled
    at the same phase forever).
    """

    code: str
    phases: tuple[Phase, ...]
    sync: Literal["synchronised", "staggered"] = "synchronised"
    jitter: float = 0.03
    label: str = ""

    @property
    def step_s(self) -> float:
        """Nominal step time in seconds."""
        return float(sum(p.seconds for p in self.phases))

    def mean(self, attr: str) -> float:
        """Time-weighted mean over the step of `duty` or of duty x a per-kernel level (sm, tensor, dram)."""
        total = self.step_s
        if attr == "duty":
            return sum(p.seconds * p.duty for p in self.phases) / total
        return sum(p.seconds * p.duty * float(getattr(p, attr)) for p in self.phases) / total


@dataclass(frozen=True, slots=True)
class Exporter:
    """How the metrics are recorded (defaults: dcgm-exporter's 30 s collect interval, 15 s scrapes)."""

    scrape_s: float = 15.0
    collect_s: float = 30.0
    nvml_window_s: float = 1.0  # 1/6 s to 1 s depending on the product
    failed_scrapes: float = 0.01
    #: (start as a fraction of the job, seconds): one node's exporter unreachable for that long.
    node_lost: tuple[float, float] | None = None
    fine_dt_s: float = 0.1
    noise: float = 0.01


@dataclass(slots=True)
class Recorded:
    """Per-GPU exporter samples at the scrape times (G, T) and each GPU's scrape offset (G,)."""

    fields: dict[str, np.ndarray]
    activity: np.ndarray  # (G, T) collect-interval mean of the duty (drives power and temperature)
    offsets: np.ndarray
    truth: dict[str, object] = field(default_factory=dict)


def record(
    workload: Workload,
    exporter: Exporter,
    *,
    n_gpus: int,
    host_index: np.ndarray,
    n_samples: int,
    rng: np.random.Generator,
) -> Recorded:
    """Run the step pattern on a fine time base and record it as the exporter and Prometheus would."""
    n_hosts = int(host_index.max()) + 1
    step = workload.step_s
    dt = min(exporter.fine_dt_s, step / 10.0)
    scrape, collect = exporter.scrape_s, max(exporter.collect_s, 1e-3)
    window = max(exporter.nvml_window_s, dt)
    margin = collect + window + scrape
    span = n_samples * scrape + margin
    # Each host: a fine series starting `margin` before the job (so the first collect has a full window).
    n_fine = int(np.ceil(span / dt)) + 1
    t_fine = -margin + dt * np.arange(n_fine)
    edges = np.cumsum([0.0, *[p.seconds for p in workload.phases]])
    kinds = ("duty", "sm", "tensor", "dram", "nvlink_bps", "pcie_bps")
    table = {
        k: np.array([p.duty if k == "duty" else p.duty * getattr(p, k) if k in ("sm", "tensor", "dram")
                     else getattr(p, k) for p in workload.phases])
        for k in kinds
    }  # fmt: skip
    # Step-time jitter as a random walk of the phase (ranks in lock-step share it; nodes differ only by
    # their offset when staggered).
    steps_total = int(np.ceil(span / step)) + 2
    drift = np.cumsum(workload.jitter * step * rng.standard_normal(steps_total))
    host_shift = rng.uniform(0.0, step, n_hosts) if workload.sync == "staggered" else np.zeros(n_hosts)
    collect_phase = rng.uniform(0.0, collect, n_hosts)  # each exporter started at its own time
    scrape_offset = rng.uniform(0.05, 0.95, n_hosts) * scrape  # Prometheus spreads targets over the interval
    fine: dict[str, np.ndarray] = {k: np.empty((n_hosts, n_fine)) for k in kinds}
    for h in range(n_hosts):
        t = t_fine + host_shift[h]
        k = np.clip(np.floor((t + margin) / step).astype(np.int64), 0, steps_total - 1)
        pos = np.mod(t + drift[k], step)
        idx = np.clip(np.searchsorted(edges, pos, side="right") - 1, 0, len(workload.phases) - 1)
        for name in kinds:
            fine[name][h] = table[name][idx]
    csum = {
        k: np.concatenate([np.zeros((n_hosts, 1)), np.cumsum(v, axis=1)], axis=1) for k, v in fine.items()
    }

    def window_mean(name: str, h: int, end: np.ndarray, length: float) -> np.ndarray:
        hi = np.clip(np.rint((end + margin) / dt).astype(np.int64), 0, n_fine)
        lo = np.clip(hi - max(round(length / dt), 1), 0, n_fine)
        return (csum[name][h, hi] - csum[name][h, lo]) / np.maximum(hi - lo, 1)

    scrape_t = np.arange(n_samples) * scrape
    per_host: dict[str, np.ndarray] = {k: np.empty((n_hosts, n_samples)) for k in (*kinds, "util", "act")}
    collection = np.empty((n_hosts, n_samples), dtype=np.int64)  # which collection each scrape serves
    for h in range(n_hosts):
        when = scrape_t + scrape_offset[h]
        # The latest collection at or before each scrape.
        collection[h] = np.floor((when - collect_phase[h]) / collect).astype(np.int64) + 1
        c = collect_phase[h] + (collection[h] - 1) * collect
        per_host["util"][h] = window_mean("duty", h, c, window)
        per_host["act"][h] = window_mean("duty", h, c, collect)
        for name in kinds:
            per_host[name][h] = window_mean(name, h, c, collect)
    noise = exporter.noise
    gpu_bias = 1.0 + noise * rng.standard_normal((n_gpus, 1))

    cols = collection[host_index]  # (G, T): a value served twice by two scrapes is the same reading

    def gpus(name: str, rel: float = 1.0) -> np.ndarray:
        base = per_host[name][host_index]
        draw = rng.standard_normal((n_gpus, int(cols.max()) + 1))
        jitter = np.take_along_axis(draw, cols, axis=1)
        return np.clip(base * gpu_bias * (1.0 + rel * noise * jitter), 0.0, None)

    util = np.clip(np.rint(100.0 * gpus("util")), 0, 100)
    sm = np.clip(gpus("sm"), 0, 1)
    tensor = np.clip(gpus("tensor"), 0, 0.95)
    dram = np.clip(gpus("dram"), 0, 0.85)
    nvl = np.rint(gpus("nvlink_bps", 2.0))
    nvl_rx = np.rint(np.clip(nvl * (1.0 + noise * np.take_along_axis(
        rng.standard_normal((n_gpus, int(cols.max()) + 1)), cols, axis=1)), 0, None))  # fmt: skip
    pcie = np.rint(2e7 + gpus("pcie_bps", 2.0))
    fields = {
        "gpu_util": util,
        "gr_engine_active": np.clip(gpus("act", 0.5), 0, 1),
        "sm_active": sm,
        "sm_occupancy": np.clip(sm * 0.35, 0, 1),
        "tensor_active": tensor,
        "tensor_hmma_active": tensor * 0.98,
        "dram_active": dram,
        "mem_copy_util": np.clip(np.rint(dram * 100 * 0.92), 0, 100),
        "nvlink_tx_bytes": nvl,
        "nvlink_rx_bytes": nvl_rx,
        "nvlink_bandwidth_total": np.rint((nvl + nvl_rx) / 1e6),
        "pcie_rx_bytes": pcie,
        "pcie_tx_bytes": np.rint(pcie * 0.3),
    }
    lost = rng.random((n_hosts, n_samples)) < exporter.failed_scrapes
    truth: dict[str, object] = {
        "step_s": step,
        "sync": workload.sync,
        "scrape_s": scrape,
        "collect_s": collect,
        "nvml_window_s": exporter.nvml_window_s,
        "workload": workload.label,
    }
    if exporter.node_lost is not None and n_samples > 1:
        start_frac, seconds = exporter.node_lost
        a = int(start_frac * n_samples)
        lost[n_hosts - 1, a : a + max(int(seconds // scrape), 1)] = True
        truth["node_lost_samples"] = (a, min(a + max(int(seconds // scrape), 1), n_samples))
    mask = lost[host_index]
    for arr in fields.values():
        arr[mask] = np.nan  # a failed scrape loses every field of the target at once
    return Recorded(fields, per_host["act"][host_index], scrape_offset[host_index], truth)


# --------------------------------------------------------------------------------------- workloads


def healthy(step_s: float = 2.0, *, nvlink_bps: float = 40e9) -> Workload:
    """Well-run training: kernels back to back, SM ~0.9, tensor ~0.55, gradients overlapped."""
    return Workload(
        "",
        (Phase("compute", step_s, duty=0.99, sm=0.9, tensor=0.55, dram=0.4, nvlink_bps=nvlink_bps),),
        label=f"healthy, {step_s:g} s steps",
    )


def input_stall(
    step_s: float,
    wait_share: float,
    *,
    sync: Literal["synchronised", "staggered"] = "synchronised",
    host_share: float = 0.0,
    compute_duty: float = 0.97,
    nvlink_bps: float = 5e9,
) -> Workload:
    """Each step the GPU waits `wait_share` of the step with nothing resident (the input pipeline), then
    computes; `host_share` more of the step runs sparse kernels while the main process tokenises."""
    wait, host = step_s * wait_share, step_s * host_share
    phases = [Phase("input_wait", wait, duty=0.0, pcie_bps=0.1e9)]
    if host > 0:
        phases.append(Phase("host", host, duty=0.08, sm=0.5, tensor=0.2, dram=0.2))
    phases.append(
        Phase("compute", step_s - wait - host, duty=compute_duty, sm=0.88, tensor=0.55, dram=0.4,
              nvlink_bps=nvlink_bps, pcie_bps=0.8e9)
    )  # fmt: skip
    return Workload("data_pipeline_stall", tuple(phases), sync=sync, label=f"input stall {sync}")


def collective_wait(
    step_s: float,
    wait_share: float,
    *,
    mode: Literal["spin", "drop"] = "spin",
    links: Literal["troughs", "idle"] = "troughs",
    link_bps: float = 200e9,
    compute_sm: float = 0.9,
    compute_tensor: float = 0.55,
) -> Workload:
    """Each step ends in an exposed collective of `wait_share` of the step, ranks in lock-step.

    `compute_sm` / `compute_tensor`: SM and tensor activity while the step computes (a dense bf16 step:
    0.9 / 0.55); the wait runs NCCL at SM 0.15 with the tensor pipes idle.

    spin: NCCL kernels stay resident while they wait (GPU_UTIL high, few SMs: NCCL runs one CTA per
    channel on a few dozen of the SMs); drop: a host-side barrier, nothing resident (GPU_UTIL drops).
    links: "troughs" = the collective moves data over NVLink in the wait; "idle" = the wait is for a peer
    (latency, a slow rank), links quiet.
    """
    wait = step_s * wait_share
    traffic = link_bps if links == "troughs" else 1e9
    waiting = (
        Phase("collective", wait, duty=1.0, sm=0.15, tensor=0.0, dram=0.25, nvlink_bps=traffic)
        if mode == "spin"
        else Phase("barrier", wait, duty=0.02, sm=0.1, tensor=0.0, dram=0.05, nvlink_bps=traffic)
    )
    return Workload(
        "communication_wait",
        (
            Phase("compute", step_s - wait, duty=0.99, sm=compute_sm, tensor=compute_tensor, dram=0.4,
                  nvlink_bps=10e9),
            waiting,
        ),
        label=f"collective {mode}, links {links}",
    )  # fmt: skip


def collective_at_sm(step_s: float, sm_mean: float, *, compute_sm: float = 0.9) -> Workload:
    """An exposed collective with NCCL spinning, its share of the step chosen so that the job's mean SM
    activity is `sm_mean`: mean = (1 - w) x 0.99 x compute_sm + w x 0.15 (the NCCL channels' level), so
    w = (0.99 compute_sm - sm_mean) / (0.99 compute_sm - 0.15). 20 % -> w = 0.93, 80 % -> w = 0.12."""
    busy = 0.99 * compute_sm
    if not 0.15 < sm_mean < busy:
        raise ValueError(f"mean SM activity {sm_mean} outside (0.15, {busy:.3f}) for compute SM {compute_sm}")
    wait = (busy - sm_mean) / (busy - 0.15)
    w = collective_wait(step_s, wait, mode="spin", links="troughs", compute_sm=compute_sm)
    return Workload(w.code, w.phases, label=f"collective spin at SM {sm_mean:.0%}")


def tiny_kernels(step_s: float = 1.0, *, duty: float = 0.68) -> Workload:
    """Launch-bound: thousands of 1-3 us kernels; the GPU idles microseconds between them (spread evenly:
    every NVML window reads about the same), few warps on few SMs, quiet pipes."""
    return Workload(
        "launch_overhead",
        (Phase("tiny_kernels", step_s, duty=duty, sm=0.35, tensor=0.12, dram=0.18, nvlink_bps=3e9),),
        label="tiny kernels",
    )
