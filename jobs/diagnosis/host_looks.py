"""The host half of the seed's "four looks", from node_exporter's host signals (jobs.metrics.host_signals).

A GPU that idles inside its steps waits on the host; what the host does meanwhile tells the causes apart
without a trace:

* input pipeline CPU-bound: the hosts' CPUs are busy (>= CPU_BUSY_HIGH of all CPU time: DataLoader workers
  decoding and augmenting on every core and never catching up);
* input pipeline I/O-bound: iowait is high (>= IOWAIT_HIGH of CPU time: workers blocked on disk reads);
* input from a remote source: CPUs and disks quiet while the hosts receive over Ethernet (>= NET_BUSY_BPS);
* host synchronisation or too few workers: the CPUs are mostly idle (< CPU_IDLE) with no I/O wait -- one
  Python thread that blocks on the GPU is ~1 core of a 100-core host;
* network wait (multi-node collectives): InfiniBand carries collective-sized traffic (RX + TX >= IB_BUSY_BPS
  per host, 5 GB/s: a tenth of one 400 Gb/s NDR port's 50 GB/s each way); quieter links between several
  hosts say the ranks wait for a peer.

Thresholds are ours, set between the levels such jobs show (jobs.simulate.node_exporter.BEHAVIOURS) and
a healthy host's; NVIDIA and node_exporter publish none. What a sample is: every host signal is a rate of
a cumulative counter over a window of at least 30 s (or a memory gauge averaged over the step), so a step
of 0.1-10 s shows only as its mean; the look is therefore a level over the job (or over the windows a rule
passes), at any scrape interval. Cannot see: which process uses the CPUs (another job on a shared node
reads the same), per-core saturation of one thread (a single hot Python thread is ~1/N of the CPU time),
network file systems that bypass the counters read (GPUDirect Storage), traffic on NICs named like virtual
ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from jobs.diagnosis.base import Evidence
from jobs.diagnosis.features import Features

CPU_BUSY_HIGH = 0.70
IOWAIT_HIGH = 0.10
CPU_IDLE = 0.25
IOWAIT_LOW = 0.05
NET_BUSY_BPS = 0.5e9
IB_BUSY_BPS = 5e9

InputCause = Literal["cpu", "io", "remote", "idle"]


@dataclass(frozen=True, slots=True)
class HostLook:
    """Mean host levels over the job (or the windows asked for), across its hosts; None = not collected."""

    hosts: int
    cpu_busy: float | None
    iowait: float | None
    disk_read_bps: float | None
    net_rx_bps: float | None
    ib_bps: float | None  # RX + TX per host
    mem_available: float | None

    @property
    def input_cause(self) -> InputCause | None:
        """What the hosts do while the GPUs wait on them; None when the levels say nothing clear."""
        if self.cpu_busy is not None and self.cpu_busy >= CPU_BUSY_HIGH:
            return "cpu"
        if self.iowait is not None and self.iowait >= IOWAIT_HIGH:
            return "io"
        if self.net_rx_bps is not None and self.net_rx_bps >= NET_BUSY_BPS:
            return "remote"
        if self.cpu_busy is not None and self.cpu_busy < CPU_IDLE and (self.iowait or 0.0) < IOWAIT_LOW:
            return "idle"
        return None

    @property
    def network_busy(self) -> bool | None:
        """Whether InfiniBand carries collective-sized traffic (None: not collected)."""
        return None if self.ib_bps is None else self.ib_bps >= IB_BUSY_BPS

    def evidence(self) -> list[Evidence]:
        """The levels, as evidence lines (those collected)."""
        out = []
        if self.cpu_busy is not None:
            out.append(
                Evidence(
                    "host CPUs busy (node_exporter, mean over hosts)", round(100 * self.cpu_busy, 1), "%"
                )
            )
        if self.iowait is not None:
            out.append(Evidence("host CPU time in iowait", round(100 * self.iowait, 1), "%"))
        if self.disk_read_bps is not None:
            out.append(Evidence("host disk reads per host", round(self.disk_read_bps / 1e9, 3), "GB/s"))
        if self.net_rx_bps is not None:
            out.append(Evidence("host network RX per host", round(self.net_rx_bps / 1e9, 3), "GB/s"))
        if self.ib_bps is not None:
            out.append(Evidence("InfiniBand RX+TX per host", round(self.ib_bps / 1e9, 3), "GB/s"))
        return out

    def input_advice(self) -> str:
        """What the host levels say about an input/host-side stall, as a sentence (empty when unclear)."""
        cause = self.input_cause
        if cause == "cpu":
            return (
                f"The hosts' CPUs are {self.cpu_busy:.0%} busy: the input pipeline is CPU-bound, so more "
                "DataLoader workers than cores will not help; move decoding and augmentation to the GPU "
                "(NVIDIA DALI, torchvision.transforms.v2 on CUDA tensors) or pre-process offline. "
            )
        if cause == "io":
            return (
                f"The hosts spend {self.iowait:.0%} of CPU time in iowait: the input pipeline waits on "
                "storage; stage the data set on local NVMe, read large sequential shards (WebDataset, "
                "memory-mapped files) and raise prefetch_factor. "
            )
        if cause == "remote":
            return (
                f"The hosts receive {(self.net_rx_bps or 0.0) / 1e9:.2g} GB/s over Ethernet with CPUs and "
                "disks quiet: the input comes from a remote source; cache it locally or read it in larger, "
                "prefetched requests. "
            )
        if cause == "idle":
            return (
                f"The hosts' CPUs are mostly idle ({self.cpu_busy:.0%} busy, {(self.iowait or 0.0):.0%} "
                "iowait): the wait is not CPU or disk work -- too few DataLoader workers, or the step "
                "blocking on the GPU (host synchronisations: a trace shows them). "
            )
        return ""


def _level(f: Features, key: str, mask: np.ndarray | None) -> float | None:
    mean = f.stat(key, "mean")
    if mean is None:
        return None
    values = mean if mask is None or mask.shape != mean.shape else mean[mask]
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else None


def host_look(f: Features, mask: np.ndarray | None = None) -> HostLook | None:
    """The job's host levels (over the aggregate grid's points in `mask`, default all); None when no host
    signal was collected."""
    keys = ("host_cpu_busy", "host_cpu_iowait", "host_disk_read_bytes", "host_net_rx_bytes",
            "host_ib_rx_bytes", "host_ib_tx_bytes", "host_mem_available")  # fmt: skip
    if not any(f.has(k) for k in keys):
        return None
    rx, tx = _level(f, "host_ib_rx_bytes", mask), _level(f, "host_ib_tx_bytes", mask)
    counts = [c for k in keys if (c := f.stat(k, "count")) is not None and np.isfinite(c).any()]
    return HostLook(
        hosts=int(max(float(np.nanmax(c)) for c in counts)) if counts else 0,
        cpu_busy=_level(f, "host_cpu_busy", mask),
        iowait=_level(f, "host_cpu_iowait", mask),
        disk_read_bps=_level(f, "host_disk_read_bytes", mask),
        net_rx_bps=_level(f, "host_net_rx_bytes", mask),
        ib_bps=None if rx is None and tx is None else (rx or 0.0) + (tx or 0.0),
        mem_available=_level(f, "host_mem_available", mask),
    )
