"""Simulator: each scenario shows the property it claims, output is deterministic, writers are valid."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from jobs.metrics.signals import SIGNALS
from jobs.simulate import (
    DEFAULT_START,
    SCENARIOS,
    SimResult,
    SimSpec,
    backfill,
    cluster_specs,
    exporter_text,
    openmetrics_lines,
    simulate,
    write_openmetrics,
)
from jobs.simulate.gpus import gpu_uuid

SPEC = SimSpec(gpus=8, gpus_per_host=4, duration_s=3600, step_s=30, seed=7)


def run(scenario: str, **kw: object) -> SimResult:
    return simulate(SimSpec(**{**_spec_kwargs(SPEC), "scenario": scenario, **kw}))


def _spec_kwargs(spec: SimSpec) -> dict[str, object]:
    return {name: getattr(spec, name) for name in spec.__slots__}


def ratio(res: SimResult, key: str) -> np.ndarray:
    """A field in the registry's normalised unit (GPU_UTIL percent -> ratio)."""
    return SIGNALS[key].normalise(res.fields[key])


def requires_promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian/Ubuntu package: prometheus)")
    return path


# --- scenarios --------------------------------------------------------------------------------------


def test_healthy_job_is_busy_with_high_sm_and_tensor_activity() -> None:
    res = run("healthy")
    assert ratio(res, "gpu_util").mean() >= 0.95
    assert ratio(res, "sm_active").mean() >= 0.85
    assert ratio(res, "tensor_active").mean() >= 0.4
    assert res.throughput.mfu == pytest.approx(0.45)


def test_false_saturation_has_util_at_least_90_percent_and_sm_active_below_half() -> None:
    res = run("false_saturation")
    assert np.median(ratio(res, "gpu_util")) >= 0.9
    assert ratio(res, "gpu_util").mean() >= 0.9
    assert ratio(res, "sm_active").mean() < 0.5
    assert ratio(res, "sm_active").max() < 0.5
    # AcmeTrace's median occupancy is 14 %: the simulated job sits close to it.
    assert 0.10 < ratio(res, "sm_occupancy").mean() < 0.18


def test_data_pipeline_stall_drops_every_gpu_to_idle_at_a_regular_period() -> None:
    res = run("data_pipeline_stall", params={"stall_every": 4})
    util = ratio(res, "gpu_util")
    idle_cols = np.flatnonzero((util < 0.1).all(axis=0))
    assert len(idle_cols) >= 0.2 * util.shape[1]
    assert set(np.diff(idle_cols)) == {4}  # regular: every 4th sample, on all GPUs at once
    busy_cols = np.setdiff1d(np.arange(util.shape[1]), idle_cols)
    assert util[:, busy_cols].mean() > 0.9
    assert res.truth["stall_period_s"] == 120


def test_launch_overhead_is_busy_with_low_sm_and_tensor_activity() -> None:
    res = run("launch_overhead")
    assert ratio(res, "gpu_util").mean() >= 0.9
    assert ratio(res, "sm_active").mean() < 0.35
    assert ratio(res, "tensor_active").mean() < 0.15


def test_communication_wait_is_a_sawtooth_synchronised_across_gpus_with_nvlink_bursts() -> None:
    res = run("communication_wait")
    sm = ratio(res, "sm_active")
    corr = np.corrcoef(sm)
    assert corr[np.triu_indices(len(corr), 1)].min() > 0.9  # every pair of GPUs moves together
    mean_sm = sm.mean(axis=0)
    nvl = res.fields["nvlink_tx_bytes"].mean(axis=0)
    assert nvl.max() > 5 * nvl.min()
    assert np.corrcoef(mean_sm, nvl)[0, 1] < -0.5  # traffic bursts while compute is low
    # Periodic: the mean SM-active curve repeats every 8 samples.
    assert np.corrcoef(mean_sm[:-8], mean_sm[8:])[0, 1] > 0.9


def test_throttling_shows_low_clocks_rising_violation_counters_heat_and_power() -> None:
    res = run("throttling")
    max_clock = res.model.max_sm_clock_mhz
    assert res.fields["sm_clock"].mean() < 0.8 * max_clock
    for key, share in (("thermal_violation", 0.55), ("power_violation", 0.35)):
        rate = np.diff(res.fields[key], axis=1) / 1e9 / res.spec.step_s
        assert (rate > 0).all()
        assert rate.mean() == pytest.approx(share, rel=0.01)
    assert res.fields["gpu_temp"][:, 20:].mean() > 80
    assert res.fields["power_usage"].mean() > 0.9 * res.model.tdp_w
    bits = res.fields["clock_throttle_reasons"].astype(int)
    assert ((bits & (0x4 | 0x20 | 0x40)) != 0).all()


def test_tensor_cores_idle_keeps_sms_busy_but_tensor_pipe_below_0_3() -> None:
    res = run("tensor_cores_idle")
    assert ratio(res, "sm_active").mean() > 0.8
    assert ratio(res, "tensor_active").mean() < 0.3
    assert ratio(res, "fp32_active").mean() > 0.4


def test_memory_bound_has_high_dram_and_low_tensor() -> None:
    res = run("memory_bound")
    assert ratio(res, "dram_active").mean() > 0.7
    assert ratio(res, "tensor_active").mean() < 0.3


def test_host_device_copy_has_high_pcie_traffic() -> None:
    res = run("host_device_copy")
    healthy = run("healthy")
    assert res.fields["pcie_rx_bytes"].mean() > 10e9
    assert res.fields["pcie_rx_bytes"].mean() > 5 * healthy.fields["pcie_rx_bytes"].mean()
    assert res.fields["pcie_tx_bytes"].mean() > 5e9


@pytest.mark.parametrize("scope", ["gpu", "node"])
def test_straggler_is_slower_and_less_active_than_its_peers(scope: str) -> None:
    res = run("straggler", params={"straggler_scope": scope})
    slow = res.truth["straggler_gpus"]
    peers = [g for g in range(len(res.gpus)) if g not in slow]
    sm = ratio(res, "sm_active").mean(axis=1)
    clock = res.fields["sm_clock"].mean(axis=1)
    assert sm[slow].max() < sm[peers].min() - 0.1
    assert clock[slow].max() < 0.8 * clock[peers].min()
    assert len(slow) == (1 if scope == "gpu" else 4)
    assert res.truth["straggler_keys"] == [res.gpus[i].key for i in slow]


def test_idle_gpus_sit_at_zero_for_long_stretches() -> None:
    res = run("idle_gpus")
    idle = res.truth["idle_gpus"]
    util = ratio(res, "gpu_util")
    assert len(idle) == 2
    assert ((util[idle] < 0.01).mean(axis=1) > 0.85).all()
    busy = [g for g in range(len(res.gpus)) if g not in idle]
    assert util[busy].mean() > 0.9
    assert (res.fields["power_usage"][idle, -10:] < 100).all()
    assert (res.fields["sm_clock"][idle, -10:] == res.model.idle_sm_clock_mhz).all()


def test_memory_headroom_uses_well_below_capacity() -> None:
    res = run("memory_headroom")
    used = res.fields["fb_used"] / res.model.fb_total_mib
    assert used.max() < 0.3
    assert ratio(res, "sm_active").mean() > 0.8


def test_gpu_errors_report_an_xid_only_inside_its_window_on_one_gpu() -> None:
    res = run("gpu_errors")
    xid = res.fields["xid_errors"]
    first, last = res.truth["xid_samples"]
    gpu = res.truth["xid_gpu"]
    assert (xid[gpu, first : last + 1] == 94).all()
    assert (xid != 0).sum() == last - first + 1
    assert (last - first + 1) * res.spec.step_s >= 600


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_throughput_matches_the_scenario_mfu_and_the_hardware_upper_estimate(name: str) -> None:
    res = run(name)
    tp = res.throughput
    peak = res.model.peak_bf16_tflops * 1e12
    # PaLM 6N + 12·L·H·Q·T for the derived 7e9 shape: 32 layers, hidden sqrt(7e9 / (12 x 32)) = 4270 ->
    # 4224 (33 x 128), 33 heads of 128, 4096 tokens: 4.2e10 + 12 x 32 x 4224 x 4096 = 4.864e10.
    assert tp.flops_per_token == 6 * 7e9 + 12 * 32 * 33 * 128 * 4096
    assert tp.tokens_per_s.mean() * tp.flops_per_token / (len(res.gpus) * peak) == pytest.approx(tp.mfu)
    assert np.all(np.diff(tp.tokens_total) >= 0)
    clock_ratio = res.fields["sm_clock"] / res.model.max_sm_clock_mhz
    upper = (ratio(res, "tensor_active") * clock_ratio).mean()
    assert upper >= tp.mfu  # tensor active x peak x clock ratio bounds MFU from above
    assert upper < tp.mfu * 1.4


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_scenario_yields_values_in_physical_ranges(name: str) -> None:
    res = run(name)
    for key in ("gpu_util", "mem_copy_util"):
        assert ((res.fields[key] >= 0) & (res.fields[key] <= 100)).all()
    for key, sig in SIGNALS.items():
        if sig.raw_unit == "ratio":
            assert ((res.fields[key] >= 0) & (res.fields[key] <= 1)).all(), key
    # dcgm.md: energy (mJ) and violations (ns) are cumulative counters; they never go down.
    for key in ("total_energy", "power_violation", "thermal_violation"):
        assert (np.diff(res.fields[key], axis=1) >= 0).all(), key
    # Field 449 is an MB/s rate, TX+RX: at most both directions of the model's links (GB/s -> MB/s: x 1000).
    nvl_total = res.fields["nvlink_bandwidth_total"]
    assert ((nvl_total >= 0) & (nvl_total <= 2 * res.model.nvlink_gbps * 1000 + 1)).all()
    fb = res.fields["fb_used"] + res.fields["fb_free"] + res.fields["fb_reserved"]
    assert (fb <= res.model.fb_total_mib).all()


# --- options ------------------------------------------------------------------------------------------


def test_same_seed_gives_identical_output_and_another_seed_differs() -> None:
    a, b, c = run("straggler"), run("straggler"), run("straggler", seed=8)
    for key in a.fields:
        np.testing.assert_array_equal(a.fields[key], b.fields[key])
    assert not np.array_equal(a.fields["sm_active"], c.fields["sm_active"])


def test_missing_samples_drop_whole_host_scrapes_as_nan() -> None:
    res = run("healthy", missing_fraction=0.2)
    miss = np.isnan(res.fields["gpu_util"])
    assert 0.1 < miss.mean() < 0.3
    host0 = [i for i, g in enumerate(res.gpus) if g.hostname == res.gpus[0].hostname]
    assert (miss[host0] == miss[host0[0]]).all()  # the whole host's scrape is lost together
    np.testing.assert_array_equal(np.isnan(res.fields["sm_active"]), miss)


def test_disabled_fields_are_absent_not_zero() -> None:
    res = run("healthy", disabled=frozenset({"sm_active", "DCGM_FI_DEV_POWER_VIOLATION"}))
    assert "sm_active" not in res.fields and "power_violation" not in res.fields
    assert "gpu_util" in res.fields
    with pytest.raises(ValueError):
        run("healthy", disabled=frozenset({"NOT_A_FIELD"}))


@pytest.mark.parametrize(
    "kw",
    [{"scenario": "nope"}, {"gpu_model": "NVIDIA L4"}, {"gpus": 0}, {"missing_fraction": 1.0},
     {"host_label": "node"}, {"gpus": 16, "hosts": ("only-one",)}],
)  # fmt: skip
def test_invalid_specs_are_rejected(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        simulate(SimSpec(**kw))  # type: ignore[arg-type]


def test_labels_are_exactly_what_dcgm_exporter_emits() -> None:
    res = run("healthy")
    g = res.gpus[5]
    assert list(g.labels) == [
        "gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION", "hpc_job",
    ]  # fmt: skip
    assert g.labels["gpu"] == "1" and g.labels["device"] == "nvidia1"
    assert g.labels["Hostname"] == "gpu-node-002"
    assert g.labels["pci_bus_id"] == "00000000:2A:00.0"
    assert g.labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", g.uuid)
    assert g.uuid == gpu_uuid("gpu-node-002", 1)


def test_new_exporter_label_spellings_and_kubernetes_labels() -> None:
    res = run("healthy", host_label="hostname", uuid_label="uuid", job_labels="kubernetes", job_id="pretrain")
    labels = res.gpus[4].labels
    assert "hostname" in labels and "Hostname" not in labels
    assert "uuid" in labels and "UUID" not in labels
    assert labels["namespace"] == "llm" and labels["pod"] == "pretrain-worker-1"
    assert labels["container"] == "pytorch" and "hpc_job" not in labels


def test_dcgm_4_6_metric_names_option() -> None:
    res = run("healthy", metric_names="dcgm46")
    assert res.metric_name("sm_active") == "DCGM_FI_PROF_SM_UTIL_RATIO"
    assert res.metric_name("fb_used") == "DCGM_FI_DEV_FB_USED"
    assert run("healthy").metric_name("sm_active") == "DCGM_FI_PROF_SM_ACTIVE"


# --- writers ------------------------------------------------------------------------------------------


def small(**kw: object) -> SimResult:
    return simulate(SimSpec(gpus=2, gpus_per_host=2, duration_s=300, **kw))  # type: ignore[arg-type]


def test_openmetrics_has_one_type_per_family_counters_as_counters_and_eof() -> None:
    text = "".join(openmetrics_lines([small(missing_fraction=0.3, seed=3)]))
    assert text.endswith("# EOF\n")
    types = re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M)
    assert len(types) == len({n for n, _ in types})
    kinds = dict(types)
    assert kinds["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    assert kinds["DCGM_FI_DEV_THERMAL_VIOLATION"] == "counter"
    assert kinds["DCGM_FI_PROF_SM_ACTIVE"] == "gauge"
    # default-counters.csv declares field 449 a counter although it is a rate: the exporter says counter.
    assert kinds["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == "counter"
    assert kinds["train_tokens"] == "counter"
    assert "NaN" not in text  # missing samples are left out, not written as NaN
    line = next(ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_GPU_UTIL{"))
    target = r'instance="gpu-node-001:9400",job="dcgm-exporter"'
    assert re.fullmatch(rf"DCGM_FI_DEV_GPU_UTIL\{{.*{target}\}} \d+ 17672256\d0", line)  # seconds


def test_openmetrics_escapes_label_values_and_renames_exported_labels() -> None:
    res = small(job_id='a"b\\c\nd', job_labels="kubernetes")
    buf = io.StringIO()
    write_openmetrics([res], buf, rename_exported=("pod", "namespace"))
    text = buf.getvalue()
    assert 'exported_pod="a\\"b\\\\c\\nd-worker-0"' in text
    assert ' namespace="' not in text and ",namespace=" not in text


@pytest.mark.prometheus
def test_openmetrics_output_is_accepted_by_promtool(tmp_path: Path) -> None:
    promtool = requires_promtool()
    jobs = [
        small(scenario="throttling", missing_fraction=0.2),
        small(scenario="healthy", hosts=("n.2",), job_id='x"} or vector(1) #', metric_names="dcgm46"),
    ]
    path = tmp_path / "sim.om"
    write_openmetrics(jobs, path)
    out = backfill(path, tmp_path / "tsdb", promtool=promtool)
    assert "NUM SAMPLES" in out
    n_expected = sum(int((~np.isnan(a)).sum()) for r in jobs for a in r.fields.values())
    n_expected += sum(len(r.timestamps) for r in jobs)  # train_tokens_total
    samples = int(out.splitlines()[1].split()[-4])
    assert samples == n_expected


def test_exporter_text_follows_the_exporter_template() -> None:
    res = small()
    text = exporter_text([res], at=res.timestamps[3] + 5, hostname="gpu-node-001")
    lines = text.splitlines()
    assert lines[0] == "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %)."
    assert lines[1] == "# TYPE DCGM_FI_DEV_GPU_UTIL gauge"
    assert lines[2].startswith('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-')
    assert re.search(
        r',modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-001",DCGM_FI_DRIVER_VERSION=', lines[2]
    )
    sm = next(ln for ln in lines if ln.startswith("DCGM_FI_PROF_SM_ACTIVE{"))
    assert re.search(r"\} \d\.\d{6}$", sm)  # doubles printed with %f
    util = int(lines[2].rsplit(" ", 1)[1])
    assert util == int(res.fields["gpu_util"][0, 3])
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in lines
    assert exporter_text([res], at=res.timestamps[0] - 1).strip() == ""
    assert exporter_text([res], at=res.timestamps[3], hostname="elsewhere").strip() == ""


@pytest.mark.prometheus
def test_exporter_text_parses_in_promtool_check_metrics() -> None:
    promtool = requires_promtool()
    res = small()
    proc = subprocess.run(
        [promtool, "check", "metrics"],
        input=exporter_text([res], at=res.timestamps[2]),
        capture_output=True,
        text=True,
        check=False,
    )
    # Exit 3 = lint findings only (dcgm-exporter's camelCase labels, counters without _total).
    assert proc.returncode in (0, 3), proc.stderr
    assert "parsing error" not in proc.stdout + proc.stderr


def test_cluster_specs_place_jobs_on_disjoint_nodes_deterministically() -> None:
    specs = cluster_specs(10, seed=4, duration_s=3600)
    assert specs == cluster_specs(10, seed=4, duration_s=3600)
    hosts = [h for s in specs for h in s.hosts]
    assert len(hosts) == len(set(hosts))
    assert len({s.job_id for s in specs}) == 10
    for spec in specs:
        assert spec.start >= DEFAULT_START and spec.start + spec.duration_s <= DEFAULT_START + 3600
        res = simulate(spec)
        assert len(res.gpus) == spec.gpus


# --- step-level workloads recorded as the exporter records them (jobs.simulate.exporter) ------------


def _recorded(workload: object, **exporter: object) -> SimResult:
    from jobs.simulate.exporter import Exporter

    return simulate(SimSpec(gpus=16, hosts=("a", "b"), duration_s=3600, seed=5, workload=workload,  # type: ignore[arg-type]
                            exporter=Exporter(**exporter)))  # type: ignore[arg-type]  # fmt: skip


def test_gpu_util_is_a_point_sample_and_profiling_fields_are_collect_interval_averages() -> None:
    from jobs.simulate.exporter import input_stall

    # 2 s steps, 0.6 s of each with nothing resident: a 1 s NVML window lands anywhere in the step and
    # overlaps the wait by 0-0.6 s, so GPU_UTIL samples range over 0.97 x [0.4, 1] = 39-97 %. SM_ACTIVE
    # averages 15 steps per 30 s collection: flat at 0.7 x 0.97 x 0.88 = 0.60.
    res = _recorded(input_stall(2.0, 0.3), scrape_s=15.0, collect_s=30.0, failed_scrapes=0.0)
    util = ratio(res, "gpu_util")
    assert np.nanmin(util) >= 0.35 and np.nanquantile(util, 0.1) <= 0.5 and np.nanquantile(util, 0.9) >= 0.9
    assert np.nanmean(util) == pytest.approx(0.7 * 0.97, abs=0.04)
    sm = res.fields["sm_active"]
    assert np.nanmean(sm) == pytest.approx(0.7 * 0.97 * 0.88, abs=0.02)
    assert np.nanstd(sm) < 0.03
    # Scrapes every 15 s of a 30 s collection: every value is served twice (per GPU, about half of the
    # consecutive samples repeat exactly).
    same = np.isclose(sm[:, 1:], sm[:, :-1])
    assert 0.4 <= same.mean() <= 0.6


def test_scrapes_land_at_a_per_target_offset_and_failed_scrapes_and_a_lost_node_are_holes() -> None:
    from jobs.simulate.exporter import healthy

    res = _recorded(healthy(2.0), scrape_s=15.0, failed_scrapes=0.01, node_lost=(0.5, 600.0))
    assert res.sample_offsets is not None
    offsets = {g.hostname: float(res.sample_offsets[i]) for i, g in enumerate(res.gpus)}
    assert all(0.0 < o < 15.0 for o in offsets.values()) and offsets["a"] != offsets["b"]
    lines = list(openmetrics_lines([res], throughput=False))
    first = next(
        line for line in lines if line.startswith("DCGM_FI_DEV_GPU_UTIL{") and 'Hostname="a"' in line
    )
    assert float(first.rsplit(" ", 1)[1]) == pytest.approx(res.timestamps[0] + offsets["a"], abs=1e-3)
    util = res.fields["gpu_util"]
    b = [i for i, g in enumerate(res.gpus) if g.hostname == "b"]
    lo, hi = res.truth["node_lost_samples"]
    assert hi - lo == 40 and np.isnan(util[b, lo:hi]).all()  # 600 s at 15 s
    a = [i for i, g in enumerate(res.gpus) if g.hostname == "a"]
    lost = np.isnan(util[a]).mean()
    assert 0.0 < lost < 0.03  # ~1 % failed scrapes, a whole target at a time
    assert (np.isnan(util[a]) == np.isnan(res.fields["sm_active"][a])).all()
