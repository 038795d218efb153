"""Parse dstat `--output file.csv` logs (dstat 0.7.2 and 0.7.3 layouts) into host time series.

Units go into key names: cpu_usr_pct, dsk_total_read_bytes_per_s, net_total_recv_bytes_per_s,
mem_used_bytes. Each value is what dstat printed for the interval ending at its row (dstat's manual:
"the first line shows averages since boot", so each block's first row is dropped).

The time axis comes from evidence in the file, never from the row number when there is a clock: the
`epoch` column (`dstat -T`, unix seconds: no zone involved), else the `time` column (`dstat -t`,
"dd-mm HH:MM:SS" in the host's local time, without a year: the year comes from the "Date:" line, which
dstat writes with `%d %b %Y %H:%M:%S %Z`). Local times are read in the zone given on upload; else, when
the "Date:" line names UTC/GMT, in UTC; else in UTC with the assumption stated (a zone abbreviation such
as CST names several zones, so it is reported, not trusted). The analysis says which (`time_zone`).
"""

from __future__ import annotations

import itertools
import re
from array import array
from datetime import UTC, datetime, tzinfo
from math import nan
from pathlib import Path
from typing import Any

import numpy as np

from jobs.profiling.detect import DEFAULT_MAX_BYTES, open_text
from jobs.profiling.errors import ArtifactError
from jobs.profiling.guard import guarded
from jobs.profiling.monitoring_common import (
    MAX_POINTS,
    MAX_UNIX_S,
    MAX_VALUE,
    as_array,
    csv_rows,
    downsample,
    parse_zone,
    slug,
    stats,
    zone_statement,
)

#: A `time` column that jumps back by more than this crossed a new year (dstat prints no year).
_YEAR_WRAP_S = 180 * 86400.0

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
            base = f"{slug(name.format(*m.groups()))}_{slug(nick)}"
            return f"{base}_{suffix}" if suffix else base
    return f"{slug(group)}_{slug(nick)}" if group else slug(nick)


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
    timezone: str | None = None,
    max_points: int = MAX_POINTS,
) -> dict[str, Any]:
    """Time series and statistics from `dstat --output file.csv` (0.7.2 and 0.7.3 layouts).

    The time axis comes from the epoch column (`dstat -T`) or the time column (`-t`, with the year from
    the "Date:" line); without either it is the sample index. dstat's first sample averages since boot,
    so it is dropped from every block. `timezone` (IANA name or offset) or `utc_offset_s`: the zone of
    the `time` column (see the module docstring for the default).
    """
    parse_zone(timezone, utc_offset_s)  # an unknown zone is refused before the file is read
    meta: dict[str, str] = {}
    header: list[str] | None = None
    keys: list[str] = []  # the current block's value columns
    cols: dict[str, array[float]] = {}
    epochs = array("d")  # the epoch column (dstat -T), NaN where unreadable
    clock_text: list[str | None] = []  # the time column (dstat -t) when there is no epoch column
    samples = 0
    first_in_block = False
    with open_text(source, max_bytes, what="dstat CSV") as text:
        rows = csv_rows(text)
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
    return _dstat_result(samples, epochs, clock_text, final, meta, (timezone, utc_offset_s), max_points)


def _number_or_nan(cell: str) -> float:
    try:
        value = float(cell) if len(cell) <= 64 else nan
    except ValueError:
        return nan
    return value if -MAX_VALUE < value < MAX_VALUE else nan


def _dstat_time(epoch: float, clock: str | None, year: int, zone: tzinfo) -> float | None:
    if clock is None:
        return epoch if 0.0 <= epoch < MAX_UNIX_S else None
    for fmt in ("%d-%m %H:%M:%S", "%d-%m %H:%M:%S.%f"):
        try:
            parsed = datetime.strptime(f"{year} {clock[:40]}", f"%Y {fmt}")
        except ValueError:
            continue
        return parsed.replace(tzinfo=zone).timestamp()
    return None


def _zone_of(meta: dict[str, str], given: tuple[str | None, float]) -> tuple[tzinfo, str, bool, str]:
    """(zone, its name, whether it is known rather than assumed, why) for the `time` column."""
    name, offset = given
    if (name or "").strip() or offset:
        zone, label = parse_zone(name, offset)
        return zone, label, True, "given on upload"
    date = meta.get("date", "")
    abbreviation = date.rsplit(" ", 1)[-1] if re.search(r"\d{2}:\d{2}:\d{2} \S+$", date) else ""
    if abbreviation.upper() in ("UTC", "GMT"):
        return UTC, "UTC", True, f'the "Date:" line names {abbreviation}'
    if abbreviation:
        return (
            UTC,
            "UTC",
            False,
            (
                f'assumed: the "Date:" line names {abbreviation}, an abbreviation that can mean several '
                "zones; set `timezone` on upload"
            ),
        )
    return UTC, "UTC", False, "assumed: the `time` column has no zone; set `timezone` on upload"


def _dstat_result(
    samples: int,
    epochs: array[float],
    clock_text: list[str | None],
    columns: dict[str, array[float]],
    meta: dict[str, str],
    given_zone: tuple[str | None, float],
    max_points: int,
) -> dict[str, Any]:
    year = datetime.now(UTC).year
    if m := re.search(r"\b(\d{4})\b", meta.get("date", "")):
        year = int(m.group(1))
    zone, zone_name, known, why = _zone_of(meta, given_zone)
    times = [
        _dstat_time(epoch, clock, year, zone)
        for epoch, clock in zip(as_array(epochs).tolist(), clock_text, strict=True)
    ]
    local = sum(1 for clock in clock_text if clock is not None)
    wrapped = 0
    for i in range(1, len(times)):
        prev, cur = times[i - 1], times[i]
        if clock_text[i] is not None and prev is not None and cur is not None and cur < prev - _YEAR_WRAP_S:
            wrapped += 1  # 31-12 -> 01-01: the rest of the log is in the next year
            year += 1
            for j in range(i, len(times)):
                times[j] = _dstat_time(as_array(epochs)[j], clock_text[j], year, zone)
    has_time = all(t is not None for t in times)
    time_zone = zone_statement(zone_name, known, naive=local if has_time else 0, zoned=0,
                               unix=len(times) - local if has_time else 0)  # fmt: skip
    time_zone["source"] = why if local and has_time else time_zone["source"]
    time_zone["year_wraps"] = wrapped
    t = np.asarray([tt if has_time else float(n) for n, tt in enumerate(times)], dtype=float)
    del times
    cols: dict[str, np.ndarray] = {key: as_array(col) for key, col in columns.items()}
    col_stats = {key: stats(col) for key, col in cols.items()}

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
        return stats(col)["mean"] if col is not None else None

    def p95(col: np.ndarray | None) -> float | None:
        return stats(col)["p95"] if col is not None else None

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
        "mem_used_max_bytes": col_stats.get("mem_used_bytes", {}).get("max"),
    }
    return {
        "format": "dstat_csv",
        "host": meta.get("host"),
        "cmdline": meta.get("cmdline"),
        "date": meta.get("date"),
        "time_axis": "unix_s" if has_time else "sample_index",
        "time_source": "epoch column (dstat -T)"
        if has_time and not local
        else ("time column (dstat -t)" if has_time else "none: no epoch or time column (sample index)"),
        "time_zone": time_zone,
        "samples": samples,
        "start_unix_s": round(float(t.min()), 3) if has_time else None,
        "end_unix_s": round(float(t.max()), 3) if has_time else None,
        "median_interval_s": round(float(np.median(np.diff(t))), 3) if has_time and t.size > 1 else None,
        "columns": list(cols),
        "summary": summary,
        "stats": col_stats,
        "series": downsample(t, cols, max_points),
    }
