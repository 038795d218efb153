"""Parse nvidia-smi `--query-gpu=... --format=csv[,noheader][,nounits] [-l N | -lms N]` logs.

Each GPU becomes a time series on unix seconds (so it can be placed on a job's time axis) plus summary
statistics. Units go into key names: utilization_gpu_pct, power_draw_w, temperature_gpu_c,
memory_used_bytes, clocks_sm_mhz.

Which GPU a row is comes from evidence, never from its position alone: the `index`, `uuid` or
`pci.bus_id` column when the query has one (in that order); without any, the rows are grouped into sweeps
by their time gaps (jobs.profiling.smi_sweeps), and a log whose grouping is ambiguous is refused with a
message asking for `index` in --query-gpu. The analysis says which (`gpu_assignment`).

Timestamps: nvidia-smi prints the host's local time without a zone ("2024/05/14 09:30:01.123"; field
`timestamp` in `nvidia-smi --help-query-gpu`). They are read in the zone given on upload (`timezone`),
else UTC, and the analysis says which (`time_zone`); ISO 8601 times with an offset and unix seconds
(custom loggers) need no assumption.
"""

from __future__ import annotations

import functools
import itertools
import re
from array import array
from collections.abc import Sequence
from datetime import UTC, datetime, tzinfo
from math import nan
from pathlib import Path
from typing import Any

import numpy as np

from jobs.profiling.detect import DEFAULT_MAX_BYTES, open_text
from jobs.profiling.errors import ArtifactError
from jobs.profiling.guard import guarded
from jobs.profiling.monitoring_common import (
    IDLE_UTIL_PCT,
    MAX_POINTS,
    MAX_UNIX_S,
    as_array,
    csv_rows,
    downsample,
    finite,
    parse_zone,
    slug,
    stats,
    zone_statement,
)
from jobs.profiling.smi_sweeps import AmbiguousSweeps, assign_by_sweeps

#: At most this many GPUs (distinct index/uuid values) per log; rows of further ones are malformed.
MAX_GPUS = 1024
_NA = {
    "",
    "[n/a]",
    "n/a",
    "[not supported]",
    "[unknown error]",
    "[insufficient permissions]",
    "[gpu is lost]",
}
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
# GPU identity columns, strongest first: `index` (nvidia-smi's enumeration order), `uuid`, `pci.bus_id`.
_ID_FIELDS = {
    "index": "index",
    "gpu_index": "index",
    "gpu_id": "index",
    "gpu": "index",
    "uuid": "uuid",
    "gpu_uuid": "uuid",
    "pci_bus_id": "pci_bus_id",
}
_ID_ORDER = ("index", "uuid", "pci_bus_id")
_ID_LABEL = {"index": "GPU index", "uuid": "GPU UUID", "pci_bus_id": "PCI bus id"}
#: An identity column may repeat a value within one timestamp on at most this share of rows (a
#: duplicated line); more and it is not a GPU identity.
MAX_REPEAT_SHARE = 0.001
_TEXT_FIELDS = {"name", "gpu_name", "uuid", "gpu_uuid", "pci_bus_id", "driver_version", "pstate", "serial"}
# Columns that are constant per GPU: checked after a sweep grouping (one GPU must keep one value).
_CONSTANT_FIELDS = ("name", "gpu_name", "serial", "memory_total_bytes")
_SMI_TIME_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S")
# How a parsed timestamp was written (for the time_zone statement).
_NAIVE, _ZONED, _UNIX = 0, 1, 2


def _column_key(title: str) -> tuple[str, float]:
    """Series key with unit suffix and the factor to the key's unit, for one nvidia-smi column."""
    title = title.strip()
    unit = None
    if m := _HEADER_UNIT.match(title):
        title, unit = m.group(1), m.group(2).strip().lower()
    base = slug(title)
    if unit is None and (m := _NAME_UNIT.match(title.strip().lower())):
        word = m.group(2)
        if word in _NAME_UNIT_SUFFIX:
            base, unit = (
                slug(m.group(1)),
                {"c": "c", "celsius": "c", "watts": "w", "percent": "%"}.get(word, word),
            )
        elif word == "mib":
            base, unit = slug(m.group(1)), "mib"
    if unit is None:
        unit = next((u for prefix, u in _KNOWN_UNITS if base.startswith(prefix)), None) or None
    suffix = _UNIT_SUFFIX.get(unit or "", _DEFAULT_SUFFIX.get(base, slug(unit or "")))
    key = f"{base}_{suffix}" if suffix else base
    return _ALIASES.get(key, key), _UNIT_SCALE.get(unit or "", 1.0)


@functools.lru_cache(maxsize=4096)
def _parse_time(text: str, zone: tzinfo) -> tuple[float, int] | None:
    """(unix seconds, how it was written) from nvidia-smi's "YYYY/MM/DD HH:MM:SS.mmm" (local time, read in
    `zone`), ISO 8601 with or without an offset, or unix seconds; None when it is none of these.
    Cached: with `-l` every GPU row of one sweep carries the same text."""
    text = text.strip()
    if not text or len(text) > 64:
        return None
    try:
        value = float(text)  # already unix seconds
    except ValueError:
        pass
    else:
        return (value, _UNIX) if 0.0 <= value < MAX_UNIX_S else None
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
            return parsed.timestamp(), _ZONED
        return parsed.replace(tzinfo=zone).timestamp(), _NAIVE
    except (OverflowError, ValueError, OSError):
        return None


def _parse_value(text: str, scale: float) -> float | str | None:
    cleaned = text.strip()
    if len(cleaned) > 200:
        return cleaned[:200]
    number, _, unit = cleaned.partition(" ")
    if unit in _VALUE_UNITS:  # fast path: "85", "85 %", "18.81 W"
        try:
            return finite(float(number) * scale)
        except ValueError:
            pass
    lowered = cleaned.lower()
    if lowered in _NA:
        return None
    if lowered.startswith("0x"):
        try:
            return finite(float(int(cleaned[:18], 16)))  # clocks_event_reasons bitmask
        except ValueError:
            return cleaned
    if m := _VALUE_UNIT.match(cleaned):
        return finite(float(m.group(1)) * scale)
    return cleaned


def _looks_like_header(row: list[str]) -> bool:
    return not any(_VALUE_UNIT.match(c.strip()) or _parse_time(c, UTC) is not None for c in row if c.strip())


def _new_entry() -> dict[str, Any]:
    return {"t": array("d"), "values": {}, "info": {}, "text_rows": {}}


@guarded("nvidia-smi log")
def analyze_nvidia_smi(
    source: bytes | str | Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    fields: Sequence[str] | str | None = None,
    utc_offset_s: float = 0.0,
    timezone: str | None = None,
    idle_util_pct: float = IDLE_UTIL_PCT,
    max_points: int = MAX_POINTS,
) -> dict[str, Any]:
    """Per-GPU time series and statistics from `nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`.

    With `noheader`, pass the `--query-gpu` field list as `fields` (a list or "a,b,c"). Values may
    carry units ("85 %", "18.81 W") or not; "[N/A]" becomes None. Series are downsampled to
    `max_points` bucket means (each bucket with its sample and idle-sample counts, see `downsample`);
    statistics use every sample. `idle_share_pct` is the share of samples
    with GPU utilisation at or below `idle_util_pct` (the evaluation's threshold by default).
    `timezone` (IANA name or offset) or `utc_offset_s`: the zone of zone-less timestamps (default UTC).
    A log without a GPU column whose rows cannot be grouped into sweeps raises ArtifactError.
    """
    zone, zone_name = parse_zone(timezone, utc_offset_s)
    kinds = [0, 0, 0]
    with open_text(source, max_bytes, what="nvidia-smi log") as text:
        rows = csv_rows(text)
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
        # GPU identity candidates, strongest kind first, then in column order; which one is trusted is
        # decided from the rows (`_choose_identity`).
        candidates = sorted(
            (_ID_ORDER.index(_ID_FIELDS[k]), i, _ID_FIELDS[k]) for i, k in enumerate(keys) if k in _ID_FIELDS
        )
        value_columns = [
            (i, key, scale, key in _TEXT_FIELDS)
            for i, (key, scale) in enumerate(columns)
            if i != time_i and key not in ("index", "gpu_index", "gpu_id", "gpu")
        ]
        # Every row in file order in one entry, with its identity candidates' labels; split after the read.
        entry = _new_entry()
        times, values, text_rows = entry["t"], entry["values"], entry["text_rows"]
        labels: dict[int, list[str]] = {i: [] for _, i, _ in candidates}
        bad = 0
        for row in rows:
            if len(row) < len(header):
                bad += 1
                continue
            t = None
            if time_i is not None:
                got = _parse_time(row[time_i], zone)
                if got is None:
                    bad += 1
                    continue
                t, kind = got
                kinds[kind] += 1
            for i, found in labels.items():
                found.append(row[i].strip()[:64])
            row_no = len(times)
            times.append(t if t is not None else float(row_no))
            skipped = False
            for i, key, scale, is_text in value_columns:
                value = _parse_value(row[i], scale)
                if is_text or isinstance(value, str):
                    if value is not None:
                        text_rows.setdefault(key, {})[row_no] = value
                    skipped = skipped or not is_text
                    continue
                column = values.get(key)
                if column is None:
                    column = values[key] = array("d", [nan]) * row_no
                column.append(nan if value is None else value)
            if skipped:  # text in a numeric column: NaN there, so the rows stay aligned
                for column in values.values():
                    if len(column) <= row_no:
                        column.append(nan)
    if not len(entry["t"]):
        raise ArtifactError(
            f"No usable nvidia-smi rows ({bad} malformed); check the header and the timestamps."
        )
    has_time = time_i is not None
    chosen, notes = _choose_identity(candidates, labels, as_array(entry["t"]), has_time, header)
    if chosen is None and not has_time and len(entry["t"]) > 1:
        raise ArtifactError(
            "This nvidia-smi log has neither a GPU column nor timestamps, so its rows cannot be told "
            "apart by GPU: add `index` (and `timestamp`) to --query-gpu."
        )
    if chosen is None:
        gpus, assignment = _split_by_sweeps(entry)
    else:
        kind_name, column_i = chosen
        names = list(dict.fromkeys(labels[column_i]))
        if len(names) > MAX_GPUS:  # rows of GPUs past the limit are malformed
            bad += sum(1 for label in labels[column_i] if label not in set(names[:MAX_GPUS]))
            names = names[:MAX_GPUS]
        number = {name: n for n, name in enumerate(names)}
        positions = np.array([number.get(label, -1) for label in labels[column_i]], dtype=np.int64)
        gpus = _split(entry, positions, names, check_constant=False)
        assignment = {"method": f"{header[column_i].strip()} column ({_ID_LABEL[kind_name]})",
                      "gpu_count": len(gpus)}  # fmt: skip
    if notes:
        assignment["rejected_columns"] = notes
    result = _smi_result(gpus, has_time, bad, idle_util_pct, max_points)
    result["gpu_assignment"] = assignment
    result["time_zone"] = zone_statement(
        zone_name, bool((timezone or "").strip()) or bool(utc_offset_s),
        naive=kinds[_NAIVE], zoned=kinds[_ZONED], unix=kinds[_UNIX],
    )  # fmt: skip
    return result


def _choose_identity(
    candidates: list[tuple[int, int, str]],
    labels: dict[int, list[str]],
    t: np.ndarray,
    has_time: bool,
    header: list[str],
) -> tuple[tuple[str, int] | None, list[str]]:
    """The identity column the rows support ((kind, column), or None: group by sweeps) and why the others
    were not trusted. A GPU identity cannot repeat within one timestamp (two rows at the same time are
    two GPUs), and a column with one value cannot be it when the timestamps show sweeps of several rows
    (a logger's mislabelled column: gpu_glasses' "index" is 0 on every row of an 8-GPU log)."""
    notes: list[str] = []
    n = t.size
    for _, i, kind in candidates:
        column = labels[i]
        name = header[i].strip()
        if not has_time or n < 2:
            return (kind, i), notes
        repeats = n - len(set(zip(t.tolist(), column, strict=True)))
        if repeats > max(1, int(MAX_REPEAT_SHARE * n)):
            notes.append(f"{name}: {repeats} rows repeat a value within one timestamp, so it is not a GPU id")
            continue
        if len(set(column)) == 1:
            try:
                sweeps = assign_by_sweeps(t)
            except AmbiguousSweeps:
                return (kind, i), notes
            if sweeps.gpu_count > 1:
                notes.append(
                    f"{name}: one value on every row while the timestamps group into sweeps of "
                    f"{sweeps.gpu_count} rows, so it is not a GPU id"
                )
                continue
        return (kind, i), notes
    return None, notes


def _split_by_sweeps(entry: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The rows of a log without a usable GPU column, split into GPUs by sweep (jobs.profiling.smi_sweeps)."""
    t = as_array(entry["t"])
    try:
        sweeps = assign_by_sweeps(t)
    except AmbiguousSweeps as exc:
        raise ArtifactError(f"This nvidia-smi log has no GPU column and {exc}.") from None
    names = [str(p) for p in range(sweeps.gpu_count)]
    return _split(entry, sweeps.positions, names, check_constant=True), sweeps.describe()


def _split(
    entry: dict[str, Any], positions: np.ndarray, names: list[str], *, check_constant: bool
) -> dict[str, dict[str, Any]]:
    """One entry per GPU from the rows of `entry` (file order) and each row's GPU position (-1: left out).
    `check_constant`: refuse when a per-GPU constant (name, serial, memory.total) changes within a GPU,
    the sign that a sweep grouping put two GPUs' rows together."""
    t = as_array(entry["t"])
    gpus: dict[str, dict[str, Any]] = {}
    for p, label in enumerate(names):
        mask = positions == p
        out = _new_entry()
        out["t"] = array("d", t[mask].tolist())
        for key, column in entry["values"].items():
            out["values"][key] = array("d", as_array(column)[mask].tolist())
        rows = np.nonzero(mask)[0]
        for key, by_row in entry["text_rows"].items():
            seen = [v for r in rows.tolist() if (v := by_row.get(r)) is not None]
            if check_constant and key in _CONSTANT_FIELDS and len(set(seen)) > 1:
                raise ArtifactError(
                    f"This nvidia-smi log has no GPU column and grouping its rows into sweeps gives GPU "
                    f"{label} more than one {key} ({', '.join(sorted(map(str, set(seen)))[:3])}): the order "
                    "of the rows is not stable; add `index` to --query-gpu."
                )
            if seen:
                out["info"][key] = seen[-1]  # driver version, pstate: the GPU's last value
        total = out["values"].get("memory_total_bytes")
        if check_constant and total is not None:
            values = as_array(total)
            values = values[~np.isnan(values)]
            if values.size and values.min() != values.max():
                raise ArtifactError(
                    "This nvidia-smi log has no GPU column and grouping its rows into sweeps gives GPU "
                    f"{label} more than one memory.total: the order of the rows is not stable; add `index` "
                    "to --query-gpu."
                )
        gpus[label] = out
    return gpus


def _smi_result(
    gpus: dict[str, dict[str, Any]], has_time: bool, bad: int, idle_util_pct: float, max_points: int
) -> dict[str, Any]:
    per_gpu, series = [], {}
    all_util, all_t = [], []
    for gpu in sorted(gpus, key=lambda g: (len(g), g)):
        entry = gpus[gpu]
        t = as_array(entry["t"])
        order = np.argsort(t, kind="stable")
        t = t[order]
        cols = {}
        for key, vals in entry["values"].items():
            if len(vals) == len(t):
                cols[key] = as_array(vals)[order]
        entry["values"] = {}  # the arrays above are copies: free the buffers as we go
        util = cols.get("utilization_gpu_pct")
        col_stats = {key: stats(col) for key, col in cols.items()}
        idle = None
        if util is not None and np.any(~np.isnan(util)):
            valid = util[~np.isnan(util)]
            idle = round(100.0 * float(np.mean(valid <= idle_util_pct)), 3)
            all_util.append(valid)
        all_t.append(t)
        per_gpu.append(
            {
                "gpu": gpu,
                **{k: v for k, v in entry["info"].items()},
                "samples": int(t.size),
                "start_unix_s": round(float(t[0]), 3) if has_time else None,
                "end_unix_s": round(float(t[-1]), 3) if has_time else None,
                "median_interval_s": round(float(np.median(np.diff(t))), 3)
                if has_time and t.size > 1
                else None,
                "idle_share_pct": idle,
                "stats": col_stats,
            }
        )
        series[gpu] = downsample(t, cols, max_points, idle_key="utilization_gpu_pct", idle_max=idle_util_pct)
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
        "idle_share_pct": round(100.0 * float(np.mean(util_all <= idle_util_pct)), 3)
        if util_all.size
        else None,
        "idle_util_threshold_pct": idle_util_pct,
        "mean_power_draw_w": mean_of("power_draw_w"),
        "max_temperature_gpu_c": max_of("temperature_gpu_c"),
        "gpus": per_gpu,
        "series": series,
    }
