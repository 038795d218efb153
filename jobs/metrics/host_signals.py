"""node_exporter series of a job's hosts ("host" signals): CPU busy and iowait, memory available, disk,
network and InfiniBand bytes, read per host and aggregated across the job's hosts like the GPU signals.

Pure: no Django and no HTTP. Names, labels, types and units from prometheus/node_exporter's collectors:
`node_cpu_seconds_total{cpu, mode}` (collector/cpu_linux.go: counter, "Seconds the CPUs spent in each
mode", modes user/nice/system/idle/iowait/irq/softirq/steal), `node_memory_MemAvailable_bytes` and
`node_memory_MemTotal_bytes` (collector/meminfo.go: gauges, /proc/meminfo in bytes),
`node_disk_read_bytes_total` / `node_disk_written_bytes_total{device}` (collector/diskstats_linux.go:
counters, sectors x 512), `node_network_receive_bytes_total` / `node_network_transmit_bytes_total{device}`
(collector/netdev_linux.go: counters), `node_infiniband_port_data_received_bytes_total` /
`..._transmitted_bytes_total{device, port}` (collector/infiniband_linux.go: counters, "Number of data octets
received on all links"; procfs converts the port counters' 4-byte words to bytes).

The join (an assumption the deployment must meet): node_exporter's series carry no job label and no GPU,
so they are joined to a job through its hosts -- the host names of its GPUs (dcgm-exporter's `Hostname`).
By default the node name is read from the target label `instance` ("<node>[.<domain>]:<port>", the usual
static or file-based scrape config); a deployment that relabels the node name into another label (e.g.
`nodename`, or `Hostname` to match dcgm-exporter) passes that label (`HostJoin.label`). Either way the name
may carry a domain after the GPU host's name (`gpu-node-001.cluster.local`).

What the signals are: CPU busy is the share of all of a host's CPU time not idle, iowait or steal (the
average of per-CPU `1 - rate(idle + iowait + steal)`), iowait the share spent idle with I/O outstanding
(per `man proc`, a lower bound that can under-read on busy hosts); memory available is MemAvailable /
MemTotal; byte rates are summed over a host's devices, leaving out stacked block devices (dm-*, md*, which
would count a read twice) and virtual or loopback network devices (lo, veth, docker, cni, flannel, cali,
virbr, br-) and IPoIB (`ib*`, counted by the InfiniBand port counters already).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from jobs.metrics.promql import duration, regex_any, regex_matcher, validate_label_name
from jobs.metrics.sampling import step_window_s
from jobs.metrics.signals import COUNT, MAX, MEAN, MIN, STAT_LABEL, JobSignals, SignalSeries, grid

CPU = "node_cpu_seconds_total"
MEM_AVAILABLE = "node_memory_MemAvailable_bytes"
MEM_TOTAL = "node_memory_MemTotal_bytes"
DISK_READ = "node_disk_read_bytes_total"
DISK_WRITTEN = "node_disk_written_bytes_total"
NET_RX = "node_network_receive_bytes_total"
NET_TX = "node_network_transmit_bytes_total"
IB_RX = "node_infiniband_port_data_received_bytes_total"
IB_TX = "node_infiniband_port_data_transmitted_bytes_total"
STACKED_DISKS = "dm-.*|md.*"
VIRTUAL_NICS = "lo|veth.*|docker.*|cni.*|flannel.*|cali.*|virbr.*|br-.*|ib.*"


@dataclass(frozen=True, slots=True)
class HostSignal:
    """One host signal: the node_exporter metrics it reads, its unit and what its absence hides."""

    key: str
    metrics: tuple[str, ...]
    unit: str
    label: str
    hides: str


HOST_SIGNALS: dict[str, HostSignal] = {s.key: s for s in (
    HostSignal("host_cpu_busy", (CPU,), "ratio", "CPU busy",
               "an input pipeline that is CPU-bound (decode, augmentation, tokenisation)"),
    HostSignal("host_cpu_iowait", (CPU,), "ratio", "CPU iowait", "an input pipeline waiting on storage"),
    HostSignal("host_mem_available", (MEM_AVAILABLE, MEM_TOTAL), "ratio", "memory available",
               "host memory pressure (page cache evicted, swapping)"),
    HostSignal("host_disk_read_bytes", (DISK_READ,), "B/s", "disk read", "reads from local disks"),
    HostSignal("host_disk_write_bytes", (DISK_WRITTEN,), "B/s", "disk write",
               "checkpoint writes to local disks"),
    HostSignal("host_net_rx_bytes", (NET_RX,), "B/s", "network RX",
               "data read from network storage or a remote source"),
    HostSignal("host_net_tx_bytes", (NET_TX,), "B/s", "network TX", "checkpoints and logs sent out"),
    HostSignal("host_ib_rx_bytes", (IB_RX,), "B/s", "InfiniBand RX", "collective traffic between nodes"),
    HostSignal("host_ib_tx_bytes", (IB_TX,), "B/s", "InfiniBand TX", "collective traffic between nodes"),
)}  # fmt: skip


#: Why a job's host signals are missing when its GPUs' host names are not known.
HOSTS_UNKNOWN = "the job's GPU host names are unknown (no per-GPU rows in this read): host signals not joined"


@dataclass(frozen=True, slots=True)
class HostJoin:
    """Where node_exporter's series name their node: `instance` (host:port, the default) or a label a
    relabelling filled with the node name."""

    label: str = "instance"

    def matcher(self, hosts: Iterable[str]) -> str:
        """The label matcher selecting the series of `hosts` (a domain and, for `instance`, a port may
        follow the name)."""
        names = sorted({h for h in hosts if h})
        if not names:
            raise ValueError("no host names to join node_exporter's series on")
        return regex_matcher(validate_label_name(self.label), self._regex(names))

    def _regex(self, names: Sequence[str]) -> str:
        tail = r"(\..*)?(:[0-9]+)?" if self.label == "instance" else r"(\..*)?"
        return f"({regex_any(names)}){tail}"

    def names_any(self, value: str, hosts: Iterable[str]) -> bool:
        """Whether a series whose join label holds `value` belongs to one of `hosts`: what `matcher(hosts)`
        selects (Prometheus anchors the regex; the RE2 escapes used are Python's too)."""
        names = sorted({h for h in hosts if h})
        return bool(names) and re.fullmatch(self._regex(names), value) is not None


def per_host_query(
    key: str, join: HostJoin, hosts: Iterable[str], rate_window_s: float, step_s: float
) -> str:
    """One series per host (by the join label) of host signal `key` in its unit."""
    m = join.matcher(hosts)
    by = join.label
    win = duration(rate_window_s)

    def rate(metric: str, extra: str = "") -> str:
        return f"rate({metric}{{{m}{extra}}}[{win}])"

    if key == "host_cpu_busy":
        not_busy = rate(CPU, ', mode=~"idle|iowait|steal"')
        return f"avg by ({by}) (1 - sum by ({by}, cpu) ({not_busy}))"
    if key == "host_cpu_iowait":
        iowait = rate(CPU, ', mode="iowait"')
        return f"avg by ({by}) ({iowait})"
    if key == "host_mem_available":
        w = duration(step_window_s(step_s))
        return (
            f"sum by ({by}) (avg_over_time({MEM_AVAILABLE}{{{m}}}[{w}])) / "
            f"sum by ({by}) (avg_over_time({MEM_TOTAL}{{{m}}}[{w}]))"
        )
    metric = HOST_SIGNALS[key].metrics[0]
    if metric in (DISK_READ, DISK_WRITTEN):
        return f"sum by ({by}) ({rate(metric, ', ' + regex_matcher('device', STACKED_DISKS, negate=True))})"
    if metric in (NET_RX, NET_TX):
        return f"sum by ({by}) ({rate(metric, ', ' + regex_matcher('device', VIRTUAL_NICS, negate=True))})"
    return f"sum by ({by}) ({rate(metric)})"


def aggregate_host_query(
    key: str, join: HostJoin, hosts: Iterable[str], rate_window_s: float, step_s: float
) -> str:
    """Mean, min, max and count across the job's hosts in one query, told apart by the `stat` label."""
    base = per_host_query(key, join, hosts, rate_window_s, step_s)
    return " or ".join(
        f'label_replace({agg}({base}), "{STAT_LABEL}", "{stat}", "", "")'
        for agg, stat in (("avg", MEAN), ("min", MIN), ("max", MAX), ("count", COUNT))
    )


class HostClient(Protocol):
    """What `fetch_host_signals` needs (PrometheusClient satisfies it)."""

    def range(self, query: str, start: Any, end: Any, step: float | None = None) -> Sequence[Any]: ...

    def label_values(
        self, label: str, match: Sequence[str] = (), start: Any = None, end: Any = None
    ) -> list[str]: ...


def missing_reason(sig: HostSignal, found: bool) -> str:
    """Why a host signal is missing (shown beside the empty host row)."""
    if found:
        return "node_exporter has the metric but no samples for this job's hosts in the window"
    return (
        f"not collected: no {', '.join(sig.metrics)} from node_exporter for this job's hosts (is it scraped, "
        "and does its node name match the GPU host names?)"
    )


def fetch_host_signals(
    client: HostClient,
    hosts: Iterable[str],
    start: float,
    end: float,
    step: float,
    *,
    join: HostJoin = HostJoin(),
    rate_window_s: float | None = None,
    keys: Iterable[str] | None = None,
) -> tuple[dict[str, SignalSeries], dict[str, str]]:
    """Read the job's host signals: 1 presence query, then 1 range query per present signal.

    Returns the series (cross-host mean/min/max/count on the grid of `step`) and the missing keys with
    their reason. Counters use `rate_window_s` (default: the step or two 15 s scrapes, the larger).
    """
    names = sorted(hosts)
    window = max(rate_window_s or 0.0, step, 30.0)
    match = [f'{{__name__=~"node_.+", {join.matcher(names)}}}']
    present = set(client.label_values("__name__", match, start, end))
    ts = grid(start, end, step)
    out: dict[str, SignalSeries] = {}
    missing: dict[str, str] = {}
    for key in keys if keys is not None else HOST_SIGNALS:
        sig = HOST_SIGNALS[key]
        if not all(m in present for m in sig.metrics):
            missing[key] = missing_reason(sig, False)
            continue
        stats: dict[str, np.ndarray] = {}
        for s in client.range(aggregate_host_query(key, join, names, window, step), start, end, step):
            stat = s.labels.get(STAT_LABEL)
            if stat:
                stats[stat] = s.on_grid(ts)
        if COUNT not in stats or np.isnan(stats[COUNT]).all():
            missing[key] = missing_reason(sig, True)
            continue
        out[key] = SignalSeries(key, sig.unit, ts, stats)
    return out, missing


def fetch_host_signals_bulk(
    client: HostClient,
    jobs: Mapping[int, tuple[Sequence[str], np.ndarray]],
    step: float,
    *,
    join: HostJoin = HostJoin(),
    rate_window_s: float | None = None,
) -> tuple[dict[int, tuple[dict[str, SignalSeries], dict[str, str]]], int]:
    """The host signals of many jobs at once (the poll cycle): `jobs` maps a key to (its hosts, its grid
    timestamps, all on one lattice of `step`). One presence request for all their hosts, then one range
    query per present signal returning one series per host (`per_host_query` over every host), split
    here: each job's cross-host mean/min/max/count from its own hosts' series (`host_stats`), the numbers
    `fetch_host_signals` reads for it alone (a grid point's value depends only on its time). Jobs
    without hosts are left out. Returns per key what `fetch_host_signals` returns, and the requests sent."""
    wanted = {k: (sorted({h for h in hosts if h}), ts) for k, (hosts, ts) in jobs.items()}
    wanted = {k: v for k, v in wanted.items() if v[0] and v[1].size}
    if not wanted:
        return {}, 0
    every = sorted({h for hosts, _ in wanted.values() for h in hosts})
    lo = min(float(ts[0]) for _, ts in wanted.values())
    hi = max(float(ts[-1]) for _, ts in wanted.values())
    window = max(rate_window_s or 0.0, step, 30.0)  # as fetch_host_signals
    present = set(
        client.label_values("__name__", [f'{{__name__=~"node_.+", {join.matcher(every)}}}'], lo, hi)
    )
    out: dict[int, tuple[dict[str, SignalSeries], dict[str, str]]] = {k: ({}, {}) for k in wanted}
    requests = 1
    for key, sig in HOST_SIGNALS.items():
        if not all(m in present for m in sig.metrics):
            for k in wanted:
                out[k][1][key] = missing_reason(sig, False)
            continue
        series = client.range(per_host_query(key, join, every, window, step), lo, hi, step)
        requests += 1
        for k, (hosts, ts) in wanted.items():
            mine = [s for s in series if join.names_any(s.labels.get(join.label, ""), hosts)]
            stats = host_stats(np.vstack([s.on_grid(ts) for s in mine])) if mine else None
            if stats is None or np.isnan(stats[COUNT]).all():
                out[k][1][key] = missing_reason(sig, bool(mine))
                continue
            out[k][0][key] = SignalSeries(key, sig.unit, ts, stats)
    return out, requests


#: Every node_exporter metric the host signals read (the readiness check counts which have series).
NODE_EXPORTER_METRICS: frozenset[str] = frozenset(m for sig in HOST_SIGNALS.values() for m in sig.metrics)


def source_readiness(label: str, present: Iterable[str] | None, error: str = "") -> dict[str, Any]:
    """node_exporter's line among the service's sources (/healthz, the readiness page): whether host signals
    are configured (`label`: NODE_EXPORTER_HOST_LABEL), whether Prometheus holds node_exporter series
    carrying that label (`present`: the metric names seen; None when the look-up failed with `error`),
    which of the metrics the host signals read are among them, and the reason in words."""
    line: dict[str, Any] = {
        "source": "node_exporter", "configured": bool(label), "label": label, "series_seen": None,
        "metrics_seen": [], "metrics_missing": [], "reason": "",
    }  # fmt: skip
    if not label:
        line["reason"] = (
            "not configured: NODE_EXPORTER_HOST_LABEL is empty, so host CPU, iowait, memory, disk, network "
            "and InfiniBand signals are not read (set it to the label holding the node name, e.g. instance)"
        )
        return line
    if present is None:
        line["reason"] = f"not checked: Prometheus did not answer ({error})" if error else "not checked"
        return line
    seen = sorted(NODE_EXPORTER_METRICS & set(present))
    line["series_seen"] = bool(seen)
    line["metrics_seen"] = seen
    line["metrics_missing"] = sorted(NODE_EXPORTER_METRICS - set(seen))
    if not seen:
        line["reason"] = (
            f"configured (join label {label!r}) but no node_exporter series carry {label!r} in Prometheus: "
            "is node_exporter scraped, and does that label hold the node names of the GPUs' Hostname?"
        )
    elif line["metrics_missing"]:
        line["reason"] = (
            f"series seen for {len(seen)} of {len(NODE_EXPORTER_METRICS)} metrics the host signals read; "
            f"missing: {', '.join(line['metrics_missing'])} (a collector switched off, e.g. infiniband on "
            "nodes without IB)"
        )
    else:
        line["reason"] = (
            f"series seen for all {len(seen)} metrics the host signals read (join label {label!r})"
        )
    return line


def job_hosts(js: JobSignals) -> list[str]:
    """The host names of a job's GPUs, from the per-GPU rows of its signals (what the join matches)."""
    return sorted({g.hostname for s in js.signals.values() for g in s.gpus if g.hostname})


def add_host_signals(js: JobSignals, series: Mapping[str, SignalSeries], missing: Mapping[str, str]) -> None:
    """Put host signals into a job's JobSignals (same grid) beside its GPU signals."""
    for key, s in series.items():
        if s.timestamps.shape != js.timestamps.shape:
            raise ValueError(f"{key}: host series on another grid than the job's signals")
        js.signals[key] = s
    js.missing.update(missing)


def attach_host_signals(
    client: HostClient, js: JobSignals, *, join: HostJoin = HostJoin(), rate_window_s: float | None = None
) -> JobSignals:
    """Read the host signals of the hosts `js`'s GPU rows name, on `js`'s grid, into `js` (the one call a
    poll needs after reading the GPU signals). Without per-GPU rows the hosts are unknown and every host
    signal is missing with that reason."""
    hosts = job_hosts(js)
    if not hosts:
        js.missing.update({k: HOSTS_UNKNOWN for k in HOST_SIGNALS if k not in js.signals})
        return js
    series, missing = fetch_host_signals(
        client, hosts, js.start, float(js.timestamps[-1]) if js.timestamps.size else js.end, js.step,
        join=join, rate_window_s=rate_window_s,
    )  # fmt: skip
    add_host_signals(js, series, missing)
    return js


def host_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """Cross-host mean/min/max/count of per-host values (hosts x time, NaN = no sample), as the aggregate
    query computes them (NaN where no host reports)."""
    v = np.asarray(values, dtype=np.float64)
    have = np.isfinite(v)
    count = have.sum(axis=0).astype(np.float64)
    none = count == 0
    with np.errstate(invalid="ignore"):
        mean = np.where(none, np.nan, np.where(have, v, 0.0).sum(axis=0) / np.maximum(count, 1))
    return {
        MEAN: mean,
        MIN: np.where(none, np.nan, np.where(have, v, np.inf).min(axis=0)),
        MAX: np.where(none, np.nan, np.where(have, v, -np.inf).max(axis=0)),
        COUNT: np.where(none, np.nan, count),
    }
