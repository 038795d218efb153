"""GPU-op statistics: kernel breakdown, launch delay, memcpy/memset/sync time, overlap, tensor cores.

Each function takes the rank's windowed `GpuOps` (see `trace_analysis.analysis_window`) and returns a
JSON-serialisable dict with units in the key names. HTA equivalents: `get_gpu_kernel_breakdown`,
`get_cuda_kernel_launch_stats`, `get_comm_comp_overlap`; the tensor-core share is the TensorBoard
plugin's, classified by `kernel_classes.math_class`.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import numpy.typing as npt

from jobs.profiling import intervals as iv
from jobs.profiling.events import (
    COPY_KIND_LABELS,
    SYNC_KIND_NAMES,
    CopyKind,
    GpuOps,
    KernelClass,
    MemKind,
    OpKind,
    RuntimeCalls,
    Trace,
    unique_inverse,
)
from jobs.profiling.kernel_classes import MathClass, math_class
from jobs.profiling.units import NS_PER_US, ms, pct

#: Kernel duration histogram edges, in microseconds (the last bin is open-ended).
HISTOGRAM_EDGES_US: tuple[float, ...] = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10_000)
#: Longest kernel name we put in a result; C++ template names run to many kilobytes.
MAX_NAME_CHARS = 1000

_CPU_SYNC_RE = re.compile(r"synchronize", re.IGNORECASE)
_CLASS_NAMES = {c.value: c.name for c in KernelClass}


def _name(trace: Trace, idx: int) -> str:
    name = trace.strings[idx]
    return name if len(name) <= MAX_NAME_CHARS else name[: MAX_NAME_CHARS - 1] + "…"


def shorten_kernel_name(name: str) -> str:
    """HTA's `shorten_name`: drop template and function arguments, keep the last word.

    "void at::native::foo_kernel<4, ...>(int, ...)" -> "at::native::foo_kernel"
    """
    if name.startswith(("Memcpy", "Memset", "dma")) or ("<" not in name and "(" not in name):
        return name
    stack: list[str] = []
    for c in name.replace("->", ""):
        if c == ">":
            while stack and stack[-1] != "<":
                stack.pop()
            if stack:
                stack.pop()
        elif c == ")":
            while stack and stack[-1] != "(":
                stack.pop()
            if stack:
                stack.pop()
        else:
            stack.append(c)
    short = "".join(stack).split(" ")[-1]
    return short or name


def _group_stats(names: npt.NDArray[np.int32], durs: npt.NDArray[np.int64]) -> dict[str, npt.NDArray[Any]]:
    uniq, inverse = unique_inverse(names)  # np.unique's inverse sorts: 5 ms at 47k kernels
    d = durs.astype(np.float64)
    count = np.bincount(inverse, minlength=uniq.size)
    total = np.bincount(inverse, weights=d, minlength=uniq.size)
    sumsq = np.bincount(inverse, weights=d * d, minlength=uniq.size)
    mn = np.full(uniq.size, np.inf)
    mx = np.full(uniq.size, -np.inf)
    np.minimum.at(mn, inverse, d)
    np.maximum.at(mx, inverse, d)
    mean = total / count
    # Sample standard deviation (ddof=1), as pandas computes it for HTA; 0 for single kernels.
    var = np.where(count > 1, (sumsq - count * mean * mean) / np.maximum(count - 1, 1), 0.0)
    return {
        "name": uniq,
        "count": count,
        "total": total,
        "mean": mean,
        "min": mn,
        "max": mx,
        "std": np.sqrt(np.maximum(var, 0.0)),
    }


def kernel_breakdown(trace: Trace, gpu: GpuOps, top_n: int, tiny_kernel_ns: int) -> dict[str, Any]:
    """Top kernels by total time, time per kernel class (with overlaps), duration histogram, tiny kernels."""
    k = gpu.take(gpu.kind == OpKind.KERNEL)
    total_ns = int(k.dur_ns.sum())
    result: dict[str, Any] = {
        "kernel_count": len(k),
        "kernel_time_ms": ms(total_ns),
        "distinct_kernels": 0,
        "by_class": [],
        "class_overlap": [],
        "top_kernels": [],
        "duration_histogram": [],
        "tiny_kernels": {
            "threshold_us": tiny_kernel_ns / NS_PER_US,
            "count": 0,
            "count_pct": None,
            "time_ms": 0.0,
            "time_pct": None,
        },
    }
    if len(k) == 0:
        return result
    stats = _group_stats(k.name, k.dur_ns)
    order = np.argsort(-stats["total"], kind="stable")
    class_of = dict(zip(k.name.tolist(), k.kclass.tolist(), strict=False))
    result["distinct_kernels"] = int(stats["name"].size)
    result["top_kernels"] = [
        {
            "name": _name(trace, int(stats["name"][i])),
            "short_name": shorten_kernel_name(trace.strings[int(stats["name"][i])])[:MAX_NAME_CHARS],
            "kernel_class": _CLASS_NAMES[class_of[int(stats["name"][i])]],
            "count": int(stats["count"][i]),
            "total_ms": ms(stats["total"][i]),
            "mean_us": round(float(stats["mean"][i]) / NS_PER_US, 3),
            "min_us": round(float(stats["min"][i]) / NS_PER_US, 3),
            "max_us": round(float(stats["max"][i]) / NS_PER_US, 3),
            "std_us": round(float(stats["std"][i]) / NS_PER_US, 3),
            "time_pct": pct(stats["total"][i], total_ns),
        }
        for i in order[:top_n]
    ]
    # Summed kernel time per class (HTA's kernel_type_df sums durations, overlaps counted twice).
    for cls in KernelClass:
        sel = k.kclass == cls
        if sel.any():
            t = int(k.dur_ns[sel].sum())
            result["by_class"].append(
                {
                    "kernel_class": cls.name,
                    "count": int(sel.sum()),
                    "time_ms": ms(t),
                    "time_pct": pct(t, total_ns),
                }
            )
    result["class_overlap"] = class_overlap(gpu)
    edges_ns = np.array([e * NS_PER_US for e in HISTOGRAM_EDGES_US], dtype=np.float64)
    bins = np.searchsorted(edges_ns, k.dur_ns, side="right") - 1
    counts = np.bincount(bins, minlength=len(edges_ns))
    times = np.bincount(bins, weights=k.dur_ns.astype(np.float64), minlength=len(edges_ns))
    for i, lo in enumerate(HISTOGRAM_EDGES_US):
        hi = HISTOGRAM_EDGES_US[i + 1] if i + 1 < len(HISTOGRAM_EDGES_US) else None
        result["duration_histogram"].append(
            {
                "lower_us": lo,
                "upper_us": hi,
                "count": int(counts[i]),
                "time_ms": ms(times[i]),
                "count_pct": pct(counts[i], len(k)),
            }
        )
    tiny = k.dur_ns < tiny_kernel_ns
    tiny_time = int(k.dur_ns[tiny].sum())
    result["tiny_kernels"].update(
        count=int(tiny.sum()),
        count_pct=pct(tiny.sum(), len(k)),
        time_ms=ms(tiny_time),
        time_pct=pct(tiny_time, total_ns),
    )
    return result


def class_overlap(gpu: GpuOps) -> list[dict[str, Any]]:
    """Wall time by which kernel classes were running, e.g. "COMPUTATION overlapping COMMUNICATION".

    HTA's `_get_gpu_kernel_type_time`, including memory ops (its include_memory_kernels=True).
    """
    classes = [KernelClass.COMPUTATION, KernelClass.COMMUNICATION, KernelClass.MEMORY]
    sets = []
    for cls in classes:
        sel = gpu.kclass == cls
        sets.append(iv.union(gpu.start_ns[sel], gpu.end_ns[sel]))
    cover = iv.coverage_by_code(sets)
    busy = sum(cover.values())
    out = []
    for code, t in sorted(cover.items(), key=lambda kv: -kv[1]):
        label = " overlapping ".join(c.name for i, c in enumerate(classes) if code & (1 << i))
        out.append({"kernel_type": label, "time_ms": ms(t), "time_pct": pct(t, busy)})
    return out


def _percentiles_us(values: npt.NDArray[Any]) -> dict[str, float | None]:
    if values.size == 0:
        return {"mean_us": None, "p50_us": None, "p90_us": None, "p99_us": None, "max_us": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "mean_us": round(float(values.mean()) / NS_PER_US, 3),
        "p50_us": round(float(p50) / NS_PER_US, 3),
        "p90_us": round(float(p90) / NS_PER_US, 3),
        "p99_us": round(float(p99) / NS_PER_US, 3),
        "max_us": round(float(values.max()) / NS_PER_US, 3),
    }


def launch_stats(
    trace: Trace, gpu: GpuOps, runtime: RuntimeCalls, runtime_cutoff_ns: int, launch_delay_cutoff_ns: int
) -> dict[str, Any]:
    """HTA's kernel launch statistics: CPU launch duration, GPU duration and launch delay per launch.

    Launch delay = GPU start - (runtime call start + runtime call duration), clipped at 0. HTA pairs only
    cudaLaunchKernel(ExC)/cudaMemcpyAsync/cudaMemsetAsync; we pair every runtime or driver call that has
    a kernel, memcpy or memset with its correlation id, which also covers cuLaunchKernel and HIP.
    """
    ops = gpu.take((gpu.kind != OpKind.SYNC) & (gpu.correlation >= 0))
    rt = runtime.take(runtime.correlation >= 0)
    result: dict[str, Any] = {"launches": 0}
    if len(ops) == 0 or len(rt) == 0:
        return result | {"launch_delay": _percentiles_us(np.zeros(0))}
    order = np.argsort(rt.correlation, kind="stable")
    corr = rt.correlation[order]
    pos = np.searchsorted(corr, ops.correlation, side="right") - 1
    ok = pos >= 0
    ok[ok] = corr[pos[ok]] == ops.correlation[ok]
    rt_idx = order[pos[ok]]
    gpu_start, gpu_dur = ops.start_ns[ok], ops.dur_ns[ok]
    cpu_start, cpu_dur = rt.start_ns[rt_idx], rt.dur_ns[rt_idx]
    delay = np.maximum(gpu_start - (cpu_start + cpu_dur), 0)
    names, name_counts = np.unique(rt.name[rt_idx], return_counts=True)
    by_name = sorted(zip(names.tolist(), name_counts.tolist(), strict=True), key=lambda x: -x[1])
    return {
        "launches": int(ok.sum()),
        "unmatched_gpu_ops": int((~ok).sum()),
        "launch_delay": _percentiles_us(delay),
        "cpu_launch_duration": _percentiles_us(cpu_dur),
        "gpu_duration": _percentiles_us(gpu_dur),
        "gpu_shorter_than_launch_count": int((gpu_dur < cpu_dur).sum()),
        "gpu_shorter_than_launch_pct": pct((gpu_dur < cpu_dur).sum(), ok.sum()),
        "runtime_outliers_count": int((cpu_dur > runtime_cutoff_ns).sum()),
        "runtime_cutoff_us": runtime_cutoff_ns / NS_PER_US,
        "launch_delay_outliers_count": int((delay > launch_delay_cutoff_ns).sum()),
        "launch_delay_cutoff_us": launch_delay_cutoff_ns / NS_PER_US,
        "by_runtime_call": [{"name": trace.strings[n], "count": c} for n, c in by_name[:10]],
    }


_HOST_SIDE_SRC = {CopyKind.HTOD, CopyKind.HTOA, CopyKind.UVM_HTOD, CopyKind.HTOH}
_HOST_SIDE_DST = {CopyKind.DTOH, CopyKind.ATOH, CopyKind.UVM_DTOH}


def memcpy_stats(gpu: GpuOps) -> dict[str, Any]:
    """Memcpy count, bytes, time and bandwidth by direction, and pageable vs pinned host memory."""
    m = gpu.take(gpu.kind == OpKind.MEMCPY)
    known = np.maximum(m.bytes, 0)
    result: dict[str, Any] = {
        "count": len(m),
        "total_bytes": int(known.sum()),
        "total_ms": ms(int(m.dur_ns.sum())),
        "by_kind": [],
        "host_memory": [],
        "pageable_bytes_pct": None,
    }
    for kind in np.unique(m.copy_kind).tolist():
        sel = m.copy_kind == kind
        b, t = int(known[sel].sum()), int(m.dur_ns[sel].sum())
        result["by_kind"].append(
            {
                "copy_kind": COPY_KIND_LABELS.get(kind, str(kind)),
                "count": int(sel.sum()),
                "bytes": b,
                "time_ms": ms(t),
                # bytes per nanosecond is GB/s
                "bandwidth_gbps": round(b / t, 3) if t > 0 and b > 0 else None,
            }
        )
    result["by_kind"].sort(key=lambda r: -r["time_ms"])
    host_kind = np.full(len(m), -1, dtype=np.int64)
    src_side = np.isin(m.copy_kind, list(_HOST_SIDE_SRC))
    dst_side = np.isin(m.copy_kind, list(_HOST_SIDE_DST))
    host_kind[src_side] = m.src_kind[src_side]
    host_kind[dst_side] = m.dst_kind[dst_side]
    labels = {MemKind.PAGEABLE: "pageable", MemKind.PINNED: "pinned", MemKind.MANAGED: "managed"}
    host_bytes = 0
    for mk in np.unique(host_kind[host_kind >= 0]).tolist():
        sel = host_kind == mk
        b = int(known[sel].sum())
        host_bytes += b
        result["host_memory"].append(
            {
                "memory": labels.get(mk, "unknown"),
                "count": int(sel.sum()),
                "bytes": b,
                "time_ms": ms(int(m.dur_ns[sel].sum())),
            }
        )
    pageable = int(known[host_kind == MemKind.PAGEABLE].sum())
    result["pageable_bytes_pct"] = pct(pageable, host_bytes)
    result["pageable_count"] = int((host_kind == MemKind.PAGEABLE).sum())
    result["pinned_count"] = int((host_kind == MemKind.PINNED).sum())
    return result


def memset_stats(gpu: GpuOps) -> dict[str, Any]:
    """Memset count, bytes and time."""
    m = gpu.take(gpu.kind == OpKind.MEMSET)
    return {
        "count": len(m),
        "total_bytes": int(np.maximum(m.bytes, 0).sum()),
        "total_ms": ms(int(m.dur_ns.sum())),
    }


def sync_stats(trace: Trace, gpu: GpuOps, runtime: RuntimeCalls) -> dict[str, Any]:
    """Synchronisation: CUPTI sync records by type, and blocking CPU *Synchronize calls by name."""
    s = gpu.take(gpu.kind == OpKind.SYNC)
    by_type: list[dict[str, Any]] = []
    for kind in np.unique(s.sync_kind).tolist():
        sel = s.sync_kind == kind
        by_type.append(
            {
                "type": SYNC_KIND_NAMES.get(kind, str(kind)),
                "count": int(sel.sum()),
                "time_ms": ms(int(s.dur_ns[sel].sum())),
            }
        )
    sync_name_ids = np.array(
        [i for i in np.unique(runtime.name).tolist() if _CPU_SYNC_RE.search(trace.strings[i])], dtype=np.int32
    )
    cpu_sel = (
        np.isin(runtime.name, sync_name_ids) if sync_name_ids.size else np.zeros(len(runtime), dtype=bool)
    )
    by_name: list[dict[str, Any]] = []
    for n in np.unique(runtime.name[cpu_sel]).tolist():
        sel = cpu_sel & (runtime.name == n)
        by_name.append(
            {"name": trace.strings[n], "count": int(sel.sum()), "time_ms": ms(int(runtime.dur_ns[sel].sum()))}
        )
    by_name.sort(key=lambda r: -r["time_ms"])
    del by_name[20:]
    by_type.sort(key=lambda r: -r["time_ms"])
    return {
        "gpu_sync_count": len(s),
        "gpu_sync_ms": ms(int(s.dur_ns.sum())),
        "gpu_sync_by_type": by_type,
        "cpu_sync_calls": int(cpu_sel.sum()),
        "cpu_sync_ms": ms(int(runtime.dur_ns[cpu_sel].sum())),
        "cpu_sync_by_call": by_name,
    }


def comm_compute_overlap(gpu: GpuOps) -> dict[str, Any]:
    """HTA's communication/computation overlap: time in both unions / time in the communication union."""
    comp = gpu.kclass == KernelClass.COMPUTATION
    comm = gpu.kclass == KernelClass.COMMUNICATION
    comp_u = iv.union(gpu.start_ns[comp], gpu.end_ns[comp])
    comm_u = iv.union(gpu.start_ns[comm], gpu.end_ns[comm])
    overlap = iv.total(iv.intersect(comp_u, comm_u))
    comm_t = iv.total(comm_u)
    return {
        "communication_ms": ms(comm_t),
        "computation_ms": ms(iv.total(comp_u)),
        "overlap_ms": ms(overlap),
        "overlap_pct": pct(overlap, comm_t),
    }


def tensor_core_share(trace: Trace, gpu: GpuOps) -> dict[str, Any]:
    """Share of kernel time in tensor-core kernels and in SIMT (CUDA-core) GEMM/convolution kernels.

    The TensorBoard plugin's "Tensor Cores Used", with the classifier of `kernel_classes.math_class`
    (what each kernel name encodes) instead of its substring allowlist, which counted FP32 FFMA xmma
    GEMMs as tensor-core time. `simt_compute_time_pct` is the share of compute-kernel time in matmuls that
    ran on CUDA cores: the work tensor cores could have done. The top SIMT kernels are listed by time.
    """
    k = gpu.take(gpu.kind == OpKind.KERNEL)
    total = int(k.dur_ns.sum())
    ids = np.unique(k.name).tolist()
    classes = {i: math_class(trace.strings[i]) for i in ids}
    tc_ids = np.array([i for i in ids if classes[i] is MathClass.TENSOR], dtype=np.int32)
    simt_ids = np.array([i for i in ids if classes[i] is MathClass.SIMT], dtype=np.int32)
    sel = np.isin(k.name, tc_ids) if tc_ids.size else np.zeros(len(k), dtype=bool)
    simt = np.isin(k.name, simt_ids) if simt_ids.size else np.zeros(len(k), dtype=bool)
    comp = k.kclass == KernelClass.COMPUTATION
    comp_ns = int(k.dur_ns[comp].sum())
    tc_time = int(k.dur_ns[sel].sum())
    simt_time = int(k.dur_ns[simt].sum())
    top_simt: list[dict[str, Any]] = []
    if simt.any():
        stats = _group_stats(k.name[simt], k.dur_ns[simt])
        for i in np.argsort(-stats["total"], kind="stable")[:5]:
            top_simt.append(
                {
                    "name": shorten_kernel_name(trace.strings[int(stats["name"][i])])[:200],
                    "count": int(stats["count"][i]),
                    "time_ms": ms(stats["total"][i]),
                }
            )
    return {
        "tensor_core_kernel_count": int(sel.sum()),
        "tensor_core_time_ms": ms(tc_time),
        "tensor_core_time_pct": pct(tc_time, total),
        "tensor_core_compute_time_pct": pct(int(k.dur_ns[sel & comp].sum()), comp_ns),
        "simt_kernel_count": int(simt.sum()),
        "simt_time_ms": ms(simt_time),
        "simt_compute_time_pct": pct(int(k.dur_ns[simt & comp].sum()), comp_ns),
        "top_simt_kernels": top_simt,
        "method": "kernel names (kernel_classes.math_class: tensor-op vs SIMT name parts)",
    }
