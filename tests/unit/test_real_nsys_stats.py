"""Real `nsys stats` console output kept in tests/data/real/nsys-stats (issue 24 items 4 and 7), uploaded
through the service's own entry points (`jobs.profiling.detect.detect_kind`,
`jobs.intake.artifacts.analyze_file`) and the diagnosis, each pinned against its truth derived by hand from
the file. Sources, commits and licence: tests/data/real/MANIFEST.md.

All four come from harp-lab/GPUJoin (MIT): CUDA nested-loop joins over (550,000 x 2) / (500,000 x 2) int
relations with cudaMallocManaged (Unified Memory), profiled with `nsys profile --stats=true` by the authors
on a GeForce GTX 1060 with Max-Q Design (progress.md) and on an ALCF ThetaGPU node (optimization.md; the
prompt `arsho@thetagpu06` names the node; ThetaGPU nodes are DGX A100s, the file itself names no GPU).
What they share, by hand: no GEMM and no NCCL -- the time is two hand-written integer join kernels
(`gpu_get_join_*`, one launch each) and at most four one-launch cub scan/reduce kernels (thrust's
exclusive scan); the copies are Unified Memory page migrations (nsys prints them as "[CUDA Unified Memory
memcpy HtoD/DtoH]") plus one or two tiny explicit copies. Sizes are printed in MB = 10^6 bytes (Unified
Memory migrates at most 2 MiB = 2.097 MB at a time, the largest size printed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.diagnosis import diagnose
from jobs.diagnosis.base import ArtifactAnalysis, DiagnosisInput
from jobs.intake.artifacts import analyze_file
from jobs.profiling.detect import detect_kind, read_head
from jobs.profiling.errors import ArtifactError

STATS = Path(__file__).resolve().parents[1] / "data" / "real" / "nsys-stats"
THETA = (
    "gpujoin_thetagpu_nonatomic_join.txt",
    "gpujoin_thetagpu_nonatomic_join_prefetch.txt",
    "gpujoin_thetagpu_atomic_join.txt",
)


def parsed(name: str) -> tuple[str, dict[str, Any]]:
    """(kind as detected, analysis) of one kept file, as an upload would be parsed."""
    path = STATS / name
    kind = detect_kind(path.name, read_head(path))
    return kind, analyze_file(path, kind)


def codes(kind: str, analysis: dict[str, Any]) -> set[str]:
    art = ArtifactAnalysis(kind=kind, analysis=analysis, name="real")
    return {f.code for f in diagnose(DiagnosisInput(signals=None, gpu_count=1, artifacts=[art]))}


def copies(analysis: dict[str, Any]) -> dict[str, tuple[int, int, float]]:
    """The memcpy block per copy kind: (count, bytes, ms)."""
    return {k["copy_kind"]: (k["count"], k["bytes"], k["time_ms"]) for k in analysis["memcpy"]["by_kind"]}


# --- progress.md: GTX 1060 with Max-Q Design, non-atomic join of (500000, 2) x (500000, 2) ------------------
# The authors pasted the nsys part of `nsys profile --stats=true ./join` below an nvprof run of the same
# program: "CUDA Kernel Statistics:" (the "[6/8] Executing 'gpukernsum'" line above it was not pasted), then
# "[7/8] Executing 'gpumemtimesum'" and "[8/8] ... 'gpumemsizesum'" (nsys 2021-2022 report names; numbers
# with thousands separators; kernel names cut at 100 characters with "…"). No API report.
# By hand:
# - kernels: 6 launches, 5,276,851,380 ns in all = 4,261,112,682 (gpu_get_join_data_dynamic, 80.8 %) +
#   1,015,684,940 (gpu_get_join_size_per_thread, 19.2 %) + 30,592 + 17,247 + 3,839 + 2,080 (cub). Under
#   10 us: the last two (3.839 and 2.080 us), 2 of 6 launches, 0.0001 % of kernel time.
# - no tensor-op and no SIMT GEMM kernel (no gemm/gemv in any name), no NCCL: compute is 100 % of kernel time.
# - copies, 12,693,341 ns: Unified Memory DtoH 74 migrations 11,550,832 ns 150.610 MB (up to 2.097 MB each),
#   Unified Memory HtoD 297 migrations 1,141,517 ns 12.468 MB, one explicit DtoH 992 ns of "0.000" MB
#   (under 500 bytes as printed; read as 0). Copies are 0.24 % of kernel time.
# No rule may fire: two long kernels, no launch storm, copies negligible, no API report.


def test_gpujoin_gtx1060_summary_is_two_join_kernels_and_unified_memory_migrations() -> None:
    kind, a = parsed("gpujoin_gtx1060maxq_unified_memory_join.txt")
    assert kind == "nsys_stats_csv"
    assert a["reports_found"] == ["cuda_gpu_kern_sum", "cuda_gpu_mem_size_sum", "cuda_gpu_mem_time_sum"]
    k = a["kernels"]
    assert (k["instances"], k["distinct_kernels"]) == (6, 6)
    assert k["total_time_ms"] == pytest.approx(5276.85138)
    top = k["top"]
    assert top[0]["name"].startswith("gpu_get_join_data_dynamic(") and top[0]["time_pct"] == 80.8
    assert top[0]["total_time_ms"] == pytest.approx(4261.112682)
    assert top[2]["name"].endswith("ScanTileState<\u2026")  # nsys' own cut at 100 characters, kept
    assert a["kernel_breakdown"]["tiny_kernels"]["count"] == 2
    tc = a["tensor_cores"]
    assert (tc["tensor_core_time_pct"], tc["simt_compute_time_pct"]) == (0.0, 0.0)
    assert tc["compute_share_of_kernel_time_pct"] == 100.0 and k["nccl_time_share_pct"] == 0.0
    assert copies(a) == {
        "Unified Memory DtoH": (74, 150_610_000, pytest.approx(11.550832)),
        "Unified Memory HtoD": (297, 12_468_000, pytest.approx(1.141517)),
        "DtoH": (1, 0, pytest.approx(0.000992)),
    }
    assert a["cuda_api"] is None


def test_gpujoin_gtx1060_summary_has_no_finding() -> None:
    kind, a = parsed("gpujoin_gtx1060maxq_unified_memory_join.txt")
    assert codes(kind, a) == set()


# --- optimization.md: three whole `nsys profile --stats=true ./join` console outputs on thetagpu06 ----------
# Each starts with the shell prompt (the atomic one with the command), a "Warning: LBR backtrace ..." line,
# the program's own output (timings, a pipe-delimited results row), nsys's "Processing events... / Saved
# report file to .qdrep / Exported successfully to .sqlite" lines, then four reports in the 2021 layout
# without "[n/m] Executing" banners: "CUDA API Statistics:", "CUDA Kernel Statistics:", "CUDA Memory
# Operation Statistics (by time):" and "(by size):", columns "Time(%)", "Average (ns)", "Minimum (ns)"...
# By hand (ns unless stated):
# nonatomic:  kernels 554,278,797 + 181,872,264 + 11,968 + 7,456 + 5,056 + 4,512 = 736,180,053 in 6
#             launches; under 10 us: 7,456, 5,056, 4,512 (3 of 6, 0.0023 % of kernel time).
#             API 1,746,079,194 in 23 calls: cudaMallocManaged 57.7 % (1,007,026,419, 4 calls),
#             cudaDeviceSynchronize 42.2 % (736,169,153, 2 calls: one after each join pass, each waiting
#             for the kernel it follows), cudaStreamSynchronize 28,835 (3 calls), 6 cudaLaunchKernel.
#             Sync: 5 calls, 736,197,988 = 42.163 % of API time.
#             Copies: Unified Memory HtoD 220 migrations 1,244,396 ns 8.806 MB, one DtoH 3,328 ns.
# prefetch:   same kernels (729,319,144 in 6 launches, 3 under 10 us); API 1,025,642,616 in 25 calls,
#             sync 729,338,322 in 5 calls (71.11 %); cudaMemPrefetchAsync 2 calls. Copies: UM HtoD 208
#             (1,208,631 ns, 8.806 MB) and -- new with the prefetch -- UM DtoH 56 (550,329 ns, 8.806 MB).
# atomic:     2 kernels, 2,683,503,813 + 974,270,748 = 3,657,774,561 in 2 launches, none tiny; API
#             4,137,967,589 in 16 calls, 2 cudaDeviceSynchronize = 3,657,800,134 (88.396 %). Copies: UM
#             HtoD 58, UM DtoH 56 (8.806 MB each), one explicit HtoD and one DtoH.
# What the service must not conclude, and did before this file was pinned: from the nonatomic and prefetch
# runs launch_overhead ("launch-bound": half of 6 launches are tiny cub kernels, beside two 0.2-0.6 s join
# kernels) and, from all three, host_sync ("frequent host synchronisations": 2 device syncs, each the host
# waiting for a long kernel that keeps the GPU busy). A summary of 6 launches shows no launch rate, and a
# large sync share of API time with 2-5 calls is no repeating pattern: no finding.


@pytest.mark.parametrize("name", THETA)
def test_gpujoin_thetagpu_console_output_reads_all_four_reports(name: str) -> None:
    kind, a = parsed(name)
    assert kind == "nsys_stats_csv"
    assert a["reports_found"] == [
        "cuda_api_sum",
        "cuda_gpu_kern_sum",
        "cuda_gpu_mem_size_sum",
        "cuda_gpu_mem_time_sum",
    ]
    assert a["reports_skipped"] == []  # the program's own pipe-delimited row is not read as a table
    tc = a["tensor_cores"]
    assert (tc["tensor_core_time_pct"], tc["simt_compute_time_pct"]) == (0.0, 0.0)
    assert a["kernels"]["nccl_time_share_pct"] == 0.0


def test_gpujoin_thetagpu_nonatomic_numbers() -> None:
    _, a = parsed("gpujoin_thetagpu_nonatomic_join.txt")
    k = a["kernels"]
    assert (k["instances"], k["total_time_ms"]) == (6, pytest.approx(736.180053))
    assert (k["tiny_instance_share_pct"], k["tiny_time_share_pct"]) == (50.0, 0.002)
    api = a["cuda_api"]
    assert (api["calls"], api["launch_calls"], api["sync_calls"]) == (23, 6, 5)
    assert api["total_time_ms"] == pytest.approx(1746.079194)
    assert api["sync_share_of_api_pct"] == 42.163
    assert [(s["name"], s["calls"]) for s in api["sync_by_call"]] == [
        ("cudaDeviceSynchronize", 2),
        ("cudaStreamSynchronize", 3),
    ]
    assert copies(a) == {
        "Unified Memory HtoD": (220, 8_806_000, pytest.approx(1.244396)),
        "DtoH": (1, 0, pytest.approx(0.003328)),
    }


def test_gpujoin_thetagpu_prefetch_adds_unified_memory_dtoh_migrations() -> None:
    _, a = parsed("gpujoin_thetagpu_nonatomic_join_prefetch.txt")
    assert a["kernels"]["total_time_ms"] == pytest.approx(729.319144)
    assert (a["cuda_api"]["sync_calls"], a["cuda_api"]["sync_share_of_api_pct"]) == (5, 71.11)
    assert copies(a) == {
        "Unified Memory HtoD": (208, 8_806_000, pytest.approx(1.208631)),
        "Unified Memory DtoH": (56, 8_806_000, pytest.approx(0.550329)),
        "DtoH": (1, 0, pytest.approx(0.003328)),
    }


def test_gpujoin_thetagpu_atomic_numbers() -> None:
    _, a = parsed("gpujoin_thetagpu_atomic_join.txt")
    k = a["kernels"]
    assert (k["instances"], k["total_time_ms"], k["tiny_instance_share_pct"]) == (
        2,
        pytest.approx(3657.774561),
        0.0,
    )
    api = a["cuda_api"]
    assert (api["sync_calls"], api["sync_share_of_api_pct"]) == (2, 88.396)
    assert set(copies(a)) == {"Unified Memory HtoD", "Unified Memory DtoH", "HtoD", "DtoH"}


@pytest.mark.parametrize("name", THETA)
def test_gpujoin_thetagpu_few_long_kernels_and_few_syncs_give_no_finding(name: str) -> None:
    kind, a = parsed(name)
    assert codes(kind, a) == set()


# --- progress.md: the nvprof run pasted just above the nsys block (GTX 1060 with Max-Q Design) --------------
# `nvprof ./join` on the same join: the program's output interleaved with "==69548== ..." lines, nvprof's
# summary ("Type  Time(%)  Time  Calls  Avg  Min  Max  Name", "GPU activities:" / "API calls:" rows, times
# with units in the cells: 4.41223s, 29.792us, 961ns) and its "Unified Memory profiling result" (284 HtoD,
# 85 DtoH, 23,837 GPU page fault groups, 497.19 ms). detect_kind sees "Time(%)" and calls it nsys stats;
# the parser must not read nvprof's tables as nsys ones, and must say what the file is.
NVPROF = STATS.parent / "nvprof" / "gpujoin_gtx1060maxq_join.txt"


def test_gpujoin_nvprof_output_is_refused_as_nvprof() -> None:
    kind = detect_kind(NVPROF.name, read_head(NVPROF))
    assert kind == "nsys_stats_csv"
    with pytest.raises(ArtifactError, match=r"^This is nvprof output .*nsys profile --stats=true"):
        analyze_file(NVPROF, kind)


def test_nvprof_pasted_before_the_nsys_block_reads_only_the_nsys_reports(tmp_path: Path) -> None:
    # The two fenced blocks of progress.md one after the other, as a user pasting both would upload them:
    # the nsys numbers are those of the nsys block alone (no nvprof row read as a kernel), nvprof is named.
    mixed = tmp_path / "join_profiles.txt"
    nsys = STATS / "gpujoin_gtx1060maxq_unified_memory_join.txt"
    mixed.write_text(NVPROF.read_text(encoding="utf-8") + "\n" + nsys.read_text(encoding="utf-8"))
    kind, a = "nsys_stats_csv", analyze_file(mixed, detect_kind(mixed.name, read_head(mixed)))
    _, alone = parsed(nsys.name)
    assert a["reports_found"] == alone["reports_found"]
    assert a["kernels"] == alone["kernels"] and a["memcpy"] == alone["memcpy"]
    assert [s["report"] for s in a["reports_skipped"]] == ["nvprof"]
    assert codes(kind, a) == set()
