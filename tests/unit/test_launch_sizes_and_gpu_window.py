"""Launch sizes from per-launch grid/block (nsys exports and Kineto alike) and the TensorBoard GPU metrics
over the GPU's steady state (issue #24 items 3 and 4), on real samples from ../shared/samples.

Every expected number below was derived from the sample itself with a separate reading (sqlite3 on the
export, json on the trace), not through the service's parsers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobs.profiling.kineto import parse_kineto
from jobs.profiling.launch_sizes import launch_sizes
from jobs.profiling.nsys import parse_nsys
from jobs.profiling.trace_analysis import analyze_trace
from tests.conftest import sample_path


def _ranks(analysis: dict[str, Any]) -> list[dict[str, Any]]:
    return list(analysis["ranks"])


# --- nsys-ai's 2x H100 export (300 ms of training), by hand with sqlite3 ---------------------------------
# SELECT deviceId, gridX*gridY*gridZ, blockX*blockY*blockZ FROM CUPTI_ACTIVITY_KIND_KERNEL: device 0 has 1,993
# kernels, device 1 2,017 (4,010 in all); on each the median grid is 2,304 blocks and the median block 128
# threads; the 33 ncclDevKernel_SendRecv launches per device are all grid 32 x block 640; the compute
# kernels range from 1 to 187,200 blocks. The export has no TARGET_INFO_GPU table (no SM count), so which
# launches are smaller than the GPU cannot be said: the small-grid figures are unknown, not 0. (With an
# H100 SXM's 132 SMs it would be 624 of 1,993 launches on device 0 -- not assumed here.)


def test_nsys_export_gives_grid_and_block_per_class_and_no_small_grid_guess() -> None:
    analysis = analyze_trace(parse_nsys(sample_path("nsys/nsysai_h100_2gpu_train_300ms.sqlite")))
    by_kernels = sorted(_ranks(analysis), key=lambda r: r["launch_sizes"]["kernels"])
    expected_counts = [1993, 2017]
    for rank, count in zip(by_kernels, expected_counts, strict=True):
        ls = rank["launch_sizes"]
        assert ls["kernels"] == ls["kernels_with_sizes"] == count
        assert (ls["grid_blocks_median"], ls["block_threads_median"]) == (2304.0, 128.0)
        assert (
            ls["sm_count"] == {} and ls["small_grid_launch_pct"] is None and ls["small_grid_time_pct"] is None
        )
        assert "SM count" in ls["note"]
        classes = {c["kernel_class"]: c for c in ls["by_class"]}
        comm = classes["COMMUNICATION"]
        assert comm["launches"] == 33
        assert (comm["grid_blocks_min"], comm["grid_blocks_max"], comm["block_threads_median"]) == (
            32,
            32,
            640.0,
        )
        compute = classes["COMPUTATION"]
        assert compute["launches"] == count - 33
        assert (compute["grid_blocks_min"], compute["grid_blocks_max"]) == (1, 187200)


# nsys-ai's minimal RTX 3080 export: TARGET_INFO_GPU says 68 SMs; its two kernels (a reduce_kernel of 2,689 ns
# and a FillFunctor elementwise kernel of 1,440 ns) are each launched with one thread block (grid 1x1x1):
# both fill 1 of 68 SMs, so 100 % of launches and of kernel time are small-grid.


def test_nsys_export_with_sm_count_says_which_launches_cannot_fill_the_gpu() -> None:
    analysis = analyze_trace(parse_nsys(sample_path("nsys/nsysai_minimal_rtx3080.sqlite")))
    (rank,) = _ranks(analysis)
    ls = rank["launch_sizes"]
    assert ls["sm_count"] == {"0": 68}
    assert (ls["kernels_with_sizes"], ls["grid_blocks_median"]) == (2, 1.0)
    assert (ls["small_grid_launches"], ls["small_grid_launch_pct"], ls["small_grid_time_pct"]) == (
        2,
        100.0,
        100.0,
    )
    assert ls["blocks_per_sm_median"] == pytest.approx(1 / 68, abs=1e-4)
    assert [t["time_ms"] for t in ls["top_small_grid"]] == [0.002689, 0.00144]


# --- HTA's AlexNet trace (A100, Kineto), by hand with json ------------------------------------------------
# 79 kernel events, each with args.grid and args.block; deviceProperties numSms 108. Median grid 3,025
# blocks, median block 256 threads, median blocks per SM 3025/108 = 28.0093. Only two launches have fewer
# blocks than SMs: cask_cudnn::computeOffsetsKernel with grid [12, 1, 1], 4 us each: 2 of 79 launches
# (2.5316 %) and 8 of 10,692 us of kernel time (0.0748 %).


def test_kineto_trace_gives_the_same_launch_size_block() -> None:
    analysis = analyze_trace(parse_kineto(sample_path("kineto/hta_alexnet_a100.json.gz")))
    (rank,) = _ranks(analysis)
    ls = rank["launch_sizes"]
    assert ls["sm_count"] == {"0": 108} and ls["kernels_with_sizes"] == 79
    assert (ls["grid_blocks_median"], ls["block_threads_median"]) == (3025.0, 256.0)
    assert ls["blocks_per_sm_median"] == pytest.approx(28.0093, abs=1e-4)
    assert (ls["small_grid_launches"], ls["small_grid_launch_pct"], ls["small_grid_time_pct"]) == (
        2,
        2.5316,
        0.0748,
    )
    (top,) = ls["top_small_grid"]
    assert top["name"].startswith("void cask_cudnn::computeOffsetsKernel")
    assert (top["launches"], top["time_ms"], top["grid_blocks_median"]) == (2, 0.008, 12.0)


# The same trace has no ProfilerStep. Its first kernel starts at ts 1695835573023613 us and its last GPU
# activity (kernel, memcpy or memset) ends at 1695835585863857 us: a 12,840.244 ms GPU span in which the 79
# kernels' union covers 10,630 us, i.e. 0.0828 % GPU utilisation. The TensorBoard plugin's one "step" is
# the CPU operators' extent from 1695835542515301 us, extended to the last kernel's end: 43,348.556 ms, over
# which the same 10,630 us read as 0.0245 % -- diluted by 30.5 s of start-up before the first kernel.


def test_tb_gpu_metrics_measure_the_gpu_span_not_the_host_extent() -> None:
    analysis = analyze_trace(parse_kineto(sample_path("kineto/hta_alexnet_a100.json.gz")))
    (rank,) = _ranks(analysis)
    tb = rank["tb_gpu_metrics"]
    assert tb["basis"] == "gpu_span"
    assert tb["steps_window_ms"] == pytest.approx(12840.244)
    assert tb["gpu_utilization_pct"] == pytest.approx(100 * 10630 / 12840244, abs=1e-4)
    plugin = tb["host_extent"]
    assert plugin["basis"] == "cpu_ops" and plugin["steps_window_ms"] == pytest.approx(43348.556)
    assert plugin["gpu_utilization_pct"] == pytest.approx(100 * 10630 / 43348556, abs=1e-4)


def test_tb_gpu_metrics_with_profiler_steps_keep_the_plugins_figures() -> None:
    # The TensorBoard plugin's golden input has ProfilerStep ranges: the section is the plugin's figures.
    analysis = analyze_trace(parse_kineto(sample_path("kineto/tbplugin_gpu_metrics_input.json")))
    (rank,) = _ranks(analysis)
    tb = rank["tb_gpu_metrics"]
    assert tb["basis"] == "ProfilerStep" and "host_extent" not in tb


# --- constructed: a device whose SM count is known, a grid below and above it -------------------------------


def _kineto(grids: list[list[int] | None], durs: list[int], num_sms: int | None) -> bytes:
    """A minimal Kineto trace: one kernel per grid ([x, y, z], or None for a launch without dimensions)."""
    events: list[dict[str, Any]] = []
    for i, (grid, dur) in enumerate(zip(grids, durs, strict=True)):
        args: dict[str, Any] = {"device": 0, "stream": 7, "correlation": i + 1}
        if grid is not None:
            args |= {"grid": grid, "block": [256, 1, 1]}
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": "k",
                "pid": 0,
                "tid": 7,
                "ts": 10 * i,
                "dur": dur,
                "args": args,
            }
        )
    props = [{"id": 0, "name": "test GPU", "numSms": num_sms}] if num_sms else []
    return json.dumps({"deviceProperties": props, "traceEvents": events}).encode()


def _launch_sizes(data: bytes) -> dict[str, Any]:
    trace = parse_kineto(data)
    (rank,) = trace.ranks
    return launch_sizes(trace, rank, rank.gpu)


def test_a_grid_equal_to_the_sm_count_is_not_small_and_unknown_sizes_are_not_counted() -> None:
    # 4 SMs: 3 blocks (small), 4 = 2x2 and 8 blocks (fill it), no dimensions (left out of every share).
    ls = _launch_sizes(_kineto([[3, 1, 1], [2, 2, 1], [8, 1, 1], None], [1, 3, 6, 9], num_sms=4))
    assert (ls["kernels"], ls["kernels_with_sizes"]) == (4, 3)
    assert ls["small_grid_launches"] == 1
    assert ls["small_grid_launch_pct"] == pytest.approx(100 / 3, abs=1e-4)
    assert ls["small_grid_time_pct"] == 10.0  # 1 of the 10 us of sized kernels


def test_a_trace_without_dimensions_or_sm_count_says_so() -> None:
    none = _launch_sizes(_kineto([None, None], [1, 1], num_sms=4))
    assert none["kernels_with_sizes"] == 0 and "no grid/block" in none["note"]
    assert "small_grid_launch_pct" not in none
    unknown = _launch_sizes(_kineto([[1, 1, 1]], [1], num_sms=None))
    assert unknown["small_grid_launches"] is None and "SM count" in unknown["note"]


# --- nsys stats cuda_gpu_trace (tests/unit/data/run1_cuda_gpu_trace.csv, nsys's documented layout) ---------
# By hand: 24 kernel rows (2 memcpy rows have no GrdX..BlkZ): 3 sm90_xmma GEMMs of grid 16x66x1 = 1,056 blocks
# x 384 threads, 18 vectorized_elementwise_kernel of 5,120 x 128, 3 triton layer-norm of 8,192 x 512. Median
# grid 5,120 and block 128; all COMPUTATION. The report names the device by model only ("NVIDIA H100 80GB
# HBM3 (0)"), no SM count: the small-grid share is unknown.


def test_nsys_stats_gpu_trace_gives_the_launch_size_block() -> None:
    from jobs.profiling.nsys_stats import analyze_nsys_stats

    ls = analyze_nsys_stats(Path(__file__).parent / "data" / "run1_cuda_gpu_trace.csv")["launch_sizes"]
    assert (ls["kernels"], ls["kernels_with_sizes"]) == (24, 24)
    assert (ls["grid_blocks_median"], ls["block_threads_median"]) == (5120.0, 128.0)
    (cls,) = ls["by_class"]
    assert cls["kernel_class"] == "COMPUTATION" and (cls["grid_blocks_min"], cls["grid_blocks_max"]) == (
        1056,
        8192,
    )
    assert ls["small_grid_launch_pct"] is None and "SM count" in ls["note"]
