"""What the nvidia-smi and dstat parsers share: CSV rows, numbers, statistics, downsampling, time zones.

Pure (no Django). Both tools print wall-clock times without a zone (nvidia-smi's `timestamp` field is
"YYYY/MM/DD HH:MM:SS.mmm" in the host's local time; dstat's `time` column is "dd-mm HH:MM:SS", also
local), so every analysis states which zone it read them in (`zone_statement`): the zone the uploader
gave, else UTC, and says so.
"""

from __future__ import annotations

import csv
import re
from array import array
from collections.abc import Iterator
from datetime import UTC, timedelta, timezone, tzinfo
from typing import Any, TextIO
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np

from jobs.diagnosis.thresholds import IDLE_UTIL_MAX
from jobs.profiling.errors import ArtifactError
from jobs.profiling.guard import checkpoint

#: A GPU sample is idle at or below this utilisation, in percent: the evaluation's and the idle_gpus
#: rule's threshold (jobs.diagnosis.thresholds.IDLE_UTIL_MAX, a 0-1 ratio), so a log and DCGM agree.
IDLE_UTIL_PCT = IDLE_UTIL_MAX * 100.0
MAX_POINTS = 2000
#: Readings beyond this magnitude (a power of 1e309 W, a 10^23 % utilisation) are unknown.
MAX_VALUE = 1e18
#: Unix seconds before year 5000.
MAX_UNIX_S = 95_617_584_000.0
_SLUG = re.compile(r"[^a-z0-9]+")
_OFFSET = re.compile(r"^(?:utc|gmt)?\s*([+-])(\d{1,2})(?::?(\d{2}))?$", re.IGNORECASE)


def slug(text: str) -> str:
    """Lower-case words joined by underscores ("power.draw [W]" -> "power_draw_w")."""
    return _SLUG.sub("_", text.strip().lower()).strip("_")


def finite(value: float) -> float | None:
    """A measurement, or None when it is not finite or beyond any believable reading."""
    return value if -MAX_VALUE < value < MAX_VALUE else None


def as_array(values: array[float]) -> np.ndarray:
    """A float64 view of an array("d") buffer (no Python float per value, no copy)."""
    return np.frombuffer(values, dtype=np.float64) if len(values) else np.zeros(0)


def stats(values: np.ndarray) -> dict[str, float | None]:
    """Mean, 5th/50th/95th percentiles, min and max of the finite values (each None when there are none)."""
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


def downsample(
    t: np.ndarray,
    columns: dict[str, np.ndarray],
    max_points: int,
    *,
    idle_key: str | None = None,
    idle_max: float = IDLE_UTIL_PCT,
) -> dict[str, list[Any]]:
    """Every sample, or `max_points` bucket means so a week-long 1 s log still draws and stores small.

    A bucket mean hides what happened inside it: a 2 s idle gap in a 30-sample bucket of a busy GPU reads
    as 88 % busy, so a log judged on its bucket means loses its short idle gaps. Bucketed series therefore
    also carry, computed on the full samples, each bucket's sample count (`bucket_samples`) and, for
    `idle_key` (a utilisation column, percent), the count and mean of its idle samples (at or below
    `idle_max`): `<idle_key>_idle_samples`, `<idle_key>_idle_mean` -- what the evaluation needs to count
    idle time exactly (jobs.evaluation.monitoring_signals).
    """
    n = t.size
    if n <= max_points:
        out: dict[str, list[Any]] = {"t_unix_s": [round(float(x), 3) for x in t]}
        for key, col in columns.items():
            out[key] = [None if np.isnan(v) else round(float(v), 4) for v in col]
        return out
    edges = np.linspace(0, n, max_points + 1).astype(np.int64)
    starts = edges[:-1]
    sizes = np.diff(edges)

    def bucket_sum(values: np.ndarray) -> np.ndarray:
        return np.add.reduceat(values, starts)

    def rounded(values: np.ndarray, digits: int) -> list[Any]:
        return [None if np.isnan(v) else round(float(v), digits) for v in values]

    out = {"t_unix_s": rounded(bucket_sum(t) / sizes, 3), "bucket_samples": [int(x) for x in sizes]}
    for key, col in columns.items():
        present = ~np.isnan(col)
        counts = bucket_sum(present.astype(np.int64))
        sums = bucket_sum(np.where(present, col, 0.0))
        with np.errstate(invalid="ignore", divide="ignore"):
            out[key] = rounded(np.where(counts > 0, sums / np.maximum(counts, 1), np.nan), 4)
        if key == idle_key:
            idle = present & (col <= idle_max)
            idle_n = bucket_sum(idle.astype(np.int64))
            idle_sum = bucket_sum(np.where(idle, col, 0.0))
            out[f"{key}_idle_samples"] = [int(x) for x in idle_n]
            out[f"{key}_valid_samples"] = [int(x) for x in counts]
            out[f"{key}_idle_mean"] = rounded(
                np.where(idle_n > 0, idle_sum / np.maximum(idle_n, 1), np.nan), 4
            )
    return out


def csv_rows(text: TextIO) -> Iterator[list[str]]:
    """Non-empty CSV rows, streamed from the upload (the file is never held whole next to its rows)."""
    try:
        for row in csv.reader(text, skipinitialspace=True):
            if row and (len(row) > 1 or row[0].strip()):
                checkpoint()
                yield row
    except csv.Error as exc:
        raise ArtifactError(f"The CSV is malformed: {exc}.") from exc


def parse_zone(name: str | None, utc_offset_s: float = 0.0) -> tuple[tzinfo, str]:
    """The zone a log's zone-less timestamps are read in, and its name as the analysis states it.

    `name`: an IANA zone ("Europe/Berlin": daylight saving follows the date of each timestamp), "UTC", or
    a fixed offset ("+02:00", "UTC-5", "+0530"); None or "" means `utc_offset_s` (seconds east of UTC,
    the older option; 0 = UTC). An unknown name is an ArtifactError that says what is accepted.
    """
    text = (name or "").strip()
    if not text:
        if utc_offset_s:
            zone = timezone(timedelta(seconds=utc_offset_s))
            return zone, _offset_name(utc_offset_s)
        return UTC, "UTC"
    if text.upper() in ("UTC", "Z", "GMT"):
        return UTC, "UTC"
    if m := _OFFSET.match(text):
        sign = -1 if m.group(1) == "-" else 1
        hours, minutes = int(m.group(2)), int(m.group(3) or 0)
        if hours > 14 or minutes > 59:
            raise ArtifactError(f"time zone offset {text!r} is out of range (-14:00 to +14:00)")
        seconds = sign * (hours * 3600 + minutes * 60)
        return timezone(timedelta(seconds=seconds)), _offset_name(seconds)
    try:
        return ZoneInfo(text), text
    except (ZoneInfoNotFoundError, ValueError):
        raise ArtifactError(
            f"unknown time zone {text[:64]!r}: give an IANA name (e.g. Europe/Berlin), UTC, or an offset "
            "such as +02:00"
        ) from None


def _offset_name(seconds: float) -> str:
    sign = "-" if seconds < 0 else "+"
    minutes = round(abs(seconds) / 60)
    return f"UTC{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def zone_statement(zone_name: str, given: bool, *, naive: int, zoned: int, unix: int) -> dict[str, Any]:
    """The analysis' `time_zone` block: which zone zone-less timestamps were read in, and why.

    `naive`, `zoned`, `unix`: how many timestamps were local wall-clock times, carried their own offset
    (ISO 8601 with Z or +hh:mm), or were unix seconds; only the first kind depends on the assumption.
    """
    if naive == 0:
        source = (
            "not needed: the timestamps carry their own zone or are unix seconds"
            if zoned or unix
            else "not needed: no timestamps"
        )
    elif given:
        source = "given on upload"
    else:
        source = (
            "assumed: the timestamps carry no zone (nvidia-smi and dstat print the host's local time); "
            "set `timezone` on upload if the host was not on UTC"
        )
    return {
        "zone": zone_name,
        "source": source,
        "assumed": naive > 0 and not given,
        "local_timestamps": naive,
        "zoned_timestamps": zoned,
        "unix_timestamps": unix,
    }
