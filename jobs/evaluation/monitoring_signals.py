"""An uploaded nvidia-smi log as a signal source of the evaluation, where DCGM has no samples.

Pure (numpy, no Django). `log_signals` turns the stored analysis of one nvidia-smi log
(jobs.profiling.nvidia_smi) into the same `SignalSeries` the DCGM read gives, so one evaluation (idle
share, idle waste, coverage, energy, peak memory) and one diagnosis read both:

- per GPU, a matrix at the log's own resolution (its median sampling interval, on a regular grid as the
  rules need). A log longer than MAX_POINTS samples per GPU was stored as bucket means; a bucket mean
  hides a short idle gap (2 idle seconds of 30 read as 88 % busy), so such a bucket is expanded back
  into its samples from the counts the parser kept on the full samples (`bucket_samples`, and the
  utilisation's idle-sample count and mean): the idle samples keep their number and value and the
  others the bucket's remaining mean, so idle share and mean are those of the full log. Only the order
  of samples inside one bucket is not kept: its idle samples are placed at its end;
- cross-GPU mean/min/max/count and `sampled` on the job's evaluation grid (windows (t - step, t]), so
  coverage says how much of the job's GPU-time the log covers.

Fields and units: nvidia-smi's `utilization.gpu` is NVML's utilisation ("percent of time over the past
sample period during which one or more kernels was executing", `nvidia-smi --help-query-gpu`), the
quantity DCGM field 203 GPU_UTIL reports: percent -> 0-1 ratio like the registry's gpu_util.
`power.draw` W -> power_usage W (DCGM field 155); `memory.used` (stored in bytes) -> fb_used MiB (DCGM
field 252); `temperature.gpu` C -> gpu_temp; `clocks.sm` MHz -> sm_clock; `utilization.memory` % ->
mem_copy_util ratio (NVML's memory utilisation, DCGM field 204).

`merge` lets DCGM win: a signal DCGM has keeps DCGM's value in every window with a DCGM sample, and only
windows without one take the log's; a signal DCGM lacks comes from the log alone. `sources` says, per
signal key, where the values came from (the job page prints it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jobs.metrics.signals import COUNT, MAX, MEAN, MIN, SAMPLED, GpuKey, JobSignals, SignalSeries
from jobs.profiling.schema.monitoring import Column, NvidiaSmiLog, decode_nvidia_smi_log

#: What the page says of a value from a log.
LOG_SOURCE = "from the uploaded nvidia-smi log"
#: (analysis series key, signal key, factor to the signal's unit, the signal's unit).
FIELDS: tuple[tuple[str, str, float, str], ...] = (
    ("utilization_gpu_pct", "gpu_util", 0.01, "ratio"),
    ("power_draw_w", "power_usage", 1.0, "W"),
    ("memory_used_bytes", "fb_used", 1.0 / 1024**2, "MiB"),
    ("temperature_gpu_c", "gpu_temp", 1.0, "C"),
    ("clocks_sm_mhz", "sm_clock", 1.0, "MHz"),
    ("utilization_memory_pct", "mem_copy_util", 0.01, "ratio"),
)
#: At most this many columns in a log's per-GPU matrix (a log with a long pause is coarsened, not huge).
MAX_COLUMNS = 50_000
#: A bucketed series is expanded back into at most this many samples per GPU (else read as stored).
MAX_EXPANDED_SAMPLES = MAX_COLUMNS


@dataclass
class LogSignals:
    """One log's signals on the job's grid, what it covers, and why it was (partly) not used."""

    series: dict[str, SignalSeries] = field(default_factory=dict)
    interval_s: float | None = None
    gpus: tuple[str, ...] = ()
    start: float | None = None
    end: float | None = None
    note: str = ""
    #: Host signals from dstat logs (jobs.evaluation.monitoring_host): the hosts and the logs' names.
    hosts: tuple[str, ...] = ()
    logs: tuple[str, ...] = ()


def _float_list(values: Column) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def as_smi_log(analysis: Mapping[str, Any] | NvidiaSmiLog) -> NvidiaSmiLog:
    """A stored nvidia-smi analysis read through its schema (jobs.profiling.schema.monitoring)."""
    return analysis if isinstance(analysis, NvidiaSmiLog) else decode_nvidia_smi_log(analysis)


def pick_gpus(
    analysis: Mapping[str, Any] | NvidiaSmiLog, job_gpus: Sequence[str], gpu_count: int
) -> tuple[list[str], str]:
    """The log's GPUs that are the job's, and why (empty with the reason when none can be told).

    The job's registered GPU ids (`gpus` of the registration, index or UUID) select them when the log
    names them; otherwise a log with no more GPUs than the job is taken whole, and a log of more GPUs (a
    whole node for a 2-GPU job) is not used: nothing says which of its GPUs were the job's.
    """
    labels = list(as_smi_log(analysis).series)
    if not labels:
        return [], "the log has no per-GPU series"
    wanted = [g for g in dict.fromkeys(job_gpus) if g]
    if wanted:
        found = [g for g in labels if g in wanted]
        if found:
            return found, f"the job's registered GPU(s) {', '.join(found)}"
    if len(labels) <= gpu_count:
        return labels, f"all {len(labels)} GPU(s) of the log (the job has {gpu_count})"
    return [], (
        f"the log has {len(labels)} GPUs and the job {gpu_count}, and nothing says which are the job's "
        "(register the job's GPU indices, or log only its GPUs with nvidia-smi -i)"
    )


def _native_intervals(log: NvidiaSmiLog) -> dict[str, float]:
    """Each GPU's median sampling interval over its full samples (the parser's per-GPU entry)."""
    return {
        g.gpu: g.median_interval_s
        for g in log.gpus
        if g.gpu is not None and g.median_interval_s is not None and g.median_interval_s > 0
    }


def _counts(values: Column | None, n: int) -> np.ndarray | None:
    """A per-bucket count column as integers, or None when it is absent or of another length."""
    if values is None or len(values) != n:
        return None
    return np.array([max(int(v), 0) if v is not None else 0 for v in values], dtype=np.int64)


def _samples(
    gpu_series: Mapping[str, Column], native_interval: float | None
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One GPU's times and FIELDS columns, bucketed series expanded back into their samples.

    A bucket of `n` samples whose utilisation had `i` idle samples (mean `m_i`) and mean `m` becomes `n`
    samples `native_interval` apart around the bucket's mean time: `n - i` at the busy mean
    (n*m - i*m_i)/(n - i) and then `i` at `m_i`; other columns repeat the bucket mean. Without the counts
    (a series stored whole, or by an older parser) the series is returned as stored.
    """
    t = _float_list(gpu_series.get("t_unix_s") or [])
    columns = {src: _float_list(gpu_series[src]) for src, *_ in FIELDS if src in gpu_series}
    sizes = _counts(gpu_series.get("bucket_samples"), t.size)
    if sizes is None or not native_interval:
        return t, columns
    total = int(sizes.sum())
    if total == 0 or total > MAX_EXPANDED_SAMPLES:
        return t, columns
    bucket = np.repeat(np.arange(t.size), sizes)
    offset = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)  # position inside the bucket
    t_full = t[bucket] + (offset - (sizes[bucket] - 1) / 2.0) * native_interval
    out = {src: col[bucket] for src, col in columns.items()}
    util = "utilization_gpu_pct"
    idle_n = _counts(gpu_series.get(f"{util}_idle_samples"), t.size)
    if util in columns and idle_n is not None:
        valid = _counts(gpu_series.get(f"{util}_valid_samples"), t.size)
        valid = sizes if valid is None else valid
        idle_n = np.clip(idle_n, 0, valid)
        idle_mean = np.nan_to_num(_float_list(gpu_series.get(f"{util}_idle_mean") or [None] * t.size))
        mean = columns[util]
        busy_n = valid - idle_n
        with np.errstate(invalid="ignore", divide="ignore"):
            busy_mean = np.where(
                busy_n > 0, (valid * mean - idle_n * idle_mean) / np.maximum(busy_n, 1), np.nan
            )
        # Inside each bucket: its busy samples, then its idle ones, then those that had no reading.
        busy_end, idle_end = busy_n[bucket], busy_n[bucket] + idle_n[bucket]
        out[util] = np.where(
            offset < busy_end, busy_mean[bucket], np.where(offset < idle_end, idle_mean[bucket], np.nan)
        )
    return t_full, out


def log_signals(
    analysis: Mapping[str, Any] | NvidiaSmiLog,
    ts: np.ndarray,
    step: float,
    *,
    start: float,
    end: float,
    job_gpus: Sequence[str] = (),
    gpu_count: int = 1,
) -> LogSignals:
    """The log's signals for the job window [start, end] on the evaluation grid `ts` (step `step`).

    An analysis without unix timestamps (no timestamp column) cannot be placed on the job's time axis
    and gives no series (the note says why); so does a log outside the job's window.
    """
    out = LogSignals()
    log = as_smi_log(analysis)
    if log.gpu_assignment is None:
        # Parsed before rows were assigned to GPUs by evidence (an index-less log's rows by position):
        # its per-GPU series may mix GPUs.
        out.note = "it was parsed by an older parser that assigned rows to GPUs by position; re-parse it"
        return out
    if log.time_axis != "unix_s":
        out.note = "the log has no timestamps, so it cannot be placed on the job's time axis"
        return out
    chosen, why = pick_gpus(log, job_gpus, gpu_count)
    if not chosen:
        out.note = why
        return out
    native = _native_intervals(log)
    samples = {g: _samples(log.series[g], native.get(g)) for g in chosen}
    per_gpu_t = {g: t for g, (t, _) in samples.items()}
    intervals = [np.diff(t) for t in per_gpu_t.values() if t.size > 1]
    diffs = np.concatenate(intervals) if intervals else np.array([])
    diffs = diffs[diffs > 0]
    if diffs.size == 0:
        out.note = "the log has fewer than two samples per GPU"
        return out
    interval = max(float(np.median(diffs)), 0.001)
    inside = {g: (t >= start - interval) & (t <= end) for g, t in per_gpu_t.items()}
    if not any(m.any() for m in inside.values()):
        out.note = "the log's samples are all outside the job's window"
        return out
    t_all = np.concatenate([t[inside[g]] for g, t in per_gpu_t.items()])
    t0, t1 = float(t_all.min()), float(t_all.max())
    cell = interval
    if (t1 - t0) / cell + 1 > MAX_COLUMNS:
        cell = (t1 - t0) / (MAX_COLUMNS - 1)
    columns = int(np.floor((t1 - t0) / cell + 0.5)) + 1
    gpu_ts = t0 + cell * np.arange(columns, dtype=np.float64)
    out.interval_s, out.gpus, out.start, out.end = interval, tuple(chosen), t0, t1
    keys = [GpuKey("", g) for g in chosen]
    n = ts.size
    for src, key, factor, unit in FIELDS:
        if not all(src in samples[g][1] for g in chosen):
            continue
        matrix = np.full((len(chosen), columns), np.nan)
        sums = np.zeros((len(chosen), n))
        hits = np.zeros((len(chosen), n))
        mins = np.full((len(chosen), n), np.inf)
        maxs = np.full((len(chosen), n), -np.inf)
        for row, g in enumerate(chosen):
            t = per_gpu_t[g][inside[g]]
            values = samples[g][1][src]
            if values.size != per_gpu_t[g].size:
                continue
            v = values[inside[g]] * factor
            ok = np.isfinite(v)
            t, v = t[ok], v[ok]
            col = np.clip(np.rint((t - t0) / cell).astype(np.int64), 0, columns - 1)
            matrix[row, col] = v  # two samples in one cell (jitter): the later one
            # Window k of the grid is (ts[k] - step, ts[k]]: a sample belongs to the point closing it.
            win = np.ceil((t - ts[0]) / step - 1e-9).astype(np.int64) if n else np.zeros(0, np.int64)
            good = (win >= 0) & (win < n)
            np.add.at(sums[row], win[good], v[good])
            np.add.at(hits[row], win[good], 1.0)
            np.minimum.at(mins[row], win[good], v[good])
            np.maximum.at(maxs[row], win[good], v[good])
        with np.errstate(invalid="ignore", divide="ignore"):
            gpu_mean = np.where(hits > 0, sums / hits, np.nan)
        reported = hits > 0
        count = reported.sum(axis=0).astype(np.float64)
        observed = count > 0
        stats = {
            # The mean over the GPUs that reported in the window, of each one's mean in it.
            MEAN: np.where(
                observed, np.where(reported, gpu_mean, 0.0).sum(axis=0) / np.maximum(count, 1), np.nan
            ),
            MIN: np.where(observed, np.min(np.where(reported, mins, np.inf), axis=0), np.nan),
            MAX: np.where(observed, np.max(np.where(reported, maxs, -np.inf), axis=0), np.nan),
            COUNT: np.where(observed, count, np.nan),
            # GPUs' worth of each window the samples cover: each sample stands for one interval.
            SAMPLED: np.minimum(hits * interval / step, 1.0).sum(axis=0),
        }
        out.series[key] = SignalSeries(
            key=key,
            unit=unit,
            timestamps=ts,
            stats=stats,
            gpus=tuple(keys),
            gpu_timestamps=gpu_ts,
            per_gpu=matrix,
        )
    if not out.series:
        out.note = "the log has none of utilization.gpu, power.draw, memory.used, temperature.gpu, clocks.sm"
    return out


def describe(name: str, analysis: Mapping[str, Any] | NvidiaSmiLog, got: LogSignals) -> str:
    """One line for the page: which log, which GPUs, its resolution and the zone its times were read in."""
    zone = as_smi_log(analysis).time_zone
    zone_text = ""
    if zone.local_timestamps:
        zone_text = f"; its local timestamps read as {zone.zone}" + (
            " (assumed: set the upload's timezone if the host was not on UTC)" if zone.assumed else ""
        )
    interval = f"{got.interval_s:.3g} s samples" if got.interval_s else "samples"
    return f"{LOG_SOURCE} {name!r} ({len(got.gpus)} GPU(s), {interval}{zone_text})"


def primary_source(key: str) -> str:
    """The scraped source a signal normally comes from: node_exporter for host signals, else DCGM."""
    return "node_exporter" if key.startswith("host_") else "DCGM"


def merge(
    sigs: JobSignals | None,
    logs: Sequence[tuple[str, LogSignals]],
    *,
    start: float,
    end: float,
    step: float,
    ts: np.ndarray,
) -> tuple[JobSignals | None, dict[str, str]]:
    """The job's signals with the logs' where the scraped source (DCGM; node_exporter for host signals, see
    `primary_source`) has none; and per signal key where its values came from.

    `logs`: (description, LogSignals) pairs, newest first: a signal comes from the first log that has
    it (two logs of one signal are not blended). A DCGM signal keeps its values (and per-GPU rows)
    wherever it has a sample; windows without one take a log's cross-GPU values, and its per-GPU rows
    are then dropped (two sources at two resolutions are not one matrix: the evaluation reads the merged
    cross-GPU statistics).
    """
    sources: dict[str, str] = {}
    usable = [(text, got) for text, got in logs if got.series]
    if not usable:
        return sigs, sources
    merged = sigs if sigs is not None else JobSignals(start=start, end=end, step=step, timestamps=ts)
    for text, got in usable:
        for key, series in got.series.items():
            current = merged.signals.get(key)
            primary = primary_source(key)
            if key in sources and not sources[key].startswith(primary):
                continue  # an earlier (newer) log already gave this signal: one log per signal
            if current is None:
                merged.signals[key] = series
                merged.missing.pop(key, None)
                sources[key] = text
                continue
            have = current.stats.get(COUNT)
            if have is None or have.size != series.timestamps.size:
                continue  # another grid: DCGM stands
            empty = ~(np.isfinite(have) & (have > 0))
            fill = empty & np.isfinite(series.stats[COUNT])
            if not fill.any():
                continue
            for stat, values in series.stats.items():
                if stat not in current.stats:
                    continue
                target = np.array(current.stats[stat], dtype=np.float64, copy=True)
                target[fill] = values[fill]
                current.stats[stat] = target
            if key not in sources:  # DCGM per-GPU rows cannot hold the log's cells: cross-GPU only
                current.per_gpu, current.gpu_timestamps, current.gpus = None, None, ()
            share = float(fill.sum()) / max(int(have.size), 1)
            sources[key] = (
                f"{primary}; {share:.0%} of the job's windows had no {primary} sample and are {text}"
            )
    return merged, sources
