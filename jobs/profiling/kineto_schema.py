"""The typed schema a Kineto trace is decoded against (msgspec Structs and decoders) and the tables that
map its categories, copy kinds and sync names to the columnar model's codes; the trace's metadata
(distributedInfo, deviceProperties, baseTimeNanoseconds) as the model's types.

Private to the Kineto parser (`jobs.profiling.kineto` decodes with it, `jobs.profiling.kineto_columns`
builds columns from what it decodes): the names keep their leading underscore.
"""

from __future__ import annotations

import math
import re
from typing import Any, Union

import msgspec

from jobs.profiling.events import (
    CopyKind,
    DeviceInfo,
    DistributedInfo,
    MemKind,
    OpKind,
    RankTrace,
    SyncKind,
)


class _Args(msgspec.Struct, gc=False):
    # Loosely typed on purpose: producers disagree on types (ROCm writes stream "0x0", some tools
    # write numbers as strings); `_ints`/`_floats` normalise. gc=False: a decoded trace holds hundreds of
    # thousands of these and nothing in them can form a reference cycle, so the cyclic GC need not track
    # them (tracking made decoding 2-3.5x slower: every allocation burst triggered collections).
    stream: Any = None
    device: Any = None
    correlation: Any = None
    nbytes: Any = msgspec.field(default=None, name="bytes")
    blocks_per_sm: Any = msgspec.field(default=None, name="blocks per SM")
    occupancy: Any = msgspec.field(default=None, name="est. achieved occupancy %")
    grid: Any = None
    block: Any = None
    kind: Any = None


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: float | None = None
    dur: float | None = None
    args: _Args | None = None


class _Complete(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete ("X") event in the fast decoder: the only phase the analyses read."""

    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: float | None = None
    dur: float | None = None
    args: _Args | None = None


# Every other phase of the Chrome trace event format decodes to an empty struct: their fields (flow ids,
# instant scopes, metadata args) are skipped by the decoder without building Python objects. A phase not
# listed here (or a missing/non-string ph) fails the fast decoder, which then falls back to `_Event`.
_OTHER_PHASES = tuple("BEiICbnestfPONDMVvRc()")  # one character each
_Skipped = tuple(
    msgspec.defstruct(f"_Phase{i}", [], tag_field="ph", tag=ph, gc=False)
    for i, ph in enumerate(_OTHER_PHASES)
)
_FastEvent: Any = Union[(_Complete, *_Skipped)]  # built at runtime from the phase list


class _Document(msgspec.Struct, gc=False):
    traceEvents: list[_Event] | None = None  # Kineto's camelCase keys, verbatim
    deviceProperties: Any = None
    computeProperties: Any = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    displayTimeUnit: Any = None
    schemaVersion: Any = None
    traceName: Any = None


class _FastDocument(msgspec.Struct, gc=False):
    traceEvents: list[_FastEvent] | None = None
    deviceProperties: Any = None
    computeProperties: Any = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    displayTimeUnit: Any = None
    schemaVersion: Any = None
    traceName: Any = None


_DECODER = msgspec.json.Decoder(type=_Document | list[_Event])
_FAST_DOC_DECODER = msgspec.json.Decoder(type=_FastDocument)
_FAST_LIST_DECODER = msgspec.json.Decoder(type=list[_FastEvent])
_LENIENT_DOC_DECODER = msgspec.json.Decoder(type=_Document)
_LENIENT_LIST_DECODER = msgspec.json.Decoder(type=list[_Event])

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


#: Integers from the trace (ids, sizes, counts) beyond this are not believable: "unknown".
_MAX_INT = 2**62


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
