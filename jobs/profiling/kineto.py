"""Parse PyTorch profiler (Kineto) Chrome-trace JSON, plain or gzipped, into the columnar event model.

Handles the current schema (``cat`` kernel/gpu_memcpy/cuda_runtime/..., ``deviceProperties``,
``distributedInfo``, ``baseTimeNanoseconds``, float microsecond timestamps with nanosecond digits), the
2021 schema (``cat`` Kernel/Memcpy/Runtime/Operator, ``computeProperties``, string tids such as
"stream 7", flows with cat "async"), ROCm traces (HIP runtime calls under cat cuda_runtime), CPU-only
traces and traces without distributedInfo. Flow events (ac2g, async_cpu_to_gpu, async) are not needed:
GPU ops and the runtime calls that launched them join on ``args.correlation`` in every schema.

Uploads are untrusted: decompression is bounded by `max_decompressed_bytes` and the JSON is decoded
against a typed schema (msgspec), so a malformed file fails with one `ArtifactError` that says what and
where, never with a stack trace from deep inside an analysis.

Why msgspec rather than orjson: decoding into typed structs skips every field we do not need (input
shapes, call stacks, memory events' args) while parsing. On the 54 MB V100 sample trace orjson peaks at
~820 MB of Python dicts; the typed decode peaks at ~105 MB and is faster (0.26 s vs 0.46 s).
"""

from __future__ import annotations

import io
import math
import re
import zlib
from array import array
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np

from jobs.profiling.errors import ArtifactError
from jobs.profiling.events import (
    ANNOTATION_COLUMNS,
    CPU_OP_COLUMNS,
    GPU_COLUMNS,
    RUNTIME_COLUMNS,
    Annotations,
    AnnotationSource,
    ColumnBuilder,
    CopyKind,
    CpuOps,
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
)
from jobs.profiling.guard import checkpoint, grow_input, guarded

#: Default ceiling on the decompressed JSON size.
DEFAULT_MAX_DECOMPRESSED_BYTES = 2 * 1024**3

_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20


class _Args(msgspec.Struct):
    # Loosely typed on purpose: producers disagree on types (ROCm writes stream "0x0", some tools
    # write numbers as strings); `_as_int`/`_as_float` normalise.
    stream: Any = None
    device: Any = None
    correlation: Any = None
    nbytes: Any = msgspec.field(default=None, name="bytes")
    blocks_per_sm: Any = msgspec.field(default=None, name="blocks per SM")
    occupancy: Any = msgspec.field(default=None, name="est. achieved occupancy %")
    grid: Any = None
    block: Any = None
    kind: Any = None


class _Event(msgspec.Struct):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: float | None = None
    dur: float | None = None
    args: _Args | None = None


class _Document(msgspec.Struct):
    traceEvents: list[_Event] | None = None  # Kineto's camelCase keys, verbatim
    deviceProperties: Any = None
    computeProperties: Any = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    displayTimeUnit: Any = None
    schemaVersion: Any = None
    traceName: Any = None


_DECODER = msgspec.json.Decoder(type=_Document | list[_Event])

# cat -> what we do with the complete ("X") event.
(
    _GPU_KERNEL,
    _GPU_MEMCPY,
    _GPU_MEMSET,
    _GPU_SYNC,
    _RUNTIME,
    _DRIVER,
    _CPU_OP,
    _ANNOT_CPU,
    _ANNOT_GPU,
    _TRACE,
) = range(10)
_CAT_ROLE: dict[str, int] = {
    "kernel": _GPU_KERNEL,
    "Kernel": _GPU_KERNEL,
    "gpu_memcpy": _GPU_MEMCPY,
    "Memcpy": _GPU_MEMCPY,
    "gpu_memset": _GPU_MEMSET,
    "Memset": _GPU_MEMSET,
    "cuda_sync": _GPU_SYNC,
    "cuda_runtime": _RUNTIME,
    "Runtime": _RUNTIME,
    "cuda_driver": _DRIVER,
    "cpu_op": _CPU_OP,
    "Operator": _CPU_OP,
    "user_annotation": _ANNOT_CPU,
    "gpu_user_annotation": _ANNOT_GPU,
    "Trace": _TRACE,
}
_GPU_KINDS = {
    _GPU_KERNEL: OpKind.KERNEL,
    _GPU_MEMCPY: OpKind.MEMCPY,
    _GPU_MEMSET: OpKind.MEMSET,
    _GPU_SYNC: OpKind.SYNC,
}

_MEMCPY_NAME_RE = re.compile(r"^Memcpy\s+(\w+)(?:\s*\(\s*([\w ]+?)\s*->\s*([\w ]+?)\s*\))?")
_COPY_KIND_BY_LABEL: dict[str, int] = {
    "htod": CopyKind.HTOD,
    "dtoh": CopyKind.DTOH,
    "htoa": CopyKind.HTOA,
    "atoh": CopyKind.ATOH,
    "atoa": CopyKind.ATOA,
    "atod": CopyKind.ATOD,
    "dtoa": CopyKind.DTOA,
    "dtod": CopyKind.DTOD,
    "htoh": CopyKind.HTOH,
    "ptop": CopyKind.PTOP,
}
_MEM_KIND_BY_LABEL: dict[str, int] = {
    "pageable": MemKind.PAGEABLE,
    "pinned": MemKind.PINNED,
    "device": MemKind.DEVICE,
    "array": MemKind.ARRAY,
    "managed": MemKind.MANAGED,
    "device static": MemKind.DEVICE_STATIC,
    "managed static": MemKind.MANAGED_STATIC,
    "host": MemKind.HOST,
}
_SYNC_KIND_BY_NAME: dict[str, int] = {
    "event sync": SyncKind.EVENT_SYNC,
    "stream wait event": SyncKind.STREAM_WAIT_EVENT,
    "stream sync": SyncKind.STREAM_SYNC,
    "context sync": SyncKind.CONTEXT_SYNC,
}
_STREAM_TID_RE = re.compile(r"stream\s*(\d+)", re.IGNORECASE)
_PROFILER_STEP_RE = re.compile(r"^ProfilerStep#\d+")
# Kineto's "no stream" marker for device-wide syncs is UINT32_MAX.
_NO_STREAM_U32 = 0xFFFFFFFF


def read_trace_bytes(
    source: bytes | bytearray | str | Path | BinaryIO,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> bytes | bytearray:
    """The JSON bytes of an upload: gunzipped when gzip, refusing more than `max_decompressed_bytes`.

    Gzip is detected from the magic bytes, not the file name, and may have several members.
    """
    raw = _read_source(source, max_decompressed_bytes)
    if raw[:2] != _GZIP_MAGIC:
        if len(raw) > max_decompressed_bytes:
            raise ArtifactError(
                f"The trace is {len(raw):,} bytes; the limit is {max_decompressed_bytes:,} bytes."
            )
        return raw
    return _gunzip_bounded(raw, max_decompressed_bytes)


def _read_source(source: bytes | bytearray | str | Path | BinaryIO, limit: int) -> bytes | bytearray:
    if isinstance(source, bytes | bytearray):
        return source
    if isinstance(source, memoryview):
        return bytes(source)
    try:
        if isinstance(source, str | Path):
            with Path(source).open("rb") as handle:
                return _read_stream(handle, limit)
        return _read_stream(source, limit)
    except OSError as exc:
        raise ArtifactError(f"The trace file cannot be read: {exc.strerror or exc}.") from exc


def _read_stream(handle: BinaryIO | io.BufferedReader, limit: int) -> bytes:
    # Compressed input is smaller than the decompressed limit, and plain JSON must be under it, so
    # reading one byte past the limit is enough to know either way. Chunked: read(limit) would
    # allocate the whole limit up front.
    buf = bytearray()
    while len(buf) <= limit:
        chunk = handle.read(min(_CHUNK * 8, limit + 1 - len(buf)))
        if not chunk:
            break
        if not isinstance(chunk, bytes | bytearray):
            raise ArtifactError("The trace source did not return bytes.")
        buf += chunk
    return bytes(buf)


def _gunzip_bounded(raw: bytes | bytearray, limit: int) -> bytearray:
    out = bytearray()
    data: bytes = bytes(raw)
    try:
        while True:
            decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
            pending = data
            while not decomp.eof:
                # max_length bounds each step, so a bomb is caught one chunk past the limit.
                chunk = decomp.decompress(pending, _CHUNK)
                pending = decomp.unconsumed_tail
                if not chunk and not pending and not decomp.eof:
                    raise ArtifactError("The gzip trace is truncated (the compressed stream ends early).")
                out += chunk
                if len(out) > limit:
                    raise ArtifactError(
                        f"The gzip trace decompresses to more than the limit of {limit:,} bytes "
                        "(a gzip bomb, or a trace too large to analyse)."
                    )
            data = decomp.unused_data
            # Concatenated members are valid gzip; trailing zero padding is tolerated as gzip(1) does.
            if not data.strip(b"\0"):
                break
            if data[:2] != _GZIP_MAGIC:
                raise ArtifactError("The gzip trace has trailing garbage after the compressed data.")
    except zlib.error as exc:
        raise ArtifactError(f"The trace is not a valid gzip file: {exc}.") from exc
    return out


@guarded("Kineto trace", storable=False)
def parse_kineto(
    source: bytes | bytearray | str | Path | BinaryIO,
    *,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    rank: int | None = None,
) -> Trace:
    """Parse one Kineto trace (one rank) from a path, bytes or binary file object.

    `rank` overrides the rank when distributedInfo is missing or wrong (e.g. from the file name).
    Raises `ArtifactError` for anything that is not a readable Kineto trace.
    """
    data = read_trace_bytes(source, max_decompressed_bytes)
    size = len(data)
    grow_input(size)
    events, meta = _decode(data)
    # The JSON bytes are freed as soon as decoding is done, so the columns are built without the raw
    # text still in memory.
    del data
    trace = _build_trace(events, meta, rank)
    trace.input_bytes = size
    return trace


@guarded("Kineto trace", storable=False)
def parse_kineto_json(data: bytes | bytearray | str, *, rank: int | None = None) -> Trace:
    """Parse already-decompressed Kineto JSON."""
    events, meta = _decode(data)
    trace = _build_trace(events, meta, rank)
    trace.input_bytes = len(data)
    return trace


def _decode(data: bytes | bytearray | str) -> tuple[list[_Event], _Document]:
    if not data or not (data.strip() if isinstance(data, str) else bytes(data[:4096]).strip()):
        raise ArtifactError("The trace is empty.")
    try:
        doc = _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise ArtifactError(f"Not a PyTorch profiler (Kineto) trace: {exc}.") from exc
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"The trace is not valid JSON: {exc}.") from exc
    if isinstance(doc, list):
        # Chrome's "JSON array format": events only, no metadata.
        return doc, _Document(traceEvents=doc)
    if doc.traceEvents is None:
        raise ArtifactError(
            "The JSON has no traceEvents array, so it is not a PyTorch profiler (Kineto) trace."
        )
    return doc.traceEvents, doc


#: Integers from the trace (ids, sizes, counts) beyond this are not believable: "unknown".
_MAX_INT = 2**62
#: Timestamps (microseconds) must stay within ~±140 years of the epoch, so ns fit int64 with room to add
#: durations; a duration of more than a year is not a real event.
_MAX_TS_US = 4.5e15
_MAX_DUR_US = 3.2e13


def _as_int(value: Any, default: int = -1) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value if -_MAX_INT <= value <= _MAX_INT else default
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and abs(value) <= _MAX_INT else default
    if isinstance(value, str):
        text = value.strip()
        if len(text) > 64:
            return default
        try:
            out = int(text, 0)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                return default
            if not math.isfinite(number):
                return default
            out = int(number)
        return out if -_MAX_INT <= out <= _MAX_INT else default
    return default


def _as_float(value: Any) -> float:
    if isinstance(value, bool) or value is None:
        return math.nan
    try:
        if isinstance(value, int | float) or (isinstance(value, str) and len(value) <= 64):
            out = float(value)
        else:
            return math.nan
    except (ValueError, OverflowError):
        return math.nan
    return out if math.isfinite(out) else math.nan


def _product(value: Any) -> int:
    if not isinstance(value, list) or not value or len(value) > 8:
        return -1
    out = 1
    for v in value:
        n = _as_int(v, -1)
        if n < 0:
            return -1
        out *= n
        if out > _MAX_INT:
            return -1
    return out


def _to_ns(us: np.ndarray) -> np.ndarray:
    """Microsecond floats to integer nanoseconds without float64's ~256 ns error at epoch scale."""
    whole = np.floor(us)
    frac_ns = np.rint((us - whole) * 1000.0)
    return whole.astype(np.int64) * 1000 + frac_ns.astype(np.int64)


def _memcpy_kinds(name: str, kind_arg: Any) -> tuple[int, int, int]:
    copy_kind: int = CopyKind.UNKNOWN
    src: int = MemKind.UNKNOWN
    dst: int = MemKind.UNKNOWN
    m = _MEMCPY_NAME_RE.match(name)
    if m:
        copy_kind = _COPY_KIND_BY_LABEL.get(m.group(1).lower(), CopyKind.UNKNOWN)
        if m.group(2):
            src = _MEM_KIND_BY_LABEL.get(m.group(2).lower(), MemKind.UNKNOWN)
            dst = _MEM_KIND_BY_LABEL.get(m.group(3).lower(), MemKind.UNKNOWN)
    if copy_kind == CopyKind.UNKNOWN and isinstance(kind_arg, str):
        copy_kind = _COPY_KIND_BY_LABEL.get(kind_arg.lower(), CopyKind.UNKNOWN)
    return int(copy_kind), int(src), int(dst)


def _stream_of(args: _Args | None, tid: Any) -> int:
    stream = _as_int(args.stream, -1) if args is not None and args.stream is not None else -1
    if stream == -1:
        if isinstance(tid, int):
            stream = tid
        elif isinstance(tid, str):
            m = _STREAM_TID_RE.search(tid[:256])
            if m and len(m.group(1)) <= 18:
                stream = int(m.group(1))
    if stream == _NO_STREAM_U32:
        stream = -1
    return stream


def _build_trace(events: list[_Event], meta: _Document, rank_override: int | None) -> Trace:
    strings = StringTable()
    gpu = ColumnBuilder(GPU_COLUMNS)
    runtime = ColumnBuilder(RUNTIME_COLUMNS)
    cpu_ops = ColumnBuilder(CPU_OP_COLUMNS)
    annots = ColumnBuilder(ANNOTATION_COLUMNS)
    # Times stay float microseconds until the end, then convert in one vectorised pass.
    times: dict[str, tuple[array[float], array[float]]] = {
        k: (array("d"), array("d")) for k in ("gpu", "rt", "cpu", "ann")
    }
    memcpy_cache: dict[str, tuple[int, int, int]] = {}
    cat_counts: dict[str, int] = {}
    window: tuple[float, float] | None = None
    skipped_without_time = 0
    intern = strings.intern
    nan = math.nan

    for ev in events:
        if ev.ph != "X":
            continue
        cat = ev.cat if isinstance(ev.cat, str) else ""
        cat_counts[cat] = cat_counts.get(cat, 0) + 1
        role = _CAT_ROLE.get(cat)
        if role is None:
            continue
        ts, dur = ev.ts, ev.dur
        if (
            ts is None
            or dur is None
            or not (-_MAX_TS_US < ts < _MAX_TS_US)  # also false for NaN and infinities
            or not (dur < _MAX_DUR_US)
            or dur != dur
        ):
            skipped_without_time += 1
            continue
        checkpoint()
        if dur < 0:
            dur = 0.0
        name = ev.name if isinstance(ev.name, str) else ("" if ev.name is None else str(ev.name))
        args = ev.args
        if role in _GPU_KINDS:
            kind = _GPU_KINDS[role]
            copy_kind = src = dst = 0
            sync_kind = 0
            nbytes = -1
            bps = occ = nan
            grid = block = -1
            if args is not None:
                nbytes = _as_int(args.nbytes, -1)
            if kind == OpKind.MEMCPY:
                cached = memcpy_cache.get(name)
                if cached is None:
                    cached = _memcpy_kinds(name[:256], args.kind if args is not None else None)
                    memcpy_cache[name] = cached
                copy_kind, src, dst = cached
            elif kind == OpKind.SYNC:
                sync_kind = _SYNC_KIND_BY_NAME.get(name.lower(), SyncKind.UNKNOWN)
            elif args is not None:
                bps = _as_float(args.blocks_per_sm)
                occ = _as_float(args.occupancy)
                grid = _product(args.grid)
                block = _product(args.block)
            device = _as_int(args.device, -1) if args is not None and args.device is not None else -1
            if device == -1:
                device = _as_int(ev.pid, -1)
            gpu.append_row(
                0,
                0,
                device,
                _stream_of(args, ev.tid),
                kind,
                0,
                intern(name),
                _as_int(args.correlation, -1) if args is not None else -1,
                nbytes,
                copy_kind,
                src,
                dst,
                sync_kind,
                bps,
                occ,
                grid,
                block,
            )
            times["gpu"][0].append(ts)
            times["gpu"][1].append(dur)
        elif role in (_RUNTIME, _DRIVER):
            runtime.append_row(
                0,
                0,
                intern(name),
                _as_int(args.correlation, -1) if args is not None else -1,
                _as_int(ev.tid, -1),
                RuntimeKind.DRIVER if role == _DRIVER else RuntimeKind.RUNTIME,
            )
            times["rt"][0].append(ts)
            times["rt"][1].append(dur)
        elif role == _CPU_OP and not _PROFILER_STEP_RE.match(name):
            cpu_ops.append_row(0, 0, intern(name), _as_int(ev.tid, -1))
            times["cpu"][0].append(ts)
            times["cpu"][1].append(dur)
        elif role in (_ANNOT_CPU, _ANNOT_GPU, _CPU_OP):
            # The 2021 schema records ProfilerStep#N as an "Operator"; it is an annotation either way.
            source = AnnotationSource.GPU if role == _ANNOT_GPU else AnnotationSource.CPU
            annots.append_row(0, 0, intern(name), source, _as_int(ev.tid, -1))
            times["ann"][0].append(ts)
            times["ann"][1].append(dur)
        elif role == _TRACE and name.startswith("PyTorch Profiler"):
            window = (ts, ts + dur)

    gpu_cols = _with_times(gpu.to_numpy(), times["gpu"])
    gpu_cols["kclass"] = class_of_names(strings, gpu_cols["kind"], gpu_cols["name"])
    rank_trace = RankTrace(
        rank=0,
        gpu=GpuOps(**gpu_cols),
        runtime=RuntimeCalls(**_with_times(runtime.to_numpy(), times["rt"])),
        cpu_ops=CpuOps(**_with_times(cpu_ops.to_numpy(), times["cpu"])),
        annotations=Annotations(**_with_times(annots.to_numpy(), times["ann"])),
    )
    warnings: list[str] = []
    if skipped_without_time:
        warnings.append(f"{skipped_without_time} complete events had no usable ts/dur and were skipped.")

    rank_trace.distributed = _distributed_info(meta.distributedInfo)
    if rank_override is not None:
        rank_trace.rank = rank_override
    elif rank_trace.distributed is not None and rank_trace.distributed.rank is not None:
        rank_trace.rank = rank_trace.distributed.rank
    else:
        warnings.append("The trace has no distributedInfo rank; it is treated as rank 0.")
    rank_trace.devices = _device_info(meta.deviceProperties) or _device_info(meta.computeProperties)
    rank_trace.unix_offset_ns = _unix_offset(meta.baseTimeNanoseconds, rank_trace)
    clock = (
        "unknown: no baseTimeNanoseconds and the timestamps are relative"
        if rank_trace.unix_offset_ns is None
        else "traceEvents ts are unix-epoch microseconds"
        if rank_trace.unix_offset_ns == 0
        else "baseTimeNanoseconds"
    )
    if window is not None:
        w = _to_ns(np.array(window, dtype=np.float64))
        rank_trace.window_ns = (int(w[0]), int(w[1]))
    rank_trace.label = f"rank {rank_trace.rank}"
    rank_trace.sub_us_timestamps = any(
        len(ts) and bool(np.any(np.frombuffer(ts, dtype=np.float64) % 1.0)) for ts, _ in times.values()
    )

    metadata: dict[str, Any] = {
        "schema_version": meta.schemaVersion if isinstance(meta.schemaVersion, int | str) else None,
        "display_time_unit": meta.displayTimeUnit if isinstance(meta.displayTimeUnit, str) else None,
        # Categories come from the upload: keep the 50 most frequent so a hostile file cannot bloat results.
        "event_counts_by_category": dict(sorted(cat_counts.items(), key=lambda kv: -kv[1])[:50]),
        "format": "kineto-2021" if "Kernel" in cat_counts or "Operator" in cat_counts else "kineto",
        "clock": clock,
        "capture_window": "profiler span (cat Trace)" if window is not None else "event extent",
    }
    return Trace(source="kineto", strings=strings, ranks=[rank_trace], metadata=metadata, warnings=warnings)


def _with_times(
    cols: dict[str, np.ndarray], ts_dur: tuple[array[float], array[float]]
) -> dict[str, np.ndarray]:
    ts = np.frombuffer(ts_dur[0], dtype=np.float64) if len(ts_dur[0]) else np.zeros(0)
    dur = np.frombuffer(ts_dur[1], dtype=np.float64) if len(ts_dur[1]) else np.zeros(0)
    cols["start_ns"] = _to_ns(ts)
    # Duration rounds on its own (it is small), so sub-microsecond digits survive exactly.
    cols["dur_ns"] = np.rint(dur * 1000.0).astype(np.int64)
    return cols


def _distributed_info(raw: Any) -> DistributedInfo | None:
    if not isinstance(raw, dict):
        return None
    rank = raw.get("rank")
    world = raw.get("world_size")
    backend = raw.get("backend")
    nccl = raw.get("nccl_version")
    return DistributedInfo(
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 2**31 else None,
        world_size=(
            world if isinstance(world, int) and not isinstance(world, bool) and 0 < world < 2**31 else None
        ),
        backend=backend[:200] if isinstance(backend, str) else None,
        nccl_version=(
            str(nccl)[:100]
            if isinstance(nccl, str | int) or (isinstance(nccl, float) and math.isfinite(nccl))
            else None
        ),
    )


def _device_info(raw: Any) -> list[DeviceInfo]:
    if not isinstance(raw, list):
        return []
    out: list[DeviceInfo] = []
    for item in raw:
        if not isinstance(item, dict):
            continue
        dev_id = _as_int(item.get("id"), -1)
        if dev_id < 0:
            continue
        major = item.get("computeMajor", item.get("major"))
        minor = item.get("computeMinor", item.get("minor"))
        sms = _as_int(item.get("numSms", item.get("multiProcessorCount")), -1)
        mem = _as_int(item.get("totalGlobalMem"), -1)
        threads = _as_int(
            item.get("maxThreadsPerMultiprocessor", item.get("maxThreadsPerMultiProcessor")), -1
        )
        name = item.get("name")
        out.append(
            DeviceInfo(
                id=dev_id,
                name=name[:200] if isinstance(name, str) else "",
                num_sms=sms if sms > 0 else None,
                total_memory_bytes=mem if mem > 0 else None,
                compute_capability=(
                    f"{major}.{minor}"
                    if isinstance(major, int)
                    and isinstance(minor, int)
                    and 0 <= major < 100
                    and 0 <= minor < 100
                    else None
                ),
                max_threads_per_sm=threads if threads > 0 else None,
            )
        )
    return out


def _unix_offset(base: Any, rank_trace: RankTrace) -> int | None:
    if isinstance(base, int) and not isinstance(base, bool) and 0 < base < 2**62:
        return base
    # Without baseTimeNanoseconds, Kineto writes Unix-epoch microseconds; anything after 2001 says so.
    starts = [arr.start_ns for arr in (rank_trace.gpu, rank_trace.runtime, rank_trace.cpu_ops) if len(arr)]
    if starts and min(int(s.min()) for s in starts) > 10**18:
        return 0
    return None
