"""Launch sizes: the grid and block of every kernel launch, per kernel class, and the small-grid share.

One block for every trace format that records them per launch: Kineto kernel events carry ``args.grid`` and
``args.block`` ([x, y, z]); an Nsight Systems export's CUPTI_ACTIVITY_KIND_KERNEL rows carry gridX/Y/Z and
blockX/Y/Z. Both arrive in `GpuOps` as products (`grid_blocks` = gridX*gridY*gridZ thread blocks,
`block_threads` = blockX*blockY*blockZ threads per block), so the block reads the same for both.

Why the grid matters: a thread block runs on one streaming multiprocessor (SM) from start to end ("the
thread blocks of a grid are distributed to multiprocessors with available execution capacity ... all
threads of a thread block execute concurrently on one multiprocessor", CUDA C++ Programming Guide,
"Hardware Implementation"). A launch with fewer blocks than the GPU has SMs leaves the other SMs without
work for its whole duration, whatever nvidia-smi's utilisation says; Nsight Compute's launch statistics
call it a grid "too small to fill the available resources" (Profiling Guide, Launch Statistics). The SM
count comes from the trace (Kineto deviceProperties[].numSms, nsys TARGET_INFO_GPU.smCount); where the
trace does not name it, the small-grid figures are unknown (None), never guessed from the name.

What it cannot see: how long each block ran (a grid of many blocks can still leave SMs idle in its last
partial wave), occupancy within an SM, and kernels launched by CUDA graphs that recorded no dimensions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from jobs.profiling.events import GpuOps, KernelClass, OpKind, RankTrace, Trace, classify_gpu_op
from jobs.profiling.units import ms, pct

#: Kernel names listed among the small-grid launches with the most time.
TOP_SMALL_GRID = 5
_CLASS_NAMES = {c.value: c.name for c in KernelClass}
#: Bound on a duration (ns) or dimension read from a report: int64 with room for sums.
_MAX_INT = float(2**62)
BASIS = "per-launch grid and block dimensions (Kineto args grid/block, nsys gridX..Z/blockX..Z)"


def _sm_counts(rank: RankTrace, devices: npt.NDArray[np.int32]) -> npt.NDArray[np.float64]:
    """SM count of each launch's device (NaN where the trace does not say)."""
    out = np.full(devices.size, np.nan)
    for device in np.unique(devices).tolist():
        info = rank.device_by_id(int(device))
        if info is not None and info.num_sms:
            out[devices == device] = float(info.num_sms)
    return out


def _median(values: npt.NDArray[Any]) -> float | None:
    return float(np.median(values)) if values.size else None


def _small_grid(
    small: npt.NDArray[np.bool_], known: npt.NDArray[np.bool_], dur: npt.NDArray[np.int64]
) -> dict[str, Any]:
    """Small-grid launches among those whose device's SM count is known."""
    if not known.any():
        return {"small_grid_launches": None, "small_grid_launch_pct": None, "small_grid_time_pct": None}
    return {
        "small_grid_launches": int((small & known).sum()),
        "small_grid_launch_pct": pct(int((small & known).sum()), int(known.sum())),
        "small_grid_time_pct": pct(
            float(dur[small & known].sum(dtype=np.float64)), float(dur[known].sum(dtype=np.float64))
        ),
    }


@dataclass
class Launches:
    """Kernel launches with known dimensions, as columns (one row per launch)."""

    name: npt.NDArray[np.int64]  # index into `names`
    kclass: npt.NDArray[np.int8]  # KernelClass
    dur_ns: npt.NDArray[np.int64]
    grid: npt.NDArray[np.int64]  # thread blocks
    block: npt.NDArray[np.int64]  # threads per block
    sms: npt.NDArray[np.float64]  # SM count of the launch's device (NaN: unknown)
    names: Callable[[int], str]


def launch_sizes(trace: Trace, rank: RankTrace, gpu: GpuOps) -> dict[str, Any]:
    """The ``launch_sizes`` section of a rank's analysis over the GPU ops `gpu` (the analysis window).

    Keys: see `sizes_block`; `sm_count` names each device's SM count the trace gives.
    """
    kernels = gpu.take(gpu.kind == OpKind.KERNEL)
    sized_mask = (kernels.grid_blocks > 0) & (kernels.block_threads > 0)
    k = kernels.take(sized_mask)
    launches = Launches(
        name=k.name.astype(np.int64),
        kclass=k.kclass,
        dur_ns=k.dur_ns,
        grid=k.grid_blocks,
        block=k.block_threads,
        sms=_sm_counts(rank, k.device),
        names=lambda i: trace.strings[i],
    )
    sms_by_device = {
        str(d.id): d.num_sms for d in rank.devices if d.num_sms and np.any(kernels.device == d.id)
    }
    return sizes_block(len(kernels), launches, sms_by_device, BASIS)


def launch_sizes_from_rows(rows: Iterable[tuple[str, float, float, float]], kernels: int) -> dict[str, Any]:
    """The same block from an `nsys stats` cuda_gpu_trace report: (name, duration ns, grid blocks, threads
    per block) per kernel launch with known dimensions; `kernels` counts every kernel launch. The report
    names a device by its model only, so the small-grid figures are unknown."""
    ids: dict[str, int] = {}
    name, dur, grid, block = [], [], [], []
    for n, d, g, b in rows:
        if not (0 <= d < _MAX_INT and 0 < g < _MAX_INT and 0 < b < _MAX_INT):
            continue  # a duration or dimension no launch has (a damaged report): not counted
        name.append(ids.setdefault(n, len(ids)))
        dur.append(int(d))
        grid.append(int(g))
        block.append(int(b))
    by_id = list(ids)
    classes = np.array([classify_gpu_op(OpKind.KERNEL, n) for n in by_id], dtype=np.int8)
    name_arr = np.array(name, dtype=np.int64)
    launches = Launches(
        name=name_arr,
        kclass=classes[name_arr] if name_arr.size else np.zeros(0, np.int8),
        dur_ns=np.array(dur, dtype=np.int64),
        grid=np.array(grid, dtype=np.int64),
        block=np.array(block, dtype=np.int64),
        sms=np.full(name_arr.size, np.nan),
        names=lambda i: by_id[i],
    )
    return sizes_block(
        kernels, launches, {}, "nsys stats cuda_gpu_trace: GrdX*GrdY*GrdZ and BlkX*BlkY*BlkZ per launch"
    )


def sizes_block(kernels: int, k: Launches, sm_count: dict[str, int], basis: str) -> dict[str, Any]:
    """The block: `kernels`, `kernels_with_sizes`, `sm_count` (per device), `basis`, the overall
    `grid_blocks_median` / `block_threads_median` / `blocks_per_sm_median` and `small_grid_*` (launches
    with fewer thread blocks than SMs: count, share of launches and of kernel time, among launches on a
    device whose SM count is known), `by_class` (the same per HTA kernel class) and `top_small_grid`
    (the kernel names with the most small-grid time).
    """
    result: dict[str, Any] = {
        "kernels": kernels,
        "kernels_with_sizes": int(k.grid.size),
        "sm_count": sm_count,
        "basis": basis,
        "small_grid_rule": "fewer thread blocks than the device has SMs",
    }
    if k.grid.size == 0:
        result["note"] = "the trace records no grid/block dimensions per launch"
        return result
    grid, sms = k.grid, k.sms
    known = ~np.isnan(sms)
    small = known & (grid < np.where(known, sms, 0.0))
    if not known.any():
        result["note"] = "the trace does not name the GPUs' SM count, so the small-grid share is unknown"
    result.update(
        grid_blocks_median=_median(grid),
        block_threads_median=_median(k.block),
        blocks_per_sm_median=round(float(np.median(grid[known] / sms[known])), 4) if known.any() else None,
        kernel_time_ms=ms(float(k.dur_ns.sum(dtype=np.float64))),
        **_small_grid(small, known, k.dur_ns),
    )
    by_class = []
    for cls in np.unique(k.kclass).tolist():
        sel = k.kclass == cls
        by_class.append(
            {
                "kernel_class": _CLASS_NAMES.get(int(cls), str(cls)),
                "launches": int(sel.sum()),
                "time_ms": ms(float(k.dur_ns[sel].sum(dtype=np.float64))),
                "grid_blocks_median": _median(grid[sel]),
                "grid_blocks_min": int(grid[sel].min()),
                "grid_blocks_max": int(grid[sel].max()),
                "block_threads_median": _median(k.block[sel]),
                **_small_grid(small[sel], known[sel], k.dur_ns[sel]),
            }
        )
    result["by_class"] = sorted(by_class, key=lambda c: -c["launches"])
    top: list[dict[str, Any]] = []
    if small.any():
        names, inverse = np.unique(k.name[small], return_inverse=True)
        time_ns = np.bincount(inverse, weights=k.dur_ns[small].astype(np.float64))
        counts = np.bincount(inverse)
        for i in np.argsort(-time_ns, kind="stable")[:TOP_SMALL_GRID].tolist():
            in_name = small & (k.name == names[i])
            top.append(
                {
                    "name": k.names(int(names[i]))[:200],
                    "launches": int(counts[i]),
                    "time_ms": ms(int(time_ns[i])),
                    "grid_blocks_median": _median(grid[in_name]),
                }
            )
    result["top_small_grid"] = top
    return result
