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
import io
import itertools
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from jobs.profiling.detect import DEFAULT_MAX_BYTES, decode_text, load_bytes
from jobs.profiling.errors import ArtifactError
from jobs.profiling.guard import guarded

IDLE_UTIL_PCT = 5.0
MAX_POINTS = 2000
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
    if not text:
        return None
    try:
        return float(text)  # already unix seconds
    except ValueError:
        pass
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
    if parsed.tzinfo is not None:
        return parsed.timestamp()
    return parsed.replace(tzinfo=UTC).timestamp() - utc_offset_s


def _parse_value(text: str, scale: float) -> float | str | None:
    cleaned = text.strip()
    number, _, unit = cleaned.partition(" ")
    if unit in _VALUE_UNITS:  # fast path: "85", "85 %", "18.81 W"
        try:
            return float(number) * scale
        except ValueError:
            pass
    lowered = cleaned.lower()
    if lowered in _NA:
        return None
    if lowered.startswith("0x"):
        try:
            return float(int(cleaned, 16))  # clocks_event_reasons bitmask
        except ValueError:
            return cleaned
    if m := _VALUE_UNIT.match(cleaned):
        return float(m.group(1)) * scale
    return cleaned


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


def _rows(text: str) -> list[list[str]]:
    try:
        rows = csv.reader(io.StringIO(text), skipinitialspace=True)
        return [row for row in rows if row and (len(row) > 1 or row[0].strip())]
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
    rows = _rows(decode_text(load_bytes(source, max_bytes, what="nvidia-smi log")))
    if not rows:
        raise ArtifactError("The nvidia-smi log is empty.")
    if isinstance(fields, str):
        fields = fields.split(",")
    if fields:
        header = [f.strip() for f in fields]
        if _looks_like_header(rows[0]):
            rows = rows[1:]
    elif _looks_like_header(rows[0]):
        header, rows = rows[0], rows[1:]
    else:
        raise ArtifactError(
            "This nvidia-smi CSV has no header line (format=csv,noheader): give the --query-gpu field list."
        )
    columns = [_column_key(h) for h in header]
    keys = [k for k, _ in columns]
    time_i = next((i for i, k in enumerate(keys) if k in ("timestamp", "time", "date_time")), None)
    id_i = {_ID_FIELDS[k]: i for i, k in enumerate(keys) if k in _ID_FIELDS}
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
            gpu = row[id_i["index"]].strip()
        elif "uuid" in id_i:
            gpu = row[id_i["uuid"]].strip()
        else:
            # No GPU column: the n-th row of one timestamp is the n-th GPU.
            gpu = str(seen_at.get(t, 0))
            seen_at[t] = seen_at.get(t, 0) + 1
        entry = gpus.setdefault(gpu, {"t": [], "values": {}, "info": {}})
        entry["t"].append(t if t is not None else float(len(entry["t"])))
        for i, (key, scale) in enumerate(columns):
            if i == time_i or key in _ID_FIELDS:
                continue
            value = _parse_value(row[i], scale)
            if key in _TEXT_FIELDS or isinstance(value, str):
                if value is not None:
                    entry["info"][key] = value
                continue
            entry["values"].setdefault(key, []).append(np.nan if value is None else value)
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
        t = np.asarray(entry["t"], dtype=float)
        order = np.argsort(t, kind="stable")
        t = t[order]
        cols = {}
        for key, vals in entry["values"].items():
            if len(vals) == len(t):
                cols[key] = np.asarray(vals, dtype=float)[order]
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
    rows = _rows(decode_text(load_bytes(source, max_bytes, what="dstat CSV")))
    meta: dict[str, str] = {}
    header: list[str] | None = None
    data: list[dict[str, Any]] = []
    first_in_block = False
    i = 0
    while i < len(rows):
        row = [c.strip() for c in rows[i]]
        i += 1
        if row[0].startswith(_DSTAT_META):
            for label, value in itertools.pairwise(row):
                if label in ("Host:", "User:", "Cmdline:", "Date:"):
                    meta[label.rstrip(":").lower()] = value
            continue
        numeric = any(_is_number(c) for c in row if c)
        if not numeric and i < len(rows) and not any(_is_number(c) for c in rows[i] if c.strip()):
            groups, nicks = row, [c.strip() for c in rows[i]]
            i += 1
            current = ""
            header = []
            for index, nick in enumerate(nicks):
                if index < len(groups) and groups[index]:
                    current = groups[index]
                header.append(_dstat_key(current, nick) if nick else "")
            first_in_block = True
            continue
        if header is None or not numeric:
            continue
        if first_in_block:
            first_in_block = False
            continue
        data.append(dict(zip(header, row, strict=False)))
    if header is None:
        raise ArtifactError('No dstat header found (a group row such as "total cpu usage" and a column row).')
    if not data:
        raise ArtifactError(
            "The dstat CSV has a header but fewer than two samples (the first one is since boot)."
        )
    return _dstat_result(data, header, meta, utc_offset_s, max_points)


def _dstat_time(record: dict[str, Any], year: int, utc_offset_s: float) -> float | None:
    if record.get("epoch_epoch"):
        try:
            return float(record["epoch_epoch"])
        except ValueError:
            return None
    text = record.get("system_time_per_s") or record.get("system_time")
    if not text:
        return None
    for fmt in ("%d-%m %H:%M:%S", "%d-%m %H:%M:%S.%f"):
        try:
            parsed = datetime.strptime(f"{year} {text}", f"%Y {fmt}")
        except ValueError:
            continue
        return parsed.replace(tzinfo=UTC).timestamp() - utc_offset_s
    return None


def _dstat_result(
    data: list[dict[str, Any]], header: list[str], meta: dict[str, str], utc_offset_s: float, max_points: int
) -> dict[str, Any]:
    year = datetime.now(UTC).year
    if m := re.search(r"\b(\d{4})\b", meta.get("date", "")):
        year = int(m.group(1))
    times = [_dstat_time(r, year, utc_offset_s) for r in data]
    has_time = all(t is not None for t in times)
    t = np.asarray([tt if has_time else float(n) for n, tt in enumerate(times)], dtype=float)
    skip = {"", "epoch_epoch", "system_time_per_s", "system_time"}
    cols: dict[str, np.ndarray] = {}
    for key in dict.fromkeys(header):
        if key in skip:
            continue
        values = []
        for record in data:
            cell = record.get(key, "")
            values.append(float(cell) if cell and _is_number(cell) else np.nan)
        cols[key] = np.asarray(values, dtype=float)
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
        "samples": len(data),
        "start_unix_s": round(float(t.min()), 3) if has_time else None,
        "end_unix_s": round(float(t.max()), 3) if has_time else None,
        "median_interval_s": round(float(np.median(np.diff(t))), 3) if has_time and t.size > 1 else None,
        "columns": list(cols),
        "summary": summary,
        "stats": stats,
        "series": _downsample(t, cols, max_points),
    }
