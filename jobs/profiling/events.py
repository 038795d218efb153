"""The normalised, columnar event model both trace parsers produce and every trace analysis reads.

Kineto (PyTorch profiler) JSON and Nsight Systems SQLite exports describe the same things -- GPU kernels,
copies, memsets and synchronisations on device streams, the CPU runtime calls that launched them, and
annotations such as ``ProfilerStep#N`` or NVTX ranges -- with different names and units. Parsers map both
to a `Trace`: one `RankTrace` per training process (or per GPU for nsys), each holding numpy columns in
integer nanoseconds, and one `StringTable` that event names index into. Columns keep memory proportional to
the event count (a few dozen bytes per event) instead of one Python dict per event.

Pure Python and numpy: no Django import, so analyses and tests run anywhere.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields
from enum import IntEnum
from itertools import repeat
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
I8 = npt.NDArray[np.int8]
F64 = npt.NDArray[np.float64]


class OpKind(IntEnum):
    """What a GPU-timeline event is."""

    KERNEL = 0
    MEMCPY = 1
    MEMSET = 2
    SYNC = 3


class KernelClass(IntEnum):
    """HTA's kernel types (`hta.utils.utils.KernelType`): the basis of the temporal breakdown."""

    COMPUTATION = 0
    COMMUNICATION = 1
    MEMORY = 2
    OTHER = 3


class CopyKind(IntEnum):
    """Memcpy direction, numbered as CUPTI's CUpti_ActivityMemcpyKind (and nsys `copyKind`)."""

    UNKNOWN = 0
    HTOD = 1
    DTOH = 2
    HTOA = 3
    ATOH = 4
    ATOA = 5
    ATOD = 6
    DTOA = 7
    DTOD = 8
    HTOH = 9
    PTOP = 10
    UVM_HTOD = 11
    UVM_DTOH = 12
    UVM_DTOD = 13


#: Display labels in Kineto's spelling ("Memcpy HtoD ...").
COPY_KIND_LABELS: dict[int, str] = {
    CopyKind.UNKNOWN: "Unknown",
    CopyKind.HTOD: "HtoD",
    CopyKind.DTOH: "DtoH",
    CopyKind.HTOA: "HtoA",
    CopyKind.ATOH: "AtoH",
    CopyKind.ATOA: "AtoA",
    CopyKind.ATOD: "AtoD",
    CopyKind.DTOA: "DtoA",
    CopyKind.DTOD: "DtoD",
    CopyKind.HTOH: "HtoH",
    CopyKind.PTOP: "PtoP",
    CopyKind.UVM_HTOD: "UVM HtoD",
    CopyKind.UVM_DTOH: "UVM DtoH",
    CopyKind.UVM_DTOD: "UVM DtoD",
}


class MemKind(IntEnum):
    """Memory kind of a copy's source or destination, numbered as CUPTI's CUpti_ActivityMemoryKind.

    `HOST` is ours: ROCm traces say "Host" without telling pinned from pageable.
    """

    PAGEABLE = 0
    PINNED = 1
    DEVICE = 2
    ARRAY = 3
    MANAGED = 4
    DEVICE_STATIC = 5
    MANAGED_STATIC = 6
    UNKNOWN = 7
    HOST = 8


MEM_KIND_LABELS: dict[int, str] = {
    MemKind.PAGEABLE: "Pageable",
    MemKind.PINNED: "Pinned",
    MemKind.DEVICE: "Device",
    MemKind.ARRAY: "Array",
    MemKind.MANAGED: "Managed",
    MemKind.DEVICE_STATIC: "Device Static",
    MemKind.MANAGED_STATIC: "Managed Static",
    MemKind.UNKNOWN: "Unknown",
    MemKind.HOST: "Host",
}


class SyncKind(IntEnum):
    """Synchronisation type, numbered as CUPTI's CUpti_ActivitySynchronizationType (nsys `syncType`)."""

    UNKNOWN = 0
    EVENT_SYNC = 1
    STREAM_WAIT_EVENT = 2
    STREAM_SYNC = 3
    CONTEXT_SYNC = 4


#: Kineto's event names for each synchronisation type (`cuda_sync` category).
SYNC_KIND_NAMES: dict[int, str] = {
    SyncKind.UNKNOWN: "Unknown Sync",
    SyncKind.EVENT_SYNC: "Event Sync",
    SyncKind.STREAM_WAIT_EVENT: "Stream Wait Event",
    SyncKind.STREAM_SYNC: "Stream Sync",
    SyncKind.CONTEXT_SYNC: "Context Sync",
}


class AnnotationSource(IntEnum):
    """Where an annotation range was recorded."""

    CPU = 0  # Kineto user_annotation (record_function, ProfilerStep#N) on a CPU thread
    GPU = 1  # Kineto gpu_user_annotation: the same range projected onto a GPU stream
    NVTX = 2  # NVTX push/pop or start/end range (nsys)


class RuntimeKind(IntEnum):
    """Which CPU-side API a runtime call belongs to."""

    RUNTIME = 0  # cudaLaunchKernel, hipMemcpyAsync, ...
    DRIVER = 1  # cuLaunchKernel (Triton), ...


# HTA's kernel-name rules, copied from hta/utils/utils.py (HolisticTraceAnalysis 0.5.0) so our temporal
# breakdown classifies exactly as HTA does. Note the grouping in the compute rule: a name that merely
# *contains* "Memcpy" or "Sync" anywhere is not compute either.
_HTA_COMM_RE = re.compile(r"^nccl.*Kernel")
_HTA_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_HTA_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def hta_kernel_class(name: str) -> KernelClass:
    """Classify a GPU event name the way HTA's `get_kernel_type` does."""
    if _HTA_COMM_RE.match(name):
        return KernelClass.COMMUNICATION
    if _HTA_MEMORY_RE.match(name):
        return KernelClass.MEMORY
    if not _HTA_NOT_COMPUTE_RE.match(name):
        return KernelClass.COMPUTATION
    return KernelClass.OTHER


def classify_gpu_op(kind: int, name: str) -> KernelClass:
    """Kernel class of one GPU op: HTA's name rules, except that the op kind wins where it is known.

    Memcpy/memset ops are MEMORY whatever their name, and synchronisation records are OTHER: HTA's name
    rule would call Kineto's "Stream Wait Event" a compute kernel, which it is not.
    """
    if kind == OpKind.SYNC:
        return KernelClass.OTHER
    if kind in (OpKind.MEMCPY, OpKind.MEMSET):
        return KernelClass.MEMORY
    return hta_kernel_class(name)


def intern_codes(
    values: list[Any], index: dict[str, int], table: list[str], text: Callable[[Any], str]
) -> I32:
    """The code of each value in `index`, new values added to `index` and `table` in first-seen order, a
    value that is not a str as `text(value)`.

    One dict look-up per value through `map`; only the values not yet known (the first chunk's names, a
    few after) take the Python-level loop, so no separate pass collects the distinct values first.
    """
    n = len(values)
    try:
        codes = np.fromiter(map(index.get, values, repeat(-1)), dtype=np.int32, count=n)
    except TypeError:  # an unhashable value (a list or object where a string belongs)
        values = list(map(text, values))
        codes = np.fromiter(map(index.get, values, repeat(-1)), dtype=np.int32, count=n)
    for i in np.flatnonzero(codes < 0).tolist():
        value = values[i]
        if type(value) is not str:
            value = text(value)
        code = index.get(value)
        if code is None:
            code = index[value] = len(table)
            table.append(value)
        codes[i] = code
    return codes


class StringTable:
    """Interned strings: events store an int32 index instead of a Python string each."""

    __slots__ = ("_index", "values")

    def __init__(self) -> None:
        self.values: list[str] = []
        self._index: dict[str, int] = {}

    def intern(self, value: str) -> int:
        """Index of `value`, adding it on first sight."""
        idx = self._index.get(value)
        if idx is None:
            idx = len(self.values)
            self.values.append(value)
            self._index[value] = idx
        return idx

    def intern_many(self, values: list[str]) -> I32:
        """Indices of `values` (interned in order, as repeated `intern` calls would), as an int32 array.

        One dict look-up per value through `map` instead of a Python-level call per value: parsers
        intern hundreds of thousands of event names.
        """
        index = self._index
        for value in dict.fromkeys(values):  # first-seen order, so the table grows exactly as intern's
            if value not in index:
                index[value] = len(self.values)
                self.values.append(value)
        return np.fromiter(map(index.__getitem__, values), dtype=np.int32, count=len(values))

    def intern_each(self, values: list[Any], text: Callable[[Any], str]) -> I32:
        """`intern_many` for values read from a file: one that is not a str is interned as `text(value)`."""
        return intern_codes(values, self._index, self.values, text)

    def get(self, value: str) -> int | None:
        """Index of `value` or None when it was never interned."""
        return self._index.get(value)

    def __getitem__(self, idx: int) -> str:
        return self.values[idx]

    def __len__(self) -> int:
        return len(self.values)


class _Columns:
    """Base of the columnar tables: equal-length numpy arrays, one per dataclass field."""

    # Every subclass is a @dataclass; declared here so `fields(self)` type-checks on the base.
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def __len__(self) -> int:
        first = fields(self)[0].name
        return int(getattr(self, first).shape[0])

    def take(self, index: npt.NDArray[Any]) -> Any:
        """A new table of the same type holding only the rows selected by `index` (mask or positions)."""
        if isinstance(index, np.ndarray) and index.dtype == np.bool_ and index.shape == (len(self),):
            # Positions once, not a mask per column: each boolean index counts and scans the mask again.
            index = np.flatnonzero(index)
        return type(self)(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def nbytes(self) -> int:
        """Memory held by the columns."""
        return sum(int(getattr(self, f.name).nbytes) for f in fields(self))


@dataclass
class GpuOps(_Columns):
    """Everything that ran on (or was recorded against) a GPU stream: kernels, copies, memsets, syncs.

    Times are integer nanoseconds on the trace's own clock. Unknown integers are -1, unknown floats NaN.
    """

    start_ns: I64
    dur_ns: I64
    device: I32
    stream: I64
    kind: I8  # OpKind
    kclass: I8  # KernelClass
    name: I32  # index into Trace.strings
    correlation: I64  # joins RuntimeCalls.correlation (-1: none)
    bytes: I64  # memcpy / memset size
    copy_kind: I8  # CopyKind
    src_kind: I8  # MemKind
    dst_kind: I8  # MemKind
    sync_kind: I8  # SyncKind
    blocks_per_sm: F64  # Kineto "blocks per SM" (grid blocks / SM count)
    occupancy_pct: F64  # Kineto "est. achieved occupancy %"
    grid_blocks: I64  # gridX*gridY*gridZ
    block_threads: I64  # blockX*blockY*blockZ

    @property
    def end_ns(self) -> I64:
        """End of each op."""
        return self.start_ns + self.dur_ns


@dataclass
class RuntimeCalls(_Columns):
    """CPU-side CUDA/HIP runtime and driver API calls (cudaLaunchKernel, cudaMemcpyAsync, ...)."""

    start_ns: I64
    dur_ns: I64
    name: I32
    correlation: I64
    tid: I64
    kind: I8  # RuntimeKind


@dataclass
class CpuOps(_Columns):
    """CPU operators (Kineto cpu_op / 2021 "Operator"): aten ops, autograd nodes, DataLoader iterators."""

    start_ns: I64
    dur_ns: I64
    name: I32
    tid: I64


@dataclass
class Annotations(_Columns):
    """Named ranges: ProfilerStep#N, record_function labels, gpu_user_annotation, NVTX ranges."""

    start_ns: I64
    dur_ns: I64
    name: I32
    source: I8  # AnnotationSource
    tid: I64  # CPU thread, or the stream for GPU annotations


@dataclass
class DeviceInfo:
    """What the trace says about one GPU."""

    id: int
    name: str = ""
    num_sms: int | None = None
    total_memory_bytes: int | None = None
    compute_capability: str | None = None
    max_threads_per_sm: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {
            "id": self.id,
            "name": self.name,
            "num_sms": self.num_sms,
            "total_memory_bytes": self.total_memory_bytes,
            "compute_capability": self.compute_capability,
            "max_threads_per_sm": self.max_threads_per_sm,
        }


@dataclass
class DistributedInfo:
    """Kineto's distributedInfo block (any part may be missing)."""

    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    nccl_version: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "backend": self.backend,
            "nccl_version": self.nccl_version,
        }


@dataclass
class RankTrace:
    """One rank's events: a Kineto file, or one GPU's share of an nsys export."""

    rank: int
    gpu: GpuOps
    runtime: RuntimeCalls
    cpu_ops: CpuOps
    annotations: Annotations
    devices: list[DeviceInfo] = field(default_factory=list)
    distributed: DistributedInfo | None = None
    #: Add to a `*_ns` timestamp to get Unix epoch nanoseconds, when the trace anchors its clock.
    unix_offset_ns: int | None = None
    #: The profiling window (Kineto's "PyTorch Profiler (0)" span, nsys analysis range), if known.
    window_ns: tuple[int, int] | None = None
    label: str = ""
    #: Kineto timestamps with sub-microsecond digits: HTA rounds these to whole microseconds.
    sub_us_timestamps: bool = False

    def device_by_id(self, device_id: int) -> DeviceInfo | None:
        """Properties of a device, if the trace recorded them."""
        for dev in self.devices:
            if dev.id == device_id:
                return dev
        return None

    def nbytes(self) -> int:
        """Memory held by this rank's columns."""
        return self.gpu.nbytes() + self.runtime.nbytes() + self.cpu_ops.nbytes() + self.annotations.nbytes()


@dataclass
class Trace:
    """A parsed trace: ranks of columnar events plus the string table their names index into."""

    source: str  # "kineto" | "nsys"
    strings: StringTable
    ranks: list[RankTrace]
    metadata: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: Size of the (decompressed) input the trace was parsed from: the analysis' budgets scale with it.
    input_bytes: int = 0

    def name(self, idx: int) -> str:
        """The string behind a name index."""
        return self.strings[idx]

    def nbytes(self) -> int:
        """Approximate memory held by the event columns (excluding the string table)."""
        return sum(r.nbytes() for r in self.ranks)


def combine_traces(traces: list[Trace]) -> Trace:
    """Merge per-rank traces (e.g. one Kineto file per rank) into one `Trace` with a shared string table."""
    if not traces:
        raise ValueError("combine_traces needs at least one trace")
    strings = StringTable()
    ranks: list[RankTrace] = []
    warnings: list[str] = []
    for trace in traces:
        remap = np.array([strings.intern(s) for s in trace.strings.values], dtype=np.int32)
        for rank in trace.ranks:
            ranks.append(
                RankTrace(
                    rank=rank.rank,
                    gpu=_remap_names(rank.gpu, remap),
                    runtime=_remap_names(rank.runtime, remap),
                    cpu_ops=_remap_names(rank.cpu_ops, remap),
                    annotations=_remap_names(rank.annotations, remap),
                    devices=rank.devices,
                    distributed=rank.distributed,
                    unix_offset_ns=rank.unix_offset_ns,
                    window_ns=rank.window_ns,
                    label=rank.label,
                    sub_us_timestamps=rank.sub_us_timestamps,
                )
            )
        warnings.extend(trace.warnings)
    ranks.sort(key=lambda r: r.rank)
    return Trace(
        source=traces[0].source,
        strings=strings,
        ranks=ranks,
        metadata={"combined_from": len(traces)},
        warnings=warnings,
    )


def _remap_names(table: Any, remap: npt.NDArray[np.int32]) -> Any:
    values = {f.name: getattr(table, f.name) for f in fields(table)}
    values["name"] = remap[values["name"]] if len(remap) else values["name"]
    return type(table)(**values)


class ColumnBuilder:
    """Appends rows into typed `array.array` buffers (8 bytes per value, no per-row Python objects).

    `columns` maps a column name to an array typecode: "q" int64, "i" int32, "b" int8, "d" float64.
    """

    def __init__(self, columns: dict[str, str]) -> None:
        self._arrays: dict[str, array[Any]] = {name: array(code) for name, code in columns.items()}
        self._order = list(columns)
        # Bound append methods, in column order, so `append_row` does no dict lookups per value.
        self._appenders = [self._arrays[name].append for name in self._order]

    def append_row(self, *values: Any) -> None:
        """Append one row; values in the order the columns were declared.

        A value the column cannot hold (an integer past its range, a float where an integer belongs, a
        string) becomes the column's "unknown" (-1, NaN): uploads are untrusted, and one bad cell must
        not fail the parse or misalign the columns.
        """
        try:
            for append, value in zip(self._appenders, values, strict=True):
                append(value)
        except (OverflowError, TypeError, ValueError):
            self._append_checked(values)

    def _append_checked(self, values: tuple[Any, ...]) -> None:
        arrays = [self._arrays[name] for name in self._order]
        n = min(len(arr) for arr in arrays)  # the columns before the failing one already took a value
        for arr in arrays:  # undo the partial row
            del arr[n:]
        for arr, value in zip(arrays, values, strict=True):
            arr.append(_fit(arr.typecode, value))

    def __len__(self) -> int:
        return len(self._arrays[self._order[0]])

    def to_numpy(self) -> dict[str, npt.NDArray[Any]]:
        """The columns as numpy arrays (copied out of the buffers)."""
        dtypes = {"q": np.int64, "i": np.int32, "b": np.int8, "d": np.float64}
        out: dict[str, npt.NDArray[Any]] = {}
        for name, arr in self._arrays.items():
            out[name] = (
                np.frombuffer(arr, dtype=dtypes[arr.typecode]).copy()
                if len(arr)
                else np.zeros(0, dtype=dtypes[arr.typecode])
            )
        return out


_INT_RANGE = {"q": (-(2**63), 2**63 - 1), "i": (-(2**31), 2**31 - 1), "b": (-128, 127)}


def _fit(typecode: str, value: Any) -> int | float:
    """`value` as the column type holds it, or the column's unknown (-1 for integers, NaN for floats)."""
    if typecode == "d":
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:
                return float("nan")
        return float("nan")
    lo, hi = _INT_RANGE[typecode]
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return -1
        value = int(value)
    if isinstance(value, int) and lo <= value <= hi:
        return int(value)
    return -1


GPU_COLUMNS: dict[str, str] = {
    "start_ns": "q",
    "dur_ns": "q",
    "device": "i",
    "stream": "q",
    "kind": "b",
    "kclass": "b",
    "name": "i",
    "correlation": "q",
    "bytes": "q",
    "copy_kind": "b",
    "src_kind": "b",
    "dst_kind": "b",
    "sync_kind": "b",
    "blocks_per_sm": "d",
    "occupancy_pct": "d",
    "grid_blocks": "q",
    "block_threads": "q",
}
RUNTIME_COLUMNS: dict[str, str] = {
    "start_ns": "q",
    "dur_ns": "q",
    "name": "i",
    "correlation": "q",
    "tid": "q",
    "kind": "b",
}
CPU_OP_COLUMNS: dict[str, str] = {"start_ns": "q", "dur_ns": "q", "name": "i", "tid": "q"}
ANNOTATION_COLUMNS: dict[str, str] = {"start_ns": "q", "dur_ns": "q", "name": "i", "source": "b", "tid": "q"}


def empty_cpu_ops() -> CpuOps:
    """A CpuOps table with no rows."""
    return CpuOps(**ColumnBuilder(CPU_OP_COLUMNS).to_numpy())


def unique_inverse(values: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], npt.NDArray[np.intp]]:
    """`np.unique(values, return_inverse=True)`, by counting when the values are small non-negative
    integers (string-table indices, kinds): numpy 2.4 sorts to build the inverse, 17 ms for the 100 MB
    trace's 119k CPU op names against 0.3 ms counting. The same arrays either way."""
    if values.ndim == 1 and values.size and values.dtype.kind in "iu" and np.can_cast(values.dtype, np.intp):
        lo, hi = int(values.min()), int(values.max())
        if lo >= 0 and hi <= 4 * values.size + 4096:  # the count array stays about the input's size
            present = np.bincount(values, minlength=hi + 1) > 0
            inverse = np.cumsum(present) - 1
            return np.flatnonzero(present).astype(values.dtype), inverse[values]
    return np.unique(values, return_inverse=True)


def class_of_names(strings: StringTable, kinds: I8, names: I32) -> I8:
    """`classify_gpu_op` for every row, evaluating the regexes once per distinct (kind, name)."""
    out = np.empty(len(names), dtype=np.int8)
    if len(names) == 0:
        return out
    pairs = (kinds.astype(np.int64) << 32) | names.astype(np.int64)
    uniq, inverse = unique_inverse(pairs)
    classes = np.array(
        [classify_gpu_op(int(p >> 32), strings[int(p & 0xFFFFFFFF)]) for p in uniq], dtype=np.int8
    )
    out[:] = classes[inverse]
    return out
