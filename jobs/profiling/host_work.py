"""What the host did while the GPU waited in the idle no other category explains
(``gpu_idle_attribution.host_work``), and the repetition measures (per step, per idle gap) that the host
analysis's sections share.

`host_analysis` calls `host_work_breakdown` for the idle it counts as *other*. A gap whose ending op was
launched after the gap began (HTA's host-wait test: nothing was queued) is the GPU waiting for the host;
its idle is split by what the launching threads were in: a host-side collective, a non-blocking runtime
call (allocation, lazy init), a traced CPU operator (CPU-bound work between kernels: the launch queue runs
dry), or nothing traced (Python, sleep, I/O). Gaps whose ending op was already queued are *queued* (a
dependency, not the host).

Pure numpy over the columnar event model; no Django.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import numpy.typing as npt

from jobs.profiling import intervals as iv
from jobs.profiling.events import OpKind, RankTrace, Trace, unique_inverse
from jobs.profiling.host_blocking import MAX_SITE_CHARS, MAX_SITES, is_dataloader
from jobs.profiling.tb_metrics import TbSteps
from jobs.profiling.units import ms, pct

#: A step counts as showing host-sync idle when that idle is at least this share of the step (%).
STEP_SHARE_MIN_PCT = 1.0


#: Longest list of per-step values carried in a result.
MAX_STEP_VALUES = 200


# Host-side collective calls: a host inside one waits for other ranks (communication), not on its own work.
_COMM_OP_RE = re.compile(r"^(?:nccl|gloo|c10d|mpi|ucc)[:_]|^record_param_comms$|^ProcessGroup")


def per_step_pcts(idle_sync: iv.Intervals, steps: TbSteps) -> list[float]:
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

    HTA's host-wait test (see `hta_breakdowns.idle_breakdown`) on the union of the streams: of the ops
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
    """Which of one thread's ops no other op encloses (vectorised `host_blocking._outermost`)."""
    order = np.lexsort((-(end - start), start))
    e = end[order]
    prev_max = np.maximum.accumulate(e)
    top = np.ones(e.size, dtype=bool)
    top[1:] = e[1:] > prev_max[:-1]
    out = np.zeros(e.size, dtype=bool)
    out[order] = top
    return out


def host_work_breakdown(
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
    gaps, largest_ns = gaps_holding(in_ops, idle)
    per_step = per_step_pcts(in_ops, steps)
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
    code, inverse = unique_inverse(name[hit])  # np.unique's inverse sorts: 17 ms at 119k names
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


def gaps_holding(part: iv.Intervals, idle: iv.Intervals) -> tuple[int, int]:
    """How many idle gaps hold some of `part` (a subset of `idle`), and the most one of them holds (ns)."""
    if part[0].size == 0 or idle[0].size == 0:
        return 0, 0
    gap_of = np.searchsorted(idle[0], part[0], side="right") - 1
    ok = gap_of >= 0
    per_gap = np.bincount(gap_of[ok], weights=(part[1] - part[0])[ok].astype(np.float64))
    return int((per_gap > 0).sum()), int(per_gap.max()) if per_gap.size else 0
