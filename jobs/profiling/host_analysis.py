"""What the host did while the GPU waited: blocking calls, the input pipeline, launch gaps.

Three sections of a rank's trace analysis, all measured over the same steps (`tb_metrics.tb_steps`: the
``ProfilerStep#N`` ranges stretched to their GPU work, else the traced extent), so their shares add up:

* ``host_blocking``: every CPU call that blocks the host on the GPU, as time and as a share of the step
  and of the host's busy (traced) time, with the call sites that block (which calls block, and
  how a site is read: `host_blocking`).
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
* ``gpu_idle_attribution.host_work``: what the host did during *other* (`host_work.host_work_breakdown`).

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

from typing import Any

import numpy as np

from jobs.profiling import intervals as iv
from jobs.profiling.events import (
    AnnotationSource,
    OpKind,
    RankTrace,
    Trace,
)
from jobs.profiling.host_blocking import (
    ITEM,
    MAX_SITES,
    Blocking,
    api_name,
    blocking_sites,
    find_blocking,
    in_window,
    is_dataloader,
)
from jobs.profiling.host_work import (
    MAX_STEP_VALUES,
    STEP_SHARE_MIN_PCT,
    gaps_holding,
    host_work_breakdown,
    per_step_pcts,
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
    trace: Trace, rank: RankTrace, steps: TbSteps, blocking: Blocking, window: iv.Intervals
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


def host_analysis(trace: Trace, rank: RankTrace, steps: TbSteps) -> dict[str, Any]:
    """The ``host_blocking``, ``input_pipeline``, ``gpu_idle_attribution`` and ``phases`` sections.

    `steps` are the TensorBoard plugin's steps; without ProfilerStep they are replaced by the GPU's
    steady state (`steady_steps`).
    """
    steps = steady_steps(rank, steps)
    window = _steps_union(steps)
    window_ns = iv.total(window)
    all_blocking, copy_memory = find_blocking(trace, rank)
    rt, cpu = rank.runtime, rank.cpu_ops
    # Calls outside the window (start-up before the first kernel or step) are reported in `phases`.
    blocking = in_window(all_blocking, rank, window)

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
        "sites": blocking_sites(trace, rank, blocking, window_ns),
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
    sync_gaps, largest_gap_ns = gaps_holding(idle_sync, idle)
    step_sync = per_step_pcts(idle_sync, steps) if has_gpu else []
    host_work = host_work_breakdown(trace, rank, other, idle, steps, window_ns) if has_gpu else None
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
