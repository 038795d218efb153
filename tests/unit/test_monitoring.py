"""nvidia-smi and dstat CSV logs: time axis, units in keys, per-GPU statistics, malformed input."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from jobs.profiling.errors import ArtifactError
from jobs.profiling.monitoring import analyze_dstat, analyze_nvidia_smi
from tests.conftest import sample_path

DATA = Path(__file__).parent / "data"
NOHEADER_FIELDS = "timestamp,index,utilization.gpu,utilization.memory,memory.used,power.draw,temperature.gpu"


def _unix(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC).timestamp()


def test_nanogpt_custom_header_sample() -> None:
    result = analyze_nvidia_smi(sample_path("nvidia-smi/nanogpt_8gpu_util_power.csv"))
    json.dumps(result, allow_nan=False)
    assert result["gpu_count"] == 8
    assert [g["gpu"] for g in result["gpus"]] == [str(i) for i in range(8)]
    assert result["samples"] == sum(g["samples"] for g in result["gpus"])
    assert result["start_unix_s"] == pytest.approx(_unix("2025-09-24 03:48:33.493"))
    gpu0 = result["gpus"][0]
    assert set(gpu0["stats"]) == {"temperature_gpu_c", "utilization_gpu_pct", "power_draw_w"}
    assert 90 < gpu0["stats"]["utilization_gpu_pct"]["mean"] <= 100
    assert 300 < gpu0["stats"]["power_draw_w"]["mean"] < 450
    assert result["mean_utilization_gpu_pct"] > 90
    assert 0 <= result["idle_share_pct"] < 5
    series = result["series"]["0"]
    assert len(series["t_unix_s"]) == gpu0["samples"]
    assert series["t_unix_s"] == sorted(series["t_unix_s"])
    assert len(series["power_draw_w"]) == gpu0["samples"]


def test_series_are_downsampled_but_stats_use_every_sample() -> None:
    path = sample_path("nvidia-smi/nanogpt_8gpu_util_power.csv")
    full = analyze_nvidia_smi(path)
    small = analyze_nvidia_smi(path, max_points=50)
    assert len(small["series"]["3"]["t_unix_s"]) == 50
    assert len(small["series"]["3"]["utilization_gpu_pct"]) == 50
    assert small["gpus"][3]["stats"] == full["gpus"][3]["stats"]


def test_standard_header_with_units() -> None:
    result = analyze_nvidia_smi(DATA / "nvidia_smi_units.csv")
    json.dumps(result, allow_nan=False)
    gpu0, gpu1 = result["gpus"]
    assert gpu0["name"] == "NVIDIA A100-SXM4-80GB" and gpu0["pci_bus_id"] == "00000000:07:00.0"
    assert gpu0["start_unix_s"] == pytest.approx(_unix("2024-05-14 09:30:01.123"))
    # One "[N/A]" power reading is missing, not zero.
    assert gpu0["stats"]["power_draw_w"]["mean"] == pytest.approx((300 + 302.5 + 305 + 307.5 + 312.5) / 5)
    assert result["series"]["0"]["power_draw_w"][4] is None
    assert gpu0["stats"]["memory_used_bytes"]["max"] == 61234 * 1024**2
    assert gpu0["stats"]["clocks_sm_mhz"]["mean"] == 1410
    assert gpu0["stats"]["temperature_gpu_c"]["max"] == 62
    assert gpu1["stats"]["clocks_event_reasons_active"]["max"] == 1  # hex bitmask
    assert gpu0["idle_share_pct"] == pytest.approx(100 / 6, abs=1e-3)
    assert gpu1["idle_share_pct"] == 100.0
    assert result["idle_share_pct"] == pytest.approx(100 * 7 / 12, abs=1e-3)
    assert result["median_interval_s"] == pytest.approx(1.003)


def test_noheader_nounits_needs_the_field_list() -> None:
    with pytest.raises(ArtifactError, match="field list"):
        analyze_nvidia_smi(DATA / "nvidia_smi_noheader_nounits.csv")
    result = analyze_nvidia_smi(DATA / "nvidia_smi_noheader_nounits.csv", fields=NOHEADER_FIELDS.split(","))
    assert result["gpu_count"] == 4
    gpu2 = result["gpus"][2]
    assert gpu2["idle_share_pct"] == 100.0
    assert gpu2["stats"]["memory_used_bytes"]["mean"] == 40002 * 1024**2  # MiB inferred from the field
    assert gpu2["stats"]["temperature_gpu_c"]["mean"] == 57
    assert set(result["series"]["0"]) == {
        "t_unix_s",
        "utilization_gpu_pct",
        "utilization_memory_pct",
        "memory_used_bytes",
        "power_draw_w",
        "temperature_gpu_c",
    }


def test_utc_offset_moves_local_timestamps() -> None:
    utc = analyze_nvidia_smi(DATA / "nvidia_smi_units.csv")
    cest = analyze_nvidia_smi(DATA / "nvidia_smi_units.csv", utc_offset_s=7200)
    assert utc["start_unix_s"] - cest["start_unix_s"] == pytest.approx(7200)


def test_rows_without_gpu_column_are_numbered_within_a_timestamp() -> None:
    text = (
        "timestamp, utilization.gpu [%], power.draw [W]\n"
        "2024/05/14 09:30:01.000, 90 %, 300.0 W\n"
        "2024/05/14 09:30:01.000, 10 %, 100.0 W\n"
        "2024/05/14 09:30:02.000, 80 %, 290.0 W\n"
        "2024/05/14 09:30:02.000, 20 %, 110.0 W\n"
    )
    result = analyze_nvidia_smi(text.encode())
    assert [g["gpu"] for g in result["gpus"]] == ["0", "1"]
    assert result["gpus"][1]["stats"]["utilization_gpu_pct"]["mean"] == 15


def test_bad_rows_are_counted_not_fatal() -> None:
    text = (
        "timestamp, index, utilization.gpu [%]\n"
        "2024/05/14 09:30:01.000, 0, 90 %\n"
        "not a time, 0, 50 %\n"
        "2024/05/14 09:30:02.000, 0\n"
        "2024/05/14 09:30:03.000, 0, 70 %\n"
    )
    result = analyze_nvidia_smi(text.encode())
    assert result["malformed_rows"] == 2 and result["samples"] == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty"),
        (b"timestamp, index, utilization.gpu [%]\n", "No usable"),
        (b"timestamp, index, utilization.gpu [%]\ngarbage, 0, 1 %\n", "No usable"),
        (b'"unterminated\n', "No usable|malformed"),
    ],
)
def test_nvidia_smi_malformed(content: bytes, message: str) -> None:
    with pytest.raises(ArtifactError, match=message):
        analyze_nvidia_smi(content)


def test_dstat_072() -> None:
    result = analyze_dstat(DATA / "dstat_0.7.2.csv")
    json.dumps(result, allow_nan=False)
    assert result["host"] == "gpu-node-07"
    assert result["date"] == "14 May 2024 09:30:00 UTC"
    assert result["samples"] == 4  # the since-boot first row is dropped
    assert result["time_axis"] == "unix_s"
    assert result["start_unix_s"] == pytest.approx(_unix("2024-05-14 09:30:01.000"))
    assert result["median_interval_s"] == 1.0
    assert "cpu_hiq_pct" in result["columns"] and "system_int_per_s" in result["columns"]
    summary = result["summary"]
    assert summary["cpu_usr_mean_pct"] == pytest.approx((22.5 + 24.0 + 23.125 + 21.0) / 4, abs=1e-3)
    assert summary["cpu_wait_mean_pct"] == pytest.approx(22.5)
    assert summary["disk_read_mean_bytes_per_s"] == pytest.approx(104071168.0)
    assert summary["net_send_mean_bytes_per_s"] == pytest.approx(2042.0)
    assert summary["mem_used_max_bytes"] is None  # not recorded
    assert len(result["series"]["cpu_wai_pct"]) == 4


def test_dstat_073_multi_device_and_trailing_commas() -> None:
    result = analyze_dstat(DATA / "dstat_0.7.3.csv")
    assert result["samples"] == 3
    assert result["start_unix_s"] == pytest.approx(1715679005.004)
    assert result["median_interval_s"] == 5.0
    assert "dsk_sdb_writ_bytes_per_s" in result["columns"]
    assert "" not in result["columns"]
    summary = result["summary"]
    assert summary["disk_write_mean_bytes_per_s"] == pytest.approx((524288 + 4096 + 262144) / 3)
    assert summary["net_recv_mean_bytes_per_s"] == pytest.approx((5242880000 + 5138022400 + 5348392960) / 3)
    assert summary["mem_used_max_bytes"] == 22565355520
    assert result["stats"]["cpu_stl_pct"]["max"] == 0


def test_dstat_without_time_columns_uses_sample_index() -> None:
    text = '"total cpu usage",,,\n"usr","sys","idl","wai"\n1,1,97,1\n50,5,40,5\n60,5,30,5\n'
    result = analyze_dstat(text.encode())
    assert result["time_axis"] == "sample_index"
    assert result["start_unix_s"] is None
    assert result["series"]["t_unix_s"] == [0.0, 1.0]
    assert result["summary"]["cpu_usr_mean_pct"] == 55


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "No dstat header"),
        (b'"Dstat 0.7.3 CSV output"\n"Host:","h",,,,"User:","u"\n', "No dstat header"),
        (b'"total cpu usage",,,\n"usr","sys","idl","wai"\n1,1,97,1\n', "fewer than two samples"),
        (b"1,2,3\n4,5,6\n", "No dstat header"),
    ],
)
def test_dstat_malformed(content: bytes, message: str) -> None:
    with pytest.raises(ArtifactError, match=message):
        analyze_dstat(content)


def test_size_limits() -> None:
    with pytest.raises(ArtifactError, match="limit"):
        analyze_dstat(DATA / "dstat_0.7.2.csv", max_bytes=10)
    with pytest.raises(ArtifactError, match="limit"):
        analyze_nvidia_smi(DATA / "nvidia_smi_units.csv", max_bytes=10)


def test_fields_may_be_one_string() -> None:
    result = analyze_nvidia_smi(DATA / "nvidia_smi_noheader_nounits.csv", fields=NOHEADER_FIELDS)
    assert result["gpu_count"] == 4


@pytest.mark.parametrize(
    ("name", "analyze"),
    [
        ("nvidia_smi_units.csv", analyze_nvidia_smi),
        ("dstat_0.7.2.csv", analyze_dstat),
        ("dstat_0.7.3.csv", analyze_dstat),
    ],
)
def test_truncated_files_parse_or_raise_artifact_error(name: str, analyze: Callable[..., dict]) -> None:
    data = (DATA / name).read_bytes()
    for cut in range(0, len(data), max(1, len(data) // 40)):
        with contextlib.suppress(ArtifactError):
            json.dumps(analyze(data[:cut]), allow_nan=False)
