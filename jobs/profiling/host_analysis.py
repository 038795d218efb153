"""What the host did while the GPU waited: blocking calls, the input pipeline, launch gaps.

Three sections of a rank's trace analysis, all measured over the same steps (`tb_metrics.tb_steps`: the
``ProfilerStep#N`` ranges stretched to their GPU work, else the traced extent), so their shares add up:

* ``host_blocking``: every CPU call that blocks the host on the GPU, as time and as a share of the step
  and of the host's busy (traced) time, with the call sites that block. Blocking calls are
  - ``cuda/hip{Stream,Device,Event,Ctx}Synchronize`` (and the driver's ``cu*Synchronize``);
  - synchronous copies: ``cudaMemcpy``/``cudaMemcpy2D``/``3D``/``Peer``/``ToSymbol``/... without
    ``Async``, the driver's ``cuMemcpyHtoD``/``DtoH``/..., ``hipMemcpy``/``hipMemcpyWithStream`` (what
    PyTorch's ROCm build uses for blocking copies);
  - ``*MemcpyAsync`` whose copy (joined on the correlation id) has *pageable* host memory: CUDA
    stages those through a pinned buffer, and a device-to-pageable copy returns only when it is done
    (CUDA runtime API, "API synchronization behavior");
  - ``cudaFree``/``cudaFreeHost``/``hipFree``, which synchronise the device implicitly;
  - the op-level ``aten::item`` / ``aten::_local_scalar_dense`` when they enclose a runtime call on the
    same thread (on a CPU tensor they are plain reads and do not block).
  A call site is the enclosing ``cpu_op`` stack on the same thread (outermost first). Python frames
  (``python_function`` events) are not read, so the site is the operator stack, not the source line.
* ``input_pipeline``: host time inside the DataLoader iterator (``enumerate(DataLoader)#...__next__``,
  ``enumerate(DataPipe)#...``, as cpu_op, user annotation or NVTX range) as a share of the step, and the
  iterator class, which tells whether the loader has worker processes (``_SingleProcessDataLoaderIter``:
  num_workers=0; ``_MultiProcessingDataLoaderIter``: workers). Worker processes themselves are other
  processes and are not in the training process's trace.
* ``gpu_idle_attribution``: the GPU's idle time inside the steps (no kernel, copy or memset running on
  any stream of the rank), each instant given to the first of: *input* (the host is in the DataLoader),
  *host_sync* (the host is in a blocking call, or up to `LAUNCH_GAP_MAX_NS` after such a call returned
  into the idle gap: the call drained the GPU's queue and the GPU waits for the host to launch again),
  *launch_gaps* (the instant belongs to an idle gap shorter than `LAUNCH_GAP_MAX_NS`: the host was
  launching the next kernel), *other* (longer gaps the trace does not explain: CPU work outside the
  loader, the optimizer on the host, untraced time). Also the idle gaps by length and how much of the
  launch gaps the host was busy (in a traced op or runtime call).
* ``gpu_idle_attribution.host_work``: what the host did during *other*. A gap whose ending op was
  launched after the gap began (HTA's host-wait test: nothing was queued) is the GPU waiting for the
  host; its idle is split by what the launching threads were in: a host-side collective, a non-blocking
  runtime call (allocation, lazy init), a traced CPU operator (CPU-bound work between kernels: the
  launch queue runs dry), or nothing traced (Python, sleep, I/O). Gaps whose ending op was already
  queued are *queued* (a dependency, not the host). See `_host_work`.

Window and phases (issue #24): with ``ProfilerStep#N`` ranges the sections cover those steps. Without
them the steady state is the GPU span from the first kernel to the last GPU activity (`steady_steps`),
and the host time before the first kernel is *start-up* (lazy CUDA context, cuBLAS/cuDNN handles and
workspaces -- typically ``cudaFree``/``cudaMalloc`` inside the first operator --, module loading,
``torch.compile``, warm-up), reported in the ``phases`` section with the blocking calls it holds, never
as steady-state idle or blocking. The host's own extent (the TensorBoard plugin's step without
ProfilerStep) would count that start-up as GPU idle: 81.5 % instead of 63.2 % of the GPU span on the
issue's trace.

Repetition: ``gpu_idle_attribution`` also says how often host blocking idled the GPU -- in how many
steps (at least `STEP_SHARE_MIN_PCT` of the step) and in how many distinct idle gaps -- so a rule can
tell a pattern of the steady state from a one-off.

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
    AnnotationSource,
    CopyKind,
    MemKind,
    OpKind,
    RankTrace,
    Trace,
)
from jobs.profiling.tb_metrics import TbSteps
from jobs.profiling.units import NS_PER_US, ms, pct

#: An idle gap shorter than this between GPU ops is a launch gap: the host was issuing the next launch.
#: The launch path (Python op dispatch + cudaLaunchKernel) costs ~5-50 us per kernel; a few of them in a
#: row, or a short stretch of Python between ops, makes gaps of 30 us to ~1 ms. Longer gaps mean the host
#: was doing something else (loading data, the optimizer on the CPU, logging).
LAUNCH_GAP_MAX_NS = 1_000 * NS_PER_US
#: Idle gap length buckets (microseconds; the last is open-ended). 30 us is HTA's consecutive-kernel delay.
GAP_EDGES_US: tuple[int, ...] = (0, 30, 1_000, 10_000)
#: A step counts as showing host-sync idle when that idle is at least this share of the step (%).
STEP_SHARE_MIN_PCT = 1.0
#: Longest list of per-step values carried in a result.
MAX_STEP_VALUES = 200
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
# Host-side collective calls: a host inside one waits for other ranks (communication), not on its own work.
_COMM_OP_RE = re.compile(r"^(?:nccl|gloo|c10d|mpi|ucc)[:_]|^record_param_comms$|^ProcessGroup")
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
class _Blocking:
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


def _blocking(trace: Trace, rank: RankTrace) -> tuple[_Blocking, dict[str, int]]:
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
        _Blocking(np.array(rt_index, dtype=np.int64), rt_kind, np.array(items, dtype=np.int64)),
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


def _steps_union(steps: TbSteps) -> iv.Intervals:
    return iv.union(steps.starts, steps.ends)


def steady_steps(rank: RankTrace, steps: TbSteps) -> TbSteps:
    """The steps the host analysis measures: ProfilerStep ranges as given, else the GPU's steady state.

    Without ProfilerStep the plugin's single "step" is the host's traced extent, start-up included. The
    steady state is [first kernel start, last GPU activity end) -- kernels, copies and memsets; a copy
    before the first kernel (weights moved to the GPU) belongs to start-up. With no kernel at all it is
    the whole GPU span.
    """
    if steps.source == "ProfilerStep":
        return steps
    gpu = rank.gpu
    work = gpu.kind != OpKind.SYNC
    if not work.any():
        return steps
    kernels = gpu.kind == OpKind.KERNEL
    start = int(gpu.start_ns[kernels].min()) if kernels.any() else int(gpu.start_ns[work].min())
    end = int(gpu.end_ns[work].max())
    if end <= start:
        return steps
    return TbSteps(
        np.array([start], dtype=np.int64), np.array([end], dtype=np.int64), ["steady state"], 0, "gpu_span"
    )


def _host_extent_start(rank: RankTrace) -> int | None:
    """Earliest host event (operator, runtime call, host annotation) of the rank."""
    lows = [int(t.start_ns.min()) for t in (rank.cpu_ops, rank.runtime) if len(t)]
    host_ann = rank.annotations.source != AnnotationSource.GPU
    if host_ann.any():
        lows.append(int(rank.annotations.start_ns[host_ann].min()))
    return min(lows) if lows else None


def phases(
    trace: Trace, rank: RankTrace, steps: TbSteps, blocking: _Blocking, window: iv.Intervals
) -> dict[str, Any]:
    """The ``phases`` section: where the analysed window lies, and the start-up before it.

    Start-up runs from the first host event to the window's start (the first kernel without
    ProfilerStep, the first step with it). Its blocking calls are listed here, not in ``host_blocking``.
    """
    gpu = rank.gpu
    work = gpu.kind != OpKind.SYNC
    kernels = gpu.kind == OpKind.KERNEL
    win = steps.window
    host_start = _host_extent_start(rank)
    out: dict[str, Any] = {
        "basis": steps.source,
        "note": (
            "ProfilerStep ranges (the steady state the profiler schedule captured)"
            if steps.source == "ProfilerStep"
            else "no ProfilerStep: the steady state is the GPU span from the first kernel to the last GPU "
            "activity; the host time before the first kernel is start-up (lazy init, compile, warm-up)"
        ),
        "window_ms": ms(iv.total(window)),
        "gpu_span_ms": ms(int(gpu.end_ns[work].max() - gpu.start_ns[work].min())) if work.any() else None,
        "first_kernel_ms": None,
        "startup_ms": None,
        "startup_blocked_ms": 0.0,
        "startup_blocking": [],
        # The analysed window on the wall clock, when the trace anchors its clock: findings from the
        # steady state cover this, not the profiler's whole span (start-up included).
        "window_start_unix": None,
        "window_end_unix": None,
    }
    if win is None:
        return out
    if rank.unix_offset_ns is not None:
        out["window_start_unix"] = (win[0] + rank.unix_offset_ns) / 1e9
        out["window_end_unix"] = (win[1] + rank.unix_offset_ns) / 1e9
    origin = host_start if host_start is not None else win[0]
    origin = min(origin, int(gpu.start_ns[work].min())) if work.any() else origin
    if kernels.any():
        out["first_kernel_ms"] = ms(int(gpu.start_ns[kernels].min()) - origin)
    startup = max(win[0] - origin, 0)
    out["startup_ms"] = ms(startup)
    if startup <= 0:
        return out
    rt, cpu = rank.runtime, rank.cpu_ops
    names = trace.strings
    by_kind: dict[tuple[str, str], list[int]] = {}
    blocked_parts: list[iv.Intervals] = []
    rows = [
        (k, int(rt.start_ns[i]), int(rt.dur_ns[i]), api_name(names[int(rt.name[i])]))
        for k, i in zip(blocking.rt_kind, blocking.rt_index.tolist(), strict=True)
    ] + [
        (ITEM, int(cpu.start_ns[i]), int(cpu.dur_ns[i]), names[int(cpu.name[i])]) for i in blocking.item_index
    ]
    for kind, start, dur, name in rows:
        if start >= win[0]:
            continue  # inside the window: steady state
        part = iv.clip(iv.union(np.array([start]), np.array([start + dur])), origin, win[0])
        blocked_parts.append(part)
        row = by_kind.setdefault((kind, name), [0, 0])
        row[0] += 1
        row[1] += iv.total(part)
    out["startup_blocked_ms"] = ms(iv.total(_union_of(blocked_parts)))
    out["startup_blocking"] = [
        {"kind": kind, "call": name, "count": c, "time_ms": ms(t)}
        for (kind, name), (c, t) in sorted(by_kind.items(), key=lambda kv: -kv[1][1])[:MAX_SITES]
    ]
    return out


def _in_window(blocking: _Blocking, rank: RankTrace, window: iv.Intervals) -> _Blocking:
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
    return _Blocking(
        ri[keep_rt],
        [k for k, keep in zip(blocking.rt_kind, keep_rt.tolist(), strict=True) if keep],
        ci[keep_item],
    )


def _per_step(idle_sync: iv.Intervals, steps: TbSteps) -> list[float]:
    """Host-sync idle in each step, as % of that step (steps of zero length are left out)."""
    starts, ends = steps.starts, steps.ends
    if starts.size == 0:
        return []
    edges = np.empty(2 * starts.size, dtype=np.int64)
    edges[0::2], edges[1::2] = starts, ends
    if np.any(np.diff(edges) < 0):  # overlapping steps: measure each on its own
        covered = np.array(
            [iv.total(iv.clip(idle_sync, int(a), int(b))) for a, b in zip(starts, ends, strict=True)]
        )
    else:
        # One pass over the sorted step edges; every other bin is a step, the rest the gaps between.
        covered = iv.overlap_with_bins(idle_sync, edges)[0::2]
    lengths = ends - starts
    keep = lengths > 0
    return [round(100.0 * float(c) / float(n), 4) for c, n in zip(covered[keep], lengths[keep], strict=True)]


def host_analysis(trace: Trace, rank: RankTrace, steps: TbSteps) -> dict[str, Any]:
    """The ``host_blocking``, ``input_pipeline``, ``gpu_idle_attribution`` and ``phases`` sections.

    `steps` are the TensorBoard plugin's steps; without ProfilerStep they are replaced by the GPU's
    steady state (`steady_steps`).
    """
    steps = steady_steps(rank, steps)
    window = _steps_union(steps)
    window_ns = iv.total(window)
    all_blocking, copy_memory = _blocking(trace, rank)
    rt, cpu = rank.runtime, rank.cpu_ops
    # Calls outside the window (start-up before the first kernel or step) are reported in `phases`.
    blocking = _in_window(all_blocking, rank, window)

    # --- blocked host time, per thread, inside the steps
    b_start = np.concatenate([rt.start_ns[blocking.rt_index], cpu.start_ns[blocking.item_index]])
    b_end = np.concatenate(
        [
            (rt.start_ns + rt.dur_ns)[blocking.rt_index],
            (cpu.start_ns + cpu.dur_ns)[blocking.item_index],
        ]
    )
    b_tid = np.concatenate([rt.tid[blocking.rt_index], cpu.tid[blocking.item_index]])
    blocked_ns = 0
    busy_ns = 0
    blocked_sets: list[iv.Intervals] = []
    host_busy_sets: list[iv.Intervals] = []
    for tid in np.unique(np.concatenate([rt.tid, cpu.tid])).tolist():
        on = b_tid == tid
        rt_on, cpu_on = rt.tid == tid, cpu.tid == tid
        busy = iv.intersect(
            window,
            iv.union(
                np.concatenate([rt.start_ns[rt_on], cpu.start_ns[cpu_on]]),
                np.concatenate([(rt.start_ns + rt.dur_ns)[rt_on], (cpu.start_ns + cpu.dur_ns)[cpu_on]]),
            ),
        )
        host_busy_sets.append(busy)
        if not on.any():
            continue
        blocked = iv.intersect(window, iv.union(b_start[on], b_end[on]))
        blocked_sets.append(blocked)
        blocked_ns += iv.total(blocked)
        busy_ns += iv.total(busy)
    blocked_any = _union_of(blocked_sets)
    host_busy_any = _union_of(host_busy_sets)

    by_kind: dict[str, list[float]] = {}
    for k, i in zip(blocking.rt_kind, blocking.rt_index.tolist(), strict=True):
        row = by_kind.setdefault(k, [0, 0])
        row[0] += 1
        row[1] += int(rt.dur_ns[i])
    if blocking.item_index.size:
        by_kind[ITEM] = [int(blocking.item_index.size), int(cpu.dur_ns[blocking.item_index].sum())]
    host_blocking: dict[str, Any] = {
        "basis": steps.source,
        "steps": int(steps.starts.size),
        "window_ms": ms(window_ns),
        "calls": int(blocking.rt_index.size + blocking.item_index.size),
        "blocked_ms": ms(blocked_ns),
        "step_pct": pct(blocked_ns, window_ns),
        "cpu_busy_ms": ms(busy_ns),
        "cpu_time_pct": pct(blocked_ns, busy_ns),
        "by_kind": [
            {"kind": k, "count": int(v[0]), "time_ms": ms(v[1])}
            for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1][1])
        ],
        **copy_memory,
        "sites": _sites(trace, rank, blocking, window_ns),
    }

    # --- input pipeline
    names = trace.strings
    dl_cpu = np.array([i for i in np.unique(cpu.name).tolist() if is_dataloader(names[i])], dtype=np.int32)
    ann = rank.annotations
    host_ann = ann.source != AnnotationSource.GPU
    dl_ann = np.array(
        [i for i in np.unique(ann.name[host_ann]).tolist() if is_dataloader(names[i])], dtype=np.int32
    )
    cpu_sel = np.isin(cpu.name, dl_cpu) if dl_cpu.size else np.zeros(len(cpu), dtype=bool)
    ann_sel = host_ann & np.isin(ann.name, dl_ann) if dl_ann.size else np.zeros(len(ann), dtype=bool)
    loader = iv.intersect(
        window,
        iv.union(
            np.concatenate([cpu.start_ns[cpu_sel], ann.start_ns[ann_sel]]),
            np.concatenate([(cpu.start_ns + cpu.dur_ns)[cpu_sel], (ann.start_ns + ann.dur_ns)[ann_sel]]),
        ),
    )
    loader_names = {names[i] for i in [*dl_cpu.tolist(), *dl_ann.tolist()]}
    iterator = (
        "single_process"
        if any("_SingleProcessDataLoaderIter" in n for n in loader_names)
        else "multi_process"
        if any("_MultiProcessingDataLoaderIter" in n for n in loader_names)
        else "datapipe"
        if any(n.startswith("enumerate(DataPipe)#") for n in loader_names)
        else None
    )

    # --- GPU idle attribution
    gpu = rank.gpu
    work = gpu.kind != OpKind.SYNC
    gpu_busy = iv.union(gpu.start_ns[work], gpu.end_ns[work])
    has_gpu = bool(work.any())
    idle = iv.subtract(window, gpu_busy) if has_gpu else iv.EMPTY
    idle_ns = iv.total(idle)
    idle_input = iv.intersect(idle, loader)
    rest = iv.subtract(idle, loader)
    # A blocking call that returns while the GPU is idle has drained the queue: the GPU then waits until
    # the host launches again, time it would have spent working had the host stayed ahead.
    sync_cover = _union_of([blocked_any, _drained(idle, blocked_any)])
    idle_sync = iv.intersect(rest, sync_cover)
    rest = iv.subtract(rest, sync_cover)
    gap_len = idle[1] - idle[0]
    short = gap_len < LAUNCH_GAP_MAX_NS
    launch = iv.intersect(rest, (idle[0][short], idle[1][short]))
    other = iv.subtract(rest, launch)
    launch_ns = iv.total(launch)
    gaps = []
    for i, lo in enumerate(GAP_EDGES_US):
        hi = GAP_EDGES_US[i + 1] if i + 1 < len(GAP_EDGES_US) else None
        sel = (gap_len >= lo * NS_PER_US) & ((gap_len < hi * NS_PER_US) if hi is not None else True)
        gaps.append(
            {"lower_us": lo, "upper_us": hi, "count": int(sel.sum()), "time_ms": ms(int(gap_len[sel].sum()))}
        )
    input_ns, sync_ns, other_ns = iv.total(idle_input), iv.total(idle_sync), iv.total(other)
    # Repetition: distinct idle gaps holding host-sync idle, and steps where it is a real share.
    sync_gaps, largest_gap_ns = _gaps_holding(idle_sync, idle)
    step_sync = _per_step(idle_sync, steps) if has_gpu else []
    host_work = _host_work(trace, rank, other, idle, steps, window_ns) if has_gpu else None
    attribution: dict[str, Any] = {
        "basis": steps.source,
        "steps": int(steps.starts.size),
        "window_ms": ms(window_ns),
        "has_gpu_ops": has_gpu,
        "idle_ms": ms(idle_ns),
        "idle_pct": pct(idle_ns, window_ns) if has_gpu else None,
        "input_ms": ms(input_ns),
        "input_pct": pct(input_ns, window_ns) if has_gpu else None,
        "host_sync_ms": ms(sync_ns),
        "host_sync_pct": pct(sync_ns, window_ns) if has_gpu else None,
        "launch_gaps_ms": ms(launch_ns),
        "launch_gaps_pct": pct(launch_ns, window_ns) if has_gpu else None,
        "other_ms": ms(other_ns),
        "other_pct": pct(other_ns, window_ns) if has_gpu else None,
        "launch_gap_max_us": LAUNCH_GAP_MAX_NS / NS_PER_US,
        "launch_gaps_host_busy_pct": pct(iv.total(iv.intersect(launch, host_busy_any)), launch_ns),
        "idle_gaps": gaps,
        "host_sync_gaps": sync_gaps,
        "host_sync_largest_gap_pct": pct(largest_gap_ns, sync_ns),
        "host_sync_steps": sum(1 for v in step_sync if v >= STEP_SHARE_MIN_PCT),
        "host_sync_step_min_pct": STEP_SHARE_MIN_PCT,
        "host_sync_step_pcts": step_sync[:MAX_STEP_VALUES],
        "host_work": host_work,
    }
    loader_ns = iv.total(loader)
    input_pipeline = {
        "basis": steps.source,
        "dataloader_calls": int(cpu_sel.sum() + ann_sel.sum()),
        "dataloader_ms": ms(loader_ns),
        "dataloader_step_pct": pct(loader_ns, window_ns),
        "gpu_idle_in_dataloader_pct": attribution["input_pct"],
        "iterator": iterator,
    }
    return {
        "host_blocking": host_blocking,
        "input_pipeline": input_pipeline,
        "gpu_idle_attribution": attribution,
        "phases": phases(trace, rank, steps, all_blocking, window),
    }


def _launching_tids(rank: RankTrace) -> npt.NDArray[np.int64]:
    """Threads whose runtime calls launched GPU work (matched on the correlation id)."""
    rt, gpu = rank.runtime, rank.gpu
    corr = gpu.correlation[(gpu.kind != OpKind.SYNC) & (gpu.correlation >= 0)]
    if corr.size == 0 or len(rt) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.unique(rt.tid[(rt.correlation >= 0) & np.isin(rt.correlation, corr)]).astype(np.int64)


def _late_gaps(rank: RankTrace, idle: iv.Intervals) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """For each idle gap: (late, queued) -- was the GPU op that ends it launched after the gap began (the
    queue ran dry), or before it (it was queued and waited on something else)?

    HTA's host-wait test (see `trace_analysis.idle_breakdown`) on the union of the streams: of the ops
    starting when the gap ends, the earliest launched decides. A gap no op ends (the window's edge) or
    ended by an op whose launching call is not in the trace is neither.
    """
    g0, g1 = idle
    out = np.zeros(g0.size, dtype=bool)
    gpu, rt = rank.gpu, rank.runtime
    work = (gpu.kind != OpKind.SYNC) & (gpu.correlation >= 0)
    if g0.size == 0 or not work.any() or len(rt) == 0:
        return out, out.copy()
    has = rt.correlation >= 0
    if not has.any():
        return out, out.copy()
    order = np.argsort(rt.correlation[has], kind="stable")
    r_corr, r_start = rt.correlation[has][order], rt.start_ns[has][order]
    o_corr, o_start = gpu.correlation[work], gpu.start_ns[work]
    pos = np.clip(np.searchsorted(r_corr, o_corr, side="right") - 1, 0, r_corr.size - 1)
    known = r_corr[pos] == o_corr
    launch = np.where(known, r_start[pos], np.iinfo(np.int64).max).astype(np.int64)
    # Earliest launch among the ops starting at each instant.
    by = np.lexsort((launch, o_start))
    o_start, launch = o_start[by], launch[by]
    first = np.searchsorted(o_start, g1, side="left")
    ok = first < o_start.size
    ok[ok] = o_start[first[ok]] == g1[ok]
    idx = first[ok]
    known_launch = launch[idx] != np.iinfo(np.int64).max
    out[ok] = (launch[idx] > g0[ok]) & known_launch
    queued = np.zeros(g0.size, dtype=bool)
    queued[ok] = (launch[idx] <= g0[ok]) & known_launch
    return out, queued


def _covered_before(cover: iv.Intervals, t: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Time of the disjoint set `cover` before each instant of `t`."""
    s, e = cover
    out = np.zeros(t.size, dtype=np.int64)
    if s.size == 0:
        return out
    cum = np.concatenate([[0], np.cumsum(e - s)])
    idx = np.searchsorted(s, t, side="right") - 1
    ok = idx >= 0
    out[ok] = cum[idx[ok]] + np.minimum(t[ok], e[idx[ok]]) - s[idx[ok]]
    return out


def _outermost_rows(start: npt.NDArray[np.int64], end: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Which of one thread's ops no other op encloses (vectorised `_outermost`)."""
    order = np.lexsort((-(end - start), start))
    e = end[order]
    prev_max = np.maximum.accumulate(e)
    top = np.ones(e.size, dtype=bool)
    top[1:] = e[1:] > prev_max[:-1]
    out = np.zeros(e.size, dtype=bool)
    out[order] = top
    return out


def _host_work(
    trace: Trace,
    rank: RankTrace,
    other: iv.Intervals,
    idle: iv.Intervals,
    steps: TbSteps,
    window_ns: int,
) -> dict[str, Any]:
    """What the host did while the GPU sat in the idle gaps no other category explains (``other``).

    The GPU waits for the host when a gap ends with a *late launch* (the op that ends it was launched
    after the gap began: nothing was queued, `_late_gaps`). What the threads that launch GPU work did
    meanwhile names the cause; each instant of late-launch idle goes to the first of:

    * *communication*: a launching thread inside a host-side collective call (``nccl:*``, ``c10d::*``,
      ``record_param_comms``): it waits for other ranks;
    * *runtime*: inside a CUDA/HIP runtime or driver call that does not block on the GPU (those are
      host_sync): allocations (``cudaMalloc``: the caching allocator growing), stream/event creation,
      lazy module loading in a kernel's first ``cudaLaunchKernel`` -- initialisation and allocator
      churn, not computation;
    * *cpu_ops*: inside a traced operator but in no runtime call: CPU-bound host work between kernels
      (pre/post-processing on CPU tensors, Python-side model logic, per-parameter optimizer loops);
    * *untraced*: in no traced event on a launching thread: Python between operators, ``time.sleep``,
      file or network I/O, the GIL held by another thread -- the trace cannot tell them apart
      (``python_function`` events are not read).

    Idle in gaps whose ending op was launched before the gap began is *queued*: the GPU was not waiting
    for a launch (a cross-stream dependency or a device-side wait). Gaps no op ends (at the window's edge)
    or whose ending op's launch is not in the trace are *unknown*. Repetition of the cpu_ops part (how
    many gaps hold it, the largest one's share, the steps that show it) lets a rule tell the steady
    state from a one-off.
    """
    late, was_queued = _late_gaps(rank, idle)
    dry = iv.intersect(other, (idle[0][late], idle[1][late]))
    queued = iv.intersect(other, (idle[0][was_queued], idle[1][was_queued]))
    unknown_ns = iv.total(other) - iv.total(dry) - iv.total(queued)
    cpu, rt, names = rank.cpu_ops, rank.runtime, trace.strings
    tids = _launching_tids(rank)
    cpu_on = np.isin(cpu.tid, tids)
    rt_on = np.isin(rt.tid, tids)
    op_names = np.unique(cpu.name[cpu_on]).tolist()
    comm_ids = np.array([i for i in op_names if _COMM_OP_RE.search(names[i])], dtype=np.int32)
    loader_ids = np.array([i for i in op_names if is_dataloader(names[i])], dtype=np.int32)
    is_comm = cpu_on & np.isin(cpu.name, comm_ids)
    is_work = cpu_on & ~is_comm & ~np.isin(cpu.name, loader_ids)
    cpu_end = cpu.start_ns + cpu.dur_ns
    rt_end = rt.start_ns + rt.dur_ns
    in_comm = iv.intersect(dry, iv.union(cpu.start_ns[is_comm], cpu_end[is_comm]))
    rest = iv.subtract(dry, in_comm)
    in_rt = iv.intersect(rest, iv.union(rt.start_ns[rt_on], rt_end[rt_on]))
    rest = iv.subtract(rest, in_rt)
    in_ops = iv.intersect(rest, iv.union(cpu.start_ns[is_work], cpu_end[is_work]))
    untraced = iv.subtract(rest, in_ops)
    ops_ns, rt_ns, dry_ns = iv.total(in_ops), iv.total(in_rt), iv.total(dry)
    gaps, largest_ns = _gaps_holding(in_ops, idle)
    per_step = _per_step(in_ops, steps)
    return {
        "basis": "late-launch idle (the GPU had nothing queued) in the gaps counted as other",
        "launching_threads": int(tids.size),
        "late_launch_ms": ms(dry_ns),
        "late_launch_pct": pct(dry_ns, window_ns),
        "queued_ms": ms(iv.total(queued)),
        "queued_pct": pct(iv.total(queued), window_ns),
        "unknown_ms": ms(unknown_ns),
        "unknown_pct": pct(unknown_ns, window_ns),
        "communication_ms": ms(iv.total(in_comm)),
        "communication_pct": pct(iv.total(in_comm), window_ns),
        "runtime_ms": ms(rt_ns),
        "runtime_pct": pct(rt_ns, window_ns),
        "cpu_ops_ms": ms(ops_ns),
        "cpu_ops_pct": pct(ops_ns, window_ns),
        "untraced_ms": ms(iv.total(untraced)),
        "untraced_pct": pct(iv.total(untraced), window_ns),
        "cpu_ops_gaps": gaps,
        "cpu_ops_largest_gap_pct": pct(largest_ns, ops_ns),
        "cpu_ops_steps": sum(1 for v in per_step if v >= STEP_SHARE_MIN_PCT),
        "cpu_ops_step_pcts": per_step[:MAX_STEP_VALUES],
        # The outermost operators (what the host was busy with) and the runtime calls filling that idle.
        "top_ops": _top_by_name(
            trace,
            cpu.start_ns[is_work],
            cpu_end[is_work],
            cpu.name[is_work],
            cpu.tid[is_work],
            in_ops,
            window_ns,
        ),
        "top_runtime": _top_by_name(
            trace, rt.start_ns[rt_on], rt_end[rt_on], rt.name[rt_on], rt.tid[rt_on], in_rt, window_ns
        ),
    }


def _top_by_name(
    trace: Trace,
    start: npt.NDArray[np.int64],
    end: npt.NDArray[np.int64],
    name: npt.NDArray[np.int32],
    tid: npt.NDArray[np.int64],
    cover: iv.Intervals,
    window_ns: int,
) -> list[dict[str, Any]]:
    """The outermost events (per thread) overlapping `cover`, by name, largest overlap first."""
    if cover[0].size == 0 or start.size == 0:
        return []
    outer = np.zeros(start.size, dtype=bool)
    for t in np.unique(tid).tolist():
        on = tid == t
        outer[on] = _outermost_rows(start[on], end[on])
    start, end, name = start[outer], end[outer], name[outer]
    overlap = _covered_before(cover, end) - _covered_before(cover, start)
    hit = overlap > 0
    code, inverse = np.unique(name[hit], return_inverse=True)
    time_by = np.bincount(inverse, weights=overlap[hit].astype(np.float64), minlength=code.size)
    count_by = np.bincount(inverse, minlength=code.size)
    return [
        {
            "name": trace.strings[int(code[j])][:MAX_SITE_CHARS],
            "count": int(count_by[j]),
            "idle_ms": ms(int(time_by[j])),
            "idle_pct": pct(int(time_by[j]), window_ns),
        }
        for j in np.argsort(-time_by, kind="stable")[:MAX_SITES].tolist()
    ]


def _gaps_holding(part: iv.Intervals, idle: iv.Intervals) -> tuple[int, int]:
    """How many idle gaps hold some of `part` (a subset of `idle`), and the most one of them holds (ns)."""
    if part[0].size == 0 or idle[0].size == 0:
        return 0, 0
    gap_of = np.searchsorted(idle[0], part[0], side="right") - 1
    ok = gap_of >= 0
    per_gap = np.bincount(gap_of[ok], weights=(part[1] - part[0])[ok].astype(np.float64))
    return int((per_gap > 0).sum()), int(per_gap.max()) if per_gap.size else 0


def _drained(idle: iv.Intervals, blocked: iv.Intervals) -> iv.Intervals:
    """The part of each idle gap after a blocking call ended inside it: from the first such end, for at
    most `LAUNCH_GAP_MAX_NS` (the time to relaunch; beyond it the host was busy with something else)."""
    g0, g1 = idle
    ends = blocked[1]
    if g0.size == 0 or ends.size == 0:
        return iv.EMPTY
    first = np.searchsorted(ends, g0, side="left")  # first blocked end at or after the gap start
    ok = first < ends.size
    starts = np.where(ok, ends[np.minimum(first, ends.size - 1)], g1)
    keep = ok & (starts < g1)
    # Relaunching after a drain takes launch-gap time; a longer gap means the host went on to other work.
    return starts[keep], np.minimum(g1[keep], starts[keep] + LAUNCH_GAP_MAX_NS)


def _union_of(sets: list[iv.Intervals]) -> iv.Intervals:
    if not sets:
        return iv.EMPTY
    return iv.union(np.concatenate([s for s, _ in sets]), np.concatenate([e for _, e in sets]))


def _sites(trace: Trace, rank: RankTrace, blocking: _Blocking, window_ns: int) -> list[dict[str, Any]]:
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
