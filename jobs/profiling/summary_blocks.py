"""The trace analysis' blocks, built from per-kernel summaries (`nsys stats`, Nsight Compute CSV).

Rules read a trace's `tensor_cores`, `kernel_breakdown` and `memcpy` blocks. A summary format has no
timeline, but it has what those blocks are made of: kernel names with their summed time and launch
count, and copy operations with their time and bytes. Building the same blocks here, with the same
classifiers (`kernel_classes.math_class` for tensor-op vs SIMT, HTA's name rule for compute vs
communication), lets a rule read one shape whatever was uploaded.

What a summary cannot give: overlap between streams (summed kernel time can exceed wall time), the
GPU's idle time, and the share of the step; shares here are of summed kernel (or copy) time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from jobs.profiling.events import KernelClass, hta_kernel_class
from jobs.profiling.kernel_classes import MathClass, math_class

#: Kernels shorter than this are "tiny" (HTA's and the trace analysis' threshold).
TINY_KERNEL_NS = 10_000.0
#: Longest kernel name kept in a listing.
MAX_NAME = 200
METHOD = "kernel names (kernel_classes.math_class: tensor-op vs SIMT name parts)"


@dataclass(frozen=True, slots=True)
class KernelTotal:
    """One kernel name's launches: summed time (ns) and count, from a summary row."""

    name: str
    time_ns: float
    count: float


def _ms(ns: float) -> float:
    return round(ns / 1e6, 6)


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 4) if whole > 0 else None


def tensor_cores_block(kernels: Iterable[KernelTotal], basis: str) -> dict[str, Any]:
    """The trace analysis' `tensor_cores` block (see `gpu_stats.tensor_core_share`) from kernel totals.

    `tensor_core_compute_time_pct` / `simt_compute_time_pct`: tensor-op / SIMT matmul time as a share
    of compute-kernel time (HTA's compute class: not NCCL, not copies), by kernel name.
    """
    total = comp = tc = tc_comp = simt = simt_comp = 0.0
    tc_count = simt_count = 0.0
    simt_rows: list[KernelTotal] = []
    for k in kernels:
        if k.time_ns <= 0:
            continue
        cls = math_class(k.name)
        is_comp = hta_kernel_class(k.name) is KernelClass.COMPUTATION
        total += k.time_ns
        comp += k.time_ns if is_comp else 0.0
        if cls is MathClass.TENSOR:
            tc += k.time_ns
            tc_count += k.count
            tc_comp += k.time_ns if is_comp else 0.0
        elif cls is MathClass.SIMT:
            simt += k.time_ns
            simt_count += k.count
            simt_comp += k.time_ns if is_comp else 0.0
            simt_rows.append(k)
    simt_rows.sort(key=lambda k: -k.time_ns)
    return {
        "basis": basis,
        "kernel_time_ms": _ms(total),
        "compute_time_ms": _ms(comp),
        "compute_share_of_kernel_time_pct": _pct(comp, total),
        "tensor_core_kernel_count": int(tc_count),
        "tensor_core_time_ms": _ms(tc),
        "tensor_core_time_pct": _pct(tc, total),
        "tensor_core_compute_time_pct": _pct(tc_comp, comp),
        "simt_kernel_count": int(simt_count),
        "simt_time_ms": _ms(simt),
        "simt_compute_time_pct": _pct(simt_comp, comp),
        "top_simt_kernels": [
            {"name": k.name[:MAX_NAME], "count": int(k.count), "time_ms": _ms(k.time_ns)}
            for k in simt_rows[:5]
        ],
        "method": METHOD,
    }


def kernel_breakdown_block(
    kernels: Iterable[KernelTotal], tiny: tuple[float, float] | None
) -> dict[str, Any]:
    """The trace analysis' `kernel_breakdown` counts: kernels launched and the tiny-kernel share.

    `tiny` is (tiny launches, tiny time ns) when the caller knows them (per-launch data or min/max
    bounds); without it the tiny share is left unknown rather than guessed.
    """
    rows = [k for k in kernels if k.count > 0]
    count = sum(k.count for k in rows)
    time = sum(max(k.time_ns, 0.0) for k in rows)
    out: dict[str, Any] = {
        "kernel_count": int(count),
        "distinct_kernels": len(rows),
        "kernel_time_ms": _ms(time),
        "avg_kernel_us": round(time / count / 1e3, 4) if count else None,
        "tiny_kernels": None,
    }
    if tiny is not None:
        out["tiny_kernels"] = {
            "threshold_us": TINY_KERNEL_NS / 1e3,
            "count": int(tiny[0]),
            "count_pct": _pct(tiny[0], count),
            "time_pct": _pct(tiny[1], time),
        }
    return out


#: nsys stats' memory operation labels (after `nsys_stats._memop`) -> the trace's copy-kind labels
#: (`events.COPY_KIND_LABELS`). "memset" is not a copy.
COPY_KINDS = {"HtoD": "HtoD", "DtoH": "DtoH", "DtoD": "DtoD", "HtoH": "HtoH", "PtoP": "PtoP"}


def memcpy_block(ops: Iterable[tuple[str, float | None, float, float | None]]) -> dict[str, Any]:
    """The trace analysis' `memcpy` block from (operation, time ns, count, bytes) per copy kind.

    A summary does not say whether host memory was pageable or pinned: `pageable_bytes_pct` is None.
    Operations other than copies (memset) are left out; unknown copy labels keep their own name.
    """
    by_kind: list[dict[str, Any]] = []
    total_ns = total_bytes = count = 0.0
    for op, time_ns, n, nbytes in ops:
        if op.lower().startswith("memset"):
            continue
        kind = COPY_KINDS.get(op, op)
        t = time_ns or 0.0
        b = nbytes or 0.0
        total_ns += t
        total_bytes += b
        count += n
        by_kind.append(
            {
                "copy_kind": kind,
                "count": int(n),
                "bytes": int(b),
                "time_ms": _ms(t),
                # bytes per nanosecond is GB/s
                "bandwidth_gbps": round(b / t, 3) if t > 0 and b > 0 else None,
            }
        )
    by_kind.sort(key=lambda r: -r["time_ms"])
    return {
        "count": int(count),
        "total_bytes": int(total_bytes),
        "total_ms": _ms(total_ns),
        "by_kind": by_kind,
        "host_memory": [],
        "pageable_bytes_pct": None,
    }
