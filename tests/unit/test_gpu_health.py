"""DCGM health fields in gpu_errors: increases inside the job's window, flags, severity and advice."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from benchmarks.diagnosis_inputs import input_from_sim, signals_from_sim
from jobs.diagnosis.base import Severity
from jobs.diagnosis.features import Features
from jobs.diagnosis.rules import gpu_errors
from jobs.diagnosis.rules.gpu_errors import aggregate_increase, counter_increase
from jobs.metrics.signals import SIGNALS, Reading
from jobs.simulate.core import SimSpec, simulate
from jobs.simulate.writers import openmetrics_lines


def _run(per_gpu: bool = True, duration_s: float = 3600.0, **params: Any) -> gpu_errors.Finding | None:
    res = simulate(SimSpec(gpus=8, duration_s=duration_s, step_s=30.0, seed=4, params=params))
    inp = input_from_sim(res, signals=signals_from_sim(res, per_gpu=per_gpu))
    return gpu_errors.check(inp, Features(inp))


def test_counter_increase_sums_rises_and_skips_missing_samples() -> None:
    assert counter_increase(np.array([5.0, 5.0, 7.0, 7.0, np.nan, 9.0])) == 4.0  # 2 + 2 across the gap
    assert counter_increase(np.array([12.0, 12.0, 12.0])) == 0.0  # 12 errors before the job: none in it
    assert counter_increase(np.array([np.nan, 3.0])) == 0.0  # one sample: no rise seen


def test_counter_increase_reads_a_drop_as_a_reset_whose_new_count_is_new() -> None:
    # 10 -> 12 (+2), reset to 0 (+0), 0 -> 3 (+3); 3 -> 1 is another reset (+1).
    assert counter_increase(np.array([10.0, 12.0, 0.0, 3.0])) == 5.0
    assert counter_increase(np.array([3.0, 1.0])) == 1.0


def test_aggregate_increase_counts_only_between_points_where_every_gpu_reports() -> None:
    # 4 GPUs, mean count 2 -> 2 -> 2.5: the sum rises 8 -> 10, by 2.
    inc, mask = aggregate_increase(np.array([2.0, 2.0, 2.5]), np.array([4.0, 4.0, 4.0]))
    assert inc == 2.0 and mask.tolist() == [False, False, True]
    # A GPU short at the middle point: 8 -> (6 from 3 GPUs) -> 10 is a rise of 2 between full points only.
    inc, _ = aggregate_increase(np.array([2.0, 2.0, 2.5]), np.array([4.0, 3.0, 4.0]))
    assert inc == 2.0


def test_health_fields_are_registered_as_dcgm_exporter_declares_them() -> None:
    # etc/default-counters.csv: on by default with these types; ECC/NVLink errors commented out (off).
    assert SIGNALS["pcie_replay"].enable_line == (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, Total number of PCIe retries."
    )
    assert SIGNALS["uncorrectable_remapped_rows"].default_enabled
    assert SIGNALS["row_remap_failure"].prom_type == "gauge" and SIGNALS["row_remap_failure"].default_enabled
    assert not SIGNALS["ecc_dbe_volatile"].default_enabled
    assert not SIGNALS["nvlink_crc_flit_errors"].default_enabled
    assert SIGNALS["ecc_dbe_volatile"].reading is Reading.LEVEL
    assert SIGNALS["ecc_dbe_volatile"].prom_type == "counter"


def test_simulated_health_fields_are_written_as_dcgm_exporter_emits_them() -> None:
    res = simulate(SimSpec(gpus=2, duration_s=60.0, params={"health_fields": "all"}))
    text = "".join(openmetrics_lines([res], throughput=False))
    assert "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\n" in text
    assert "# TYPE DCGM_FI_DEV_ROW_REMAP_FAILURE gauge\n" in text
    assert "# TYPE DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL counter\n" in text
    line = next(x for x in text.splitlines() if x.startswith('DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="1"'))
    assert 'Hostname="gpu-node-001"' in line and line.split()[-2] == "2"  # 2 replays before the job
    default = "".join(openmetrics_lines([simulate(SimSpec(gpus=1, duration_s=60.0))], throughput=False))
    assert "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{" in default and "ECC_DBE" not in default


def test_a_healthy_job_on_gpus_with_old_errors_gets_no_finding() -> None:
    # Every GPU carries PCIe replays from before the job (0, 2, ... 14): absolute counts never fire.
    assert _run() is None
    assert _run(per_gpu=False) is None


def test_uncorrectable_ecc_errors_in_the_window_are_critical_on_their_gpu() -> None:
    f = _run(health=[{"field": "ecc_dbe_volatile", "gpu": 5, "at": 0.5, "count": 2}])
    assert f is not None and f.severity is Severity.CRITICAL
    assert f.title == "2 uncorrectable (double-bit) ECC errors during the job"
    ev = {e.label: e.value for e in f.evidence}
    assert ev["uncorrectable (double-bit) ECC errors in the job's window"] == 2
    assert ev["uncorrectable (double-bit) ECC errors, by GPU"] == "gpu-node-001/5: 2"
    assert "checkpoint" in f.recommendation and "reset the GPU" in f.recommendation
    # The rise is seen at sample 60 of 121 (at = 0.5): the window starts there.
    assert f.windows[0][0] == pytest.approx(1_767_225_600.0 + 60 * 30.0)
    assert f.impact == pytest.approx(1 / 8)


def test_cross_gpu_aggregates_still_count_the_rise_and_say_which_gpu_is_unknown() -> None:
    f = _run(per_gpu=False, health=[{"field": "ecc_dbe_volatile", "gpu": 5, "at": 0.5, "count": 2}])
    assert f is not None and f.severity is Severity.CRITICAL
    assert "per-GPU series" in f.missing_signals
    assert {e.label: e.value for e in f.evidence}[
        "uncorrectable (double-bit) ECC errors in the job's window"
    ] == 2


def test_a_reset_inside_the_job_does_not_hide_errors_after_it() -> None:
    # GPU 1 starts at 2 replays... here ECC: 0 -> 3 at 30 %, reset to 0 at 60 %, 1 more at 80 %: 3 + 1.
    f = _run(
        health=[
            {"field": "ecc_dbe_volatile", "gpu": 1, "at": 0.3, "count": 3},
            {"field": "ecc_dbe_volatile", "gpu": 1, "at": 0.6, "reset": True},
            {"field": "ecc_dbe_volatile", "gpu": 1, "at": 0.8, "count": 1},
        ]
    )
    assert f is not None and f.title.startswith("4 uncorrectable")


def test_a_failed_row_remap_asks_for_an_rma() -> None:
    f = _run(health=[{"field": "row_remap_failure", "gpu": 2, "at": 0.9}])
    assert f is not None and f.severity is Severity.CRITICAL
    assert "RMA" in f.recommendation and "GPUs whose row remapping failed: 1" in f.title


def test_a_pending_remap_asks_for_a_reset_as_a_warning() -> None:
    f = _run(health=[{"field": "row_remap_pending", "gpu": 0, "at": 0.2}])
    assert (
        f is not None
        and f.severity is Severity.WARNING
        and "reset the GPU once it is idle" in f.recommendation
    )


@pytest.mark.parametrize(("count", "severity"), [(10, Severity.INFO), (100, Severity.WARNING)])
def test_link_replays_are_info_unless_more_than_one_a_minute(count: int, severity: Severity) -> None:
    # 121 samples at 30 s: a 3630 s window; 100 replays = 1.65 a minute > 1, 10 = 0.17.
    f = _run(health=[{"field": "nvlink_replay_errors", "gpu": 3, "at": 0.4, "count": count}])
    assert f is not None and f.severity is severity and f.title == f"{count} NVLink replays during the job"


def test_xid_and_health_fields_share_one_finding() -> None:
    res = simulate(
        SimSpec(
            scenario="gpu_errors", gpus=8, seed=3, duration_s=3600.0,
            params={"xid": 94, "health": [{"field": "uncorrectable_remapped_rows", "gpu": 7, "at": 0.5}]},
        )
    )  # fmt: skip
    inp = input_from_sim(res)
    f = gpu_errors.check(inp, Features(inp))
    assert f is not None and f.severity is Severity.CRITICAL
    assert "XID" in f.title and "1 HBM rows remapped after uncorrectable errors" in f.title
    assert "XID catalogue" in f.recommendation and "nvidia-smi -r" in f.recommendation


def test_the_health_fast_path_skips_only_matrices_whose_every_gpu_row_shows_nothing():
    from jobs.diagnosis.rules.gpu_errors import _may_show, _rise_mask, counter_increase

    rng = np.random.default_rng(5)
    for trial in range(400):
        x = np.full((4, 30), float(trial % 3))
        if trial % 2:  # one GPU's count moves (a rise, or a drop that is a reset)
            x[int(rng.integers(0, 4)), int(rng.integers(1, 30)) :] += float(rng.choice([-1.0, 2.0]))
        x[rng.random(x.shape) < 0.3] = np.nan
        if trial % 7 == 0:
            x[:] = np.nan
        rows_show = any(counter_increase(r) > 0 or _rise_mask(r).any() for r in x)
        assert _may_show(x, "increase") or not rows_show, trial
        assert _may_show(x, "state") == bool((np.isfinite(x) & (x > 0)).any())
    assert not _may_show(np.array([[0.0, np.nan, 0.0], [3.0, 3.0, np.nan]]), "increase")
    assert _may_show(np.array([[0.0, np.nan, 1.0]]), "increase")
