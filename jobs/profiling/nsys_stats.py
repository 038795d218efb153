"""Summarise `nsys stats` reports into the analysis blocks the diagnosis rules read.

`nsys_stats_parse` reads the reports (kernel, API, memcpy time/size, NVTX and GPU trace) into rows with
times in ns and sizes in bytes; this module turns them into the upload's analysis: per-report summaries
(`kernels`, `memory_ops`, `cuda_api`, `nvtx`, `gpu_trace`) and, where the data allows, the same blocks a
trace analysis gives (`tensor_cores`, `memcpy`, `launch_sizes`; see `summary_blocks`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from jobs.profiling.detect import DEFAULT_MAX_BYTES
from jobs.profiling.guard import guarded
from jobs.profiling.launch_sizes import launch_sizes_from_rows
from jobs.profiling.nsys_stats_parse import SUPPORTED_REPORTS, NsysStats, parse_nsys_stats
from jobs.profiling.summary_blocks import (
    KernelTotal,
    kernel_breakdown_block,
    memcpy_block,
    tensor_cores_block,
)

__all__ = ["SUPPORTED_REPORTS", "NsysStats", "analyze_nsys_stats", "parse_nsys_stats"]

TINY_KERNEL_US = 10.0
NCCL_NAME = re.compile(r"nccl|^hccl|^rccl", re.IGNORECASE)
_SYNC_API = re.compile(
    r"^(cuda(Stream|Device|Event|Thread|Ctx)Synchronize|cu(Stream|Ctx|Event)Synchronize|cudaStreamQuery)"
)
_LAUNCH_API = re.compile(r"^(cudaLaunch|cuLaunch|cudaGraphLaunch|cuGraphLaunch)")
_API_SUFFIX = re.compile(r"(_v\d+|_ptsz|_ptds)+$")


def _ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 6)


def _ns(ms: float | None) -> float | None:
    return None if ms is None else ms * 1e6


def _us(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e3, 4)


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 3) if whole > 0 else None


def _memop(label: str) -> str:
    text = label.strip("[] ").removeprefix("CUDA ").strip()
    text = text.replace("memcpy ", "").replace("Host-to-Device", "HtoD").replace("Device-to-Host", "DtoH")
    text = (
        text.replace("Device-to-Device", "DtoD")
        .replace("Host-to-Host", "HtoH")
        .replace("Peer-to-Peer", "PtoP")
    )
    return text


def _kernel_summary(
    rows: list[dict[str, Any]], trace: list[dict[str, Any]] | None, top_n: int
) -> dict[str, Any]:
    total = sum(r.get("total_time") or 0.0 for r in rows)
    instances = sum(r.get("count") or 0.0 for r in rows)
    top = []
    for r in sorted(rows, key=lambda r: r.get("total_time") or 0.0, reverse=True)[:top_n]:
        top.append(
            {
                "name": r.get("name"),
                "time_pct": r.get("time_pct")
                if r.get("time_pct") is not None
                else _pct(r.get("total_time") or 0, total),
                "total_time_ms": _ms(r.get("total_time")),
                "instances": int(r.get("count") or 0),
                "avg_us": _us(r.get("avg")),
                "med_us": _us(r.get("med")),
                "min_us": _us(r.get("min")),
                "max_us": _us(r.get("max")),
            }
        )
    method, tiny_count, tiny_time, all_count, all_time = _tiny_kernels(rows, trace)
    nccl = [r for r in rows if NCCL_NAME.search(str(r.get("name", "")))]
    nccl_time = sum(r.get("total_time") or 0.0 for r in nccl)
    return {
        "total_time_ms": _ms(total),
        "instances": int(instances),
        "distinct_kernels": len(rows),
        "avg_kernel_us": _us(total / instances) if instances else None,
        "top": top,
        "tiny_threshold_us": TINY_KERNEL_US,
        "tiny_method": method,
        "tiny_instance_share_pct": _pct(tiny_count, all_count),
        "tiny_time_share_pct": _pct(tiny_time, all_time),
        "nccl_time_ms": _ms(nccl_time),
        "nccl_time_share_pct": _pct(nccl_time, total),
        "nccl_instances": int(sum(r.get("count") or 0.0 for r in nccl)),
    }


def _tiny_kernels(
    rows: list[dict[str, Any]], trace: list[dict[str, Any]] | None
) -> tuple[str, float, float, float, float]:
    """(method, tiny launches, tiny time, all launches, all time) for kernels under TINY_KERNEL_US."""
    thr = TINY_KERNEL_US * 1e3
    trace_kernels = [t for t in trace or [] if not str(t.get("name", "")).startswith("[CUDA ")]
    if trace_kernels:
        tiny = [t for t in trace_kernels if (t.get("duration") or 0.0) < thr]
        return (
            "per_instance",
            len(tiny),
            sum(t.get("duration") or 0.0 for t in tiny),
            len(trace_kernels),
            sum(t.get("duration") or 0.0 for t in trace_kernels),
        )
    # Without per-launch data a kernel's launches count as tiny when its average is under the threshold,
    # unless min/max prove all (max < thr) or none (min >= thr) are.
    tiny_count = tiny_time = 0.0
    for r in rows:
        lo, hi, avg = r.get("min"), r.get("max"), r.get("avg")
        is_tiny = (hi is not None and hi < thr) or (
            not (lo is not None and lo >= thr) and avg is not None and avg < thr
        )
        if is_tiny:
            tiny_count += r.get("count") or 0.0
            tiny_time += r.get("total_time") or 0.0
    instances = sum(r.get("count") or 0.0 for r in rows)
    total = sum(r.get("total_time") or 0.0 for r in rows)
    return "estimated_from_avg", tiny_count, tiny_time, instances, total


def _kernel_totals(rows: list[dict[str, Any]]) -> list[KernelTotal]:
    return [
        KernelTotal(str(r.get("name") or ""), float(r.get("total_time") or 0.0), float(r.get("count") or 0.0))
        for r in rows
    ]


def _kernels_from_trace(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[str, list[float]] = {}
    for t in trace:
        name = str(t.get("name", ""))
        if not name.startswith("[CUDA ") and t.get("duration") is not None:
            groups.setdefault(name, []).append(t["duration"])
    return [
        {
            "name": n,
            "total_time": sum(d),
            "count": len(d),
            "avg": sum(d) / len(d),
            "min": min(d),
            "max": max(d),
        }
        for n, d in groups.items()
    ]


def _memcpy_summary(times: list[dict[str, Any]], sizes: list[dict[str, Any]]) -> dict[str, Any]:
    by_op: dict[str, dict[str, Any]] = {}
    for r in times:
        op = _memop(str(r.get("name", "")))
        entry = by_op.setdefault(op, {"operation": op, "label": r.get("name"), "time_ns": 0.0, "count": 0.0})
        entry["time_ns"] += r.get("total_time") or 0.0
        entry["count"] += r.get("count") or 0.0
    for r in sizes:
        op = _memop(str(r.get("name", "")))
        entry = by_op.setdefault(
            op, {"operation": op, "label": r.get("name"), "time_ns": None, "count": r.get("count")}
        )
        entry["bytes"] = (entry.get("bytes") or 0.0) + (r.get("total") or 0.0)
    total_time = sum(e["time_ns"] or 0.0 for e in by_op.values())
    out = []
    for e in sorted(by_op.values(), key=lambda e: (e["time_ns"] or 0.0, e.get("bytes") or 0.0), reverse=True):
        nbytes, t = e.get("bytes"), e["time_ns"]
        out.append(
            {
                "operation": e["operation"],
                "label": e["label"],
                "total_time_ms": _ms(t),
                "time_pct": _pct(t or 0.0, total_time),
                "count": int(e["count"] or 0),
                "avg_us": _us(t / e["count"]) if t is not None and e["count"] else None,
                "total_bytes": None if nbytes is None else int(nbytes),
                "throughput_gb_per_s": round(nbytes / t, 3) if nbytes and t else None,
            }
        )
    copy_time = sum(e["time_ns"] or 0.0 for e in by_op.values() if e["operation"] != "memset")
    return {
        "total_time_ms": _ms(total_time) if times else None,
        "memcpy_time_ms": _ms(copy_time) if times else None,
        "by_operation": out,
    }


def _api_summary(rows: list[dict[str, Any]], top_n: int) -> dict[str, Any]:
    total = sum(r.get("total_time") or 0.0 for r in rows)
    sync: dict[str, dict[str, float]] = {}
    launch_calls = 0.0
    for r in rows:
        base = _API_SUFFIX.sub("", str(r.get("name", "")))
        if _SYNC_API.match(base):
            entry = sync.setdefault(base, {"time": 0.0, "calls": 0.0})
            entry["time"] += r.get("total_time") or 0.0
            entry["calls"] += r.get("count") or 0.0
        if _LAUNCH_API.match(base):
            launch_calls += r.get("count") or 0.0
    sync_time = sum(e["time"] for e in sync.values())
    top = sorted(rows, key=lambda r: r.get("total_time") or 0.0, reverse=True)[:top_n]
    return {
        "total_time_ms": _ms(total),
        "calls": int(sum(r.get("count") or 0.0 for r in rows)),
        "launch_calls": int(launch_calls),
        "sync_time_ms": _ms(sync_time),
        "sync_calls": int(sum(e["calls"] for e in sync.values())),
        "sync_share_of_api_pct": _pct(sync_time, total),
        "sync_by_call": [
            {"name": n, "total_time_ms": _ms(e["time"]), "calls": int(e["calls"])}
            for n, e in sorted(sync.items(), key=lambda kv: kv[1]["time"], reverse=True)
        ],
        "top": [
            {
                "name": r.get("name"),
                "time_pct": r.get("time_pct"),
                "total_time_ms": _ms(r.get("total_time")),
                "calls": int(r.get("count") or 0),
                "avg_us": _us(r.get("avg")),
            }
            for r in top
        ],
    }


def _nvtx_summary(rows: list[dict[str, Any]], top_n: int) -> dict[str, Any]:
    top = sorted(rows, key=lambda r: r.get("total_time") or 0.0, reverse=True)[:top_n]
    return {
        "range_count": len(rows),
        "ranges": [
            {
                "range": r.get("name"),
                "style": r.get("style"),
                "time_pct": r.get("time_pct"),
                "total_time_ms": _ms(r.get("total_time")),
                "instances": int(r.get("count") or 0),
                "avg_ms": _ms(r.get("avg")),
            }
            for r in top
        ],
    }


def _trace_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    per_device: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        start, dur = r.get("start"), r.get("duration")
        if start is not None and dur is not None:
            per_device.setdefault(str(r.get("device") or "?"), []).append((start, start + dur))
    devices = []
    for device, intervals in sorted(per_device.items()):
        intervals.sort()
        busy, cur_s, cur_e = 0.0, intervals[0][0], intervals[0][1]
        for s, e in intervals[1:]:
            if s > cur_e:
                busy += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        busy += cur_e - cur_s
        span = max(e for _, e in intervals) - intervals[0][0]
        devices.append(
            {
                "device": device,
                "span_ms": _ms(span),
                "busy_ms": _ms(busy),
                "idle_pct": _pct(span - busy, span),
                "operations": len(intervals),
            }
        )
    kernels = sum(1 for r in rows if not str(r.get("name", "")).startswith("[CUDA "))
    return {"events": len(rows), "kernel_launches": kernels, "devices": devices}


@guarded("nsys stats file")
def analyze_nsys_stats(
    source: bytes | str | Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    filename: str | None = None,
    top_n: int = 20,
) -> dict[str, Any]:
    """Summarise nsys stats reports: kernels, memcpy by operation, sync API time, NVTX ranges, GPU trace.

    Sections whose report is absent are None. Raises ArtifactError when no known report is found.
    """
    stats = parse_nsys_stats(source, max_bytes=max_bytes, filename=filename)
    reports = stats.reports
    trace = reports.get("cuda_gpu_trace")
    kern_rows = reports.get("cuda_gpu_kern_sum") or (_kernels_from_trace(trace) if trace else None)
    mem_time, mem_size = reports.get("cuda_gpu_mem_time_sum", []), reports.get("cuda_gpu_mem_size_sum", [])
    memory_ops = _memcpy_summary(mem_time, mem_size) if mem_time or mem_size else None
    return {
        "format": "nsys_stats_csv",
        "reports_found": sorted(reports),
        "reports_skipped": stats.skipped[:50],
        "kernels": _kernel_summary(kern_rows, trace, top_n) if kern_rows else None,
        "memory_ops": memory_ops,
        # The trace analysis' blocks, where a summary holds what they are made of.
        "tensor_cores": (
            tensor_cores_block(_kernel_totals(kern_rows), "nsys stats: summed kernel time per name")
            if kern_rows
            else None
        ),
        "kernel_breakdown": (
            kernel_breakdown_block(_kernel_totals(kern_rows), _tiny_kernels(kern_rows, trace)[1:3])
            if kern_rows
            else None
        ),
        "memcpy": (
            memcpy_block(
                (o["operation"], _ns(o["total_time_ms"]), o["count"], o["total_bytes"])
                for o in memory_ops["by_operation"]
            )
            if memory_ops
            else None
        ),
        "cuda_api": _api_summary(reports["cuda_api_sum"], top_n) if "cuda_api_sum" in reports else None,
        "nvtx": _nvtx_summary(reports["nvtx_sum"], top_n) if "nvtx_sum" in reports else None,
        "gpu_trace": _trace_summary(trace) if trace else None,
        "launch_sizes": _launch_sizes(trace) if trace else None,
    }


def _launch_sizes(trace: list[dict[str, Any]]) -> dict[str, Any]:
    """The trace analysis' `launch_sizes` block from a cuda_gpu_trace report's GrdX..Z / BlkX..Z."""
    kernels = [r for r in trace if not str(r.get("name", "")).startswith("[CUDA ")]
    rows = (
        (
            str(r.get("name", "")),
            float(r.get("duration") or 0.0),
            float(r["grid_blocks"]),
            float(r["block_threads"]),
        )
        for r in kernels
        if r.get("grid_blocks") and r.get("block_threads")
    )
    return launch_sizes_from_rows(rows, len(kernels))
