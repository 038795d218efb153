"""Read an Nsight Systems SQLite export (`nsys export --type sqlite`) into the columnar event model.

One `RankTrace` per GPU (CUPTI deviceId): kernels, memcpy (copyKind/srcKind/dstKind), memset and
SYNCHRONIZATION records on that device, the CUDA runtime calls whose correlation ids launched them (or
that ran in the process using that GPU), and the process's NVTX push/pop and start/end ranges.

The file is untrusted. It is opened read-only and immutable through a URI, without extension loading,
with `trusted_schema` off (so a crafted schema cannot run functions through views or triggers), a bound on
string/blob size, and a progress handler that aborts any query after `timeout_s`. Only tables (never
views) are read, by name, and every table -- even CUPTI_ACTIVITY_KIND_KERNEL or TARGET_INFO_GPU -- may be
missing, because nsys creates tables lazily and column sets differ across export schema versions
(3.24, 3.25, ...).

The capture window is where the events are: first to last GPU op, CUDA API call or NVTX range. The
session's ANALYSIS_DETAILS.duration (reported as `session_duration_s`) covers the whole session: a
trimmed export of 300 ms of events from a 138 s session keeps 138 s there.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from jobs.profiling.events import (
    ANNOTATION_COLUMNS,
    COPY_KIND_LABELS,
    GPU_COLUMNS,
    RUNTIME_COLUMNS,
    SYNC_KIND_NAMES,
    Annotations,
    AnnotationSource,
    ColumnBuilder,
    DeviceInfo,
    DistributedInfo,
    GpuOps,
    MemKind,
    OpKind,
    RankTrace,
    RuntimeCalls,
    RuntimeKind,
    StringTable,
    SyncKind,
    Trace,
    class_of_names,
    empty_cpu_ops,
)
from jobs.profiling.guard import checkpoint, guarded
from jobs.profiling.safe_sqlite import GuardedSQLite, check_sqlite_header

DEFAULT_TIMEOUT_S = 120.0
_NO_ID_U32 = 0xFFFFFFFF
_API_VERSION_SUFFIX = re.compile(r"_v\d+$")
_STRING_TABLES = ("StringIds", "StringTable", "Strings")
# (column candidates..., default) for the device/stream/correlation/process columns of activity tables.
_COMMON_COLUMNS: list[tuple[str, ...]] = [
    ("deviceId", "0"),
    ("streamId", "-1"),
    ("correlationId", "-1"),
    ("globalPid", "0"),
]
# ENUM_CUPTI_SYNC_TYPE names -> our SyncKind, for exports whose numbering we should not assume.
_SYNC_ENUM_SUFFIX = {
    "EVENT_SYNCHRONIZE": SyncKind.EVENT_SYNC,
    "STREAM_WAIT_EVENT": SyncKind.STREAM_WAIT_EVENT,
    "STREAM_SYNCHRONIZE": SyncKind.STREAM_SYNC,
    "CONTEXT_SYNCHRONIZE": SyncKind.CONTEXT_SYNC,
}
_NVTX_RANGE_TYPES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange
# Kineto's spelling for the synthesised memcpy names; unified-memory copies are named like plain ones.
_COPY_LABELS = {kind: label.removeprefix("UVM ") for kind, label in COPY_KIND_LABELS.items()}
_MEM_LABELS: dict[int, str] = {
    MemKind.PAGEABLE: "Pageable",
    MemKind.PINNED: "Pinned",
    MemKind.DEVICE: "Device",
    MemKind.ARRAY: "Array",
    MemKind.MANAGED: "Managed",
    MemKind.DEVICE_STATIC: "Device",
    MemKind.MANAGED_STATIC: "Managed",
}


@guarded("nsys export", storable=False)
def parse_nsys(path: str | Path, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Trace:
    """Parse an Nsight Systems SQLite export; one rank per GPU. Raises `ArtifactError` on bad input."""
    path = Path(path)
    check_sqlite_header(path)
    reader = GuardedSQLite(path, timeout_s)
    try:
        trace = _parse(reader)
    finally:
        reader.close()
    with contextlib.suppress(OSError):
        trace.input_bytes = path.stat().st_size
    return trace


def _load_strings(reader: GuardedSQLite) -> dict[int, str]:
    for table in _STRING_TABLES:
        if table in reader.tables:
            id_col = reader.col(table, "id")
            val_col = reader.col(table, "value", "string", "text")
            if id_col == "NULL" or val_col == "NULL":
                continue
            return {
                _int(i, -1): str(v)
                for i, v in reader.rows(f'SELECT {id_col}, {val_col} FROM "{table}"')
                if isinstance(i, int | float) and not isinstance(i, bool) and v is not None
            }
    return {}


class _StringResolver:
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


def _parse(reader: GuardedSQLite) -> Trace:
    strings = StringTable()
    resolve = _StringResolver(strings, _load_strings(reader))
    warnings: list[str] = []
    gpu = ColumnBuilder(GPU_COLUMNS)
    gpu_pid: list[int] = []  # process of each GPU op, for joining runtime calls

    def add_op(
        gpid: Any,
        start: int,
        end: int,
        dev: Any,
        stream: Any,
        kind: int,
        name: int,
        corr: Any,
        *,
        nbytes: Any = -1,
        copy_kind: int = 0,
        src_kind: int = MemKind.UNKNOWN,
        dst_kind: int = MemKind.UNKNOWN,
        sync_kind: int = 0,
        grid_blocks: Any = -1,
        block_threads: Any = -1,
    ) -> None:
        gpu.append_row(
            start,
            max(end - start, 0),
            _int(dev, 0),
            _stream(stream),
            kind,
            0,  # kclass: filled in one vectorised pass at the end
            name,
            _int(corr, -1),
            _int(nbytes, -1),
            copy_kind,
            src_kind,
            dst_kind,
            sync_kind,
            np.nan,
            np.nan,
            _int(grid_blocks, -1),
            _int(block_threads, -1),
        )
        # globalPid is (vm id, pid) << 24: the shifted value identifies the process.
        gpu_pid.append(_int(gpid, 0) >> 24)

    present: list[str] = []

    kt = "CUPTI_ACTIVITY_KIND_KERNEL"
    if kt in reader.tables:
        present.append(kt)
        has_grid = reader.col(kt, "gridX") != "NULL"
        grid = "*".join(reader.col(kt, c, default="1") for c in ("gridX", "gridY", "gridZ"))
        block = "*".join(reader.col(kt, c, default="1") for c in ("blockX", "blockY", "blockZ"))
        sql = reader.select(
            kt,
            [
                ("start", "NULL"),
                ("end", "NULL"),
                *_COMMON_COLUMNS,
                ("demangledName", "shortName", "mangledName", "name", "NULL"),
                (grid if has_grid else "-1",),
                (block if has_grid else "-1",),
            ],
        )
        for start, end, dev, stream, corr, gpid, name, grid_n, block_n in reader.rows(sql):
            start, end = _time(start), _time(end)
            if start is None or end is None:
                continue
            checkpoint()
            add_op(
                gpid,
                start,
                end,
                dev,
                stream,
                OpKind.KERNEL,
                resolve(name, "<unnamed kernel>"),
                corr,
                grid_blocks=_int(grid_n, -1),
                block_threads=_int(block_n, -1),
            )
    else:
        warnings.append("The export has no CUPTI_ACTIVITY_KIND_KERNEL table (no CUDA kernels were traced).")

    mt = "CUPTI_ACTIVITY_KIND_MEMCPY"
    if mt in reader.tables:
        present.append(mt)
        sql = reader.select(
            mt,
            [
                ("start", "NULL"),
                ("end", "NULL"),
                *_COMMON_COLUMNS,
                ("bytes", "-1"),
                ("copyKind", "0"),
                ("srcKind", "7"),
                ("dstKind", "7"),
            ],
        )
        for start, end, dev, stream, corr, gpid, nbytes, ck, sk, dk in reader.rows(sql):
            start, end = _time(start), _time(end)
            if start is None or end is None:
                continue
            checkpoint()
            ck, sk, dk = _int(ck, 0), _int(sk, MemKind.UNKNOWN), _int(dk, MemKind.UNKNOWN)
            label = (
                f"Memcpy {_COPY_LABELS.get(ck, 'Unknown')} "
                f"({_MEM_LABELS.get(sk, 'Unknown')} -> {_MEM_LABELS.get(dk, 'Unknown')})"
            )
            add_op(
                gpid,
                start,
                end,
                dev,
                stream,
                OpKind.MEMCPY,
                strings.intern(label),
                corr,
                nbytes=_int(nbytes, -1),
                copy_kind=ck if 0 <= ck <= 13 else 0,
                src_kind=sk if 0 <= sk <= 7 else MemKind.UNKNOWN,
                dst_kind=dk if 0 <= dk <= 7 else MemKind.UNKNOWN,
            )

    st = "CUPTI_ACTIVITY_KIND_MEMSET"
    if st in reader.tables:
        present.append(st)
        sql = reader.select(
            st, [("start", "NULL"), ("end", "NULL"), *_COMMON_COLUMNS, ("bytes", "-1"), ("memKind", "2")]
        )
        for start, end, dev, stream, corr, gpid, nbytes, mk in reader.rows(sql):
            start, end = _time(start), _time(end)
            if start is None or end is None:
                continue
            checkpoint()
            label = f"Memset ({_MEM_LABELS.get(_int(mk, 2), 'Unknown')})"
            add_op(
                gpid,
                start,
                end,
                dev,
                stream,
                OpKind.MEMSET,
                strings.intern(label),
                corr,
                nbytes=_int(nbytes, -1),
            )

    yt = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    if yt in reader.tables:
        present.append(yt)
        sql = reader.select(
            yt,
            [("start", "NULL"), ("end", "NULL"), *_COMMON_COLUMNS, ("syncType", "deprecatedSyncType", "0")],
        )
        sync_kinds = _sync_kind_map(reader)
        for start, end, dev, stream, corr, gpid, sync_value in reader.rows(sql):
            start, end = _time(start), _time(end)
            if start is None or end is None:
                continue
            checkpoint()
            kind = sync_kinds.get(_int(sync_value, 0), SyncKind.UNKNOWN)
            add_op(
                gpid,
                start,
                end,
                dev,
                stream,
                OpKind.SYNC,
                strings.intern(SYNC_KIND_NAMES[kind]),
                corr,
                sync_kind=kind,
            )

    cols = gpu.to_numpy()
    cols["kclass"] = class_of_names(strings, cols["kind"], cols["name"])
    all_ops = GpuOps(**cols)
    op_pid = np.array(gpu_pid, dtype=np.int64)

    runtime, rt_pid = _read_runtime(reader, resolve, present)
    nvtx, nvtx_pid = _read_nvtx(reader, resolve, present)
    devices = _read_devices(reader)
    unix_offset = _session_start(reader)
    session = _analysis_window(reader)
    window = _event_window(all_ops, runtime, nvtx)

    ranks = _split_by_device(all_ops, op_pid, runtime, rt_pid, nvtx, nvtx_pid, devices, unix_offset, window)
    if not ranks:
        warnings.append("The export has no GPU activity (kernels, copies, memsets or syncs).")
    dropped_rt = len(runtime) - sum(len(r.runtime) for r in ranks)
    if dropped_rt > 0 and ranks:
        warnings.append(
            f"{dropped_rt} runtime calls came from processes without GPU activity and were left out."
        )
    metadata = {
        "export_schema_version": _meta(reader, "EXPORT_SCHEMA_VERSION"),
        "nsys_version": _meta(reader, "EXPORT_PRODUCT_VERSION"),
        "tables_read": present,
        "gpu_ops": len(all_ops),
        "runtime_calls": len(runtime),
        "nvtx_ranges": len(nvtx),
        "clock": (
            "TARGET_INFO_SESSION_START_TIME.utcEpochNs"
            if unix_offset is not None
            else "unknown: the export has no TARGET_INFO_SESSION_START_TIME"
        ),
        # The window is where the events are: a trimmed export (300 ms of a 138 s session) keeps the
        # session's ANALYSIS_DETAILS.duration, which says nothing about what the export holds.
        "capture_window": "event extent (GPU ops, CUDA API calls, NVTX ranges)",
        "session_duration_s": None if session is None else round((session[1] - session[0]) / 1e9, 6),
    }
    return Trace(source="nsys", strings=strings, ranks=ranks, metadata=metadata, warnings=warnings)


def _sync_kind_map(reader: GuardedSQLite) -> dict[int, int]:
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


def _int(value: Any, default: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value if -_MAX_INT <= value <= _MAX_INT else default
    if isinstance(value, float) and math.isfinite(value) and abs(value) <= _MAX_INT:
        return int(value)
    return default


def _time(value: Any) -> int | None:
    """A timestamp in ns (SQLite is dynamically typed: text, blobs, NaN or 2^63 may sit in the column)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if -_MAX_INT <= value <= _MAX_INT else None
    if isinstance(value, float) and math.isfinite(value) and abs(value) <= _MAX_INT:
        return int(value)
    return None


def _stream(value: Any) -> int:
    stream = _int(value, -1)
    return -1 if stream == _NO_ID_U32 else stream


def _read_runtime(
    reader: GuardedSQLite, resolve: _StringResolver, present: list[str]
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
            start, end = _time(start), _time(end)
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
            gtid = _int(gtid, 0)
            rt.append_row(start, max(end - start, 0), idx, _int(corr, -1), gtid & 0xFFFFFF, kind)
            pids.append(gtid >> 24)
    return RuntimeCalls(**rt.to_numpy()), np.array(pids, dtype=np.int64)


def _read_nvtx(
    reader: GuardedSQLite, resolve: _StringResolver, present: list[str]
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
            start, end = _time(start), _time(end)
            if start is None or end is None or end < start:
                continue
            checkpoint()
            name = text if isinstance(text, str) else text_id
            gtid = _int(gtid, 0)
            ann.append_row(
                start, end - start, resolve(name, "<unnamed range>"), AnnotationSource.NVTX, gtid & 0xFFFFFF
            )
            pids.append(gtid >> 24)
    return Annotations(**ann.to_numpy()), np.array(pids, dtype=np.int64)


def _read_devices(reader: GuardedSQLite) -> dict[int, DeviceInfo]:
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
            dev_id = _int(dev, 0)
            threads = _int(warps, 0) * _int(warp_size, 0) if 0 < _int(warp_size, 0) <= 1024 else 0
            threads = threads if 0 < threads < 2**31 else 0
            devices[dev_id] = DeviceInfo(
                id=dev_id,
                name=name[:200] if isinstance(name, str) else "",
                num_sms=_int(sms, 0) if 0 < _int(sms, 0) < 2**31 else None,
                total_memory_bytes=_int(mem, 0) if _int(mem, 0) > 0 else None,
                compute_capability=f"{major}.{minor}"
                if isinstance(major, int) and isinstance(minor, int)
                else None,
                max_threads_per_sm=threads or None,
            )
    table = "TARGET_INFO_CUDA_DEVICE"
    if table in reader.tables and reader.col(table, "cudaId") != "NULL":
        sql = f"SELECT cudaId, {reader.col(table, 'numMultiprocessors', default='NULL')} FROM {table}"
        for dev, sms in reader.rows(sql):
            dev_id = _int(dev, -1)
            if dev_id < 0:
                continue
            info = devices.setdefault(dev_id, DeviceInfo(id=dev_id))
            if info.num_sms is None and _int(sms, 0) > 0:
                info.num_sms = _int(sms, 0)
    return devices


def _session_start(reader: GuardedSQLite) -> int | None:
    table = "TARGET_INFO_SESSION_START_TIME"
    if table in reader.tables and reader.col(table, "utcEpochNs") != "NULL":
        row = reader.one(f"SELECT utcEpochNs FROM {table} LIMIT 1")
        if row and isinstance(row[0], int) and not isinstance(row[0], bool) and 0 <= row[0] < _MAX_INT:
            return row[0]
    return None


def _event_window(ops: GpuOps, runtime: RuntimeCalls, nvtx: Annotations) -> tuple[int, int] | None:
    """[first event start, last event end) over GPU ops, runtime calls and NVTX ranges (ns)."""
    lows: list[int] = []
    highs: list[int] = []
    for start, dur in (
        (ops.start_ns, ops.dur_ns),
        (runtime.start_ns, runtime.dur_ns),
        (nvtx.start_ns, nvtx.dur_ns),
    ):
        if start.size:
            lows.append(int(start.min()))
            highs.append(int((start + np.maximum(dur, 0)).max()))
    return (min(lows), max(highs)) if lows else None


def _analysis_window(reader: GuardedSQLite) -> tuple[int, int] | None:
    """The session's analysed range [0, ANALYSIS_DETAILS.duration): reported, not used as the window."""
    table = "ANALYSIS_DETAILS"
    if table in reader.tables and reader.col(table, "duration") != "NULL":
        row = reader.one(f"SELECT duration FROM {table} LIMIT 1")
        if row and isinstance(row[0], int) and not isinstance(row[0], bool) and 0 < row[0] < _MAX_INT:
            # Event timestamps count from the session start, so the analysed range is [0, duration).
            return 0, row[0]
    return None


def _meta(reader: GuardedSQLite, name: str) -> str | None:
    table = "META_DATA_EXPORT"
    if table not in reader.tables:
        return None
    row = reader.one(f"SELECT value FROM {table} WHERE name = ? LIMIT 1", (name,))
    return str(row[0])[:200] if row and row[0] is not None else None


def _split_by_device(
    ops: GpuOps,
    op_pid: npt.NDArray[np.int64],
    runtime: RuntimeCalls,
    rt_pid: npt.NDArray[np.int64],
    nvtx: Annotations,
    nvtx_pid: npt.NDArray[np.int64],
    devices: dict[int, DeviceInfo],
    unix_offset: int | None,
    window: tuple[int, int] | None,
) -> list[RankTrace]:
    """One rank per device. Runtime calls follow their GPU op's device (by process and correlation id);
    uncorrelated calls and NVTX ranges go to the device their process used most."""
    # CUPTI leaves deviceId 0 on synchronisation records; place them by their process and stream.
    work = ops.kind != OpKind.SYNC
    stream_device = {
        (pid, stream): dev
        for pid, stream, dev in zip(
            op_pid[work].tolist(), ops.stream[work].tolist(), ops.device[work].tolist(), strict=True
        )
    }
    device_ids = sorted(set(np.unique(ops.device[work]).tolist()))
    if not device_ids:
        return []
    # Main device per process: the one with most GPU ops from that process.
    main_device: dict[int, int] = {}
    pairs = Counter(zip(op_pid[work].tolist(), ops.device[work].tolist(), strict=True))
    for (pid, dev), _n in sorted(pairs.items(), key=lambda kv: kv[1]):
        main_device[pid] = dev  # ascending count: the last write wins
    if (~work).any():
        device = ops.device.copy()
        for i in np.flatnonzero(~work).tolist():
            pid, stream = int(op_pid[i]), int(ops.stream[i])
            device[i] = stream_device.get((pid, stream), main_device.get(pid, int(device[i])))
        ops = replace(ops, device=device)
    # Runtime call -> device: by (process, correlation id) of a GPU op, else the process's main device.
    key_to_device: dict[tuple[int, int], int] = {}
    for pid, corr, dev in zip(op_pid.tolist(), ops.correlation.tolist(), ops.device.tolist(), strict=True):
        if corr >= 0:
            key_to_device[(pid, corr)] = dev
    rt_device = np.array(
        [
            key_to_device.get((pid, corr), main_device.get(pid, -1))
            for pid, corr in zip(rt_pid.tolist(), runtime.correlation.tolist(), strict=True)
        ],
        dtype=np.int64,
    )
    nvtx_device = np.array([main_device.get(pid, -1) for pid in nvtx_pid.tolist()], dtype=np.int64)
    ranks: list[RankTrace] = []
    world = len(device_ids)
    for dev in device_ids:
        info = devices.get(dev, DeviceInfo(id=dev))
        pids = sorted({p for p, d in main_device.items() if d == dev})
        ranks.append(
            RankTrace(
                rank=dev,
                gpu=ops.take(ops.device == dev),
                runtime=runtime.take(rt_device == dev),
                cpu_ops=empty_cpu_ops(),
                annotations=nvtx.take(nvtx_device == dev),
                devices=[info],
                distributed=DistributedInfo(rank=dev, world_size=world),
                unix_offset_ns=unix_offset,
                window_ns=window,
                label=f"GPU {dev}" + (f" (pid {', '.join(str(p & 0xFFFFFF) for p in pids)})" if pids else ""),
            )
        )
    return ranks
