"""Parse host monitoring logs: nvidia-smi `--query-gpu ... --format=csv` and dstat `--output` CSV.

Both become time series on unix seconds (so they can be placed on a job's time axis) plus summary
statistics. Units go into key names: utilization_gpu_pct, power_draw_w, temperature_gpu_c,
memory_used_bytes, clocks_sm_mhz; dstat: cpu_usr_pct, dsk_total_read_bytes_per_s...
nvidia-smi and dstat print local time without a zone: pass `utc_offset_s` (seconds east of UTC) when
the host was not on UTC.
"""

from __future__ import annotations

import csv
import functools
import itertools
import re
from array import array
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from math import nan
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from jobs.profiling.detect import DEFAULT_MAX_BYTES, open_text
from jobs.profiling.errors import ArtifactError
from jobs.profiling.guard import checkpoint, guarded

IDLE_UTIL_PCT = 5.0
MAX_POINTS = 2000
#: At most this many GPUs (distinct index/uuid values) per log; rows of further ones are malformed.
MAX_GPUS = 1024
#: Readings beyond this magnitude (a power of 1e309 W, a 10^23 % utilisation) are unknown.
MAX_VALUE = 1e18
#: Unix seconds before year 5000.
MAX_UNIX_S = 95_617_584_000.0
_NA = {
    "",
    "[n/a]",
    "n/a",
    "[not supported]",
    "[unknown error]",
    "[insufficient permissions]",
    "[gpu is lost]",
}
_SLUG = re.compile(r"[^a-z0-9]+")
_HEADER_UNIT = re.compile(r"^(.*?)\s*\[([^\]]*)\]\s*$")
_VALUE_UNITS = frozenset({"", "%", "W", "MiB", "GiB", "KiB", "MHz", "C", "mW", "V"})
_VALUE_UNIT = re.compile(r"^([-+]?\d+(?:\.\d+)?)\s*(%|W|MiB|GiB|KiB|MHz|C|mW|V)?$")
_UNIT_SUFFIX = {"%": "pct", "w": "w", "mhz": "mhz", "c": "c", "mib": "bytes", "gib": "bytes", "kib": "bytes"}
_UNIT_SCALE = {"mib": 1024.0**2, "gib": 1024.0**3, "kib": 1024.0}
# Custom logger headers (e.g. temperature_C, utilization_gpu_percent, power_W) end in a unit word.
_NAME_UNIT = re.compile(r"^(.*?)[_.](c|percent|pct|w|mhz|mib|watts|celsius)$")
_NAME_UNIT_SUFFIX = {
    "c": "c",
    "celsius": "c",
    "percent": "pct",
    "pct": "pct",
    "w": "w",
    "watts": "w",
    "mhz": "mhz",
}
# Fields nvidia-smi prints without a unit in the header.
_DEFAULT_SUFFIX = {"temperature_gpu": "c", "temperature_memory": "c"}
# Units of --query-gpu fields, for a field list given without units (format=csv,noheader).
_KNOWN_UNITS = (
    ("utilization_", "%"),
    ("memory_total", "mib"),
    ("memory_used", "mib"),
    ("memory_free", "mib"),
    ("memory_reserved", "mib"),
    ("power_", "w"),
    ("enforced_power_limit", "w"),
    ("clocks_event", ""),
    ("clocks_throttle", ""),
    ("clocks_", "mhz"),
    ("fan_speed", "%"),
)
_ALIASES = {
    "power_w": "power_draw_w",
    "temperature_c": "temperature_gpu_c",
    "temp_c": "temperature_gpu_c",
    "gpu_temperature_c": "temperature_gpu_c",
    "utilization_pct": "utilization_gpu_pct",
    "gpu_utilization_pct": "utilization_gpu_pct",
    "util_pct": "utilization_gpu_pct",
    "gpu_util_pct": "utilization_gpu_pct",
    "memory_utilization_pct": "utilization_memory_pct",
}
_ID_FIELDS = {"index": "index", "gpu_index": "index", "gpu_id": "index", "gpu": "index", "uuid": "uuid"}
_TEXT_FIELDS = {"name", "gpu_name", "uuid", "gpu_uuid", "pci_bus_id", "driver_version", "pstate", "serial"}
_SMI_TIME_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S")


def _slug(text: str) -> str:
    return _SLUG.sub("_", text.strip().lower()).strip("_")


def _column_key(title: str) -> tuple[str, float]:
    """Series key with unit suffix and the factor to the key's unit, for one nvidia-smi column."""
    title = title.strip()
    unit = None
    if m := _HEADER_UNIT.match(title):
        title, unit = m.group(1), m.group(2).strip().lower()
    base = _slug(title)
    if unit is None and (m := _NAME_UNIT.match(title.strip().lower())):
        word = m.group(2)
        if word in _NAME_UNIT_SUFFIX:
            base, unit = (
                _slug(m.group(1)),
                {"c": "c", "celsius": "c", "watts": "w", "percent": "%"}.get(word, word),
            )
        elif word == "mib":
            base, unit = _slug(m.group(1)), "mib"
    if unit is None:
        unit = next((u for prefix, u in _KNOWN_UNITS if base.startswith(prefix)), None) or None
    suffix = _UNIT_SUFFIX.get(unit or "", _DEFAULT_SUFFIX.get(base, _slug(unit or "")))
    key = f"{base}_{suffix}" if suffix else base
    return _ALIASES.get(key, key), _UNIT_SCALE.get(unit or "", 1.0)


def _parse_time(text: str, utc_offset_s: float) -> float | None:
    """Unix seconds from nvidia-smi's "YYYY/MM/DD HH:MM:SS.mmm" (local time), ISO 8601 or unix seconds."""
    return _parse_time_cached(text.strip(), utc_offset_s)


@functools.lru_cache(maxsize=4096)
def _parse_time_cached(text: str, utc_offset_s: float) -> float | None:
    # Cached: every GPU row of one sample carries the same timestamp.
    if not text or len(text) > 64:
        return None
    try:
        value = float(text)  # already unix seconds
    except ValueError:
        pass
    else:
        return value if 0.0 <= value < MAX_UNIX_S else None
    try:
        parsed = datetime.fromisoformat(text.replace("/", "-"))
    except ValueError:
        parsed = None
        for fmt in _SMI_TIME_FORMATS:
            try:
                parsed = datetime.strptime(text, fmt)
                break
            except ValueError:
                continue
    if parsed is None:
        return None
    try:
        if parsed.tzinfo is not None:
            return parsed.timestamp()
        return parsed.replace(tzinfo=UTC).timestamp() - utc_offset_s
    except (OverflowError, ValueError, OSError):
        return None


def _finite(value: float) -> float | None:
    """A measurement, or None when it is not finite or beyond any believable reading."""
    return value if -MAX_VALUE < value < MAX_VALUE else None


def _parse_value(text: str, scale: float) -> float | str | None:
    cleaned = text.strip()
    if len(cleaned) > 200:
        return cleaned[:200]
    number, _, unit = cleaned.partition(" ")
    if unit in _VALUE_UNITS:  # fast path: "85", "85 %", "18.81 W"
        try:
            return _finite(float(number) * scale)
        except ValueError:
            pass
    lowered = cleaned.lower()
    if lowered in _NA:
        return None
    if lowered.startswith("0x"):
        try:
            return _finite(float(int(cleaned[:18], 16)))  # clocks_event_reasons bitmask
        except ValueError:
            return cleaned
    if m := _VALUE_UNIT.match(cleaned):
        return _finite(float(m.group(1)) * scale)
    return cleaned


def _as_array(values: array[float]) -> np.ndarray:
    """A float64 view of an array("d") buffer (no Python float per value, no copy)."""
    return np.frombuffer(values, dtype=np.float64) if len(values) else np.zeros(0)


def _stats(values: np.ndarray) -> dict[str, float | None]:
    values = values[~np.isnan(values)]
    if values.size == 0:
        return {"mean": None, "p5": None, "p50": None, "p95": None, "min": None, "max": None}
    p5, p50, p95 = np.percentile(values, [5, 50, 95])
    return {
        "mean": round(float(values.mean()), 4),
        "p5": round(float(p5), 4),
        "p50": round(float(p50), 4),
        "p95": round(float(p95), 4),
        "min": round(float(values.min()), 4),
        "max": round(float(values.max()), 4),
    }


def _downsample(t: np.ndarray, columns: dict[str, np.ndarray], max_points: int) -> dict[str, list[Any]]:
    """Bucket means so a week-long 1 s log still draws; the summary uses every sample."""
    n = t.size
    if n <= max_points:
        out: dict[str, list[Any]] = {"t_unix_s": [round(float(x), 3) for x in t]}
        for key, col in columns.items():
            out[key] = [None if np.isnan(v) else round(float(v), 4) for v in col]
        return out
    edges = np.linspace(0, n, max_points + 1).astype(int)
    out = {"t_unix_s": [round(float(t[a:b].mean()), 3) for a, b in itertools.pairwise(edges)]}
    for key, col in columns.items():
        series = []
        for a, b in itertools.pairwise(edges):
            chunk = col[a:b]
            chunk = chunk[~np.isnan(chunk)]
            series.append(round(float(chunk.mean()), 4) if chunk.size else None)
        out[key] = series
    return out


def _rows(text: TextIO) -> Iterator[list[str]]:
    """Non-empty CSV rows, streamed from the upload (the file is never held whole next to its rows)."""
    try:
        for row in csv.reader(text, skipinitialspace=True):
            if row and (len(row) > 1 or row[0].strip()):
                checkpoint()
                yield row
    except csv.Error as exc:
        raise ArtifactError(f"The CSV is malformed: {exc}.") from exc


def _looks_like_header(row: list[str]) -> bool:
    return not any(_VALUE_UNIT.match(c.strip()) or _parse_time(c, 0) is not None for c in row if c.strip())


@guarded("nvidia-smi log")
def analyze_nvidia_smi(
    source: bytes | str | Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    fields: Sequence[str] | str | None = None,
    utc_offset_s: float = 0.0,
    idle_util_pct: float = IDLE_UTIL_PCT,
    max_points: int = MAX_POINTS,
) -> dict[str, Any]:
    """Per-GPU time series and statistics from `nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`.

    With `noheader`, pass the `--query-gpu` field list as `fields` (a list or "a,b,c"). Values may
    carry units ("85 %", "18.81 W") or not; "[N/A]" becomes None. Series are downsampled to
    `max_points` bucket means; statistics use every sample. `idle_share_pct` is the share of samples
    with GPU utilisation below `idle_util_pct`.
    """
    with open_text(source, max_bytes, what="nvidia-smi log") as text:
        rows = _rows(text)
        first = next(rows, None)
        if first is None:
            raise ArtifactError("The nvidia-smi log is empty.")
        if isinstance(fields, str):
            fields = fields.split(",")
        if fields:
            header = [f.strip() for f in fields]
            if not _looks_like_header(first):
                rows = itertools.chain([first], rows)
        elif _looks_like_header(first):
            header = first
        else:
            raise ArtifactError(
                "This nvidia-smi CSV has no header line (format=csv,noheader): "
                "give the --query-gpu field list."
            )
        columns = [_column_key(h) for h in header]
        keys = [k for k, _ in columns]
        time_i = next((i for i, k in enumerate(keys) if k in ("timestamp", "time", "date_time")), None)
        id_i = {_ID_FIELDS[k]: i for i, k in enumerate(keys) if k in _ID_FIELDS}
        value_columns = [
            (i, key, scale) for i, (key, scale) in enumerate(columns) if i != time_i and key not in _ID_FIELDS
        ]
        gpus: dict[str, dict[str, Any]] = {}
        seen_at: dict[float | None, int] = {}
        bad = 0
        for row in rows:
            if len(row) < len(header):
                bad += 1
                continue
            t = _parse_time(row[time_i], utc_offset_s) if time_i is not None else None
            if time_i is not None and t is None:
                bad += 1
                continue
            if "index" in id_i:
                gpu = row[id_i["index"]].strip()[:64]
            elif "uuid" in id_i:
                gpu = row[id_i["uuid"]].strip()[:64]
            else:
                # No GPU column: the n-th row of one timestamp is the n-th GPU.
                gpu = str(seen_at.get(t, 0))
                seen_at[t] = seen_at.get(t, 0) + 1
            entry = gpus.get(gpu)
            if entry is None:
                if len(gpus) >= MAX_GPUS:
                    bad += 1
                    continue
                entry = gpus[gpu] = {"t": array("d"), "values": {}, "info": {}}
            entry["t"].append(t if t is not None else float(len(entry["t"])))
            for i, key, scale in value_columns:
                value = _parse_value(row[i], scale)
                if key in _TEXT_FIELDS or isinstance(value, str):
                    if value is not None:
                        entry["info"][key] = value
                    continue
                column = entry["values"].get(key)
                if column is None:
                    column = entry["values"][key] = array("d")
                column.append(nan if value is None else value)
    if not gpus:
        raise ArtifactError(
            f"No usable nvidia-smi rows ({bad} malformed); check the header and the timestamps."
        )
    return _smi_result(gpus, time_i is not None, bad, idle_util_pct, max_points)


def _smi_result(
    gpus: dict[str, dict[str, Any]], has_time: bool, bad: int, idle_util_pct: float, max_points: int
) -> dict[str, Any]:
    per_gpu, series = [], {}
    all_util, all_t = [], []
    for gpu in sorted(gpus, key=lambda g: (len(g), g)):
        entry = gpus[gpu]
        t = _as_array(entry["t"])
        order = np.argsort(t, kind="stable")
        t = t[order]
        cols = {}
        for key, vals in entry["values"].items():
            if len(vals) == len(t):
                cols[key] = _as_array(vals)[order]
        entry["values"] = {}  # the arrays above are copies: free the buffers as we go
        util = cols.get("utilization_gpu_pct")
        stats = {key: _stats(col) for key, col in cols.items()}
        idle = None
        if util is not None and np.any(~np.isnan(util)):
            valid = util[~np.isnan(util)]
            idle = round(100.0 * float(np.mean(valid < idle_util_pct)), 3)
            all_util.append(valid)
        all_t.append(t)
        per_gpu.append(
            {
                "gpu": gpu,
                **{k: v for k, v in entry["info"].items()},
                "samples": int(t.size),
                "start_unix_s": round(float(t[0]), 3) if has_time else None,
                "end_unix_s": round(float(t[-1]), 3) if has_time else None,
                "idle_share_pct": idle,
                "stats": stats,
            }
        )
        series[gpu] = _downsample(t, cols, max_points)
    times = np.concatenate(all_t)
    diffs = [np.diff(t) for t in all_t if t.size > 1] if has_time else []
    intervals = np.concatenate(diffs) if diffs else np.array([])
    util_all = np.concatenate(all_util) if all_util else np.array([])

    def mean_of(key: str) -> float | None:
        means = [
            g["stats"][key]["mean"]
            for g in per_gpu
            if key in g["stats"] and g["stats"][key]["mean"] is not None
        ]
        return round(float(np.mean(means)), 4) if means else None

    def max_of(key: str) -> float | None:
        maxes = [
            g["stats"][key]["max"]
            for g in per_gpu
            if key in g["stats"] and g["stats"][key]["max"] is not None
        ]
        return round(float(max(maxes)), 4) if maxes else None

    return {
        "format": "nvidia_smi_csv",
        "time_axis": "unix_s" if has_time else "sample_index",
        "gpu_count": len(per_gpu),
        "samples": int(times.size),
        "malformed_rows": bad,
        "start_unix_s": round(float(times.min()), 3) if has_time else None,
        "end_unix_s": round(float(times.max()), 3) if has_time else None,
        "duration_s": round(float(times.max() - times.min()), 3) if has_time else None,
        "median_interval_s": round(float(np.median(intervals)), 3) if intervals.size else None,
        "mean_utilization_gpu_pct": mean_of("utilization_gpu_pct"),
        "idle_share_pct": round(100.0 * float(np.mean(util_all < idle_util_pct)), 3)
        if util_all.size
        else None,
        "idle_util_threshold_pct": idle_util_pct,
        "mean_power_draw_w": mean_of("power_draw_w"),
        "max_temperature_gpu_c": max_of("temperature_gpu_c"),
        "gpus": per_gpu,
        "series": series,
    }


# ---------------------------------------------------------------- dstat

_DSTAT_META = ("Dstat", "Author:", "Host:", "Cmdline:")
_DSTAT_GROUPS = (
    (re.compile(r"^total cpu usage$"), "cpu", "pct"),
    (re.compile(r"^cpu(\d+) usage$"), "cpu{0}", "pct"),
    (re.compile(r"^dsk/(.+)$"), "dsk_{0}", "bytes_per_s"),
    (re.compile(r"^net/(.+)$"), "net_{0}", "bytes_per_s"),
    (re.compile(r"^memory usage$"), "mem", "bytes"),
    (re.compile(r"^swap$"), "swap", "bytes"),
    (re.compile(r"^paging$"), "paging", "bytes_per_s"),
    (re.compile(r"^system$"), "system", "per_s"),
    (re.compile(r"^io/(.+)$"), "io_{0}", "per_s"),
    (re.compile(r"^load avg$"), "load", ""),
    (re.compile(r"^procs$"), "procs", ""),
)


_DSTAT_SKIP = {"", "epoch_epoch", "system_time_per_s", "system_time"}
MAX_DSTAT_COLUMNS = 512


def _dstat_key(group: str, nick: str) -> str:
    if ":" in nick:  # 0.7.3 names a multi-device column "group:nick"
        group, nick = nick.split(":", 1)
    group = group.strip().lower()
    for pattern, name, suffix in _DSTAT_GROUPS:
        if m := pattern.match(group):
            base = f"{_slug(name.format(*m.groups()))}_{_slug(nick)}"
            return f"{base}_{suffix}" if suffix else base
    return f"{_slug(group)}_{_slug(nick)}" if group else _slug(nick)


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


@guarded("dstat CSV")
def analyze_dstat(
    source: bytes | str | Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    utc_offset_s: float = 0.0,
    max_points: int = MAX_POINTS,
) -> dict[str, Any]:
    """Time series and statistics from `dstat --output file.csv` (0.7.2 and 0.7.3 layouts).

    The time axis comes from the epoch column (`dstat -T`) or the time column (`-t`, with the year from
    the "Date:" line); without either it is the sample index. dstat's first sample averages since boot,
    so it is dropped from every block.
    """
    meta: dict[str, str] = {}
    header: list[str] | None = None
    keys: list[str] = []  # the current block's value columns
    cols: dict[str, array[float]] = {}
    epochs = array("d")  # the epoch column (dstat -T), NaN where unreadable
    clock_text: list[str | None] = []  # the time column (dstat -t) when there is no epoch column
    samples = 0
    first_in_block = False
    with open_text(source, max_bytes, what="dstat CSV") as text:
        rows = _rows(text)
        pending: list[str] | None = None
        while True:
            raw = pending if pending is not None else next(rows, None)
            pending = None
            if raw is None:
                break
            row = [c.strip() for c in raw]
            if row[0].startswith(_DSTAT_META):
                for label, value in itertools.pairwise(row):
                    if label in ("Host:", "User:", "Cmdline:", "Date:"):
                        meta[label.rstrip(":").lower()] = value[:300]
                continue
            numeric = any(_is_number(c) for c in row if c)
            if not numeric:
                pending = next(rows, None)
                if pending is not None and not any(_is_number(c) for c in pending if c.strip()):
                    groups, nicks = row, [c.strip() for c in pending]
                    pending = None
                    current = ""
                    header = []
                    for index, nick in enumerate(nicks[:MAX_DSTAT_COLUMNS]):
                        if index < len(groups) and groups[index]:
                            current = groups[index][:100]
                        header.append(_dstat_key(current, nick[:100]) if nick else "")
                    keys = [k for k in dict.fromkeys(header) if k not in _DSTAT_SKIP]
                    for key in keys:
                        if key not in cols:
                            cols[key] = array("d", [nan]) * samples
                    first_in_block = True
                continue
            if header is None:
                continue
            if first_in_block:
                first_in_block = False
                continue
            record = dict(zip(header, row, strict=False))
            epoch = record.get("epoch_epoch")
            if epoch:
                epochs.append(_number_or_nan(epoch))
                clock_text.append(None)
            else:
                epochs.append(nan)
                clock_text.append(record.get("system_time_per_s") or record.get("system_time") or None)
            current_keys = set(keys)
            for key in keys:
                cell = record.get(key, "")
                cols[key].append(_number_or_nan(cell) if cell else nan)
            for key, column in cols.items():
                if key not in current_keys:
                    column.append(nan)
            samples += 1
    if header is None:
        raise ArtifactError('No dstat header found (a group row such as "total cpu usage" and a column row).')
    if not samples:
        raise ArtifactError(
            "The dstat CSV has a header but fewer than two samples (the first one is since boot)."
        )
    final = {key: cols[key] for key in keys}
    return _dstat_result(samples, epochs, clock_text, final, meta, utc_offset_s, max_points)


def _number_or_nan(cell: str) -> float:
    try:
        value = float(cell) if len(cell) <= 64 else nan
    except ValueError:
        return nan
    return value if -MAX_VALUE < value < MAX_VALUE else nan


def _dstat_time(epoch: float, clock: str | None, year: int, utc_offset_s: float) -> float | None:
    if clock is None:
        return epoch if 0.0 <= epoch < MAX_UNIX_S else None
    for fmt in ("%d-%m %H:%M:%S", "%d-%m %H:%M:%S.%f"):
        try:
            parsed = datetime.strptime(f"{year} {clock[:40]}", f"%Y {fmt}")
        except ValueError:
            continue
        return parsed.replace(tzinfo=UTC).timestamp() - utc_offset_s
    return None


def _dstat_result(
    samples: int,
    epochs: array[float],
    clock_text: list[str | None],
    columns: dict[str, array[float]],
    meta: dict[str, str],
    utc_offset_s: float,
    max_points: int,
) -> dict[str, Any]:
    year = datetime.now(UTC).year
    if m := re.search(r"\b(\d{4})\b", meta.get("date", "")):
        year = int(m.group(1))
    times = [
        _dstat_time(epoch, clock, year, utc_offset_s)
        for epoch, clock in zip(_as_array(epochs).tolist(), clock_text, strict=True)
    ]
    has_time = all(t is not None for t in times)
    t = np.asarray([tt if has_time else float(n) for n, tt in enumerate(times)], dtype=float)
    del times
    cols: dict[str, np.ndarray] = {key: _as_array(col) for key, col in columns.items()}
    stats = {key: _stats(col) for key, col in cols.items()}

    def total(prefix: str, nick: str) -> np.ndarray | None:
        # Prefer the "total" device; otherwise sum the listed devices (dstat -D sda,sdb).
        exact = f"{prefix}_total_{nick}_bytes_per_s"
        if exact in cols:
            return cols[exact]
        parts = [
            c for k, c in cols.items() if k.startswith(prefix + "_") and k.endswith(f"_{nick}_bytes_per_s")
        ]
        return np.nansum(parts, axis=0) if parts else None

    def mean(col: np.ndarray | None) -> float | None:
        return _stats(col)["mean"] if col is not None else None

    def p95(col: np.ndarray | None) -> float | None:
        return _stats(col)["p95"] if col is not None else None

    summary = {
        "cpu_usr_mean_pct": mean(cols.get("cpu_usr_pct")),
        "cpu_sys_mean_pct": mean(cols.get("cpu_sys_pct")),
        "cpu_idle_mean_pct": mean(cols.get("cpu_idl_pct")),
        "cpu_wait_mean_pct": mean(cols.get("cpu_wai_pct")),
        "cpu_wait_p95_pct": p95(cols.get("cpu_wai_pct")),
        "disk_read_mean_bytes_per_s": mean(total("dsk", "read")),
        "disk_write_mean_bytes_per_s": mean(total("dsk", "writ")),
        "disk_read_p95_bytes_per_s": p95(total("dsk", "read")),
        "net_recv_mean_bytes_per_s": mean(total("net", "recv")),
        "net_send_mean_bytes_per_s": mean(total("net", "send")),
        "mem_used_max_bytes": stats.get("mem_used_bytes", {}).get("max"),
    }
    return {
        "format": "dstat_csv",
        "host": meta.get("host"),
        "cmdline": meta.get("cmdline"),
        "date": meta.get("date"),
        "time_axis": "unix_s" if has_time else "sample_index",
        "samples": samples,
        "start_unix_s": round(float(t.min()), 3) if has_time else None,
        "end_unix_s": round(float(t.max()), 3) if has_time else None,
        "median_interval_s": round(float(np.median(np.diff(t))), 3) if has_time and t.size > 1 else None,
        "columns": list(cols),
        "summary": summary,
        "stats": stats,
        "series": _downsample(t, cols, max_points),
    }
