"""A job's hosts as prometheus/node_exporter exports them (pure numpy), and the host signals read from them.

Names, labels, types and units as node_exporter's collectors emit them (see jobs.metrics.host_signals for
the collector files): `node_cpu_seconds_total{cpu, mode}` counters in seconds per CPU and mode (user,
nice, system, idle, iowait, irq, softirq, steal), `node_memory_MemAvailable_bytes` / `MemTotal_bytes`
gauges, `node_disk_read_bytes_total` / `node_disk_written_bytes_total{device}` counters (a physical NVMe
and the dm-0 stacked on it, which repeats its bytes), `node_network_receive_bytes_total` /
`transmit_bytes_total{device}` (eth0, lo and the IPoIB ib0), and
`node_infiniband_port_data_received_bytes_total` / `transmitted_bytes_total{device, port}` (mlx5_0 port 1).
Counters start at a host's uptime before the job; series carry `instance="<host>:9100"` and
`job="node"` as a static scrape config stores them.

What the hosts do (`HostLoad`) is given per behaviour rather than derived from the step's phases: a counter's
rate over a window of 30 s or more averages any step shorter than that, so only the step's mean host load
shows; `behaviour` picks the mean levels an SRE sees for each cause (documented on `BEHAVIOURS`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from jobs.metrics import host_signals as H
from jobs.metrics.signals import JobSignals, SignalSeries

NODE_PORT = 9100
MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
UPTIME_S = 10 * 86400.0  # counters count from boot, ten days before the job
MEM_TOTAL_BYTES = 2048 * 2**30  # a 2 TiB DGX-class host


@dataclass(frozen=True, slots=True)
class HostLoad:
    """Mean host load while the job runs: CPU shares of all CPUs, byte rates per host (B/s)."""

    busy: float
    iowait: float
    disk_read_bps: float
    disk_write_bps: float
    net_rx_bps: float
    net_tx_bps: float
    ib_bps: float  # per direction, summed over the host's IB ports
    mem_available: float  # share of MemTotal


# Levels for each cause (our model of what the hosts of such a job do; not measurements):
#   cpu_bound_input: DataLoader workers decode/augment on every core and never catch up (busy ~0.9);
#   io_bound_input: workers block on local disk reads (iowait ~0.25 of CPU time, busy low);
#   remote_input: workers wait on network storage (CPUs idle, no iowait, network RX high);
#   host_sync: one Python thread runs and syncs; the rest of the host idles (busy ~1 core);
#   network_wait: NCCL moves gradients between nodes over InfiniBand (tens of GB/s per host), CPUs idle;
#   peer_wait: ranks block in collectives for a slow peer: InfiniBand nearly quiet, CPUs idle;
#   healthy: workers keep up with time to spare, modest reads, gradients over IB between nodes.
# Input-bound and sync-bound jobs move ~2 GB/s of gradients per host each way (steps slowed by the wait).
BEHAVIOURS: dict[str, HostLoad] = {
    "cpu_bound_input": HostLoad(0.92, 0.01, 0.4e9, 0.0, 0.05e9, 0.01e9, 2e9, 0.55),
    "io_bound_input": HostLoad(0.12, 0.25, 2.5e9, 0.0, 0.05e9, 0.01e9, 2e9, 0.60),
    "remote_input": HostLoad(0.08, 0.005, 0.01e9, 0.0, 2.4e9, 0.02e9, 2e9, 0.62),
    "host_sync": HostLoad(0.02, 0.002, 0.02e9, 0.0, 0.01e9, 0.01e9, 2e9, 0.70),
    "network_wait": HostLoad(0.05, 0.002, 0.02e9, 0.0, 0.01e9, 0.01e9, 40e9, 0.70),
    "peer_wait": HostLoad(0.04, 0.002, 0.02e9, 0.0, 0.01e9, 0.01e9, 0.2e9, 0.70),
    "healthy": HostLoad(0.30, 0.01, 0.3e9, 0.0, 0.05e9, 0.01e9, 12e9, 0.60),
}


@dataclass(slots=True)
class NodeSeries:
    """node_exporter's samples of a job's hosts: per metric, (labels, values over `timestamps`)."""

    timestamps: np.ndarray
    hosts: tuple[str, ...]
    series: dict[str, list[tuple[dict[str, str], np.ndarray]]]


def simulate_hosts(
    hosts: Sequence[str],
    timestamps: np.ndarray,
    behaviour: str | HostLoad,
    *,
    n_cpus: int = 16,
    noise: float = 0.02,
    seed: int = 0,
) -> NodeSeries:
    """node_exporter's series for `hosts` sampled at `timestamps` (the scrape grid), for one behaviour."""
    load = BEHAVIOURS[behaviour] if isinstance(behaviour, str) else behaviour
    if not 0.0 <= load.busy + load.iowait <= 1.0 or n_cpus < 1:
        raise ValueError("busy + iowait must be a share of CPU time (0-1) and n_cpus >= 1")
    rng = np.random.default_rng(seed)
    ts = np.asarray(timestamps, dtype=np.float64)
    dt = np.diff(ts, prepend=ts[0])  # seconds since the previous scrape (0 for the first)
    out: dict[str, list[tuple[dict[str, str], np.ndarray]]] = {}

    def add(metric: str, labels: dict[str, str], values: np.ndarray) -> None:
        out.setdefault(metric, []).append((labels, values))

    def counter(rate: float, start: float) -> np.ndarray:
        r = np.clip(rate * (1.0 + noise * rng.standard_normal(ts.size)), 0.0, None)
        return start + np.cumsum(r * dt)

    for host in hosts:
        base = {"instance": f"{host}:{NODE_PORT}", "job": "node"}
        # Busy time split as a training host's usually is: mostly user, some system and softirq.
        share = {"user": 0.8 * load.busy, "nice": 0.0, "system": 0.15 * load.busy, "iowait": load.iowait,
                 "irq": 0.01 * load.busy, "softirq": 0.04 * load.busy, "steal": 0.0}  # fmt: skip
        share["idle"] = 1.0 - sum(share.values())
        for cpu in range(n_cpus):
            for mode in MODES:
                add(H.CPU, {"cpu": str(cpu), **base, "mode": mode},
                    np.round(counter(share[mode], UPTIME_S * 0.5 * share[mode]), 2))  # fmt: skip
        avail = MEM_TOTAL_BYTES * np.clip(load.mem_available + noise * rng.standard_normal(ts.size), 0, 1)
        add(H.MEM_AVAILABLE, dict(base), np.rint(avail))
        add(H.MEM_TOTAL, dict(base), np.full(ts.size, float(MEM_TOTAL_BYTES)))
        for metric, rate in ((H.DISK_READ, load.disk_read_bps), (H.DISK_WRITTEN, load.disk_write_bps)):
            physical = np.rint(counter(rate, 1e12))
            add(metric, {"device": "nvme0n1", **base}, physical)
            add(metric, {"device": "dm-0", **base}, physical.copy())  # LVM on top: the same bytes again
        for metric, rate in ((H.NET_RX, load.net_rx_bps), (H.NET_TX, load.net_tx_bps)):
            add(metric, {"device": "eth0", **base}, np.rint(counter(rate, 5e12)))
            add(metric, {"device": "lo", **base}, np.rint(counter(1e8, 1e11)))  # local traffic only
            add(metric, {"device": "ib0", **base}, np.rint(counter(1e6, 1e9)))  # IPoIB: in the IB counters
        for metric in (H.IB_RX, H.IB_TX):
            add(metric, {"device": "mlx5_0", **base, "port": "1"}, np.rint(counter(load.ib_bps, 1e14)))
    return NodeSeries(ts, tuple(hosts), out)


_TYPES = {H.MEM_AVAILABLE: "gauge", H.MEM_TOTAL: "gauge"}


def openmetrics_lines(nodes: NodeSeries) -> Iterator[str]:
    """The samples as Prometheus stored them, in OpenMetrics for promtool (counters without `_total` in
    the TYPE line's family name, as OpenMetrics names counter families; ends with `# EOF`)."""
    for metric, rows in nodes.series.items():
        kind = _TYPES.get(metric, "counter")
        family = metric.removesuffix("_total") if kind == "counter" else metric
        yield f"# TYPE {family} {kind}\n"
        for labels, values in rows:
            text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            for t, v in zip(nodes.timestamps, values, strict=True):
                if np.isfinite(v):
                    yield f"{metric}{{{text}}} {v:.15g} {t:.3f}\n"
    yield "# EOF\n"


def _rate(values: np.ndarray, ts: np.ndarray, window_s: float) -> np.ndarray:
    """rate() over (t - window, t] from the first and last sample in it (no extrapolation)."""
    out = np.full(ts.size, np.nan)
    for i, t in enumerate(ts):
        lo = int(np.searchsorted(ts, t - window_s, side="right"))
        if i - lo >= 1:
            out[i] = (values[i] - values[lo]) / (ts[i] - ts[lo])
    return out


def per_host_values(nodes: NodeSeries, key: str, window_s: float = 60.0) -> np.ndarray:
    """What `host_signals.per_host_query` computes for each host (hosts x time), from the samples (the
    same selection: idle/iowait/steal for busy, physical disks, Ethernet without lo/IPoIB)."""
    ts = nodes.timestamps
    out = np.full((len(nodes.hosts), ts.size), np.nan)
    for h, host in enumerate(nodes.hosts):
        inst = f"{host}:{NODE_PORT}"

        def rows(metric: str, inst: str = inst) -> list[tuple[dict[str, str], np.ndarray]]:
            return [(lab, v) for lab, v in nodes.series.get(metric, []) if lab["instance"] == inst]

        if key in ("host_cpu_busy", "host_cpu_iowait"):
            per_cpu: dict[str, np.ndarray] = {}
            for lab, v in rows(H.CPU):
                wanted = lab["mode"] in ("idle", "iowait", "steal") if key == "host_cpu_busy" else (
                    lab["mode"] == "iowait")  # fmt: skip
                if wanted:
                    per_cpu[lab["cpu"]] = per_cpu.get(lab["cpu"], 0.0) + _rate(v, ts, window_s)
            share = np.mean(list(per_cpu.values()), axis=0)
            out[h] = 1.0 - share if key == "host_cpu_busy" else share
        elif key == "host_mem_available":
            out[h] = rows(H.MEM_AVAILABLE)[0][1] / rows(H.MEM_TOTAL)[0][1]
        else:
            metric = H.HOST_SIGNALS[key].metrics[0]
            skip = {"dm-0"} if metric in (H.DISK_READ, H.DISK_WRITTEN) else {"lo", "ib0"}
            chosen = [_rate(v, ts, window_s) for lab, v in rows(metric) if lab.get("device") not in skip]
            out[h] = np.sum(chosen, axis=0)
    return out


def host_signals(nodes: NodeSeries, window_s: float = 60.0) -> dict[str, SignalSeries]:
    """Every host signal across the hosts (mean/min/max/count), as `fetch_host_signals` returns them."""
    return {
        key: SignalSeries(
            key, sig.unit, nodes.timestamps, H.host_stats(per_host_values(nodes, key, window_s))
        )
        for key, sig in H.HOST_SIGNALS.items()
    }


def add_to(js: JobSignals, nodes: NodeSeries, window_s: float = 60.0) -> JobSignals:
    """`js` with the host signals of `nodes` added (the simulated job's own grid)."""
    H.add_host_signals(js, host_signals(nodes, window_s), {})
    return js
