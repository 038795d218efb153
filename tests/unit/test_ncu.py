"""Nsight Compute CSV: details (old and new units), raw page, per-kernel summary, unit normalisation."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from jobs.profiling.errors import ArtifactError
from jobs.profiling.ncu import analyze_ncu, normalize_value, parse_ncu_csv

DATA = Path(__file__).parent / "data"
GEMM = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn"


def _by_kernel(result: dict) -> dict[str, dict]:
    return {k["kernel"].split("<")[0].split("(")[0]: k for k in result["kernels"]}


def test_details_page_2022_units() -> None:
    result = analyze_ncu(DATA / "ncu_details_2022.csv")
    json.dumps(result, allow_nan=False)
    assert result["kernel_launches"] == 4 and result["distinct_kernels"] == 3
    kernels = _by_kernel(result)
    gemm = kernels[GEMM]
    assert gemm["launches"] == 2
    assert gemm["total_duration_ms"] == pytest.approx(2.4)  # 1.21 ms + 1.19 ms
    assert gemm["sm_throughput_pct"] == pytest.approx((88.41 * 1.21 + 89.02 * 1.19) / 2.4, abs=1e-3)
    assert gemm["registers_per_thread"] == 238
    assert gemm["block_dim"] == "(128, 1, 1)" and gemm["grid_dim"] == "(48, 16, 1)"
    assert gemm["bound"] == "compute"
    assert gemm["metrics"]["sm_frequency_hz"] == pytest.approx(1.41e9)  # cycle/usecond
    assert gemm["metrics"]["dram_frequency_hz"] == pytest.approx(1.59e9)  # cycle/nsecond
    assert gemm["metrics"]["dynamic_shared_memory_per_block_bytes"] == pytest.approx(73_730)  # Kbyte/block
    assert gemm["metrics"]["threads"] == 98_304  # thousands separator
    assert kernels["void at::native::vectorized_elementwise_kernel"]["bound"] == "memory"
    reduce_kernel = kernels["void at::native::reduce_kernel"]
    assert reduce_kernel["bound"] == "latency"
    assert reduce_kernel["avg_duration_us"] == pytest.approx(4.512)  # "4,512" nsecond
    assert result["memory_bound_kernels"] == 1
    assert result["compute_bound_kernels"] == 1
    assert result["latency_bound_kernels"] == 1
    assert result["duration_weighted_sm_throughput_pct"] == pytest.approx(88.2148, abs=1e-3)
    assert result["bound_time_share_pct"]["compute"] > 99


def test_details_page_2024_units_and_rules_match_2022() -> None:
    old = analyze_ncu(DATA / "ncu_details_2022.csv")
    new = analyze_ncu(DATA / "ncu_details_2024.csv")
    assert new["total_duration_ms"] == pytest.approx(old["total_duration_ms"])
    for key in ("duration_weighted_sm_throughput_pct", "duration_weighted_achieved_occupancy_pct"):
        assert new[key] == pytest.approx(old[key])
    old_gemm, new_gemm = _by_kernel(old)[GEMM], _by_kernel(new)[GEMM]
    for key in (
        "sm_frequency_hz",
        "dram_frequency_hz",
        "shared_memory_configuration_size_bytes",
        "duration_ns",
    ):
        assert new_gemm["metrics"][key] == pytest.approx(old_gemm["metrics"][key], rel=1e-2), key
    # Rule rows (empty metric name) are not metrics.
    assert all(key for key in new_gemm["metrics"])


def test_raw_page_with_units_row() -> None:
    launches = parse_ncu_csv(DATA / "ncu_raw.csv")
    assert [launch["id"] for launch in launches] == ["0", "1", "2", "3"]
    first = launches[0]["metrics"]
    assert first["duration_ns"] == pytest.approx(1_210_000)
    assert first["dram_bytes_read_sum_bytes"] == pytest.approx(25.17e6)
    assert first["sm_throughput_pct"] == 88.41
    assert first["achieved_occupancy_pct"] == 12.43
    assert launches[1]["metrics"]["grid_size"] == 10_240
    result = analyze_ncu(DATA / "ncu_raw.csv")
    assert result["total_duration_ms"] == pytest.approx(2.41686)
    assert result["memory_bound_kernels"] == 1


def test_per_kernel_summary_layout() -> None:
    text = (
        '"Kernel Name","Invocations","Section Name","Metric Name","Metric Unit",'
        '"Minimum","Maximum","Average"\n'
        '"k1","3","GPU Speed Of Light Throughput","Duration","usecond","9.00","11.00","10.00"\n'
        '"k1","3","GPU Speed Of Light Throughput","Compute (SM) Throughput","%","70","90","80"\n'
        '"k1","3","GPU Speed Of Light Throughput","Memory Throughput","%","20","40","30"\n'
    )
    result = analyze_ncu(text.encode())
    kernel = result["kernels"][0]
    assert kernel["launches"] == 3
    assert kernel["total_duration_ms"] == pytest.approx(0.03)
    assert kernel["bound"] == "compute"


def test_missing_metrics_are_none() -> None:
    text = (
        '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
        '"0","k","Registers Per Thread","register/thread","40"\n'
    )
    result = analyze_ncu(text.encode())
    kernel = result["kernels"][0]
    assert kernel["registers_per_thread"] == 40
    assert kernel["sm_throughput_pct"] is None and kernel["bound"] == "unknown"
    assert result["total_duration_ms"] is None
    assert result["duration_weighted_sm_throughput_pct"] is None


@pytest.mark.parametrize(
    ("value", "unit", "expected", "suffix"),
    [
        ("1,234.5", "usecond", 1_234_500.0, "ns"),
        ("2", "msecond", 2_000_000.0, "ns"),
        ("15", "nsecond", 15.0, "ns"),
        ("3", "us", 3000.0, "ns"),
        ("1.5", "Kbyte", 1500.0, "bytes"),
        ("2", "Mbyte", 2_000_000.0, "bytes"),
        ("1", "Gbyte", 1e9, "bytes"),
        ("1.2", "Tbyte/second", 1.2e12, "bytes_per_s"),
        ("900", "Gbyte/second", 9e11, "bytes_per_s"),
        ("1.41", "cycle/nsecond", 1.41e9, "hz"),
        ("1.5", "Ghz", 1.5e9, "hz"),
        ("87.5", "%", 87.5, "pct"),
        ("128", "register/thread", 128.0, "register_thread"),
        ("CachePreferNone", "", "CachePreferNone", ""),
        ("n/a", "%", None, "pct"),
    ],
)
def test_normalize_value(value: str, unit: str, expected: float | str | None, suffix: str) -> None:
    got, got_suffix = normalize_value(value, unit)
    assert got == (pytest.approx(expected) if isinstance(expected, float) else expected)
    assert got_suffix == suffix


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "No ncu CSV header"),
        (b"==PROF== Connected to process 1\n==PROF== Disconnected from process 1\n", "No ncu CSV header"),
        (b"==ERROR== The application returned an error code (1).\n", "application returned an error"),
        (b'"ID","Process ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n', "no kernel rows"),
        (
            b'"ID","Process ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n"0","1"\n',
            "no kernel rows",
        ),
        (b'"ID","Foo","Bar"\n"0","1","2"\n', "Kernel Name"),
    ],
)
def test_malformed_inputs_raise(content: bytes, message: str) -> None:
    with pytest.raises(ArtifactError, match=message):
        analyze_ncu(content)


def test_size_limit() -> None:
    with pytest.raises(ArtifactError, match="limit"):
        analyze_ncu(DATA / "ncu_raw.csv", max_bytes=100)


@pytest.mark.parametrize("name", ["ncu_details_2022.csv", "ncu_details_2024.csv", "ncu_raw.csv"])
def test_truncated_files_parse_or_raise_artifact_error(name: str) -> None:
    data = (DATA / name).read_bytes()
    for cut in range(0, len(data), max(1, len(data) // 40)):
        with contextlib.suppress(ArtifactError):
            json.dumps(analyze_ncu(data[:cut]), allow_nan=False)
