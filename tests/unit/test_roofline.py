"""jobs.evaluation.roofline: hand-derived placements against H100 SXM roofs (no database)."""

from __future__ import annotations

import json
import math

import pytest

from jobs.evaluation.catalog import match_gpu_name
from jobs.evaluation.roofline import (
    CAVEATS,
    Activities,
    Roofs,
    bin_means,
    check_mfu,
    job_roofline,
    place,
    roofs_for,
)

# H100 SXM, reference/gpus.md: BF16 dense 989.5 TFLOP/s, HBM3 3.35 TB/s, peak clock 1830 MHz.
PEAK = 989.5e12
BW = 3.35e12
RIDGE = PEAK / BW  # 295.37... FLOP/byte


def h100(dtype: str = "bf16", clock: float | None = None) -> Roofs:
    return roofs_for("H100 SXM", dtype, {"bf16": 989.5, "fp8": 1979.0}, 3.35, clock)


def test_h100_bf16_ridge_is_peak_over_bandwidth() -> None:
    roofs = h100()
    assert roofs.peak_flops == pytest.approx(989.5e12)
    assert roofs.bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert roofs.ridge == pytest.approx(295.37, abs=0.01)
    assert roofs.reasons == ()


def test_roofs_from_the_catalog_row_match_the_hand_values() -> None:
    spec = match_gpu_name("NVIDIA H100 80GB HBM3")
    assert spec is not None
    roofs = roofs_for(spec.name, "bf16", spec.peak_tflops, spec.bandwidth_tbps, spec.peak_clock_mhz)
    assert roofs.ridge == pytest.approx(RIDGE)
    assert roofs.peak_clock_mhz == 1830


def test_busy_tensor_pipe_light_dram_is_near_the_compute_roof() -> None:
    p = place(Activities(tensor=0.6, dram=0.2), h100())
    assert p.verdict == "compute"
    assert p.compute_share == 0.6 and p.busiest_pipe == "tensor_active"
    assert p.memory_share == 0.2
    assert p.flops_per_s == pytest.approx(0.6 * 989.5e12)  # 593.7 TFLOP/s
    assert p.bytes_per_s == pytest.approx(0.2 * 3.35e12)  # 0.67 TB/s
    # (0.6 / 0.2) x 295.37 = 886.1 FLOP/byte: right of the ridge, where the compute roof is the lower.
    assert p.intensity == pytest.approx(886.12, abs=0.01)
    assert p.intensity is not None and p.intensity > RIDGE
    assert p.roof_at_intensity == pytest.approx(PEAK)
    assert "above the ridge" in p.text


def test_idle_tensor_busy_dram_is_near_the_memory_roof() -> None:
    p = place(Activities(tensor=0.05, dram=0.7), h100())
    assert p.verdict == "memory"
    # (0.05 / 0.7) x 295.37 = 21.10 FLOP/byte, where the memory roof allows 21.10 x 3.35 TB/s = 70.7 TFLOP/s.
    assert p.intensity == pytest.approx(21.098, abs=0.001)
    assert p.roof_at_intensity == pytest.approx(70.68e12, rel=1e-3)
    assert "below the ridge" in p.text


def test_neither_roof_busy_is_under_both() -> None:
    p = place(Activities(tensor=0.1, fp32=0.05, fp16=0.0, fp64=0.0, dram=0.15), h100())
    assert p.verdict == "under_both"
    assert "neither roof binds" in p.text
    assert p.notes == ()  # every pipe collected


def test_both_busy_picks_the_closer_roof_with_dram_against_its_practical_maximum() -> None:
    # DRAM 0.7 is 0.875 of its practical 0.8; tensor 0.8 is 0.8 of its roof: the memory roof is closer.
    assert place(Activities(tensor=0.8, dram=0.7), h100()).verdict == "memory"
    # DRAM 0.55 is 0.69 of 0.8; tensor 0.8: compute.
    assert place(Activities(tensor=0.8, dram=0.55), h100()).verdict == "compute"


def test_busiest_pipe_can_be_a_non_tensor_pipe() -> None:
    p = place(Activities(tensor=0.05, fp32=0.7, fp16=0.0, fp64=0.0, dram=0.1), h100())
    assert p.verdict == "compute"
    assert p.busiest_pipe == "fp32_active" and p.compute_share == 0.7
    # The FLOP/s estimate is the tensor pipe's only: FP32 math has no dtype peak here.
    assert p.flops_per_s == pytest.approx(0.05 * PEAK)
    assert any("busiest pipe is FP32, not the tensor pipe" in n for n in p.notes)
    # A busy tensor pipe gets no such note.
    assert not any("busiest pipe" in n for n in place(Activities(tensor=0.6, fp32=0.2), h100()).notes)


def test_missing_fp_pipes_are_a_note_not_an_unknown() -> None:
    p = place(Activities(tensor=0.3, dram=0.3), h100())
    assert p.verdict == "under_both"
    assert any("FP16/FP32/FP64 pipe activity not collected" in n for n in p.notes)


def test_missing_dram_is_unknown_never_zero() -> None:
    p = place(
        Activities(tensor=0.2, missing={"dram_active": "DRAM_ACTIVE not exported by dcgm-exporter"}), h100()
    )
    assert p.verdict == "unknown"
    assert p.memory_share is None and p.bytes_per_s is None and p.intensity is None
    assert "DRAM_ACTIVE not exported" in p.text
    d = p.to_dict()
    assert d["memory_roof_share"] is None and d["intensity_flop_per_byte"] is None


def test_missing_tensor_is_unknown_with_the_field_named() -> None:
    p = place(Activities(dram=0.2), h100())
    assert p.verdict == "unknown"
    assert p.compute_share is None and p.flops_per_s is None
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE not collected" in p.text


def test_one_roof_near_is_said_even_when_the_other_is_unknown() -> None:
    assert place(Activities(tensor=0.6), h100()).verdict == "compute"
    assert place(Activities(dram=0.7), h100()).verdict == "memory"


def test_dram_idle_leaves_intensity_unplaced() -> None:
    p = place(Activities(tensor=0.3, dram=0.0), h100())
    assert p.intensity is None
    assert any("unbounded" in n for n in p.notes)


def test_sm_clock_scales_the_flops_estimate() -> None:
    # 1647 / 1830 = 0.9: tensor 0.6 at that clock is 0.54 x peak.
    p = place(Activities(tensor=0.6, dram=0.2, sm_clock_mhz=1647.0), h100(clock=1830))
    assert p.flops_per_s == pytest.approx(0.54 * PEAK)


def test_unknown_gpu_leaves_roofs_and_rates_unknown_but_shares_known() -> None:
    roofs = roofs_for(None, "bf16", None, None)
    assert roofs.ridge is None and roofs.reasons
    p = place(Activities(tensor=0.6, dram=0.2), roofs)
    assert p.verdict == "compute" and p.flops_per_s is None and p.intensity is None


def test_dtype_without_a_peak_leaves_the_compute_roof_unknown() -> None:
    roofs = roofs_for("H100 SXM", "fp32", {"bf16": 989.5}, 3.35)
    assert roofs.peak_flops is None and roofs.bandwidth_bytes_per_s == pytest.approx(BW)
    assert "no dense fp32 peak" in roofs.reasons[0]


def test_percentages_are_refused() -> None:
    with pytest.raises(ValueError, match="ratio 0-1"):
        Activities(tensor=60.0)
    with pytest.raises(ValueError):
        Activities(dram=-0.1)


def test_mfu_far_below_the_tensor_estimate_is_flagged() -> None:
    c = check_mfu(0.2, Activities(tensor=0.6, dram=0.6), h100())
    assert c is not None and c.flagged and c.direction == "mfu_far_below_hardware"
    assert "DRAM is also busy" in c.explanation


def test_mfu_above_the_tensor_estimate_blames_busy_fp_pipes() -> None:
    c = check_mfu(0.5, Activities(tensor=0.3, fp32=0.4, dram=0.2), h100())
    assert c is not None and c.flagged and c.direction == "mfu_above_hardware"
    assert "FP32 40%" in c.explanation


def test_mfu_consistent_with_the_estimate_is_not_flagged() -> None:
    c = check_mfu(0.45, Activities(tensor=0.6, dram=0.2), h100())
    assert c is not None and not c.flagged and c.direction == "agree"


def test_mfu_check_unknown_without_mfu_or_tensor() -> None:
    assert check_mfu(None, Activities(tensor=0.6), h100()) is None
    assert check_mfu(0.3, Activities(dram=0.2), h100()) is None


def test_job_roofline_places_gpus_and_time_and_serialises() -> None:
    r = job_roofline(
        h100(),
        Activities(tensor=0.33, dram=0.45),
        gpus=[("node1/0", Activities(tensor=0.6, dram=0.2)), ("node1/1", Activities(tensor=0.05, dram=0.7))],
        over_time=[(100.0, Activities(tensor=0.6, dram=0.2)), (200.0, Activities())],
        mfu=0.3,
    )
    assert [g.verdict for g in r.gpus] == ["compute", "memory"]
    assert r.over_time[1][1].verdict == "unknown"
    d = json.loads(json.dumps(r.to_dict()))
    assert d["ridge_flop_per_byte"] == pytest.approx(RIDGE)
    assert d["job"]["verdict"] == "under_both"
    assert d["gpus"][0]["label"] == "node1/0"
    assert d["over_time"][1]["compute_roof_share"] is None
    assert d["mfu_check"]["direction"] == "agree"
    assert d["caveats"] == list(CAVEATS)
    assert "Profiling Metrics" in d["source"]


def test_bin_means_averages_runs_and_keeps_empty_runs_unknown() -> None:
    nan = math.nan
    t, cols = bin_means([0, 1, 2, 3, 4], {"a": [1.0, 3.0, nan, nan, 5.0]}, 3)
    assert t == [0.5, 2.5, 4.0]
    assert cols["a"][0] == 2.0 and math.isnan(cols["a"][1]) and cols["a"][2] == 5.0
    with pytest.raises(ValueError):
        bin_means([0, 1], {"a": [1.0]}, 3)


def test_time_shares_count_windows_with_a_verdict_only() -> None:
    r = job_roofline(
        h100(),
        Activities(tensor=0.3, dram=0.5),
        over_time=[
            (1.0, Activities(tensor=0.6, dram=0.2)),
            (2.0, Activities(tensor=0.05, dram=0.7)),
            (3.0, Activities(tensor=0.1, dram=0.75)),
            (4.0, Activities()),  # a gap: unknown, not counted as under both
        ],
    )
    shares = r.time_shares()
    assert shares is not None
    assert shares == pytest.approx({"compute": 1 / 3, "memory": 2 / 3, "under_both": 0.0})
    assert r.to_dict()["time_windows_unknown"] == 1
    assert job_roofline(h100(), Activities(), over_time=[(1.0, Activities())]).time_shares() is None
