"""The NVML GPM exporter's names as aliases of the DCGM fields they measure: units, queries, simulation."""

from __future__ import annotations

import re

import numpy as np
import pytest

from jobs.metrics.promql import Selector
from jobs.metrics.signal_queries import DCGM_NAME_REGEX, aggregate_query, base_vector
from jobs.metrics.signals import ALIAS_METRICS, SIGNALS, describe, readiness, signal_for_metric
from jobs.simulate import gpm
from jobs.simulate.core import SimSpec, simulate

JOB = Selector.from_labels({"hpc_job": "48213"})


@pytest.mark.parametrize(
    ("metric", "key", "scale"),
    [
        ("nvidia_gpu_sm_util_percent", "sm_active", 1.0),  # GPM writes Value / 100: a ratio
        ("nvidia_gpu_any_tensor_util_percent", "tensor_active", 1.0),
        ("nvidia_gpu_dram_bw_util_percent", "dram_active", 1.0),
        ("nvidia_gpu_graphics_util_percent", "gr_engine_active", 1.0),
        ("nvidia_gpu_sm_occupancy_percent", "sm_occupancy", 1.0),
        ("nvidia_gpu_duty_cycle", "gpu_util", 0.01),  # NVML's integer percent, as DCGM_FI_DEV_GPU_UTIL
        ("nvidia_gpu_pcie_rx_per_sec", "pcie_rx_bytes", 1.0),  # MiB/s * 1024 * 1024 = B/s
        ("nvidia_gpu_nvlink_total_tx_per_sec", "nvlink_tx_bytes", 1.0),
        ("nvidia_gpu_power_usage_milliwatts", "power_usage", 1e-3),  # mW -> W
        ("nvidia_gpu_memory_used_bytes", "fb_used", 1.0 / 1048576.0),  # B -> MiB
    ],
)
def test_gpm_names_map_to_the_dcgm_signal_with_a_scale_to_its_unit(
    metric: str, key: str, scale: float
) -> None:
    sig = signal_for_metric(metric)
    assert sig is not None and sig.key == key
    assert sig.scale_of(metric) == pytest.approx(scale)
    assert metric in sig.names and metric not in sig.metrics  # DCGM names stay first and apart


def test_alias_of_another_signal_is_refused() -> None:
    with pytest.raises(KeyError):
        SIGNALS["sm_active"].scale_of("nvidia_gpu_power_usage_milliwatts")


def test_presence_regex_matches_dcgm_fields_and_exactly_the_aliases() -> None:
    rx = re.compile(DCGM_NAME_REGEX)  # Prometheus anchors it; fullmatch does the same here
    assert rx.fullmatch("DCGM_FI_PROF_SM_ACTIVE")
    assert all(rx.fullmatch(m) for m in ALIAS_METRICS)
    assert not rx.fullmatch("nvidia_gpu_jobId")  # the exporter's other families are not signals
    assert not rx.fullmatch("nvidia_gpu_sm_util_percent_x")


def test_alias_in_other_units_is_scaled_apart_and_joined_with_or() -> None:
    q = base_vector(
        SIGNALS["power_usage"], JOB, step_s=30.0,
        metrics=["DCGM_FI_DEV_POWER_USAGE", "nvidia_gpu_power_usage_milliwatts"],
    )  # fmt: skip
    dcgm = JOB.select_range(["DCGM_FI_DEV_POWER_USAGE"], "avg_over_time", 29.999)
    gpm_mw = JOB.select_range(["nvidia_gpu_power_usage_milliwatts"], "avg_over_time", 29.999)
    assert q == f"(({dcgm}) or ({gpm_mw}) * 0.001)"  # W as is, mW * 0.001


def test_alias_in_the_same_unit_shares_the_selector() -> None:
    q = base_vector(SIGNALS["sm_active"], JOB, step_s=30.0, metrics=["nvidia_gpu_sm_util_percent"])
    assert q == f"({JOB.select_range(['nvidia_gpu_sm_util_percent'], 'avg_over_time', 29.999)})"
    agg = aggregate_query(SIGNALS["sm_active"], JOB, metrics=["nvidia_gpu_sm_util_percent"])
    assert "DCGM_FI_PROF_SM_ACTIVE" not in agg and "count_over_time(nvidia_gpu_sm_util_percent" in agg


def test_readiness_counts_a_gpm_exporter_as_present() -> None:
    lines = {r.key: r.present for r in readiness(["nvidia_gpu_sm_util_percent"])}
    assert lines["sm_active"] and not lines["tensor_active"]
    d = {x["key"]: x for x in describe(["power_usage"])}
    assert d["power_usage"]["aliases"][0] == {
        "metric": "nvidia_gpu_power_usage_milliwatts", "scale": 1e-3,
        "exporter": "nvidia_gpu_prometheus_exporter (NVML GPM)", "raw_unit": "mW",
    }  # fmt: skip


def _parse(lines: list[str]) -> dict[str, dict[tuple[str, float], float]]:
    out: dict[str, dict[tuple[str, float], float]] = {}
    for line in lines:
        if line.startswith("#"):
            continue
        m = re.fullmatch(r"(\w+)\{(.*)\} (\S+) (\S+)\n", line)
        assert m, line
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m[2]))
        out.setdefault(m[1], {})[(f"{labels['Hostname']}/{labels['gpu']}", float(m[4]))] = float(m[3])
    return out


def test_simulated_gpm_series_read_back_through_the_aliases_equal_the_dcgm_reading() -> None:
    res = simulate(SimSpec(gpus=2, duration_s=120.0, step_s=30.0))
    stored = _parse(list(gpm.openmetrics_lines([res])))
    for metric, rows in stored.items():
        sig = signal_for_metric(metric)
        assert sig is not None
        for (gpu, ts), raw in rows.items():
            g = [x.key for x in res.gpus].index(gpu)
            t = int(np.flatnonzero(np.isclose(res.timestamps, ts, rtol=0.0, atol=1e-3))[0])
            dcgm = res.fields[sig.key][g, t] * sig.scale
            # Integers (duty cycle, mW, bytes) are rounded by the exporter: within half a raw unit.
            assert raw * sig.scale_of(metric) == pytest.approx(dcgm, rel=1e-5, abs=0.5 * sig.scale_of(metric))
    # GPM needs two samples: the first scrape has no SM activity, but has duty cycle and power.
    first = res.timestamps[0]
    assert not any(ts == first for _, ts in stored["nvidia_gpu_sm_util_percent"])
    assert any(ts == first for _, ts in stored["nvidia_gpu_duty_cycle"])


def test_gpm_exporter_text_has_its_own_labels_and_units() -> None:
    res = simulate(SimSpec(gpus=1, duration_s=60.0, step_s=30.0))
    res.fields["power_usage"][0, 1] = 312.5  # W, as DCGM reports it
    res.fields["sm_active"][0, 1] = 0.42
    text = gpm.exporter_text([res], res.timestamps[1], res.gpus[0].hostname)
    labels = (
        f'GPU_I_ID="",jobid="48213",minor_number="0",name="{res.spec.gpu_model}",ordinal="0",userid="",'
        f'uuid="{res.gpus[0].uuid}"'
    )
    assert f"nvidia_gpu_power_usage_milliwatts{{{labels}}} 312500" in text.splitlines()
    assert f"nvidia_gpu_sm_util_percent{{{labels}}} 0.42" in text.splitlines()
    assert "# TYPE nvidia_gpu_sm_util_percent gauge" in text
    assert "Hostname" not in text  # the exporter has no host label; Prometheus' relabelling adds it
