"""The host's blocking calls in a rank's trace: which CPU calls block the host on the GPU, and where.

`host_analysis` measures them over the steps and gives the GPU's idle time to them. Blocking calls are

- ``cuda/hip{Stream,Device,Event,Ctx}Synchronize`` (and the driver's ``cu*Synchronize``);
- synchronous copies: ``cudaMemcpy``/``cudaMemcpy2D``/``3D``/``Peer``/``ToSymbol``/... without
  ``Async``, the driver's ``cuMemcpyHtoD``/``DtoH``/..., ``hipMemcpy``/``hipMemcpyWithStream`` (what
  PyTorch's ROCm build uses for blocking copies);
- ``*MemcpyAsync`` whose copy (joined on the correlation id) has *pageable* host memory: CUDA stages
  those through a pinned buffer, and a device-to-pageable copy returns only when it is done (CUDA
  runtime API, "API synchronization behavior");
- ``cudaFree``/``cudaFreeHost``/``hipFree``, which synchronise the device implicitly;
- the op-level ``aten::item`` / ``aten::_local_scalar_dense`` when they enclose a runtime call on the
  same thread (on a CPU tensor they are plain reads and do not block).

A call site is the enclosing ``cpu_op`` stack on the same thread (outermost first). Python frames
(``python_function`` events) are not read, so the site is the operator stack, not the source line.

Pure numpy over the columnar event model; no Django.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from jobs.profiling import intervals as iv
from jobs.profiling.events import (
    COPY_KIND_LABELS,
    MEM_KIND_LABELS,
    CopyKind,
    MemKind,
    OpKind,
    RankTrace,
    Trace,
)
from jobs.profiling.units import ms, pct

#: Longest call-site label kept (operator stacks of templated C++ names grow long).
MAX_SITE_CHARS = 200


MAX_SITES = 10


_SUFFIX_RE = re.compile(r"(?:_v\d+)?(?:_ptds|_ptsz)?$")


_SYNC_RE = re.compile(
    r"^(?:cuda|hip)(?:Stream|Device|Event|Thread|Ctx)Synchronize$|^cu(?:Stream|Ctx|Event)Synchronize$"
)


_SYNC_COPY_RE = re.compile(
    r"^(?:cuda|hip)Memcpy(?:2D|3D|Peer|ToSymbol|FromSymbol|ToArray|FromArray|2DToArray|2DFromArray|"
    r"ArrayToArray|HtoD|DtoH|DtoD|WithStream)?$|"
    r"^cuMemcpy(?:HtoD|DtoH|DtoD|HtoA|AtoH|AtoD|DtoA|AtoA|2D|2DUnaligned|3D|Peer)?$"
)


_ASYNC_COPY_RE = re.compile(r"^(?:cuda|hip|cu)Memcpy\w*Async$")


_IMPLICIT_SYNC_RE = re.compile(r"^(?:cuda|hip)Free(?:Host)?$|^cuMemFree(?:Host)?$")


_ITEM_OPS = frozenset({"aten::item", "aten::_local_scalar_dense"})


_HOST_SRC = (CopyKind.HTOD, CopyKind.HTOA, CopyKind.UVM_HTOD, CopyKind.HTOH)


_HOST_DST = (CopyKind.DTOH, CopyKind.ATOH, CopyKind.UVM_DTOH)


#: Kinds of blocking calls, as reported.
SYNC, SYNC_COPY, PAGEABLE_ASYNC_COPY, IMPLICIT_SYNC, ITEM = (
    "synchronize",
    "synchronous_copy",
    "pageable_async_copy",
    "implicit_sync",
    "item",
)


def api_name(name: str) -> str:
    """A runtime/driver API name without nsys' version suffix and the per-thread-stream suffixes."""
    return _SUFFIX_RE.sub("", name)


def is_dataloader(name: str) -> bool:
    """The DataLoader / DataPipe iterator's ``__next__`` as the PyTorch profiler names it."""
    return (name.startswith("enumerate(DataLoader)#") and name.endswith(".__next__")) or name.startswith(
        "enumerate(DataPipe)#"
    )


@dataclass
class Blocking:
    """Blocking events of one rank: runtime calls (index into rank.runtime) and item ops (into cpu_ops)."""

    rt_index: npt.NDArray[np.int64]
    rt_kind: list[str]
    item_index: npt.NDArray[np.int64]


def _memcpys(rank: RankTrace) -> list[tuple[int, int, int | None]]:
    """(correlation id, copy kind, host side's MemKind or None) of each correlated memcpy."""
    gpu = rank.gpu
    sel = (gpu.kind == OpKind.MEMCPY) & (gpu.correlation >= 0)
    out: list[tuple[int, int, int | None]] = []
    for corr, ck, src, dst in zip(
        gpu.correlation[sel].tolist(),
        gpu.copy_kind[sel].tolist(),
        gpu.src_kind[sel].tolist(),
        gpu.dst_kind[sel].tolist(),
        strict=True,
    ):
        out.append((corr, ck, src if ck in _HOST_SRC else dst if ck in _HOST_DST else None))
    return out


def _host_mem_by_correlation(rank: RankTrace) -> dict[int, int]:
    """Host memory kind (MemKind) of each memcpy's host side, by correlation id."""
    return {corr: host for corr, _, host in _memcpys(rank) if host is not None}


def find_blocking(trace: Trace, rank: RankTrace) -> tuple[Blocking, dict[str, int]]:
    rt = rank.runtime
    kinds_by_name: dict[int, str] = {}
    async_copy_names: set[int] = set()
    for idx in np.unique(rt.name).tolist():
        name = api_name(trace.strings[idx])
        if _SYNC_RE.match(name):
            kinds_by_name[idx] = SYNC
        elif _SYNC_COPY_RE.match(name):
            kinds_by_name[idx] = SYNC_COPY
        elif _IMPLICIT_SYNC_RE.match(name):
            kinds_by_name[idx] = IMPLICIT_SYNC
        elif _ASYNC_COPY_RE.match(name):
            async_copy_names.add(idx)
    host_mem = _host_mem_by_correlation(rank) if async_copy_names else {}
    copy_memory = {"pageable_async_copies": 0, "pinned_async_copies": 0, "unknown_async_copies": 0}
    # Only the candidate rows are visited in Python: traces carry millions of cudaLaunchKernel calls.
    candidate_ids = np.array([*kinds_by_name, *async_copy_names], dtype=np.int32)
    candidates = np.flatnonzero(np.isin(rt.name, candidate_ids)) if candidate_ids.size else np.zeros(0, int)
    rt_index: list[int] = []
    rt_kind: list[str] = []
    for i, n, corr in zip(
        candidates.tolist(), rt.name[candidates].tolist(), rt.correlation[candidates].tolist(), strict=True
    ):
        kind = kinds_by_name.get(n)
        if kind is None:
            mem = host_mem.get(corr)
            if mem == MemKind.PAGEABLE:
                kind = PAGEABLE_ASYNC_COPY
                copy_memory["pageable_async_copies"] += 1
            elif mem == MemKind.PINNED:
                copy_memory["pinned_async_copies"] += 1
            elif mem is not None:
                copy_memory["unknown_async_copies"] += 1
        if kind is not None:
            rt_index.append(i)
            rt_kind.append(kind)
    # aten::item / _local_scalar_dense block only on a GPU tensor: there they enclose a runtime call.
    cpu = rank.cpu_ops
    item_ids = [i for i in np.unique(cpu.name).tolist() if trace.strings[i] in _ITEM_OPS]
    items: list[int] = []
    if item_ids and len(rt):
        cand = np.flatnonzero(np.isin(cpu.name, np.array(item_ids, dtype=np.int32)))
        for tid in np.unique(cpu.tid[cand]).tolist():
            on_tid = rt.tid == tid
            starts = np.sort(rt.start_ns[on_tid])
            for i in cand[cpu.tid[cand] == tid].tolist():
                lo = np.searchsorted(starts, cpu.start_ns[i], side="left")
                if lo < starts.size and starts[lo] <= cpu.start_ns[i] + cpu.dur_ns[i]:
                    items.append(i)
    items = _outermost(cpu, items)
    return (
        Blocking(np.array(rt_index, dtype=np.int64), rt_kind, np.array(items, dtype=np.int64)),
        copy_memory,
    )


def _outermost(cpu: Any, rows: list[int]) -> list[int]:
    """The rows (cpu_op indexes) not nested in another of them on the same thread: aten::item encloses
    aten::_local_scalar_dense, and the pair is one blocking call."""
    kept: list[int] = []
    open_end: dict[int, int] = {}
    for i in sorted(rows, key=lambda r: (int(cpu.start_ns[r]), -int(cpu.dur_ns[r]))):
        tid, end = int(cpu.tid[i]), int(cpu.start_ns[i] + cpu.dur_ns[i])
        if end <= open_end.get(tid, -1):
            continue
        kept.append(i)
        open_end[tid] = end
    return sorted(kept)


def _enclosing(
    op_start: npt.NDArray[np.int64],
    op_end: npt.NDArray[np.int64],
    q_start: list[int],
    q_end: list[int],
    q_self: list[int],
) -> list[list[int]]:
    """For each query interval, the ops (indexes) that enclose it, outermost first (one thread's ops).

    A sweep over the ops in start order keeps the stack of open ops; `q_self` is an op index to leave out
    (the query's own op), or -1.
    """
    # Only ops that contain some query's start can be reported: the others need not enter the sweep.
    # A thread holds tens of thousands of ops and a handful of blocking calls, so this is most of them.
    qs_sorted = np.sort(np.asarray(q_start, dtype=np.int64))
    contains = np.searchsorted(qs_sorted, op_end, side="right") > np.searchsorted(
        qs_sorted, op_start, side="left"
    )
    candidates = np.flatnonzero(contains)
    order = candidates[np.lexsort((-(op_end - op_start)[candidates], op_start[candidates]))].tolist()
    qorder = sorted(range(len(q_start)), key=lambda k: q_start[k])
    starts = op_start.tolist()
    ends = op_end.tolist()
    out: list[list[int]] = [[] for _ in q_start]
    stack: list[int] = []
    j = 0
    for qi in qorder:
        qs, qe = q_start[qi], q_end[qi]
        while j < len(order) and starts[order[j]] <= qs:
            o = order[j]
            while stack and ends[stack[-1]] <= starts[o]:
                stack.pop()
            stack.append(o)
            j += 1
        while stack and ends[stack[-1]] <= qs:
            stack.pop()
        out[qi] = [o for o in stack if ends[o] >= qe and o != q_self[qi]]
    return out


def _site_label(frames: list[str], leaf: str) -> str:
    if len(frames) > 4:
        frames = [*frames[:2], "…", *frames[-2:]]
    label = " > ".join([*frames, leaf]) if frames else leaf
    return label if len(label) <= MAX_SITE_CHARS else label[: MAX_SITE_CHARS - 1] + "…"


def in_window(blocking: Blocking, rank: RankTrace, window: iv.Intervals) -> Blocking:
    """The blocking calls that overlap the window."""
    rt, cpu = rank.runtime, rank.cpu_ops

    def overlaps(start: npt.NDArray[np.int64], end: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        ws, we = window
        if ws.size == 0:
            return np.zeros(start.size, dtype=bool)
        # The last window interval starting before the call's end must end after the call's start.
        idx = np.searchsorted(ws, end, side="left") - 1
        ok = idx >= 0
        ok[ok] = we[idx[ok]] > start[ok]
        return ok

    ri, ci = blocking.rt_index, blocking.item_index
    keep_rt = overlaps(rt.start_ns[ri], (rt.start_ns + rt.dur_ns)[ri])
    keep_item = overlaps(cpu.start_ns[ci], (cpu.start_ns + cpu.dur_ns)[ci])
    return Blocking(
        ri[keep_rt],
        [k for k, keep in zip(blocking.rt_kind, keep_rt.tolist(), strict=True) if keep],
        ci[keep_item],
    )


def blocking_sites(trace: Trace, rank: RankTrace, blocking: Blocking, window_ns: int) -> list[dict[str, Any]]:
    """Blocking time by call site (enclosing cpu_op stack + the blocking call), largest first."""
    rt, cpu, names = rank.runtime, rank.cpu_ops, trace.strings
    copy_label = _copy_labels(rank)
    cpu_end = cpu.start_ns + cpu.dur_ns
    totals: dict[tuple[str, str], list[int]] = {}
    item_set = set(blocking.item_index.tolist())
    tids = set(rt.tid[blocking.rt_index].tolist()) | set(cpu.tid[blocking.item_index].tolist())
    for tid in sorted(tids):
        ops = np.flatnonzero(cpu.tid == tid)
        q_start: list[int] = []
        q_end: list[int] = []
        q_self: list[int] = []
        q_leaf: list[tuple[str, str, int]] = []
        for k, i in zip(blocking.rt_kind, blocking.rt_index.tolist(), strict=True):
            if int(rt.tid[i]) != tid:
                continue
            leaf = api_name(names[int(rt.name[i])]) + copy_label.get(int(rt.correlation[i]), "")
            q_start.append(int(rt.start_ns[i]))
            q_end.append(int(rt.start_ns[i] + rt.dur_ns[i]))
            q_self.append(-1)
            q_leaf.append((leaf, k, int(rt.dur_ns[i])))
        for i in blocking.item_index.tolist():
            if int(cpu.tid[i]) != tid:
                continue
            q_start.append(int(cpu.start_ns[i]))
            q_end.append(int(cpu_end[i]))
            q_self.append(int(np.searchsorted(ops, i)))
            q_leaf.append((names[int(cpu.name[i])], ITEM, int(cpu.dur_ns[i])))
        stacks = _enclosing(cpu.start_ns[ops], cpu_end[ops], q_start, q_end, q_self)
        for stack, (leaf, kind, dur) in zip(stacks, q_leaf, strict=True):
            global_stack = [int(ops[o]) for o in stack]
            if kind != ITEM and any(o in item_set for o in global_stack):
                continue  # counted once, as the enclosing aten::item
            label = _site_label([names[int(cpu.name[o])] for o in global_stack], leaf)
            row = totals.setdefault((label, kind), [0, 0])
            row[0] += 1
            row[1] += dur
    rows = sorted(totals.items(), key=lambda kv: -kv[1][1])[:MAX_SITES]
    return [
        {"site": label, "kind": kind, "count": c, "time_ms": ms(t), "step_pct": pct(t, window_ns)}
        for (label, kind), (c, t) in rows
    ]


def _copy_labels(rank: RankTrace) -> dict[int, str]:
    """Suffixes such as " (DtoH, pageable)" for copy calls, by correlation id."""
    out: dict[int, str] = {}
    for corr, ck, host in _memcpys(rank):
        mem = (
            f", {MEM_KIND_LABELS.get(host, '?').lower()}"
            if host is not None and host != MemKind.UNKNOWN
            else ""
        )
        out[corr] = f" ({COPY_KIND_LABELS.get(ck, '?')}{mem})"
    return out
