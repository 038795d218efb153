"""Every DCGM field's unit, scale, reading and Prometheus type against reference/dcgm.md, and field 449.

Field 449 (DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL) is the case that went wrong: dcgm-exporter declares it
`counter`, but its values are an instantaneous MB/s rate (TX+RX over all links) that goes up and down
(dcgm.md; KempnerInstitute/kempnerpulse #10, #11). Reading it as a KiB counter through rate() showed
~10^4 too little. These tests pin the corrected reading end to end: what the simulator emits, what the
registry's PromQL turns it into, and what a real Prometheus returns for it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.diagnosis_inputs import signals_from_sim
from jobs.metrics.promql import Selector
from jobs.metrics.signal_queries import (
    aggregate_query,
    base_vector,
    fetch_job_signals,
    per_gpu_query,
    window_total_query,
)
from jobs.metrics.signals import MAX, MEAN, MIN, SIGNALS, Reading
from jobs.simulate import SimSpec, exporter_text, openmetrics_lines, simulate

G, R, E, C, B, L = Reading.GAUGE, Reading.RATE, Reading.ENERGY, Reading.CODE, Reading.BITMASK, Reading.LEVEL

# Hand-written from reference/dcgm.md ("Fields the product reads" for units, "What a default dcgm-exporter
# emits" for the default set) and dcgm-exporter's counters CSVs for the declared type:
# key: (raw unit, registry unit, scale raw -> unit, reading, `# TYPE` / enable-line type, default on)
EXPECTED: dict[str, tuple[str, str, float, Reading, str, bool]] = {
    # dcgm.md: "percent 0-100 (int)"; ratio = percent / 100
    "gpu_util": ("%", "ratio", 0.01, G, "gauge", True),
    # dcgm.md: profiling activities are "ratio 0-1": nothing to scale
    "gr_engine_active": ("ratio", "ratio", 1.0, G, "gauge", True),
    "sm_active": ("ratio", "ratio", 1.0, G, "gauge", False),  # dcgm.md: off by default
    "sm_occupancy": ("ratio", "ratio", 1.0, G, "gauge", False),
    "tensor_active": ("ratio", "ratio", 1.0, G, "gauge", True),
    "tensor_hmma_active": ("ratio", "ratio", 1.0, G, "gauge", False),
    "tensor_imma_active": ("ratio", "ratio", 1.0, G, "gauge", False),
    "tensor_dfma_active": ("ratio", "ratio", 1.0, G, "gauge", False),
    "fp16_active": ("ratio", "ratio", 1.0, G, "gauge", False),
    "fp32_active": ("ratio", "ratio", 1.0, G, "gauge", False),
    "fp64_active": ("ratio", "ratio", 1.0, G, "gauge", False),
    "dram_active": ("ratio", "ratio", 1.0, G, "gauge", True),
    # dcgm.md: MEM_COPY_UTIL "percent"
    "mem_copy_util": ("%", "ratio", 0.01, G, "gauge", True),
    # dcgm.md: FB_USED / FB_FREE "MiB"
    "fb_used": ("MiB", "MiB", 1.0, G, "gauge", True),
    "fb_free": ("MiB", "MiB", 1.0, G, "gauge", True),
    # dcgm.md: PROF PCIe / NVLink TX/RX "bytes/s" (rates, gauges: sampling.md)
    "pcie_tx_bytes": ("B/s", "B/s", 1.0, G, "gauge", True),
    "pcie_rx_bytes": ("B/s", "B/s", 1.0, G, "gauge", True),
    "nvlink_tx_bytes": ("B/s", "B/s", 1.0, G, "gauge", False),
    "nvlink_rx_bytes": ("B/s", "B/s", 1.0, G, "gauge", False),
    # dcgm.md: 449 "MB/s, instantaneous (declared `counter` by exporters ...) read it as a gauge";
    # MB decimal, so B/s = MB/s * 10^6. The declared type stays `counter` (default-counters.csv).
    "nvlink_bandwidth_total": ("MB/s", "B/s", 1e6, G, "counter", True),
    # dcgm.md: POWER_USAGE "W"
    "power_usage": ("W", "W", 1.0, G, "gauge", True),
    # dcgm.md: "mJ counter since driver load": rate in mJ/s * 10^-3 = W
    "total_energy": ("mJ", "W", 1e-3, E, "counter", True),
    # dcgm.md: temperatures "deg C", clocks "MHz"
    "gpu_temp": ("C", "C", 1.0, G, "gauge", True),
    "memory_temp": ("C", "C", 1.0, G, "gauge", True),
    "sm_clock": ("MHz", "MHz", 1.0, G, "gauge", True),
    "mem_clock": ("MHz", "MHz", 1.0, G, "gauge", True),
    # dcgm.md: "bitmask"; not in the default list
    "clock_throttle_reasons": ("bitmask", "share of GPUs", 1.0, B, "gauge", False),
    # dcgm.md: "cumulative ns": rate in ns/s * 10^-9 = share of time; off by default
    "power_violation": ("ns", "share of time", 1e-9, R, "counter", False),
    "thermal_violation": ("ns", "share of time", 1e-9, R, "counter", False),
    # dcgm.md: XID_ERRORS "gauge, last XID code"
    "xid_errors": ("code", "code", 1.0, C, "gauge", True),
    # Health fields (NVIDIA/dcgm-exporter etc/default-counters.csv): cumulative counts since driver load,
    # declared `counter`, read as levels (their rise in the job's window matters); the two remap flags
    # are gauges. Default on: PCIe replays, remapped rows, remap failure; the others are commented out
    # of the CSV (ROW_REMAP_PENDING is not in it).
    "pcie_replay": ("count", "count", 1.0, L, "counter", True),
    "ecc_sbe_volatile": ("count", "count", 1.0, L, "counter", False),
    "ecc_dbe_volatile": ("count", "count", 1.0, L, "counter", False),
    "retired_dbe": ("pages", "pages", 1.0, L, "counter", False),
    "retired_pending": ("pages", "pages", 1.0, L, "counter", False),
    "uncorrectable_remapped_rows": ("rows", "rows", 1.0, L, "counter", True),
    "correctable_remapped_rows": ("rows", "rows", 1.0, L, "counter", True),
    "row_remap_failure": ("flag", "flag", 1.0, C, "gauge", True),
    "row_remap_pending": ("flag", "flag", 1.0, C, "gauge", False),
    "nvlink_crc_flit_errors": ("count", "count", 1.0, L, "counter", False),
    "nvlink_crc_data_errors": ("count", "count", 1.0, L, "counter", False),
    "nvlink_replay_errors": ("count", "count", 1.0, L, "counter", False),
    "nvlink_recovery_errors": ("count", "count", 1.0, L, "counter", False),
}

JOB = Selector.from_labels({"hpc_job": "48213"})
NVL = SIGNALS["nvlink_bandwidth_total"]


def test_expectation_table_covers_the_whole_registry() -> None:
    assert set(EXPECTED) == set(SIGNALS)


@pytest.mark.parametrize("key", list(EXPECTED))
def test_registry_entry_has_the_unit_scale_reading_and_type_of_dcgm_md(key: str) -> None:
    raw_unit, unit, scale, reading, prom_type, default = EXPECTED[key]
    sig = SIGNALS[key]
    assert (sig.raw_unit, sig.unit, sig.reading, sig.prom_type, sig.default_enabled) == (
        raw_unit, unit, reading, prom_type, default,
    )  # fmt: skip
    assert sig.scale == pytest.approx(scale, rel=1e-12)
    assert sig.enable_line.startswith(f"{sig.field}, {prom_type}, ")


def test_nvlink_total_enable_line_keeps_the_exporters_counter_type() -> None:
    # default-counters.csv: "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, counter, Total number of NVLink ...".
    assert NVL.enable_line.startswith("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, counter, ")
    assert NVL.metrics == ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL")


def test_nvlink_total_queries_never_use_rate_or_increase() -> None:
    for query in (
        base_vector(NVL, JOB, rate_window_s=120),
        aggregate_query(NVL, JOB),
        per_gpu_query(NVL, JOB),
    ):
        # Gauge functions (a plain read, avg_over_time over the step) are fine; counter functions are not.
        assert not re.search(r"\b(i?rate|increase|delta|deriv|resets)\(", query), query
    assert base_vector(NVL, JOB).endswith(") * 1000000.0")  # MB/s -> B/s
    with pytest.raises(ValueError):
        window_total_query(NVL, JOB, 3600)  # a rate has no total over the window


def test_nvlink_total_normalises_mb_per_s_to_bytes_per_s() -> None:
    # 1 MB/s (decimal) = 10^6 B/s; 80,000 MB/s = 8 * 10^10 B/s = 80 GB/s.
    np.testing.assert_allclose(NVL.normalise(np.array([0, 1, 80_000])), [0, 1e6, 8e10])


# --- the simulator emits what dcgm-exporter emits ------------------------------------------------------


def _eight_gpu_job(**kw: Any) -> Any:
    # The healthy profile moves 40 GB/s TX and 40 GB/s RX per GPU while busy (scenarios.Profile.nvlink);
    # noise=0 makes every GPU move exactly that in every sample.
    spec = dict(scenario="healthy", gpus=8, gpus_per_host=8, hosts=("node-nvl",), job_id="48213",
                duration_s=600.0, step_s=30.0, noise=0.0, seed=1)  # fmt: skip
    return simulate(SimSpec(**{**spec, **kw}))


def test_simulated_nvlink_total_is_tx_plus_rx_in_mb_per_s_per_gpu() -> None:
    res = _eight_gpu_job()
    np.testing.assert_array_equal(res.fields["nvlink_tx_bytes"], 40e9)
    np.testing.assert_array_equal(res.fields["nvlink_rx_bytes"], 40e9)
    # 40e9 + 40e9 = 8e10 B/s; / 1e6 B per MB = 80,000 MB/s, on each of the 8 GPUs, in every sample.
    np.testing.assert_array_equal(res.fields["nvlink_bandwidth_total"], 80_000)


def test_simulated_nvlink_total_reads_back_as_80_gb_per_s_per_gpu() -> None:
    res = _eight_gpu_job()
    js = signals_from_sim(res, keys=["nvlink_bandwidth_total"])
    series = js.signals["nvlink_bandwidth_total"]
    # 80,000 MB/s * 1e6 = 8e10 B/s on every GPU: mean, min and max across the 8 GPUs are all 8e10.
    for stat in (MEAN, MIN, MAX):
        np.testing.assert_allclose(series.stats[stat], 8e10, err_msg=stat)
    assert series.unit == "B/s"


def test_nvlink_total_goes_up_and_down_with_traffic_like_a_rate() -> None:
    # communication_wait bursts NVLink traffic in the troughs of a sawtooth: a rate falls after a burst,
    # a cumulative counter never would.
    res = simulate(SimSpec(scenario="communication_wait", gpus=8, duration_s=3600.0, seed=2))
    total = res.fields["nvlink_bandwidth_total"]
    assert (np.diff(total, axis=1) < 0).any()
    # Still TX+RX in MB/s sample by sample: (tx + rx) / 1e6, rounded to the integer DCGM stores.
    expected = np.rint((res.fields["nvlink_tx_bytes"] + res.fields["nvlink_rx_bytes"]) / 1e6)
    np.testing.assert_array_equal(total, expected)


def test_gpus_without_nvlink_report_no_nvlink_traffic() -> None:
    # An L40S has no NVLink (gpus.py: nvlink_gbps 0): whatever the scenario asks for, it cannot move any.
    res = simulate(SimSpec(scenario="healthy", gpus=2, gpus_per_host=2, gpu_model="NVIDIA L40S"))
    for key in ("nvlink_tx_bytes", "nvlink_rx_bytes", "nvlink_bandwidth_total"):
        assert (res.fields[key] == 0).all(), key


def test_exporter_text_declares_field_449_counter_and_prints_integer_mb_per_s() -> None:
    res = _eight_gpu_job()
    text = exporter_text([res], at=res.timestamps[2])
    assert "# TYPE DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL counter" in text.splitlines()
    values = re.findall(r"^DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL\{.*\} (\S+)$", text, flags=re.M)
    assert values == ["80000"] * 8
    om = "".join(openmetrics_lines([res]))
    assert "# TYPE DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL counter\n" in om


def test_simulated_fields_carry_the_units_of_dcgm_md() -> None:
    res = _eight_gpu_job(noise=0.02, duration_s=1800.0)
    f, m = res.fields, res.model
    # GPU_UTIL is integer percent: a busy GPU reads ~100, which as a ratio would be impossible.
    assert f["gpu_util"].max() > 1 and (f["gpu_util"] == np.rint(f["gpu_util"])).all()
    # Energy in mJ: each step adds power (W = J/s) * 30 s * 1000 mJ/J, so diff / 30 / 1000 = W.
    watts = np.diff(f["total_energy"], axis=1) / res.spec.step_s / 1e3
    np.testing.assert_allclose(watts, f["power_usage"][:, 1:], atol=1e-3)
    # Frame buffer in MiB: used + free + reserved = the model's capacity as nvidia-smi shows it.
    assert (f["fb_used"] + f["fb_free"] + f["fb_reserved"] <= m.fb_total_mib).all()
    assert f["fb_used"].max() > 1000  # tens of GiB in MiB, not GiB or bytes
    # Clocks in MHz, below the model's max boost clock; power in W, near the TDP for a busy GPU.
    assert 1000 < f["sm_clock"].mean() <= m.max_sm_clock_mhz
    assert 0.5 * m.tdp_w < f["power_usage"].mean() <= 1.02 * m.tdp_w
    # PCIe in bytes/s: the healthy profile reads ~1.5 GB/s host-to-device.
    assert 1e8 < f["pcie_rx_bytes"].mean() < m.pcie_gbps * 1e9


# --- a real Prometheus returns the same numbers --------------------------------------------------------


@pytest.mark.prometheus
def test_prometheus_returns_80_gb_per_s_per_gpu_for_a_simulated_8_gpu_job(tmp_path: Path) -> None:
    from jobs.metrics.prometheus import PrometheusClient
    from jobs.simulate import backfill, write_openmetrics
    from tests.prom_server import PrometheusProcess, prometheus_binary

    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (Debian package 'prometheus')")
    res = _eight_gpu_job()
    om = tmp_path / "nvl.om"
    write_openmetrics([res], om)
    backfill(om, tmp_path / "tsdb")
    start, end = float(res.timestamps[0]), float(res.timestamps[-1])
    with PrometheusProcess(tmp_path / "tsdb") as prom:
        client = PrometheusClient(prom.url, timeout_s=10, retries=0)
        js = fetch_job_signals(client, JOB, start, end, 30.0, keys=["nvlink_bandwidth_total"])
    series = js.signals["nvlink_bandwidth_total"]
    # Each GPU: 40 GB/s TX + 40 GB/s RX = 80,000 MB/s stored, * 1e6 in PromQL = 8e10 B/s. Had the query
    # used rate(), a constant 80,000 would have read 0.
    for stat in (MEAN, MIN, MAX):
        np.testing.assert_allclose(series.stats[stat], 8e10, err_msg=stat)
    np.testing.assert_array_equal(series.count, 8)
