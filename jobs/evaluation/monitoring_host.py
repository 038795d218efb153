"""An uploaded dstat log as the job's host signals where node_exporter has none (issue #24 item 2).

Pure (numpy, no Django). dstat logs carry no GPU field, but they carry the host look node_exporter gives
(jobs.metrics.host_signals): CPU busy and iowait, disk read/write and network receive/send. `dstat_signals`
turns the stored analyses of a job's dstat logs (jobs.profiling.dstat, one log per host) into the same
host `SignalSeries` -- cross-host mean/min/max/count on the job's evaluation grid, window (t - step, t] --
so the rules that read node_exporter's host signals (data_pipeline_stall, host_sync, communication_wait)
read a dstat log the same way; `monitoring_signals.merge` lets node_exporter win wherever it has a sample.

Units (dstat 0.7.x source, `dstat --output` writes the raw values, not the screen's k/M-scaled ones):
- CPU (`total cpu usage`: usr, sys, idl, wai, hiq, siq[, stl]) in percent of all CPU time over the
  interval (plugin dstat_cpu: 100 x delta of each /proc/stat field / delta of their total). As
  node_exporter's signals define them: host_cpu_busy = 1 - (idl + wai + stl) / 100 (CPU time not idle,
  iowait or steal), host_cpu_iowait = wai / 100; both ratios.
- Disk (`dsk/total` or `dsk/<dev>`: read, writ) in bytes per second (dstat_disk: sectors x 512 /
  elapsed); without a total the listed devices are summed, leaving out stacked devices (dm-*, md*) as the
  node_exporter query does.
- Network (`net/total` or `net/<dev>`: recv, send) in bytes per second (dstat_net: byte counters / elapsed);
  without a total the devices are summed, leaving out loopback and virtual ones (lo, veth, docker, ...).

What it cannot give: memory available (dstat's used/free/buff/cach are not /proc/meminfo's MemAvailable)
and InfiniBand traffic (dstat has no IB counter plugin in its default set): those stay missing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jobs.evaluation.monitoring_signals import LogSignals
from jobs.metrics.host_signals import HOST_SIGNALS, STACKED_DISKS, VIRTUAL_NICS, host_stats
from jobs.metrics.signals import SignalSeries
from jobs.profiling.schema.monitoring import Column, DstatLog, decode_dstat_log

#: What the page says of a value from a dstat log.
DSTAT_SOURCE = "from the uploaded dstat log"
# The parser slugs device names ("dm-0" -> "dm_0"): node_exporter's device patterns with either.
_STACKED = re.compile("^(?:{})$".format(STACKED_DISKS.replace("-", "[-_]")))
_VIRTUAL = re.compile("^(?:{})$".format(VIRTUAL_NICS.replace("-", "[-_]")))
_DEVICE_COLUMN = re.compile(r"^(dsk|net)_(.+)_(read|writ|recv|send)_bytes_per_s$")


def _floats(values: Column | None) -> np.ndarray:
    if values is None:
        return np.zeros(0)
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def as_dstat_log(analysis: Mapping[str, Any] | DstatLog) -> DstatLog:
    """A stored dstat analysis read through its schema (jobs.profiling.schema.monitoring)."""
    return analysis if isinstance(analysis, DstatLog) else decode_dstat_log(analysis)


def _device_sum(series: Mapping[str, Column], group: str, field: str, n: int) -> np.ndarray | None:
    """The `total` device's column, else the sum of the real devices' (NaN where none reported)."""
    total = series.get(f"{group}_total_{field}_bytes_per_s")
    if total is not None:
        column = _floats(total)
        return column if column.size == n else None
    skip = _STACKED if group == "dsk" else _VIRTUAL
    parts = []
    for key, values in series.items():
        m = _DEVICE_COLUMN.match(key)
        if m and m.group(1) == group and m.group(3) == field and not skip.match(m.group(2)):
            part = _floats(values)
            if part.size == n:
                parts.append(part)
    if not parts:
        return None
    stacked = np.vstack(parts)
    return np.where(np.isfinite(stacked).any(axis=0), np.nansum(stacked, axis=0), np.nan)


def host_columns(series: Mapping[str, Column]) -> dict[str, np.ndarray]:
    """A dstat analysis' series as host signal columns (signal key -> values in the signal's unit)."""
    n = len(series.get("t_unix_s") or [])
    out: dict[str, np.ndarray] = {}
    idle, wait = _floats(series.get("cpu_idl_pct")), _floats(series.get("cpu_wai_pct"))
    if idle.size == n and wait.size == n and n:
        steal = _floats(series.get("cpu_stl_pct"))
        steal = np.nan_to_num(steal) if steal.size == n else np.zeros(n)  # older dstat: no steal column
        out["host_cpu_busy"] = np.clip(1.0 - (idle + wait + steal) / 100.0, 0.0, 1.0)
        out["host_cpu_iowait"] = np.clip(wait / 100.0, 0.0, 1.0)
    for key, group, field in (
        ("host_disk_read_bytes", "dsk", "read"),
        ("host_disk_write_bytes", "dsk", "writ"),
        ("host_net_rx_bytes", "net", "recv"),
        ("host_net_tx_bytes", "net", "send"),
    ):
        column = _device_sum(series, group, field, n)
        if column is not None:
            out[key] = column
    return out


def _window_means(
    t: np.ndarray, values: np.ndarray, weights: np.ndarray, ts: np.ndarray, step: float
) -> np.ndarray:
    """Weighted mean of the samples closing each grid window (ts[k] - step, ts[k]] (NaN: none)."""
    n = ts.size
    out = np.full(n, np.nan)
    if n == 0:
        return out
    win = np.ceil((t - ts[0]) / step - 1e-9).astype(np.int64)
    good = (win >= 0) & (win < n) & np.isfinite(values)
    sums = np.bincount(win[good], weights=values[good] * weights[good], minlength=n)
    hits = np.bincount(win[good], weights=weights[good], minlength=n)
    np.divide(sums, hits, out=out, where=hits > 0)
    return out


def dstat_signals(
    logs: Sequence[tuple[str, Mapping[str, Any] | DstatLog]],
    ts: np.ndarray,
    step: float,
    *,
    start: float,
    end: float,
) -> tuple[LogSignals, list[str]]:
    """The host signals of a job's dstat logs on its grid `ts` (step `step`) within [start, end].

    `logs`: (name, analysis) pairs, newest first; one log per host (the newest of a host wins). Returns
    the signals (cross-host statistics as node_exporter's aggregate query gives them; `note` empty) and,
    per log not used, why.
    """
    notes: list[str] = []
    per_host: dict[str, dict[str, np.ndarray]] = {}
    names: list[str] = []
    intervals: list[float] = []
    bounds: list[tuple[float, float]] = []
    for name, analysis in logs:
        log = as_dstat_log(analysis)
        host = log.host or ""
        if log.time_axis != "unix_s":
            notes.append(f"{name!r}: the log has no epoch or time column (dstat -T or -t), so it has no time")
            continue
        if host in per_host:
            notes.append(f"{name!r}: a newer dstat log of host {host or '(unnamed)'} is used")
            continue
        series = log.series
        t = _floats(series.get("t_unix_s"))
        inside = (t >= start - step) & (t <= end)
        if not inside.any():
            notes.append(f"{name!r}: its samples are all outside the job's window")
            continue
        columns = host_columns(series)
        if not columns:
            notes.append(f"{name!r}: it has no total cpu usage, dsk or net columns")
            continue
        sizes = _floats(series.get("bucket_samples"))
        weights = sizes if sizes.size == t.size else np.ones(t.size)
        per_host[host] = {
            key: _window_means(t[inside], col[inside], weights[inside], ts, step)
            for key, col in columns.items()
        }
        names.append(name)
        bounds.append((float(t[inside].min()), float(t[inside].max())))
        if log.median_interval_s is not None and log.median_interval_s > 0:
            intervals.append(log.median_interval_s)
    out = LogSignals()
    if not per_host:
        return out, notes
    keys = sorted({k for cols in per_host.values() for k in cols})
    for key in keys:
        rows = [cols[key] for cols in per_host.values() if key in cols]
        stats = host_stats(np.vstack(rows))
        out.series[key] = SignalSeries(key=key, unit=HOST_SIGNALS[key].unit, timestamps=ts, stats=stats)
    out.interval_s = max(intervals) if intervals else None
    out.hosts = tuple(per_host)
    out.logs = tuple(names)
    out.start, out.end = min(b[0] for b in bounds), max(b[1] for b in bounds)
    return out, notes


def describe_dstat(got: LogSignals) -> str:
    """One line for the page: which dstat log(s), which host(s), at what resolution."""
    logs = ", ".join(repr(n) for n in got.logs)
    hosts = ", ".join(h or "(unnamed)" for h in got.hosts)
    interval = f"{got.interval_s:.3g} s samples" if got.interval_s else "samples"
    return f"{DSTAT_SOURCE} {logs} (host {hosts}, {interval})"
