"""The Nsight Systems SQLite export's side tables, for `nsys.parse_nsys`: the string table, the CUDA
runtime calls, NVTX ranges, the devices (TARGET_INFO_GPU), the session's start and analysis window, META
values, and the tolerant readers of one column value (`as_int`, `as_time`, `as_stream`).

Every table may be missing (nsys creates them lazily) and column sets differ across export schema
versions, so each reader checks what the export has and reads only tables, by name, through the guarded
reader (`safe_sqlite.GuardedSQLite`).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import numpy.typing as npt

from jobs.profiling.events import (
    ANNOTATION_COLUMNS,
    RUNTIME_COLUMNS,
    Annotations,
    AnnotationSource,
    ColumnBuilder,
    DeviceInfo,
    RuntimeCalls,
    RuntimeKind,
    StringTable,
    SyncKind,
)
from jobs.profiling.guard import checkpoint
from jobs.profiling.safe_sqlite import GuardedSQLite

_API_VERSION_SUFFIX = re.compile(r"_v\d+$")


_STRING_TABLES = ("StringIds", "StringTable", "Strings")


_NVTX_RANGE_TYPES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange


def load_strings(reader: GuardedSQLite) -> dict[int, str]:
    for table in _STRING_TABLES:
        if table in reader.tables:
            id_col = reader.col(table, "id")
            val_col = reader.col(table, "value", "string", "text")
            if id_col == "NULL" or val_col == "NULL":
                continue
            return {
                as_int(i, -1): str(v)
                for i, v in reader.rows(f'SELECT {id_col}, {val_col} FROM "{table}"')
                if isinstance(i, int | float) and not isinstance(i, bool) and v is not None
            }
    return {}


class StringResolver:
    """Maps nsys string ids (or inline text) to our string-table indices, caching per id."""

    def __init__(self, strings: StringTable, ids: dict[int, str]) -> None:
        self.strings = strings
        self.ids = ids
        self.cache: dict[Any, int] = {}

    def __call__(self, value: Any, fallback: str = "") -> int:
        idx = self.cache.get(value)
        if idx is None:
            if isinstance(value, int):
                text = self.ids.get(value, f"<string {value}>")
            elif isinstance(value, str):
                text = value
            else:
                text = fallback
            idx = self.strings.intern(text)
            self.cache[value] = idx
        return idx


def sync_kind_map(reader: GuardedSQLite) -> dict[int, int]:
    """syncType value -> SyncKind, from the export's own enum table when it has one (CUPTI numbering else)."""
    mapping = {int(k): int(k) for k in SyncKind}
    table = "ENUM_CUPTI_SYNC_TYPE"
    if table in reader.tables and reader.col(table, "id") != "NULL" and reader.col(table, "name") != "NULL":
        for value, name in reader.rows(f'SELECT id, name FROM "{table}"'):
            if isinstance(value, int) and -(2**31) <= value < 2**31 and isinstance(name, str):
                for suffix, kind in _SYNC_ENUM_SUFFIX.items():
                    if name.endswith(suffix):
                        mapping[value] = int(kind)
    return mapping


#: Integers from the export beyond this are not believable (timestamps, ids, sizes): "unknown".
_MAX_INT = 2**62


def as_int(value: Any, default: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value if -_MAX_INT <= value <= _MAX_INT else default
    if isinstance(value, float) and math.isfinite(value) and abs(value) <= _MAX_INT:
        return int(value)
    return default


def as_time(value: Any) -> int | None:
    """A timestamp in ns (SQLite is dynamically typed: text, blobs, NaN or 2^63 may sit in the column)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if -_MAX_INT <= value <= _MAX_INT else None
    if isinstance(value, float) and math.isfinite(value) and abs(value) <= _MAX_INT:
        return int(value)
    return None


def as_stream(value: Any) -> int:
    stream = as_int(value, -1)
    return -1 if stream == _NO_ID_U32 else stream


def read_runtime(
    reader: GuardedSQLite, resolve: StringResolver, present: list[str]
) -> tuple[RuntimeCalls, npt.NDArray[np.int64]]:
    rt = ColumnBuilder(RUNTIME_COLUMNS)
    pids: list[int] = []
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if table in reader.tables:
        present.append(table)
        name_col = reader.col(table, "nameId", "name")
        sql = (
            f"SELECT start, end, {name_col}, {reader.col(table, 'correlationId', default='-1')}, "
            f"{reader.col(table, 'globalTid', default='0')} FROM {table}"
        )
        # nsys spells API names with a version suffix ("cudaLaunchKernel_v7000"); Kineto does not.
        clean: dict[int, int] = {}
        for start, end, name, corr, gtid in reader.rows(sql):
            start, end = as_time(start), as_time(end)
            if start is None or end is None:
                continue
            checkpoint()
            raw_idx = resolve(name, "<unknown runtime call>")
            idx = clean.get(raw_idx)
            if idx is None:
                text = resolve.strings[raw_idx]
                idx = resolve.strings.intern(_API_VERSION_SUFFIX.sub("", text))
                clean[raw_idx] = idx
            text = resolve.strings[idx]
            kind = (
                RuntimeKind.DRIVER
                if text.startswith("cu") and not text.startswith("cuda")
                else RuntimeKind.RUNTIME
            )
            gtid = as_int(gtid, 0)
            rt.append_row(start, max(end - start, 0), idx, as_int(corr, -1), gtid & 0xFFFFFF, kind)
            pids.append(gtid >> 24)
    return RuntimeCalls(**rt.to_numpy()), np.array(pids, dtype=np.int64)


def read_nvtx(
    reader: GuardedSQLite, resolve: StringResolver, present: list[str]
) -> tuple[Annotations, npt.NDArray[np.int64]]:
    ann = ColumnBuilder(ANNOTATION_COLUMNS)
    pids: list[int] = []
    table = "NVTX_EVENTS"
    if table in reader.tables:
        present.append(table)
        text_col = reader.col(table, "text")
        text_id_col = reader.col(table, "textId")
        type_col = reader.col(table, "eventType", default="59")
        sql = (
            f"SELECT start, end, {text_col}, {text_id_col}, {reader.col(table, 'globalTid', default='0')} "
            f"FROM {table} WHERE {type_col} IN {_NVTX_RANGE_TYPES} AND end IS NOT NULL AND end >= start"
        )
        for start, end, text, text_id, gtid in reader.rows(sql):
            start, end = as_time(start), as_time(end)
            if start is None or end is None or end < start:
                continue
            checkpoint()
            name = text if isinstance(text, str) else text_id
            gtid = as_int(gtid, 0)
            ann.append_row(
                start, end - start, resolve(name, "<unnamed range>"), AnnotationSource.NVTX, gtid & 0xFFFFFF
            )
            pids.append(gtid >> 24)
    return Annotations(**ann.to_numpy()), np.array(pids, dtype=np.int64)


def read_devices(reader: GuardedSQLite) -> dict[int, DeviceInfo]:
    devices: dict[int, DeviceInfo] = {}
    table = "TARGET_INFO_GPU"
    if table in reader.tables:
        sql = reader.select(
            table,
            [
                ("cuDevice", "id", "0"),
                ("name", "''"),
                ("smCount", "multiProcessorCount", "NULL"),
                ("totalMemory", "NULL"),
                ("computeMajor", "NULL"),
                ("computeMinor", "NULL"),
                ("maxWarpsPerSm", "NULL"),
                ("threadsPerWarp", "NULL"),
            ],
        )
        for dev, name, sms, mem, major, minor, warps, warp_size in reader.rows(sql):
            dev_id = as_int(dev, 0)
            threads = as_int(warps, 0) * as_int(warp_size, 0) if 0 < as_int(warp_size, 0) <= 1024 else 0
            threads = threads if 0 < threads < 2**31 else 0
            devices[dev_id] = DeviceInfo(
                id=dev_id,
                name=name[:200] if isinstance(name, str) else "",
                num_sms=as_int(sms, 0) if 0 < as_int(sms, 0) < 2**31 else None,
                total_memory_bytes=as_int(mem, 0) if as_int(mem, 0) > 0 else None,
                compute_capability=f"{major}.{minor}"
                if isinstance(major, int) and isinstance(minor, int)
                else None,
                max_threads_per_sm=threads or None,
            )
    table = "TARGET_INFO_CUDA_DEVICE"
    if table in reader.tables and reader.col(table, "cudaId") != "NULL":
        sql = f"SELECT cudaId, {reader.col(table, 'numMultiprocessors', default='NULL')} FROM {table}"
        for dev, sms in reader.rows(sql):
            dev_id = as_int(dev, -1)
            if dev_id < 0:
                continue
            info = devices.setdefault(dev_id, DeviceInfo(id=dev_id))
            if info.num_sms is None and as_int(sms, 0) > 0:
                info.num_sms = as_int(sms, 0)
    return devices


def session_start(reader: GuardedSQLite) -> int | None:
    table = "TARGET_INFO_SESSION_START_TIME"
    if table in reader.tables and reader.col(table, "utcEpochNs") != "NULL":
        row = reader.one(f"SELECT utcEpochNs FROM {table} LIMIT 1")
        if row and isinstance(row[0], int) and not isinstance(row[0], bool) and 0 <= row[0] < _MAX_INT:
            return row[0]
    return None


def analysis_window(reader: GuardedSQLite) -> tuple[int, int] | None:
    """The session's analysed range [0, ANALYSIS_DETAILS.duration): reported, not used as the window."""
    table = "ANALYSIS_DETAILS"
    if table in reader.tables and reader.col(table, "duration") != "NULL":
        row = reader.one(f"SELECT duration FROM {table} LIMIT 1")
        if row and isinstance(row[0], int) and not isinstance(row[0], bool) and 0 < row[0] < _MAX_INT:
            # Event timestamps count from the session start, so the analysed range is [0, duration).
            return 0, row[0]
    return None


def meta(reader: GuardedSQLite, name: str) -> str | None:
    table = "META_DATA_EXPORT"
    if table not in reader.tables:
        return None
    row = reader.one(f"SELECT value FROM {table} WHERE name = ? LIMIT 1", (name,))
    return str(row[0])[:200] if row and row[0] is not None else None


_NO_ID_U32 = 0xFFFFFFFF


# ENUM_CUPTI_SYNC_TYPE names -> our SyncKind, for exports whose numbering we should not assume.
_SYNC_ENUM_SUFFIX = {
    "EVENT_SYNCHRONIZE": SyncKind.EVENT_SYNC,
    "STREAM_WAIT_EVENT": SyncKind.STREAM_WAIT_EVENT,
    "STREAM_SYNCHRONIZE": SyncKind.STREAM_SYNC,
    "CONTEXT_SYNCHRONIZE": SyncKind.CONTEXT_SYNC,
}
