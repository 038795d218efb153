"""Complete Kineto events, one decoded chunk at a time, into the columns of one rank (`_TraceBuilder`):
the coercions of loosely typed trace values (ids, sizes, grid dimensions) to numpy arrays, the role of
each category.

Private to the Kineto parser (`jobs.profiling.kineto`): the names keep their leading underscore.
"""

from __future__ import annotations

import itertools
import math
import operator
from typing import Any

import numpy as np

from jobs.profiling.events import (
    ANNOTATION_COLUMNS,
    CPU_OP_COLUMNS,
    GPU_COLUMNS,
    RUNTIME_COLUMNS,
    Annotations,
    AnnotationSource,
    CopyKind,
    CpuOps,
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
    intern_codes,
)
from jobs.profiling.guard import check_now
from jobs.profiling.kineto_schema import (
    _ANNOT_CPU,
    _ANNOT_GPU,
    _CAT_ROLE,
    _COPY_KIND_BY_LABEL,
    _CPU_OP,
    _DRIVER,
    _GPU_KERNEL,
    _GPU_KINDS,
    _GPU_MEMCPY,
    _GPU_MEMSET,
    _GPU_SYNC,
    _MAX_INT,
    _MEM_KIND_BY_LABEL,
    _MEMCPY_NAME_RE,
    _NO_STREAM_U32,
    _PROFILER_STEP_RE,
    _RUNTIME,
    _STREAM_TID_RE,
    _SYNC_KIND_BY_NAME,
    _TRACE,
    _Args,
    _as_int,
    _device_info,
    _distributed_info,
    _Document,
    _unix_offset,
)

#: Timestamps (microseconds) must stay within ~±140 years of the epoch, so ns fit int64 with room to add
#: durations; a duration of more than a year is not a real event.
_MAX_TS_US = 4.5e15
_MAX_DUR_US = 3.2e13


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
            # Bounded as every other id: a tid past int64 made the column assignment overflow (a crash).
            stream = tid if -_MAX_INT <= tid <= _MAX_INT else -1
        elif isinstance(tid, str):
            m = _STREAM_TID_RE.search(tid[:256])
            if m and len(m.group(1)) <= 18:
                stream = int(m.group(1))
    if stream == _NO_STREAM_U32:
        stream = -1
    return stream


# -- columns -----------------------------------------------------------------------------------------

_NONE_TYPE = type(None)
_INT_TYPES = {int, _NONE_TYPE}
_FLOAT_TYPES = {float, int, _NONE_TYPE}
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
#: Grid and block dimensions this small multiply exactly in int64 (3 x 20 bits), so the vectorised
#: product needs no overflow check; anything else goes through `_product`.
_MAX_FAST_DIM = 1 << 20


def _ints(values: list[Any]) -> np.ndarray:
    """`_as_int(v, -1)` for every value, vectorised when they are all plain ints (or None)."""
    types = set(map(type, values))
    if types <= _INT_TYPES:
        if _NONE_TYPE in types:
            values = [-1 if v is None else v for v in values]
        try:
            # fromiter, not np.array: no list-of-objects dtype discovery (2.5x faster). Safe only for
            # exact ints: it would truncate floats and take True as 1, which the type test rules out.
            out = np.fromiter(values, dtype=np.int64, count=len(values))
        except OverflowError:
            pass
        else:
            out[(out > _MAX_INT) | (out < -_MAX_INT)] = -1
            return out
    return np.array([_as_int(v, -1) for v in values], dtype=np.int64)


def _plain_ints(values: list[Any]) -> np.ndarray | None:
    """`_ints(values)` when every value is a plain int (no None, bool, float or str), else None."""
    if set(map(type, values)) != {int}:
        return None
    try:
        out = np.fromiter(values, dtype=np.int64, count=len(values))
    except OverflowError:
        return None
    out[(out > _MAX_INT) | (out < -_MAX_INT)] = -1
    return out


def _floats(values: list[Any]) -> np.ndarray:
    """`_as_float` for every value (NaN for unknown), vectorised for plain numbers."""
    if set(map(type, values)) <= _FLOAT_TYPES:
        try:
            out = np.array(values, dtype=np.float64)  # None becomes NaN
        except OverflowError:
            pass
        else:
            out[~np.isfinite(out)] = np.nan
            return out
    return np.array([_as_float(v) for v in values], dtype=np.float64)


def _products(values: list[Any]) -> np.ndarray:
    """`_product` (gridX*gridY*gridZ) for every value, vectorised for [x, y, z] lists of small ints."""
    types = set(map(type, values))
    if values and types <= {list, _NONE_TYPE}:
        at = None
        present = values
        if _NONE_TYPE in types:  # memsets and copies carry no grid
            at = np.flatnonzero(np.array([v is not None for v in values], dtype=bool))
            present = list(map(values.__getitem__, at.tolist()))
        dims = None
        if set(map(len, present)) == {3} and set(map(type, itertools.chain.from_iterable(present))) == {int}:
            try:  # flat, then reshaped: much faster than numpy converting a list of lists
                flat = itertools.chain.from_iterable(present)
                dims = np.fromiter(flat, dtype=np.int64, count=3 * len(present)).reshape(-1, 3)
            except (OverflowError, ValueError):
                dims = None
        if dims is not None:
            fast = ((dims >= 0) & (dims <= _MAX_FAST_DIM)).all(axis=1)
            prod = np.where(fast, dims.prod(axis=1), -1)
            for i in np.flatnonzero(~fast).tolist():
                prod[i] = _product(present[i])
            if at is None:
                return prod
            out = np.full(len(values), -1, dtype=np.int64)
            out[at] = prod
            return out
    return np.array([_product(v) for v in values], dtype=np.int64)


def _name_text(name: Any) -> str:
    return name if isinstance(name, str) else ("" if name is None else str(name))


def _cat_text(cat: Any) -> str:
    return cat if isinstance(cat, str) else ""


def _fit(values: np.ndarray, lo: int, hi: int) -> np.ndarray:
    # What the column type cannot hold is unknown (-1), as ColumnBuilder does for a row.
    values[(values < lo) | (values > hi)] = -1
    return values


_ROLE_GPU = np.array([_GPU_KERNEL, _GPU_MEMCPY, _GPU_MEMSET, _GPU_SYNC], dtype=np.int8)
_ROLE_RUNTIME = np.array([_RUNTIME, _DRIVER], dtype=np.int8)
_ROLE_ANNOTATION = np.array([_ANNOT_CPU, _ANNOT_GPU], dtype=np.int8)
_OP_KIND_OF_ROLE = np.zeros(_TRACE + 1, dtype=np.int8)
for _role, _kind in _GPU_KINDS.items():
    _OP_KIND_OF_ROLE[_role] = _kind


class _RoleOfCat(dict[str, int]):
    def __missing__(self, key: str) -> int:
        return -1


_ROLE_OF_CAT = _RoleOfCat(_CAT_ROLE)
#: Stands in for a missing args object, so attribute getters run in C (`map`) without a None test.
_NO_ARGS = _Args()
_CAT = operator.attrgetter("cat")
_NAME = operator.attrgetter("name")
_TS = operator.attrgetter("ts")
_DUR = operator.attrgetter("dur")
_TID = operator.attrgetter("tid")
_DEVICE = operator.attrgetter("device")
_STREAM = operator.attrgetter("stream")
_CORRELATION = operator.attrgetter("correlation")
_NBYTES = operator.attrgetter("nbytes")
_BLOCKS_PER_SM = operator.attrgetter("blocks_per_sm")
_OCCUPANCY = operator.attrgetter("occupancy")
_GRID = operator.attrgetter("grid")
_BLOCK = operator.attrgetter("block")


_ARGS_OR_NONE = operator.attrgetter("args")


def _args_of(events: list[Any]) -> list[_Args]:
    """Each event's args, with the placeholder where an event has none."""
    args = list(map(_ARGS_OR_NONE, events))
    if None in args:
        return [_NO_ARGS if a is None else a for a in args]
    return args


def _pick(values: list[Any], rows: np.ndarray) -> list[Any]:
    """values[rows] for a list (rows ascending positions), without a copy when every row is kept."""
    if rows.size == len(values):
        return values
    return list(map(values.__getitem__, rows.tolist()))


class _TraceBuilder:
    """Turns complete events, one chunk at a time, into the columns of one rank.

    Each chunk is handled with a few passes over its events (attribute lists, then numpy), not one
    Python-level branchy loop per event; rows keep the file's order within each table, and names are
    interned in file order, so the result does not depend on where the chunks were cut.
    """

    def __init__(self) -> None:
        self.strings = StringTable()
        self.parts: dict[str, list[dict[str, np.ndarray]]] = {"gpu": [], "rt": [], "cpu": [], "ann": []}
        # Categories by code in first-seen order, their roles and counts: one look-up per event gives
        # both the role and the count (np.bincount), where a Counter and a role map were two passes.
        self.cat_index: dict[str, int] = {}
        self.cat_names: list[str] = []
        self.cat_roles = np.zeros(0, dtype=np.int8)
        self.cat_hist = np.zeros(0, dtype=np.int64)
        self.window: tuple[float, float] | None = None
        self.skipped_without_time = 0
        self.memcpy_cache: dict[str, tuple[int, int, int]] = {}
        self.step_lut = np.zeros(0, dtype=bool)  # per string index: a ProfilerStep#N name
        self.meta = _Document()

    def add(self, events: list[Any]) -> None:
        """Add a chunk of complete ("X") events (`_Complete` or `_Event`)."""
        if not events:
            return
        known = len(self.cat_names)
        cat_codes = intern_codes(list(map(_CAT, events)), self.cat_index, self.cat_names, _cat_text)
        if len(self.cat_names) > known:
            self.cat_roles = np.array(list(map(_ROLE_OF_CAT.__getitem__, self.cat_names)), dtype=np.int8)
        counts = np.bincount(cat_codes, minlength=len(self.cat_names))
        counts[: len(self.cat_hist)] += self.cat_hist
        self.cat_hist = counts
        roles = self.cat_roles[cat_codes]
        del cat_codes
        picked = np.flatnonzero(roles >= 0)
        if picked.size == 0:
            return
        evs = _pick(events, picked)
        roles = roles[picked]
        # ts and dur are decoded as float | None; fromiter turns None into NaN (skipped below).
        ts = np.fromiter(map(_TS, evs), dtype=np.float64, count=len(evs))
        dur = np.fromiter(map(_DUR, evs), dtype=np.float64, count=len(evs))
        # NaN fails every comparison, so missing, NaN and infinite times are all skipped here.
        usable = (ts > -_MAX_TS_US) & (ts < _MAX_TS_US) & (dur < _MAX_DUR_US)
        if not usable.all():
            self.skipped_without_time += int((~usable).sum())
            keep = np.flatnonzero(usable)
            evs = _pick(evs, keep)
            roles, ts, dur = roles[keep], ts[keep], dur[keep]
        if not evs:
            return
        check_now()
        np.maximum(dur, 0.0, out=dur)
        is_span = roles == _TRACE
        if is_span.any():
            for i in np.flatnonzero(is_span).tolist():
                if _name_text(evs[i].name).startswith("PyTorch Profiler"):
                    self.window = (float(ts[i]), float(ts[i] + dur[i]))
            rows = np.flatnonzero(~is_span)
            evs = _pick(evs, rows)
            roles, ts, dur = roles[rows], ts[rows], dur[rows]
        codes = self.strings.intern_each(list(map(_NAME, evs)), _name_text)
        is_cpu_op = roles == _CPU_OP
        is_step = np.zeros(len(roles), dtype=bool)
        if is_cpu_op.any():
            # The 2021 schema records ProfilerStep#N as an "Operator"; it is an annotation either way.
            # Decided once per distinct name, then looked up per row.
            strings = self.strings
            lut = self.step_lut
            if len(lut) < len(strings):
                grown = np.zeros(len(strings), dtype=bool)
                grown[: len(lut)] = lut
                for code in range(len(lut), len(strings)):
                    grown[code] = _PROFILER_STEP_RE.match(strings[code]) is not None
                self.step_lut = lut = grown
            is_step = is_cpu_op & lut[codes]
        groups = {
            "gpu": np.isin(roles, _ROLE_GPU),
            "rt": np.isin(roles, _ROLE_RUNTIME),
            "cpu": is_cpu_op & ~is_step,
            "ann": np.isin(roles, _ROLE_ANNOTATION) | is_step,
        }
        # Thread ids in one pass over the chunk when they are all plain ints (current schema: GPU rows
        # carry the stream number as tid); otherwise (the 2021 schema's "stream 7") per table as before.
        tids = list(map(_TID, evs))
        all_tids = _plain_ints(tids)
        for table, mask in groups.items():
            rows = np.flatnonzero(mask)
            if rows.size == 0:
                continue
            cols: dict[str, np.ndarray] = {"_ts": ts[rows], "_dur": dur[rows], "name": codes[rows]}
            if table == "gpu":
                cols.update(self._gpu_columns(_pick(evs, rows), roles[rows], cols["name"]))
                self.parts[table].append(cols)
                continue
            cols["tid"] = all_tids[rows] if all_tids is not None else _ints(_pick(tids, rows))
            if table == "rt":
                cols["correlation"] = _ints(list(map(_CORRELATION, _args_of(_pick(evs, rows)))))
                cols["kind"] = np.where(roles[rows] == _DRIVER, RuntimeKind.DRIVER, RuntimeKind.RUNTIME)
            elif table == "ann":
                cols["source"] = np.where(
                    roles[rows] == _ANNOT_GPU, AnnotationSource.GPU, AnnotationSource.CPU
                )
            self.parts[table].append(cols)

    def _gpu_columns(self, evs: list[Any], roles: np.ndarray, codes: np.ndarray) -> dict[str, np.ndarray]:
        """The GPU table's own columns for `evs` (their roles, and their names' codes in the string table:
        only copies and syncs read a name, so the names are not picked for every kernel)."""
        names = self.strings.values
        n = len(evs)
        args = _args_of(evs)
        kind = _OP_KIND_OF_ROLE[roles]
        device = _ints(list(map(_DEVICE, args)))
        no_device = np.flatnonzero(device == -1)
        if no_device.size:
            device[no_device] = _ints([evs[i].pid for i in no_device.tolist()])
        stream = _ints(list(map(_STREAM, args)))
        for i in np.flatnonzero(stream == -1).tolist():
            stream[i] = _stream_of(None, evs[i].tid)
        stream[stream == _NO_STREAM_U32] = -1
        copy_kind = np.zeros(n, dtype=np.int8)
        src = np.zeros(n, dtype=np.int8)
        dst = np.zeros(n, dtype=np.int8)
        sync_kind = np.zeros(n, dtype=np.int8)
        for i in np.flatnonzero(kind == OpKind.MEMCPY).tolist():
            name = names[codes[i]]
            cached = self.memcpy_cache.get(name)
            if cached is None:
                a = args[i]
                cached = _memcpy_kinds(name[:256], a.kind if a is not None else None)
                self.memcpy_cache[name] = cached
            copy_kind[i], src[i], dst[i] = cached
        for i in np.flatnonzero(kind == OpKind.SYNC).tolist():
            sync_kind[i] = _SYNC_KIND_BY_NAME.get(names[codes[i]].lower(), SyncKind.UNKNOWN)
        bps = np.full(n, np.nan)
        occ = np.full(n, np.nan)
        grid = np.full(n, -1, dtype=np.int64)
        block = np.full(n, -1, dtype=np.int64)
        # Launch geometry of kernels and memsets (an event without args keeps NaN/-1: the helpers map
        # the placeholder's None to unknown).
        launch = np.flatnonzero((kind == OpKind.KERNEL) | (kind == OpKind.MEMSET))
        if launch.size:
            la = _pick(args, launch)
            bps[launch] = _floats(list(map(_BLOCKS_PER_SM, la)))
            occ[launch] = _floats(list(map(_OCCUPANCY, la)))
            grid[launch] = _products(list(map(_GRID, la)))
            block[launch] = _products(list(map(_BLOCK, la)))
        return {
            "device": _fit(device, _I32_MIN, _I32_MAX).astype(np.int32),
            "stream": stream,
            "kind": kind,
            "correlation": _ints(list(map(_CORRELATION, args))),
            "bytes": _ints(list(map(_NBYTES, args))),
            "copy_kind": copy_kind,
            "src_kind": src,
            "dst_kind": dst,
            "sync_kind": sync_kind,
            "blocks_per_sm": bps,
            "occupancy_pct": occ,
            "grid_blocks": grid,
            "block_threads": block,
        }

    def _table(self, table: str, columns: dict[str, str]) -> dict[str, np.ndarray]:
        dtypes = {"q": np.int64, "i": np.int32, "b": np.int8, "d": np.float64}
        parts = self.parts[table]
        out: dict[str, np.ndarray] = {}
        for name, code in columns.items():
            if name in ("start_ns", "dur_ns", "kclass"):  # times below; kernel classes from all names
                continue
            dtype = dtypes[code]
            out[name] = (
                np.concatenate([p[name] for p in parts]).astype(dtype, copy=False)
                if parts
                else np.zeros(0, dtype=dtype)
            )
        ts = np.concatenate([p["_ts"] for p in parts]) if parts else np.zeros(0)
        dur = np.concatenate([p["_dur"] for p in parts]) if parts else np.zeros(0)
        self.parts[table] = []
        out["start_ns"] = _to_ns(ts)
        # Duration rounds on its own (it is small), so sub-microsecond digits survive exactly.
        out["dur_ns"] = np.rint(dur * 1000.0).astype(np.int64)
        out["_sub_us"] = np.array([bool(len(ts) and np.any(ts % 1.0))])
        return {"start_ns": out.pop("start_ns"), "dur_ns": out.pop("dur_ns"), **out}

    def finish(self, rank_override: int | None, input_bytes: int) -> Trace:
        """The parsed trace, from the chunks added and the document's metadata (`self.meta`)."""
        meta = self.meta
        strings = self.strings
        tables = {
            key: self._table(key, columns)
            for key, columns in (
                ("gpu", GPU_COLUMNS),
                ("rt", RUNTIME_COLUMNS),
                ("cpu", CPU_OP_COLUMNS),
                ("ann", ANNOTATION_COLUMNS),
            )
        }
        sub_us = any(bool(t.pop("_sub_us")[0]) for t in tables.values())
        gpu_cols = tables["gpu"]
        gpu_cols["kclass"] = class_of_names(strings, gpu_cols["kind"], gpu_cols["name"])
        gpu_cols = {name: gpu_cols[name] for name in GPU_COLUMNS}
        rank_trace = RankTrace(
            rank=0,
            gpu=GpuOps(**gpu_cols),
            runtime=RuntimeCalls(**{name: tables["rt"][name] for name in RUNTIME_COLUMNS}),
            cpu_ops=CpuOps(**{name: tables["cpu"][name] for name in CPU_OP_COLUMNS}),
            annotations=Annotations(**{name: tables["ann"][name] for name in ANNOTATION_COLUMNS}),
        )
        warnings: list[str] = []
        if self.skipped_without_time:
            warnings.append(
                f"{self.skipped_without_time} complete events had no usable ts/dur and were skipped."
            )
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
        if self.window is not None:
            w = _to_ns(np.array(self.window, dtype=np.float64))
            rank_trace.window_ns = (int(w[0]), int(w[1]))
        rank_trace.label = f"rank {rank_trace.rank}"
        rank_trace.sub_us_timestamps = sub_us
        # First-seen order, as a Counter kept it: the sort below is stable, so ties stay in that order.
        cat_counts = dict(zip(self.cat_index, self.cat_hist.tolist(), strict=True))
        metadata: dict[str, Any] = {
            "schema_version": meta.schemaVersion if isinstance(meta.schemaVersion, int | str) else None,
            "display_time_unit": meta.displayTimeUnit if isinstance(meta.displayTimeUnit, str) else None,
            # Categories come from the upload: keep the 50 most frequent so a hostile file cannot bloat
            # results.
            "event_counts_by_category": dict(sorted(cat_counts.items(), key=lambda kv: -kv[1])[:50]),
            "format": "kineto-2021" if "Kernel" in cat_counts or "Operator" in cat_counts else "kineto",
            "clock": clock,
            "capture_window": "profiler span (cat Trace)" if self.window is not None else "event extent",
        }
        trace = Trace(
            source="kineto", strings=strings, ranks=[rank_trace], metadata=metadata, warnings=warnings
        )
        trace.input_bytes = input_bytes
        return trace
