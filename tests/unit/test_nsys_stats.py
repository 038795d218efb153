"""nsys stats reports: CSV and column layouts, mixed stdout, old report names, analysis numbers."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from jobs.profiling.errors import ArtifactError
from jobs.profiling.nsys_stats import analyze_nsys_stats, parse_nsys_stats

DATA = Path(__file__).parent / "data"
SKIPPED_ONLY = (
    b"Processing [r.sqlite] with [/x/cuda_gpu_kern_sum.py]... \n"
    b"SKIPPED: r.sqlite does not contain CUDA kernel data.\n"
)
# Kernel totals of the fixtures (ns): gemm, nccl, flash, layer norm, add, adam.
KERNEL_TOTAL_MS = (412_345_680 + 180_000_000 + 114_000_000 + 36_000_000 + 9_600_000 + 3_900_000) / 1e6


def _dumps(result: dict) -> str:
    return json.dumps(result, allow_nan=False)


def test_mixed_stdout_2024() -> None:
    result = analyze_nsys_stats(DATA / "nsys_stats_stdout_2024.txt")
    _dumps(result)
    assert result["reports_found"] == [
        "cuda_api_sum",
        "cuda_gpu_kern_sum",
        "cuda_gpu_mem_size_sum",
        "cuda_gpu_mem_time_sum",
        "nvtx_sum",
        "osrt_sum",
    ]
    assert {s["report"] for s in result["reports_skipped"]} == {
        "openmp_sum",
        "opengl_khr_range_sum",
        "um_sum",
    }

    kernels = result["kernels"]
    assert kernels["total_time_ms"] == pytest.approx(KERNEL_TOTAL_MS)
    assert kernels["instances"] == 10_500
    assert kernels["distinct_kernels"] == 6
    top = kernels["top"][0]
    assert top["name"].startswith("sm90_xmma_gemm")
    assert top["time_pct"] == 54.6 and top["instances"] == 1200 and top["avg_us"] == pytest.approx(343.6214)
    assert kernels["nccl_time_ms"] == pytest.approx(180.0)
    assert kernels["nccl_time_share_pct"] == pytest.approx(100 * 180 / KERNEL_TOTAL_MS, abs=1e-3)
    # Elementwise add (avg 2 us) and Adam (avg 6.5 us) are tiny; layer norm (avg 15 us, min 8 us) is not.
    assert kernels["tiny_method"] == "estimated_from_avg"
    assert kernels["tiny_instance_share_pct"] == pytest.approx(100 * 5400 / 10_500, abs=1e-3)
    assert kernels["tiny_time_share_pct"] == pytest.approx(100 * 13.5 / KERNEL_TOTAL_MS, abs=1e-3)

    api = result["cuda_api"]
    assert api["sync_time_ms"] == pytest.approx(226.8513 + 23.1)
    assert api["sync_calls"] == 1510
    assert [s["name"] for s in api["sync_by_call"]] == ["cudaStreamSynchronize", "cudaDeviceSynchronize"]
    assert api["launch_calls"] == 9600 + 2400
    assert all(row["name"] != "poll" for row in api["top"])  # osrt_sum is not CUDA API

    ops = {op["operation"]: op for op in result["memory_ops"]["by_operation"]}
    assert set(ops) == {"HtoD", "DtoH", "DtoD", "memset"}
    assert ops["HtoD"]["label"] == "[CUDA memcpy Host-to-Device]"
    assert ops["HtoD"]["total_time_ms"] == pytest.approx(18.2304)
    assert ops["HtoD"]["count"] == 1000
    assert ops["HtoD"]["total_bytes"] == 4_194_000_000
    assert result["memory_ops"]["memcpy_time_ms"] == pytest.approx(18.2304 + 1.56 + 0.324138)

    ranges = result["nvtx"]["ranges"]
    assert [r["range"] for r in ranges] == [":backward", ":forward", ":data_wait", ":optimizer_step"]
    assert ranges[2]["style"] == "StartEnd" and ranges[0]["avg_ms"] == pytest.approx(230.1)
    assert result["gpu_trace"] is None


def test_old_column_layout_matches_csv() -> None:
    old = analyze_nsys_stats(DATA / "nsys_stats_2021_column.txt")
    new = analyze_nsys_stats(DATA / "nsys_stats_stdout_2024.txt")
    _dumps(old)
    assert old["kernels"]["total_time_ms"] == pytest.approx(new["kernels"]["total_time_ms"])
    assert old["kernels"]["tiny_instance_share_pct"] == new["kernels"]["tiny_instance_share_pct"]
    assert old["cuda_api"]["sync_time_ms"] == pytest.approx(new["cuda_api"]["sync_time_ms"])
    old_ops = {op["operation"]: op for op in old["memory_ops"]["by_operation"]}
    assert old_ops["HtoD"]["label"] == "[CUDA memcpy HtoD]"
    # Old gpumemsizesum prints KiB without a unit in the header.
    assert old_ops["HtoD"]["total_bytes"] == pytest.approx(4_194_000_000, rel=1e-6)
    assert old["nvtx"] is None
    assert old["reports_skipped"][0]["report"] == "nvtx_sum"


def test_single_report_file_named_by_nsys() -> None:
    path = DATA / "run1_cuda_gpu_kern_sum.csv"
    result = analyze_nsys_stats(path)
    assert result["reports_found"] == ["cuda_gpu_kern_sum"]
    assert result["cuda_api"] is None and result["memory_ops"] is None
    from_bytes = analyze_nsys_stats(path.read_bytes(), filename="upload.csv")
    assert from_bytes["kernels"] == result["kernels"]  # recognised by its header alone


def test_csv_without_banners_is_classified_by_header() -> None:
    text = (DATA / "nsys_stats_stdout_2024.txt").read_text()
    bare = "\n".join(line for line in text.splitlines() if not line.startswith(("Processing", " **")))
    stats = parse_nsys_stats(bare.encode())
    assert set(stats.reports) == {
        "cuda_api_sum",
        "cuda_gpu_kern_sum",
        "cuda_gpu_mem_size_sum",
        "cuda_gpu_mem_time_sum",
        "nvtx_sum",
        "osrt_sum",
    }
    assert {r["name"] for r in stats.reports["osrt_sum"]} == {"pthread_cond_timedwait", "poll", "ioctl"}


def test_gpu_trace_gives_per_instance_tiny_share_and_idle() -> None:
    result = analyze_nsys_stats(DATA / "run1_cuda_gpu_trace.csv")
    _dumps(result)
    kernels = result["kernels"]
    assert kernels["tiny_method"] == "per_instance"
    assert kernels["instances"] == 24
    assert kernels["tiny_instance_share_pct"] == 75.0  # 6 of every 8 launches take 1.98 us
    trace = result["gpu_trace"]
    assert trace["events"] == 26 and trace["kernel_launches"] == 24
    device = trace["devices"][0]
    assert device["device"] == "NVIDIA H100 80GB HBM3 (0)"
    assert device["busy_ms"] < device["span_ms"]
    assert 40 < device["idle_pct"] < 42


def test_time_units_are_normalised() -> None:
    text = (
        "Time (%),Total Time (us),Instances,Avg (us),Med (us),Min (us),Max (us),StdDev (us),Name\n"
        "100.0,1500.5,3,500.167,500.0,499.0,501.5,1.2,my_kernel\n"
    )
    kernels = analyze_nsys_stats(text.encode())["kernels"]
    assert kernels["total_time_ms"] == pytest.approx(1.5005)
    assert kernels["top"][0]["avg_us"] == pytest.approx(500.167)
    assert kernels["tiny_instance_share_pct"] == 0.0


def test_truncated_and_odd_rows_do_not_crash() -> None:
    text = (
        "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n"
        "70.0,7000,1,7000.0,7000.0,7000,7000,0.0,k1\n"
        "30.0,3000,1\n"
        "nan,-nan,,,,,,,k3\n"
    )
    kernels = analyze_nsys_stats(text.encode())["kernels"]
    assert kernels["distinct_kernels"] == 2
    assert kernels["total_time_ms"] == pytest.approx(0.007)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"Generating SQLite file report1.sqlite from report1.nsys-rep\n",
        SKIPPED_ONLY,
        b"hello,world\n1,2\n",
        b"\x00\x01\x02",
    ],
)
def test_inputs_without_reports_raise(content: bytes) -> None:
    with pytest.raises(ArtifactError):
        analyze_nsys_stats(content)


def test_skipped_reason_is_in_the_error() -> None:
    with pytest.raises(ArtifactError, match="does not contain CUDA kernel data"):
        analyze_nsys_stats(SKIPPED_ONLY)


def test_size_limit() -> None:
    with pytest.raises(ArtifactError, match="limit"):
        analyze_nsys_stats(DATA / "nsys_stats_stdout_2024.txt", max_bytes=1000)


@pytest.mark.parametrize(
    "name", ["nsys_stats_stdout_2024.txt", "nsys_stats_2021_column.txt", "run1_cuda_gpu_trace.csv"]
)
def test_truncated_files_parse_or_raise_artifact_error(name: str) -> None:
    data = (DATA / name).read_bytes()
    for cut in range(0, len(data), max(1, len(data) // 40)):
        with contextlib.suppress(ArtifactError):
            json.dumps(analyze_nsys_stats(data[:cut]), allow_nan=False)
