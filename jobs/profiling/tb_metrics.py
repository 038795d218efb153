"""The PyTorch TensorBoard profiler plugin's GPU metrics and step breakdown, over our event model.

Re-implemented from torch_tb_profiler (pytorch/kineto tb_plugin, last version before its removal):
`event_parser.StepParser` (steps and their device-side extension), `gpu_metrics_parser.GPUMetricsParser`
(GPU utilization, est. SM efficiency, est. achieved occupancy) and `overall_parser.OverallParser` (step
time breakdown by role). Checked against the plugin's golden file tbplugin_gpu_metrics_expected.json.

* Steps: CPU ``ProfilerStep#N`` ranges (or, with none, the CPU operators' extent), each stretched to cover
  the device ops launched from inside it; trailing steps that launched nothing -- or far less than the
  step before -- are dropped, as the profiler may have missed their kernels.
* GPU utilization = union of kernel time inside the steps / step wall time.
* Est. SM efficiency = time-weighted min(sum of concurrent kernels' blocks per SM, 1) over the steps.
* Est. achieved occupancy = kernel-duration-weighted mean of Kineto's "est. achieved occupancy %".
* Step breakdown: each instant of a step goes to the first role active in the order Kernel > Memcpy >
  Memset > Communication > Runtime > DataLoader > CPU Exec > Other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from jobs.profiling import intervals as iv
from jobs.profiling.events import AnnotationSource, GpuOps, KernelClass, OpKind, RankTrace, Trace
from jobs.profiling.units import NS_PER_US, ms, pct

_PROFILER_STEP_RE = re.compile(r"^ProfilerStep#(\d+)")
_COMM_OP_RE = re.compile(r"^(nccl|gloo):")
ROLES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec")


@dataclass
class TbSteps:
    """Steps as the plugin defines them, after extending to device time and dropping tail steps."""

    starts: npt.NDArray[np.int64]
    ends: npt.NDArray[np.int64]
    names: list[str]
    removed_tail_steps: int
    source: str  # "ProfilerStep" | "cpu_ops" | "gpu_ops" | "none"

    @property
    def window(self) -> tuple[int, int] | None:
        """[first step start, last step end), or None without steps."""
        if self.starts.size == 0:
            return None
        return int(self.starts[0]), int(self.ends[-1])


def _is_dataloader(name: str) -> bool:
    return (name.startswith("enumerate(DataLoader)#") and name.endswith(".__next__")) or name.startswith(
        "enumerate(DataPipe)#"
    )


def tb_steps(trace: Trace, rank: RankTrace) -> TbSteps:
    """StepParser.parse_steps + update_device_steps."""
    ann = rank.annotations
    host: list[tuple[int, int, str]] = []
    for row in np.flatnonzero(ann.source == AnnotationSource.CPU):
        name = trace.strings[int(ann.name[row])]
        if _PROFILER_STEP_RE.match(name):
            host.append((int(ann.start_ns[row]), int(ann.start_ns[row] + ann.dur_ns[row]), name))
    source = "ProfilerStep"
    if not host:
        cpu = rank.cpu_ops
        if len(cpu):
            host = [(int(cpu.start_ns.min()), int((cpu.start_ns + cpu.dur_ns).max()), "0")]
            source = "cpu_ops"
        elif len(rank.gpu):
            host = [(int(rank.gpu.start_ns.min()), int(rank.gpu.end_ns.max()), "0")]
            source = "gpu_ops"
        else:
            return TbSteps(np.zeros(0, np.int64), np.zeros(0, np.int64), [], 0, "none")
    host.sort()
    hs = np.array([h[0] for h in host], dtype=np.int64)
    he = np.array([h[1] for h in host], dtype=np.int64)
    names = [h[2] for h in host]

    dev = rank.gpu.take(rank.gpu.kind != OpKind.SYNC)
    rt = rank.runtime
    # Which step (if any) each runtime call lies entirely inside.
    rt_step = np.searchsorted(hs, rt.start_ns, side="right") - 1
    inside = rt_step >= 0
    inside[inside] = (rt.start_ns + rt.dur_ns)[inside] <= he[rt_step[inside]]
    rt_step = np.where(inside, rt_step, -1)
    # Each device op's launching runtime call, by correlation id.
    op_step = np.full(len(dev), -1, dtype=np.int64)
    has_corr = rt.correlation >= 0
    if has_corr.any() and len(dev):
        corr = rt.correlation[has_corr]
        steps_of_corr = rt_step[has_corr]
        order = np.argsort(corr, kind="stable")
        corr, steps_of_corr = corr[order], steps_of_corr[order]
        pos = np.searchsorted(corr, dev.correlation, side="right") - 1
        ok = (pos >= 0) & (dev.correlation >= 0)
        ok[ok] = corr[pos[ok]] == dev.correlation[ok]
        op_step[ok] = steps_of_corr[pos[ok]]
    n = hs.size
    matched = op_step >= 0
    dev_min = np.full(n, np.iinfo(np.int64).max)
    dev_max = np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(dev_min, op_step[matched], dev.start_ns[matched])
    np.maximum.at(dev_max, op_step[matched], dev.end_ns[matched])
    counts = np.bincount(op_step[matched], minlength=n)

    removed = 0
    if matched.any():
        prev_end = int(hs[0])
        if counts[0] > 0:
            early = ~matched & (dev.end_ns < dev_min[0])
            if early.any():
                prev_end = max(prev_end, int(dev.end_ns[early].max()))
        new_s, new_e = hs.copy(), he.copy()
        for i in range(n):
            start = max(prev_end, int(hs[i]))
            end = max(int(he[i]), start) if counts[i] == 0 else max(int(he[i]), int(dev_max[i]))
            end = max(end, start)
            new_s[i], new_e[i] = start, end
            prev_end = end
        hs, he = new_s, new_e
        if n > 1:
            nonzero = np.flatnonzero(counts > 0)
            if nonzero.size:
                last = int(nonzero[-1])
                keep = last + 1
                if last > 0 and counts[last - 1] * 0.8 > counts[last]:
                    keep = last
                removed = n - keep
                hs, he, names = hs[:keep], he[:keep], names[:keep]
    return TbSteps(hs, he, names, removed, source)


def sm_efficiency_ranges(
    starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], blocks_per_sm: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """The plugin's `merge_ranges_with_value`: piecewise min(sum of blocks per SM, 1) over time."""
    if starts.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0)
    times = np.concatenate([starts, ends])
    kind = np.concatenate([np.zeros(starts.size, np.int8), np.ones(ends.size, np.int8)])
    value = np.concatenate([blocks_per_sm, -blocks_per_sm])
    order = np.lexsort((kind, times))  # a start sorts before an end at the same time, as in the plugin
    times, value = times[order], value[order]
    running = np.cumsum(value)
    seg_s, seg_e, seg_v = times[:-1], times[1:], running[:-1]
    keep = (seg_e > seg_s) & (seg_v > 0.0)
    return seg_s[keep], seg_e[keep], np.minimum(seg_v[keep], 1.0)


def utilization_timeline(
    kernels: GpuOps, global_start: int, global_end: int
) -> tuple[int, list[tuple[int, float]]]:
    """The plugin's GPU utilization counter: (bucket size in us, [(bucket start ns, utilization)...]).

    Buckets are a power of ten microseconds, at most 100 of them; the last one stretches to the end.
    """
    range_us = (global_end - global_start) / NS_PER_US
    bucket_us = 1
    while range_us / bucket_us > 100:
        bucket_us *= 10
    buckets = int(range_us / bucket_us)
    if buckets <= 0:
        return bucket_us, []
    edges = global_start + np.arange(buckets + 1, dtype=np.int64) * bucket_us * NS_PER_US
    edges[-1] = global_end
    union = iv.union(kernels.start_ns, kernels.end_ns)
    covered = iv.overlap_with_bins(union, edges)
    widths = np.diff(edges)
    points = [(int(edges[i]), float(covered[i] / widths[i])) for i in range(buckets)]
    points.append((int(edges[-1]), 0.0))
    return bucket_us, points


def _blocks_per_sm(rank: RankTrace, k: GpuOps) -> npt.NDArray[np.float64]:
    """Kineto's "blocks per SM", or grid blocks / SM count where only the grid is known (nsys)."""
    bps = k.blocks_per_sm.copy()
    missing = np.isnan(bps) & (k.grid_blocks > 0)
    if missing.any():
        sms = np.array(
            [((d := rank.device_by_id(int(x))) and d.num_sms) or 0 for x in k.device], dtype=np.float64
        )
        fill = missing & (sms > 0)
        bps[fill] = k.grid_blocks[fill] / sms[fill]
    return bps


def device_metrics(rank: RankTrace, steps: TbSteps, global_window: tuple[int, int]) -> list[dict[str, Any]]:
    """GPU utilization, est. SM efficiency and est. achieved occupancy for each device of the rank."""
    window = steps.window
    kernels_all = rank.gpu.take(rank.gpu.kind == OpKind.KERNEL)
    out: list[dict[str, Any]] = []
    for device in np.unique(kernels_all.device).tolist():
        k = kernels_all.take(kernels_all.device == device)
        entry: dict[str, Any] = {
            "device": int(device),
            "kernel_time_ms": ms(int(k.dur_ns.sum())),
            "gpu_utilization_pct": None,
            "est_sm_efficiency_pct": None,
            "est_achieved_occupancy_pct": None,
        }
        if window is not None and window[1] > window[0]:
            lo, hi = window
            total = hi - lo
            union = iv.union(k.start_ns, k.end_ns)
            entry["gpu_utilization_pct"] = pct(iv.total(iv.clip(union, lo, hi)), total)
            bps = _blocks_per_sm(rank, k)
            pos = bps > 0
            if pos.any():
                s, e, v = sm_efficiency_ranges(k.start_ns[pos], k.end_ns[pos], bps[pos])
                cs, ce = np.maximum(s, lo), np.minimum(e, hi)
                inside = ce > cs
                if inside.any():
                    weighted = float((v[inside] * (ce[inside] - cs[inside])).sum())
                    entry["est_sm_efficiency_pct"] = round(100.0 * weighted / total, 4)
            occ = k.occupancy_pct
            has = ~np.isnan(occ) & (occ >= 0)
            cs, ce = np.maximum(k.start_ns[has], lo), np.minimum(k.end_ns[has], hi)
            inside = ce > cs
            if inside.any():
                d = (ce[inside] - cs[inside]).astype(np.float64)
                entry["est_achieved_occupancy_pct"] = round(float((occ[has][inside] * d).sum() / d.sum()), 4)
        bucket_us, points = utilization_timeline(k, *global_window)
        entry["utilization_timeline"] = {
            "bucket_us": bucket_us,
            "points": [[ms(t - global_window[0]), round(u, 6)] for t, u in points],
        }
        out.append(entry)
    return out


def _global_window(rank: RankTrace) -> tuple[int, int] | None:
    if rank.window_ns is not None and rank.window_ns[1] > rank.window_ns[0]:
        return rank.window_ns
    lows, highs = [], []
    for table in (rank.gpu, rank.runtime, rank.cpu_ops, rank.annotations):
        if len(table):
            lows.append(int(table.start_ns.min()))
            highs.append(int((table.start_ns + table.dur_ns).max()))
    return (min(lows), max(highs)) if lows else None


def _role_sets(trace: Trace, rank: RankTrace) -> list[iv.Intervals]:
    gpu = rank.gpu
    kern = gpu.kind == OpKind.KERNEL
    comm_k = kern & (gpu.kclass == KernelClass.COMMUNICATION)
    names = trace.strings
    cpu_ids = np.unique(rank.cpu_ops.name).tolist()
    ann_cpu = rank.annotations.take(rank.annotations.source == AnnotationSource.CPU)
    ann_ids = np.unique(ann_cpu.name).tolist()
    dl_ids = np.array([i for i in set(cpu_ids) | set(ann_ids) if _is_dataloader(names[i])], dtype=np.int32)
    comm_ids = np.array(
        [i for i in set(cpu_ids) | set(ann_ids) if _COMM_OP_RE.match(names[i])], dtype=np.int32
    )
    step_ids = np.array([i for i in ann_ids if _PROFILER_STEP_RE.match(names[i])], dtype=np.int32)

    def host_union(select_ids: npt.NDArray[np.int32], exclude: bool = False) -> iv.Intervals:
        parts_s, parts_e = [], []
        for table in (rank.cpu_ops, ann_cpu):
            sel = np.isin(table.name, select_ids)
            if exclude:
                sel = ~sel & ~np.isin(table.name, step_ids)
            parts_s.append(table.start_ns[sel])
            parts_e.append((table.start_ns + table.dur_ns)[sel])
        return iv.union(np.concatenate(parts_s), np.concatenate(parts_e))

    def gpu_union(mask: npt.NDArray[np.bool_]) -> iv.Intervals:
        return iv.union(gpu.start_ns[mask], gpu.end_ns[mask])

    comm_host = host_union(comm_ids)
    comm = iv.union(
        np.concatenate([gpu.start_ns[comm_k], comm_host[0]]),
        np.concatenate([gpu.end_ns[comm_k], comm_host[1]]),
    )
    rt = rank.runtime
    return [
        gpu_union(kern & ~comm_k),
        gpu_union(gpu.kind == OpKind.MEMCPY),
        gpu_union(gpu.kind == OpKind.MEMSET),
        comm,
        iv.union(rt.start_ns, rt.start_ns + rt.dur_ns),
        host_union(dl_ids),
        host_union(np.concatenate([dl_ids, comm_ids]), exclude=True),
    ]


def step_breakdown(trace: Trace, rank: RankTrace, steps: TbSteps) -> dict[str, Any]:
    """OverallParser: average step time split by role in priority order, plus the DataLoader share."""
    result: dict[str, Any] = {"steps": int(steps.starts.size), "step_ms_mean": None}
    result.update({f"{role}_pct": None for role in (*ROLES, "other")})
    result["per_step"] = []
    if steps.starts.size == 0:
        return result
    roles = _role_sets(trace, rank)
    slots = iv.union(steps.starts, steps.ends)
    costs: list[iv.Intervals] = []
    for role in roles:
        part = iv.intersect(slots, role)
        costs.append(part)
        slots = iv.subtract(slots, part)
    costs.append(slots)  # Other: step time no role claimed
    sums = np.zeros(len(costs))
    total = 0
    for s, e, name in zip(steps.starts.tolist(), steps.ends.tolist(), steps.names, strict=True):
        dur = e - s
        per = [iv.total(iv.clip(c, s, e)) for c in costs]
        sums += per
        total += dur
        if len(result["per_step"]) < 1000:
            result["per_step"].append(
                {
                    "name": name,
                    "duration_ms": ms(dur),
                    **{f"{r}_ms": ms(v) for r, v in zip((*ROLES, "other"), per, strict=True)},
                }
            )
    n = steps.starts.size
    result["step_ms_mean"] = ms(total / n)
    for role_name, value in zip((*ROLES, "other"), sums, strict=True):
        result[f"{role_name}_pct"] = pct(value, total)
    result["dataloader_share_pct"] = result["dataloader_pct"]
    return result


def gpu_metrics(rank: RankTrace, steps: TbSteps) -> dict[str, Any]:
    """The ``tb_gpu_metrics`` section over `steps`: the main device's figures and every device's."""
    gwin = _global_window(rank)
    devices = device_metrics(rank, steps, gwin) if gwin is not None else []
    main = max(devices, key=lambda d: d["kernel_time_ms"]) if devices else None
    window = steps.window
    return {
        "steps_source": steps.source,
        "steps": int(steps.starts.size),
        "removed_tail_steps": steps.removed_tail_steps,
        "steps_window_ms": ms(window[1] - window[0]) if window else None,
        "device": main["device"] if main else None,
        "gpu_utilization_pct": main["gpu_utilization_pct"] if main else None,
        "est_sm_efficiency_pct": main["est_sm_efficiency_pct"] if main else None,
        "est_achieved_occupancy_pct": main["est_achieved_occupancy_pct"] if main else None,
        "per_device": devices,
    }
