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
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from jobs.profiling.events import (
    COPY_KIND_LABELS,
    GPU_COLUMNS,
    SYNC_KIND_NAMES,
    Annotations,
    ColumnBuilder,
    DeviceInfo,
    DistributedInfo,
    GpuOps,
    MemKind,
    OpKind,
    RankTrace,
    RuntimeCalls,
    StringTable,
    SyncKind,
    Trace,
    class_of_names,
    empty_cpu_ops,
)
from jobs.profiling.guard import checkpoint, guarded
from jobs.profiling.nsys_tables import (
    StringResolver,
    analysis_window,
    as_int,
    as_stream,
    as_time,
    load_strings,
    meta,
    read_devices,
    read_nvtx,
    read_runtime,
    session_start,
    sync_kind_map,
)
from jobs.profiling.safe_sqlite import GuardedSQLite, check_sqlite_header

DEFAULT_TIMEOUT_S = 120.0
# (column candidates..., default) for the device/stream/correlation/process columns of activity tables.
_COMMON_COLUMNS: list[tuple[str, ...]] = [
    ("deviceId", "0"),
    ("streamId", "-1"),
    ("correlationId", "-1"),
    ("globalPid", "0"),
]
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


def _parse(reader: GuardedSQLite) -> Trace:
    strings = StringTable()
    resolve = StringResolver(strings, load_strings(reader))
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
            as_int(dev, 0),
            as_stream(stream),
            kind,
            0,  # kclass: filled in one vectorised pass at the end
            name,
            as_int(corr, -1),
            as_int(nbytes, -1),
            copy_kind,
            src_kind,
            dst_kind,
            sync_kind,
            np.nan,
            np.nan,
            as_int(grid_blocks, -1),
            as_int(block_threads, -1),
        )
        # globalPid is (vm id, pid) << 24: the shifted value identifies the process.
        gpu_pid.append(as_int(gpid, 0) >> 24)

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
            start, end = as_time(start), as_time(end)
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
                grid_blocks=as_int(grid_n, -1),
                block_threads=as_int(block_n, -1),
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
            start, end = as_time(start), as_time(end)
            if start is None or end is None:
                continue
            checkpoint()
            ck, sk, dk = as_int(ck, 0), as_int(sk, MemKind.UNKNOWN), as_int(dk, MemKind.UNKNOWN)
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
                nbytes=as_int(nbytes, -1),
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
            start, end = as_time(start), as_time(end)
            if start is None or end is None:
                continue
            checkpoint()
            label = f"Memset ({_MEM_LABELS.get(as_int(mk, 2), 'Unknown')})"
            add_op(
                gpid,
                start,
                end,
                dev,
                stream,
                OpKind.MEMSET,
                strings.intern(label),
                corr,
                nbytes=as_int(nbytes, -1),
            )

    yt = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    if yt in reader.tables:
        present.append(yt)
        sql = reader.select(
            yt,
            [("start", "NULL"), ("end", "NULL"), *_COMMON_COLUMNS, ("syncType", "deprecatedSyncType", "0")],
        )
        sync_kinds = sync_kind_map(reader)
        for start, end, dev, stream, corr, gpid, sync_value in reader.rows(sql):
            start, end = as_time(start), as_time(end)
            if start is None or end is None:
                continue
            checkpoint()
            kind = sync_kinds.get(as_int(sync_value, 0), SyncKind.UNKNOWN)
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

    runtime, rt_pid = read_runtime(reader, resolve, present)
    nvtx, nvtx_pid = read_nvtx(reader, resolve, present)
    devices = read_devices(reader)
    unix_offset = session_start(reader)
    session = analysis_window(reader)
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
        "export_schema_version": meta(reader, "EXPORT_SCHEMA_VERSION"),
        "nsys_version": meta(reader, "EXPORT_PRODUCT_VERSION"),
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
