"""What the metrics can resolve, and the "four looks" read as levels when they cannot (pure numpy).

A stored DCGM sample is the end of a chain of windows (reference/sampling.md):

* GPU_UTIL is NVML's share of "the past sample period" with a kernel running, a period "between 1 second
  and 1/6 second, depending on the product" (NVML API reference, nvmlUtilization_t): a *point* sample of a
  <= 1 s window, taken when dcgm-exporter collects;
* the DCGM profiling fields (SM_ACTIVE, PIPE_TENSOR_ACTIVE, DRAM_ACTIVE, PCIe/NVLink bytes) are averages
  that DCGM aggregates to its watch interval (DCGM API reference, dcgmProfWatchFields `updateFreq`);
* dcgm-exporter collects every `-c` ms, default 30000 (dcgm-exporter pkg/cmd/app.go), and serves the
  latest collection to every scrape until the next one (DCGM docs, "Configure Prometheus for DCGM
  Exporter"); Prometheus keeps one sample per scrape interval (often 15-30 s) at a per-target offset.

What a cause looks like in these samples, derived per window (the rules cite this):

* a GPU that waits a share w of every step of length S (input, a host barrier) with nothing resident:
  the *mean* of GPU_UTIL's point samples is 1 - w at any window and any scrape (each window is a random
  phase of the step; the mean of random phases is the duty). The spread depends on the window W: with
  W <= the idle stretch (1/6 s window, or 1 s inside a 1.3 s wait) some samples read 0 and others ~100 %;
  with W of the order of S or longer, or the wait cut into several pieces per step, every sample averages
  a whole cycle and reads ~1 - w (the seed's case 1 at 15 s with a 1 s window: 2 s steps waiting 2/3 of
  the step, no sample at 0 %, mean 33 %). So a low *mean* is idle time whatever the spread: at a 33 %
  mean the GPU has no kernel two thirds of the time, which tiny kernels cannot produce (a launch-bound
  stream keeps a kernel resident most of the time: the seed's run 2 reads 68 %; issue 25's held-out
  launch-bound jobs ~95 % with low SM activity). Below `T.UNRESOLVED_UTIL_IDLE_MAX` the look is an idle
  GPU waiting on the host side; only above it does a narrow spread with small kernels mean launch gaps.
* the profiling fields are collect-interval averages (DCGM: 30 s by default): whatever the window,
  SM/tensor/DRAM activity reads duty x the per-kernel level; dividing by the mean utilisation gives the
  activity while a kernel is resident (`Looks.per_busy`).
* an exposed collective in which NCCL kernels spin: GPU_UTIL ~100 % (a kernel is resident), SM activity at
  the level NCCL's channels occupy (one CTA per channel on a few dozen SMs, ~0.1-0.2) in the wait and the
  compute level outside it, so the mean SM activity lands anywhere between (20-80 % for waits of 90-10 %
  of the step); the tensor pipes are idle in the wait; the links carry the collective's data. The
  signature is the *combination* (busy GPU, tensor pipes below their healthy level, link traffic), not an
  SM ceiling (the seed's case 2: GPU_UTIL 100 %, SM 64.5 %, tensor low, heavy NVLink).
* a Prometheus scrape is the last collected value (dcgm-exporter serves its latest collection): at 5 s
  scrapes a 30 s collect interval repeats each value ~6 times, at 60 s half the collections are never
  seen; patterns are resolved only when they span `RESOLVED_MIN_SAMPLES` distinct samples.

Two regimes follow:

* **resolved**: a pattern whose period spans at least `RESOLVED_MIN_SAMPLES` samples (a minute or more at
  15 s) shows its shape: idle gaps, sawtooths, their phase across GPUs and nodes, what the links do in the
  troughs. The rules' pattern detectors (jobs.diagnosis.detectors) read it.
* **unresolved**: a step of 0.1-5 s is far shorter than a sample. The profiling fields average many steps
  into a flat level, and GPU_UTIL's point samples land at random phases of the step. What is left are the
  four looks as *levels and ratios* (`Looks`): how far utilisation is below 100 %, whether its point
  samples spread (idle stretches at least an NVML window long) or sit at one level (idle time in
  microsecond gaps between kernels), SM/tensor/DRAM per unit of busy time, and how much the links carry.
  Findings from these levels carry a lower confidence, say the resolution they were made at, and name the
  capture that would confirm them (`capture`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np

from jobs.diagnosis import detectors as D
from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import DiagnosisInput, Evidence

Regime = Literal["resolved", "unresolved"]

#: A period must span this many samples for its shape to be read (below: unresolved).
RESOLVED_MIN_SAMPLES = 4
#: NVML's utilisation window is between 1/6 s and 1 s depending on the product (nvmlUtilization_t).
NVML_WINDOW_S = (1.0 / 6.0, 1.0)
#: dcgm-exporter's default collect interval (`-c 30000`, milliseconds).
DEFAULT_COLLECT_S = 30.0

#: The captures that confirm an unresolved finding (the seeds' workflow: metrics find the window, the trace
#: names the cause). Each is a command a user can paste.
NSYS = (
    "nsys profile -t cuda,nvtx,osrt,nccl --duration 60 --delay 300 -o capture_%h_%p "
    "<your training command> (Nsight Systems: kernels, CUDA API, NCCL and OS runtime on one timeline; "
    "DCGM profiling pauses during the capture)"
)
PYSPY = (
    "py-spy record --pid <PID of the training process> --duration 60 -o profile.speedscope "
    "--format speedscope (what the Python main process and the DataLoader workers do, no restart)"
)
TORCH_PROFILER = (
    "torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], "
    "schedule=torch.profiler.schedule(wait=5, warmup=2, active=5, repeat=1), "
    "on_trace_ready=torch.profiler.tensorboard_trace_handler('./trace')) around a few steps, then upload "
    "the .pt.trace.json"
)
CAPTURES: dict[str, tuple[str, ...]] = {
    "input": (PYSPY, NSYS, TORCH_PROFILER),
    "collective": (NSYS, TORCH_PROFILER),
    "launch": (NSYS, TORCH_PROFILER),
    "any": (NSYS, PYSPY, TORCH_PROFILER),
}


@dataclass(frozen=True, slots=True)
class Resolution:
    """How finely the job's signals are sampled and which patterns that leaves visible."""

    sample_interval_s: float
    step_time_s: float | None  # the training step, when throughput or a trace says it

    @property
    def min_period_s(self) -> float:
        """The shortest pattern period whose shape the samples resolve."""
        return RESOLVED_MIN_SAMPLES * self.sample_interval_s

    @property
    def step_regime(self) -> Regime | None:
        """Whether the training step itself is resolved (None when the step time is unknown)."""
        if self.step_time_s is None:
            return None
        return "resolved" if self.step_time_s >= self.min_period_s else "unresolved"

    def text(self) -> str:
        """The effective resolution in words, as the evidence and the page state it."""
        return (
            f"GPU_UTIL sampled every {self.sample_interval_s:g} s (each a point sample of NVML's 1/6-1 s "
            f"window); profiling fields are averages over dcgm-exporter's collect interval (default "
            f"{DEFAULT_COLLECT_S:g} s); per-step patterns < {self.min_period_s:g} s are not visible"
        )

    def evidence(self, regime: Regime) -> list[Evidence]:
        """Evidence lines naming the regime and the resolution."""
        out = [Evidence("regime", regime), Evidence("effective resolution", self.text())]
        if self.step_time_s is not None:
            out.append(Evidence("training step", round(self.step_time_s, 3), "s"))
        return out


def resolution(inp: DiagnosisInput, grid_step_s: float) -> Resolution:
    """The job's resolution: the coarser of the stored sample interval and the grid step."""
    interval = max(float(inp.sample_interval_s or 0.0), float(grid_step_s or 0.0)) or 30.0
    step = inp.step_time_ms / 1000.0 if inp.step_time_ms and inp.step_time_ms > 0 else None
    return Resolution(interval, step)


def capture(kind: str) -> str:
    """The recommendation's closing sentence: the captures that would confirm an unresolved finding."""
    cmds = CAPTURES.get(kind, CAPTURES["any"])
    return " To confirm (metrics found the window, a capture names the cause): " + "; or ".join(cmds) + "."


# ----------------------------------------------------------------------------------- the four looks


@dataclass(frozen=True, slots=True)
class Looks:
    """Job-level levels and ratios the unresolved regime reads (ratios 0-1, traffic in B/s per GPU).

    `util_*` are over the per-GPU GPU_UTIL point samples of the GPUs that work at all; `sm`, `tensor`,
    `dram` are means over all samples (not only busy ones: at this resolution a busy sample does not say
    which phase of the step the profiling average covered) and `*_per_busy` divide them by the mean
    utilisation: the activity while a kernel is resident. `nvlink_bps` is TX per direction (or
    NVLINK_BANDWIDTH_TOTAL / 2), `pcie_bps` the larger of RX and TX.
    """

    util_mean: float | None
    util_p10: float | None
    util_p90: float | None
    trough_share: float | None  # share of util samples at or below UNRESOLVED_TROUGH_UTIL
    samples: int  # util samples per working GPU (median)
    sm: float | None
    tensor: float | None
    dram: float | None
    nvlink_bps: float | None
    pcie_bps: float | None

    @property
    def spread(self) -> float | None:
        """p90 - p10 of the utilisation point samples."""
        if self.util_p10 is None or self.util_p90 is None:
            return None
        return self.util_p90 - self.util_p10

    def per_busy(self, value: float | None) -> float | None:
        """A pipe level divided by the mean utilisation: its level while a kernel is resident."""
        if value is None or not self.util_mean or self.util_mean <= 0:
            return None
        return min(value / self.util_mean, 1.0)

    @property
    def links_busy(self) -> bool:
        """NVLink (or NIC traffic over PCIe) carries collective-sized traffic."""
        return (self.nvlink_bps or 0.0) >= T.NVLINK_BUSY_BPS

    @property
    def copies_heavy(self) -> bool:
        """PCIe carries heavy host-device (or NIC) traffic."""
        return (self.pcie_bps or 0.0) >= T.PCIE_HEAVY_BPS

    def evidence(self) -> list[Evidence]:
        """The levels as evidence lines."""

        def pct(v: float | None) -> float | None:
            return None if v is None else round(100.0 * v, 1)

        def gbs(v: float | None) -> float | None:
            return None if v is None else round(v / 1e9, 2)

        out = [
            Evidence(
                "busy share, mean (GR_ENGINE_ACTIVE if exported, else GPU_UTIL)", pct(self.util_mean), "%"
            ),
            Evidence(
                "GPU_UTIL point samples, 10th-90th percentile",
                f"{pct(self.util_p10)}-{pct(self.util_p90)}",
                "%",
            ),
            Evidence("GPU_UTIL samples at or below 10 %", pct(self.trough_share), "%"),
        ]
        if self.sm is not None:
            out.append(
                Evidence(
                    "SM active, mean (per unit of busy time)",
                    f"{pct(self.sm)} ({pct(self.per_busy(self.sm))})",
                    "%",
                )
            )
        if self.tensor is not None:
            out.append(
                Evidence(
                    "tensor active, mean (per unit of busy time)",
                    f"{pct(self.tensor)} ({pct(self.per_busy(self.tensor))})",
                    "%",
                )
            )
        if self.dram is not None:
            out.append(Evidence("DRAM active, mean", pct(self.dram), "%"))
        out.append(Evidence("NVLink traffic per GPU, mean", gbs(self.nvlink_bps), "GB/s"))
        out.append(Evidence("PCIe traffic per GPU, mean", gbs(self.pcie_bps), "GB/s"))
        return out


def _mean(x: np.ndarray | None) -> float | None:
    if x is None:
        return None
    a = np.asarray(x, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(a.mean()) if a.size else None


def looks(
    util: np.ndarray | None,
    levels: dict[str, np.ndarray | None],
    busy_average: np.ndarray | None = None,
    long_idle: int | None = None,
) -> Looks | None:
    """The four looks as levels from per-GPU utilisation samples (G, T) (or a (T,) mean) and the means of
    sm_active, tensor_active, dram_active, nvlink (B/s per direction) and pcie (B/s). None without util.

    `busy_average` (GR_ENGINE_ACTIVE, a collect-interval average of the same busy share) gives the mean
    when present: GPU_UTIL's point samples are biased when the step divides the collect interval (they
    land at the same few phases of the step), the average is not. The spread still comes from the point
    samples: only they see inside a step. `long_idle`: runs of at least this many idle samples on a GPU
    are left out (a GPU idle for minutes is idle_gpus, not a partial level of its steps)."""
    if util is None:
        return None
    u = raw = np.atleast_2d(np.asarray(util, dtype=np.float64))
    if long_idle is not None and long_idle > 0:
        # Long idle stretches of a GPU are idle_gpus' (allocated, unused), not a level of its steps.
        u = u.copy()
        for row in u:
            for a, b in D.idle_gaps(row, threshold=T.IDLE_UTIL_MAX):
                if b - a >= long_idle:
                    row[a:b] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        # The mean of the point samples, not their median: with a 1/6 s window a GPU that computes a third
        # of every 2 s step reads 0 in two thirds of its samples (median 0) yet works a third of the time.
        level = np.nanmean(u, axis=1)
    working = np.isfinite(level) & (level > T.IDLE_UTIL_MAX)
    if not working.any():
        return None
    cells = u[working]
    vals = cells[np.isfinite(cells)]
    if vals.size < 3:
        return None
    counts = np.isfinite(cells).sum(axis=1)
    avg = None if busy_average is None else np.atleast_2d(np.asarray(busy_average, dtype=np.float64))
    if avg is not None and avg.shape == u.shape:
        # The same working GPUs and samples (idle GPUs and long idle stretches are idle_gpus, not a level).
        avg = np.where(np.isfinite(u) | ~np.isfinite(raw), avg, np.nan)[working]
    mean = _mean(avg)
    return Looks(
        util_mean=mean if mean is not None else float(vals.mean()),
        util_p10=float(np.quantile(vals, 0.1)),
        util_p90=float(np.quantile(vals, 0.9)),
        trough_share=float((vals <= T.UNRESOLVED_TROUGH_UTIL).mean()),
        samples=int(np.median(counts)),
        sm=_mean(levels.get("sm_active")),
        tensor=_mean(levels.get("tensor_active")),
        dram=_mean(levels.get("dram_active")),
        nvlink_bps=_mean(levels.get("nvlink")),
        pcie_bps=_mean(levels.get("pcie")),
    )


# What each look points at, unresolved: the seeds' "four looks" table read as levels. Each returns True when
# the look applies; the rules build the findings.


def host_side_stall(lk: Looks) -> bool:
    """Utilisation well below 100 % with idle links and no heavy copies, and either a mean so low that the
    GPU is idle most of the time (at or below UNRESOLVED_UTIL_IDLE_MAX, whatever the spread: see the
    module docstring), idle stretches at least an NVML window long (the point samples spread, some near
    0) or healthy kernels when resident: the GPU waits for the host / input pipeline (seed: "GPU
    utilisation low with long GPU idle")."""
    if (
        lk.util_mean is None
        or lk.util_mean > T.UNRESOLVED_UTIL_PARTIAL_MAX
        or lk.links_busy
        or lk.copies_heavy
    ):
        return False
    if lk.util_mean <= T.UNRESOLVED_UTIL_IDLE_MAX:
        return True
    spread = lk.spread or 0.0
    if spread >= T.UNRESOLVED_SPREAD_WIDE:
        return True
    return not small_kernels(lk)


def small_kernels(lk: Looks) -> bool:
    """While a kernel is resident the SMs are mostly empty and the tensor pipe quiet: tiny kernels."""
    sm, tensor = lk.per_busy(lk.sm), lk.per_busy(lk.tensor)
    if sm is not None:
        return sm < T.UNRESOLVED_SMALL_KERNEL_SM
    return tensor is not None and tensor < T.UNRESOLVED_SMALL_KERNEL_TENSOR


def launch_bound(lk: Looks) -> bool:
    """Idle time spread in gaps much shorter than an NVML window (utilisation below 100 % yet every point
    sample reads about the same), small kernels, idle links (seed: "dense, very short kernels"). Only
    above UNRESOLVED_UTIL_IDLE_MAX: a GPU without a kernel most of the time is waiting, not launching."""
    if lk.util_mean is None or lk.links_busy or lk.copies_heavy:
        return False
    if lk.util_mean <= T.UNRESOLVED_UTIL_IDLE_MAX:
        return False
    narrow = (lk.spread or 0.0) <= T.UNRESOLVED_SPREAD_NARROW
    return narrow and lk.util_mean <= T.UNRESOLVED_UTIL_PARTIAL_MAX and small_kernels(lk)


def collective(lk: Looks) -> bool:
    """Collective traffic on the links while the tensor pipes stay below their healthy level: NCCL spins
    (GPU_UTIL ~100 %, SM activity anywhere from NCCL's channel level up: no SM ceiling) or the GPU drops
    out while the collective's data moves (seed: "collective communication wait"). The tensor level is
    read per unit of busy time; without the tensor field, SM activity per unit of busy time below a
    healthy step's stands in."""
    # The traffic must exceed what a healthy step's overlapped gradients carry (NVLINK_BUSY_BPS): below
    # it a tensor deficit is tensor_cores_idle or memory_bound, which carry the same ~40 GB/s. An exposed
    # collective of ~12 % of the step (mean SM ~80 %) averages ~33 GB/s and is not separable here.
    busy_links = lk.links_busy or (
        lk.copies_heavy and lk.util_mean is not None and lk.util_mean >= T.UTIL_SATURATED_MIN
    )
    if lk.util_mean is None or not busy_links:
        return False
    if lk.links_busy and lk.util_mean <= T.UNRESOLVED_UTIL_PARTIAL_MAX:
        # Drop: the GPUs empty while collective-sized traffic moves (an input stall leaves the links quiet).
        # Per unit of busy time the kernels look healthy here; the idle time is the wait.
        return True
    tensor, sm = lk.per_busy(lk.tensor), lk.per_busy(lk.sm)
    if tensor is not None:
        return tensor < T.COMM_TENSOR_MAX
    return sm is not None and sm < T.COMM_SM_MAX
