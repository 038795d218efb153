"""DCGM signal registry: names and aliases, normalisation, readiness, query shapes, result assembly."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from jobs.metrics.prometheus import Series
from jobs.metrics.promql import Selector
from jobs.metrics.signal_queries import (
    aggregate_query,
    base_vector,
    fetch_job_signals,
    per_gpu_matrix,
    per_gpu_query,
    stats_from_series,
    window_total_query,
    xid_codes_query,
)
from jobs.metrics.signals import (
    COUNT,
    DEFAULT_DISABLED,
    MAX,
    MEAN,
    MIN,
    NONZERO,
    SIGNALS,
    THROTTLE_BITS,
    GpuKey,
    Reading,
    describe,
    grid,
    heatmap_step,
    readiness,
    signal_for_metric,
)

# Every field named in reference/dcgm.md's "Fields the product reads" table.
DCGM_MD_FIELDS = [
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_XID_ERRORS",
]  # fmt: skip

# dcgm.md "Off by default": SM_ACTIVE, SM_OCCUPANCY, PIPE_FP16/32/64, *_VIOLATION, NVLink TX/RX bytes.
OFF_BY_DEFAULT = {"sm_active", "sm_occupancy", "fp16_active", "fp32_active", "fp64_active",
                  "power_violation", "thermal_violation", "nvlink_tx_bytes", "nvlink_rx_bytes"}  # fmt: skip
ON_BY_DEFAULT = {"gpu_util", "gr_engine_active", "tensor_active", "dram_active", "pcie_tx_bytes",
                 "pcie_rx_bytes", "sm_clock", "mem_clock", "gpu_temp", "memory_temp", "power_usage",
                 "total_energy", "mem_copy_util", "fb_free", "fb_used", "xid_errors",
                 "nvlink_bandwidth_total"}  # fmt: skip

JOB = Selector.from_labels({"hpc_job": "48213"})


def test_registry_covers_every_field_in_dcgm_md() -> None:
    fields = {s.field for s in SIGNALS.values()}
    assert set(DCGM_MD_FIELDS) <= fields


@pytest.mark.parametrize(
    ("metric", "key"),
    [
        ("DCGM_FI_PROF_SM_ACTIVE", "sm_active"),
        ("DCGM_FI_PROF_SM_UTIL_RATIO", "sm_active"),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active"),
        ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", "tensor_active"),
        ("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", "gr_engine_active"),
        ("DCGM_FI_PROF_DRAM_UTIL_RATIO", "dram_active"),
        ("DCGM_FI_DEV_GPU_UTIL_RATIO", "gpu_util"),
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "clock_throttle_reasons"),
        ("DCGM_FI_DEV_XID_ERROR", "xid_errors"),
        ("DCGM_FI_DEV_BOARD_POWER_WATTS", "power_usage"),
    ],
)
def test_old_and_dcgm_4_6_names_map_to_the_same_signal(metric: str, key: str) -> None:
    sig = signal_for_metric(metric)
    assert sig is not None and sig.key == key


def test_released_exporter_name_comes_first_so_or_prefers_it() -> None:
    for sig in SIGNALS.values():
        assert sig.metrics[0] == sig.field


def test_unknown_metric_has_no_signal() -> None:
    assert signal_for_metric("node_cpu_seconds_total") is None


def test_percent_fields_normalise_to_ratios_including_the_misnamed_4_6_gpu_util() -> None:
    # DCGM 4.6 renamed GPU_UTIL to GPU_UTIL_RATIO but still stores NVML's integer percent.
    gpu_util = SIGNALS["gpu_util"]
    assert "DCGM_FI_DEV_GPU_UTIL_RATIO" in gpu_util.metrics
    np.testing.assert_allclose(gpu_util.normalise(np.array([0, 50, 99, 100])), [0, 0.5, 0.99, 1.0])
    np.testing.assert_allclose(SIGNALS["mem_copy_util"].normalise(37), 0.37)
    assert gpu_util.unit == "ratio" and gpu_util.raw_unit == "%"


def test_ratio_fields_are_left_unchanged() -> None:
    for sig in SIGNALS.values():
        if sig.raw_unit == "ratio":
            assert sig.scale == 1.0 and sig.unit == "ratio", sig.key


def test_counters_declare_how_to_read_them() -> None:
    assert SIGNALS["power_violation"].reading is Reading.RATE
    assert SIGNALS["thermal_violation"].reading is Reading.RATE
    assert SIGNALS["power_violation"].scale == 1e-9  # ns per s -> share of time
    assert SIGNALS["total_energy"].reading is Reading.ENERGY
    assert SIGNALS["total_energy"].scale == 1e-3  # mJ per s -> W
    for sig in SIGNALS.values():
        if sig.key == "nvlink_bandwidth_total":
            continue  # declared counter, read as a gauge (dcgm.md): tests/unit/test_dcgm_units.py
        # LEVEL: health counts declared `counter`, read as levels (their rise in the job's window).
        counter = sig.reading in (Reading.RATE, Reading.ENERGY, Reading.COUNTER, Reading.LEVEL)
        assert (sig.prom_type == "counter") == counter, sig.key


def test_default_set_matches_dcgm_exporter_defaults() -> None:
    assert OFF_BY_DEFAULT <= DEFAULT_DISABLED
    assert not (ON_BY_DEFAULT & DEFAULT_DISABLED)


def test_enable_line_is_a_counters_csv_line() -> None:
    line = SIGNALS["sm_active"].enable_line
    assert line == "DCGM_FI_PROF_SM_ACTIVE, gauge, The ratio of cycles an SM has at least 1 warp assigned."
    assert SIGNALS["thermal_violation"].enable_line.startswith("DCGM_FI_DEV_THERMAL_VIOLATION, counter, ")


def test_readiness_lists_every_field_with_what_its_absence_hides() -> None:
    rows = readiness(set())
    assert [r.key for r in rows] == list(SIGNALS)
    assert all(r.hides and r.enable for r in rows)
    assert not any(r.present for r in rows)


def test_readiness_for_a_default_exporter_flags_sm_active_with_how_to_enable_it() -> None:
    present = {SIGNALS[k].metrics[0] for k in SIGNALS if k not in DEFAULT_DISABLED}
    rows = {r.key: r for r in readiness(present)}
    sm = rows["sm_active"]
    assert not sm.present and not sm.default_enabled
    assert "DCGM_FI_PROF_SM_ACTIVE, gauge," in sm.enable
    assert "false saturation" in sm.hides
    assert rows["gpu_util"].present
    assert {k for k, r in rows.items() if not r.present} == set(DEFAULT_DISABLED)


def test_readiness_accepts_dcgm_4_6_names_and_signal_keys() -> None:
    rows = {r.key: r for r in readiness({"DCGM_FI_PROF_SM_UTIL_RATIO", "tensor_active"})}
    assert rows["sm_active"].present
    assert rows["tensor_active"].present
    assert not rows["dram_active"].present


def test_missing_default_field_readiness_points_at_scraping_not_the_csv() -> None:
    row = next(r for r in readiness(set()) if r.key == "gpu_util")
    assert "default counters" in row.enable and "scraped" in row.enable


def _or_branches(query: str) -> int:
    return len(re.findall(r"\{[^}]*\}", query))


def test_aggregate_query_returns_mean_min_max_count_in_one_query() -> None:
    q = aggregate_query(SIGNALS["sm_active"], JOB)
    for stat in (MEAN, MIN, MAX, COUNT):
        assert f'"stat", "{stat}"' in q
    assert q.count("avg(") == 1 and q.count("min(") == 1 and q.count("max(") == 1 and q.count("count(") == 1


def test_aggregate_query_size_does_not_grow_with_gpus_on_identical_hosts() -> None:
    small = Selector.from_gpus([{"hostname": "n0", "gpu": g} for g in range(8)])
    big = Selector.from_gpus([{"hostname": f"n{h}", "gpu": g} for h in range(32) for g in range(8)])
    sig = SIGNALS["tensor_active"]
    assert _or_branches(aggregate_query(sig, small)) == _or_branches(aggregate_query(sig, big))


def test_percent_signals_are_scaled_in_promql() -> None:
    assert base_vector(SIGNALS["gpu_util"], JOB).endswith(") * 0.01")
    assert "DCGM_FI_DEV_GPU_UTIL_RATIO{" in base_vector(SIGNALS["gpu_util"], JOB)
    assert "*" not in base_vector(SIGNALS["sm_active"], JOB)


def test_violation_counters_are_read_with_rate_and_energy_too() -> None:
    q = base_vector(SIGNALS["thermal_violation"], JOB, rate_window_s=120)
    assert q.startswith("(rate(DCGM_FI_DEV_THERMAL_VIOLATION{") and "[120s])" in q and q.endswith("* 1e-09")
    e = base_vector(SIGNALS["total_energy"], JOB)
    assert e.startswith("(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{") and e.endswith("* 0.001")


def test_energy_total_over_the_job_uses_increase() -> None:
    q = window_total_query(SIGNALS["total_energy"], JOB, 3600)
    assert q.startswith("sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{") and "[3600s]" in q
    with pytest.raises(ValueError):
        window_total_query(SIGNALS["gpu_util"], JOB, 3600)


def test_xid_aggregates_are_max_and_number_of_gpus_with_errors() -> None:
    sig = SIGNALS["xid_errors"]
    assert sig.stats == (MAX, NONZERO, COUNT)
    q = aggregate_query(sig, JOB)
    assert "avg(" not in q and "!= 0) or vector(0)" in q
    assert xid_codes_query(JOB, 600).startswith("max by (Hostname, hostname, exported_Hostname")


def test_throttle_reasons_are_split_into_bits() -> None:
    sig = SIGNALS["clock_throttle_reasons"]
    q = aggregate_query(sig, JOB)
    for name, bit in THROTTLE_BITS.items():
        assert f"/ {bit}) % 2)" in q and f'"stat", "{name}"' in q


def test_per_gpu_query_groups_by_every_host_spelling_and_gpu() -> None:
    q = per_gpu_query(SIGNALS["sm_active"], JOB)
    assert q.startswith("avg by (Hostname, hostname, exported_Hostname, exported_hostname, gpu) (")
    assert per_gpu_query(SIGNALS["xid_errors"], JOB).startswith("max by (")


def test_grid_matches_prometheus_evaluation_points() -> None:
    np.testing.assert_array_equal(grid(100.0, 220.0, 30.0), [100, 130, 160, 190, 220])
    np.testing.assert_array_equal(grid(100.0, 219.0, 30.0), [100, 130, 160, 190])


def _series(labels: dict[str, str], ts: list[float], vals: list[float]) -> Series:
    return Series(labels, np.array(ts, dtype=float), np.array(vals, dtype=float))


def test_stats_are_placed_on_the_grid_with_nan_for_missing_points() -> None:
    ts = grid(0.0, 90.0, 30.0)
    stats = stats_from_series([_series({"stat": "mean"}, [0, 60], [0.5, 0.7])], ts)
    np.testing.assert_array_equal(np.isnan(stats["mean"]), [False, True, False, True])
    assert stats["mean"][2] == 0.7


def test_per_gpu_matrix_sorts_gpus_and_merges_host_spellings() -> None:
    ts = grid(0.0, 60.0, 30.0)
    series = [
        _series({"Hostname": "b", "gpu": "10"}, [0, 30, 60], [1, 1, 1]),
        _series({"Hostname": "b", "gpu": "2"}, [0, 30, 60], [2, 2, 2]),
        _series({"hostname": "a", "gpu": "0"}, [0], [3]),
        _series({"exported_hostname": "a", "gpu": "0"}, [60], [4]),
    ]
    keys, matrix = per_gpu_matrix(series, ts)
    assert keys == (GpuKey("a", "0"), GpuKey("b", "2"), GpuKey("b", "10"))
    assert str(keys[0]) == "a/0"
    np.testing.assert_array_equal(matrix[0], [3, np.nan, 4])
    assert matrix.shape == (3, 3)


class FakeClient:
    """Answers presence and range queries from canned data, and counts queries."""

    def __init__(self, present: set[str]) -> None:
        self.present = present
        self.queries: list[str] = []

    def label_values(self, label: str, match: Any = (), start: Any = None, end: Any = None) -> list[str]:
        self.queries.append(f"labels:{label}")
        return sorted(self.present)

    def range(self, query: str, start: Any, end: Any, step: float | None = None) -> list[Series]:
        self.queries.append(query)
        ts = list(grid(float(start), float(end), float(step or 30)))
        if query.startswith("avg by") or query.startswith("max by"):
            return [_series({"Hostname": "n", "gpu": str(g)}, ts, [0.5] * len(ts)) for g in range(2)]
        return [_series({"stat": s}, ts, [0.5] * len(ts)) for s in (MEAN, MIN, MAX, COUNT)]


def test_fetch_lists_missing_signals_with_reasons_and_never_zero_fills() -> None:
    client = FakeClient({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_TENSOR_UTIL_RATIO"})
    js = fetch_job_signals(client, JOB, 0.0, 300.0, 30.0, keys=["gpu_util", "tensor_active", "sm_active"])
    assert set(js.signals) == {"gpu_util", "tensor_active"}
    assert js.get("sm_active") is None
    assert "DCGM_FI_PROF_SM_ACTIVE, gauge" in js.missing["sm_active"]
    assert js.signals["gpu_util"].mean is not None and len(js.signals["gpu_util"].mean) == len(js.timestamps)
    assert js.present == {"gpu_util", "tensor_active"}


def test_fetch_issues_one_query_per_signal_plus_one_per_gpu_query() -> None:
    client = FakeClient({s.metrics[0] for s in SIGNALS.values()})
    js = fetch_job_signals(client, JOB, 0.0, 600.0, 30.0, per_gpu_step=120.0)
    assert len(client.queries) == 1 + 2 * len(SIGNALS)
    sm = js.signals["sm_active"]
    assert sm.per_gpu is not None and sm.per_gpu.shape == (2, 6)
    assert sm.gpu_timestamps is not None and sm.gpu_timestamps[1] - sm.gpu_timestamps[0] == 120.0


def test_present_metric_without_samples_is_missing_with_its_own_reason() -> None:
    class Empty(FakeClient):
        def range(self, query: str, start: Any, end: Any, step: float | None = None) -> list[Series]:
            return []

    js = fetch_job_signals(Empty({"DCGM_FI_DEV_GPU_UTIL"}), JOB, 0.0, 300.0, 30.0, keys=["gpu_util"])
    assert "no samples" in js.missing["gpu_util"]


def test_describe_lists_registry_as_plain_dicts() -> None:
    rows = describe(["sm_active"])
    assert rows[0]["field"] == "DCGM_FI_PROF_SM_ACTIVE"
    assert rows[0]["metrics"] == ["DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO"]
    assert rows[0]["default_enabled"] is False


def test_heatmap_step_caps_columns_and_never_goes_below_the_scrape_interval() -> None:
    assert heatmap_step(0, 7 * 86400, columns=240) == 2531.0
    assert (7 * 86400) / heatmap_step(0, 7 * 86400, columns=240) <= 239
    assert heatmap_step(0, 600) == 30.0
