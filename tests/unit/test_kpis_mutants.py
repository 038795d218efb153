"""jobs.evaluation.kpis behaviours that the mutation benchmark (benchmarks/mutation.py) found untested.

Definitions (module docstrings, reference/formulas.md): MFU = FLOPs/token × tokens ÷ (GPUs × peak × covered
seconds) with 6N FLOPs/token when the shape lacks layers/heads/head dim/sequence length; cost/day = GPUs ×
$/GPU-h × 24; waste = cost/day × max(idle share, 1 − MFU ÷ reference); idle = GPU_UTIL ≤ 5 %.
Expected values are derived in the comments.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from jobs.evaluation.kpis import (
    ModelShape,
    compute_kpis,
    idle_share_lower_bound,
    idle_share_per_gpu,
    target_mfu,
    time_mean,
    tokens_per_second_from_progress,
)

T0 = datetime(2026, 11, 30, tzinfo=UTC)
PEAK = 989.5e12
# 7e9 parameters, 6N = 4.2e10 FLOPs/token; MFU 0.30 on 8 GPUs needs 0.30 × 8 × 989.5e12 / 4.2e10 tokens/s.
TPS_MFU_030 = 0.30 * 8 * PEAK / 4.2e10


def _kpis(**overrides):  # type: ignore[no-untyped-def]
    values = {
        "start": T0,
        "end": T0 + timedelta(hours=1),
        "gpu_count": 8,
        "shape": ModelShape(n_params=7e9),
        "peak_flops_per_gpu": PEAK,
        "peak_clock_mhz": 1830.0,
        "grid_step_s": 60.0,
        "tokens_per_second": np.full(60, TPS_MFU_030),
        "throughput_source": "progress pushes",
        "gpu_util": None,
        "sm_active": None,
        "tensor_active": None,
        "sm_clock": None,
        "prices": [(T0 - timedelta(days=1), 2.0)],
        "price_label": "H100 SXM, spot",
        "reference_mfu": 0.45,
        "reference_source": "organisation target",
    }
    values.update(overrides)
    return compute_kpis(**values)


# ------------------------------------------------------------------------------------ duration, means


def test_duration_and_gpu_hours_of_a_one_hour_eight_gpu_job() -> None:
    k = _kpis()
    assert k.duration_s == 3600.0
    assert k.gpu_hours == pytest.approx(8.0)  # 8 GPUs × 3600 s / 3600


def test_a_zero_length_job_has_no_duration_no_gpu_hours_and_no_window_cost() -> None:
    k = _kpis(end=T0)
    assert k.duration_s == 0.0 and k.gpu_hours == 0.0
    assert k.cost_usd is None
    assert k.cost_per_day_usd == pytest.approx(384.0)  # 8 × $2 × 24 still describes the price


def test_signal_means_are_reported() -> None:
    k = _kpis(gpu_util=np.array([0.2, 0.4]), sm_active=np.array([0.5, np.nan]), tensor_active=np.array([0.3]))
    assert k.gpu_util_mean == pytest.approx(0.3)
    assert k.sm_active_mean == pytest.approx(0.5)  # the missing sample is skipped, not a zero
    assert k.tensor_active_mean == pytest.approx(0.3)


def test_time_mean_of_one_sample_is_that_sample_and_of_no_sample_is_none() -> None:
    assert time_mean(np.array([0.5])) == 0.5
    assert time_mean(np.array([np.nan, np.nan])) is None
    assert time_mean(np.array([])) is None


# ------------------------------------------------------------------------------------ throughput, MFU


def test_throughput_source_is_the_throughput_variant() -> None:
    k = _kpis()
    assert k.variants["throughput"] == "progress pushes"
    assert k.tokens_per_second == pytest.approx(TPS_MFU_030)


def test_all_missing_throughput_is_no_throughput() -> None:
    k = _kpis(tokens_per_second=np.full(60, np.nan))
    assert k.mfu is None and k.tokens_per_second is None


def test_a_single_throughput_sample_gives_an_mfu() -> None:
    k = _kpis(tokens_per_second=np.array([TPS_MFU_030]))
    assert k.mfu == pytest.approx(0.30)


def test_mfu_notes_name_what_is_missing() -> None:
    k = _kpis(shape=ModelShape(n_params=None))
    assert "MFU needs the model's parameter count (model.n_params in the job registration)" in k.notes
    # The note is also why the waste is unknown (no utilisation either: not even the idle part).
    assert k.waste is not None and k.waste.reason.startswith(
        "MFU unknown (MFU needs the model's parameter count (model.n_params in the job registration))"
    )
    k = _kpis(peak_flops_per_gpu=None)
    assert "MFU needs the GPU's dense peak for the job's dtype: unknown GPU model or dtype" in k.notes


def test_the_6n_fallback_is_flagged_in_the_variant_and_the_notes() -> None:
    k = _kpis()
    assert k.flops_fallback is True
    assert k.variants["mfu"] == (
        "MFU, 6N (attention not counted) — fallback: the organisation's convention is 6N + 12·L·H·Q·T, but "
        "the job's shape lacks layers, heads, head dim or sequence length"
    )
    assert (
        "MFU computed as 6N (no attention term): register n_layers, n_heads, head_dim (or hidden) and "
        "seq_len for the organisation's 6N + 12·L·H·Q·T convention"
    ) in k.notes


def test_hfu_counts_full_recomputation() -> None:
    # Full recomputation: 8N = 5.6e10 FLOPs/token executed vs 6N = 4.2e10 counted: HFU = 0.30 × 8/6 = 0.40.
    k = _kpis(shape=ModelShape(n_params=7e9, recompute="full"))
    assert k.hfu == pytest.approx(0.40)
    assert k.variants["hfu"].startswith("8N (HFU")


# 1 GPU with a peak of 6e12: 6N = 6e9 FLOPs/token (N = 1e9) at 1000 tokens/s is exactly MFU 1.0 (all exact
# in binary: 6e9 × 3.6e6 tokens = 6e12 × 3600 s = 2.16e16).
ONE_GPU = {"gpu_count": 1, "peak_flops_per_gpu": 6e12, "shape": ModelShape(n_params=1e9)}
ABOVE_100 = "MFU above 100 %: the parameter count, dtype or tokens are wrong"


def test_mfu_of_exactly_100_percent_is_not_flagged() -> None:
    k = _kpis(**ONE_GPU, tokens_per_second=np.full(60, 1000.0))
    assert k.mfu == 1.0
    assert ABOVE_100 not in k.notes


def test_mfu_above_100_percent_is_flagged() -> None:
    k = _kpis(**ONE_GPU, tokens_per_second=np.full(60, 1500.0))  # MFU 1.5
    assert k.mfu == pytest.approx(1.5)
    assert ABOVE_100 in k.notes


# ------------------------------------------------------------------------------------------------ cost


def test_the_cost_variant_states_gpus_price_and_label() -> None:
    assert _kpis().variants["cost"] == "8 GPUs × $2.00/GPU-h (H100 SXM, spot) × 24 h"


def test_a_price_book_starting_after_the_job_is_used_from_the_start_and_said() -> None:
    # The only price starts 30 min into the job: the whole hour is charged at $2: 8 GPU-h × $2 = $16.
    k = _kpis(prices=[(T0 + timedelta(minutes=30), 2.0)])
    assert k.cost_usd == pytest.approx(16.0)
    assert "the price book for H100 SXM, spot starts 2026-11-30; earlier hours use that price" in k.notes


def test_a_price_starting_exactly_at_the_job_start_needs_no_note() -> None:
    k = _kpis(prices=[(T0, 2.0)])
    assert not any("price book" in n for n in k.notes)


def test_a_price_taking_effect_exactly_at_the_end_is_the_current_price() -> None:
    # $2 during the hour (8 GPU-h = $16); $3 from the end on: cost/day = 8 × $3 × 24 = $576.
    k = _kpis(prices=[(T0 - timedelta(days=1), 2.0), (T0 + timedelta(hours=1), 3.0)])
    assert k.cost_usd == pytest.approx(16.0)
    assert k.cost_per_day_usd == pytest.approx(576.0)


def test_a_reversed_window_still_gets_the_earliest_price_per_day() -> None:
    # End before start (clock skew): no window cost; the only price (from 30 min before the start, after
    # the end) is still the job's price: 8 × $2 × 24 = $384/day.
    k = _kpis(end=T0 - timedelta(hours=1), prices=[(T0 - timedelta(minutes=30), 2.0)])
    assert k.duration_s == 0.0 and k.cost_usd is None
    assert k.cost_per_day_usd == pytest.approx(384.0)


def test_no_price_is_noted_once_and_no_waste_note_is_added() -> None:
    k = _kpis(prices=[])
    assert "no price in the price book for H100 SXM, spot" in k.notes
    assert not any(n.startswith("waste/day unknown") for n in k.notes)
    assert k.cost_per_day_usd is None and k.waste_per_day_usd is None


# ------------------------------------------------------------------------------------ idle share, waste


def test_idle_variant_for_per_gpu_rows() -> None:
    k = _kpis(gpu_util_per_gpu=np.array([[0.0, 0.9]]), gpu_util=np.array([0.45, 0.45]))
    assert k.idle_share == pytest.approx(0.5) and k.idle_share_exact
    assert k.variants["idle"] == "share of observed GPU samples with GPU_UTIL ≤ 5%"


def _three_blocks() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # 4 GPUs, 60 steps. Steps 0-19: all four at 0.04 (max ≤ 5 %: all 4 idle; the mean alone gives
    # ceil(4 × (1 − 0.04/0.05)) = 1). Steps 20-39: one at 0 and three at 1.0 (min ≤ 5 %: at least 1;
    # mean 0.75).
    # Steps 40-59: all busy (min 0.9, mean 0.95): 0.
    mean = np.array([0.04] * 20 + [0.75] * 20 + [0.95] * 20)
    minimum = np.array([0.04] * 20 + [0.0] * 20 + [0.9] * 20)
    maximum = np.array([0.04] * 20 + [1.0] * 20 + [1.0] * 20)
    return mean, minimum, maximum


def test_idle_lower_bound_uses_mean_min_and_max() -> None:
    # (20 × 4 + 20 × 1 + 0) idle GPU-steps of 4 × 60 = 100 / 240 = 5/12.
    mean, minimum, maximum = _three_blocks()
    k = _kpis(gpu_count=4, gpu_util=mean, gpu_util_min=minimum, gpu_util_max=maximum)
    assert k.idle_share == pytest.approx(5 / 12)
    assert not k.idle_share_exact
    assert k.variants["idle"] == "lower bound from the cross-GPU mean/min/max of GPU_UTIL (≤ 5% = idle)"


def test_waste_variant_when_the_total_is_known() -> None:
    k = _kpis()
    # 384 × (1 − 0.30/0.45) = $128/day.
    assert k.waste_per_day_usd == pytest.approx(128.0)
    assert k.variants["waste"] == (
        "cost/day × max(idle share, 1 − MFU ÷ 45.0% reference MFU (organisation target))"
    )


def test_waste_variant_when_only_the_idle_part_is_known() -> None:
    k = _kpis(
        tokens_per_second=None, gpu_util_per_gpu=np.array([[0.0, 0.9]]), gpu_util=np.array([0.45, 0.45])
    )
    # idle share 1/2: at least 384 × 0.5 = $192/day.
    assert k.waste is not None and k.waste.lower_bound_per_day == pytest.approx(192.0)
    assert k.variants["waste"] == "at least the idle part: cost/day × idle share (MFU unknown)"


def test_the_missing_mfu_reason_lists_only_the_throughput_and_mfu_notes() -> None:
    # A late price book adds a note that is about neither MFU nor throughput: it is not part of the reason.
    # No throughput and no reason from its source (load_context passes "" then): the generic advice.
    k = _kpis(tokens_per_second=None, throughput_source="", prices=[(T0 + timedelta(minutes=30), 2.0)])
    no_throughput = (
        "no throughput: push progress (POST /api/v1/jobs/{id}/progress/), set a throughput PromQL "
        "expression, or upload a profiler trace with tokens per step"
    )
    assert k.waste is not None
    assert (
        k.waste.reason
        == f"MFU unknown ({no_throughput}); utilisation unknown, so not even the idle part is known"
    )


# ------------------------------------------------------------------------------------------ cross-check


def test_cross_check_uses_the_clock_corrected_tensor_estimate() -> None:
    # tensor_active 0.5 at SM clock 1464 of 1830 MHz (0.8): estimate 0.5 × 0.8 = 0.40; MFU 0.30 / 0.40 = 0.75
    # is within [1/2, 1.1]: agree.
    k = _kpis(tensor_active=np.full(60, 0.5), sm_clock=np.full(60, 1464.0))
    assert k.cross_check is not None
    assert k.cross_check.tensor_estimate == pytest.approx(0.40)
    assert k.cross_check.direction == "agree"


def test_no_cross_check_without_mfu() -> None:
    k = _kpis(tokens_per_second=None, tensor_active=np.full(60, 0.5))
    assert k.cross_check is None


# ------------------------------------------------------------------------------------------------ energy


def test_energy_from_the_counter_and_its_cost() -> None:
    # 7.2e7 J / 3.6e6 = 20 kWh; at $0.15/kWh: $3.
    k = _kpis(energy_increase_j=7.2e7, usd_per_kwh=0.15)
    assert k.energy_kwh == pytest.approx(20.0)
    assert k.energy_cost_usd == pytest.approx(3.0)
    assert k.variants["energy"] == "increase of DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION over the job"


def test_a_counter_increase_below_one_joule_is_still_energy() -> None:
    assert _kpis(energy_increase_j=0.9).energy_kwh == pytest.approx(0.9 / 3.6e6)


POWER_TIMES = np.arange(61) * 60.0  # 0 … 3600 s
POWER_W = np.full(61, 700.0)


def test_energy_from_power_when_the_counter_increase_is_zero() -> None:
    # A zero counter increase is no reading: 700 W × 3600 s = 2.52e6 J = 0.7 kWh per GPU, × 8 = 5.6 kWh.
    k = _kpis(energy_increase_j=0.0, power_w=POWER_W, power_times=POWER_TIMES, usd_per_kwh=0.15)
    assert k.energy_kwh == pytest.approx(5.6)
    assert k.energy_cost_usd == pytest.approx(5.6 * 0.15)
    assert k.variants["energy"] == "integral of mean board power × GPUs (trapezoid, gaps not bridged)"


def test_no_energy_cost_without_an_energy_price() -> None:
    assert _kpis(energy_increase_j=7.2e7).energy_cost_usd is None  # default price: none
    assert _kpis(energy_increase_j=7.2e7, usd_per_kwh=0.0).energy_cost_usd is None


def test_no_energy_cost_without_energy() -> None:
    k = _kpis(usd_per_kwh=0.15)
    assert k.energy_kwh is None and k.energy_cost_usd is None


def test_power_without_timestamps_is_no_energy() -> None:
    assert _kpis(power_w=POWER_W, power_times=None).energy_kwh is None


def test_power_and_timestamps_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError):
        _kpis(power_w=POWER_W, power_times=POWER_TIMES[:-1])


# ----------------------------------------------------------------------------------- idle share helpers


def test_a_gpu_at_exactly_the_idle_threshold_is_idle() -> None:
    assert idle_share_per_gpu(np.array([[0.05, 0.5]])) == pytest.approx(0.5)


def test_all_busy_gpus_have_no_idle_share() -> None:
    assert idle_share_per_gpu(np.array([[0.9, 0.5]])) == 0.0


def test_lower_bound_for_a_single_gpu() -> None:
    # One GPU: idle at step 0 (mean 0 → 1 × (1 − 0) = 1), busy at step 1 (1 × (1 − 20) < 0 → 0): 1/2.
    assert idle_share_lower_bound(np.array([0.0, 1.0]), None, None, 1) == pytest.approx(0.5)


def test_lower_bound_from_a_mean_that_allows_exactly_one_idle_gpu() -> None:
    # 2 GPUs, mean 0.025 = θ/2: k > 2 × (1 − 0.5) = 1 is read as "at least 1" (the ceiling of exactly 1): 1/2.
    assert idle_share_lower_bound(np.array([0.025]), None, None, 2) == pytest.approx(0.5)


def test_a_minimum_at_exactly_the_threshold_is_one_idle_gpu() -> None:
    # 2 GPUs, mean 0.5 (bound 0), min 0.05 ≤ θ: at least one idle: 1/2.
    assert idle_share_lower_bound(np.array([0.5]), np.array([0.05]), np.array([0.95]), 2) == pytest.approx(
        0.5
    )


def test_a_maximum_at_exactly_the_threshold_is_all_gpus_idle() -> None:
    # 2 GPUs all at 0.05: max ≤ θ: both idle: 1.
    one = np.array([0.05])
    assert idle_share_lower_bound(one, one, one, 2) == pytest.approx(1.0)


def test_a_busy_minimum_adds_no_idle_gpu() -> None:
    mean, minimum, maximum = _three_blocks()
    assert idle_share_lower_bound(mean[40:], minimum[40:], maximum[40:], 4) == 0.0


# ------------------------------------------------------------------------------------ reference, shape


def test_reference_sources_are_stated() -> None:
    assert target_mfu("FP8", 0.45, 0.25) == (0.25, "organisation target for FP8 (of the FP8 dense peak)")
    assert target_mfu("bf16", 0.45, 0.25) == (0.45, "organisation target")


FULL = {"n_layers": 32, "n_heads": 32, "head_dim": 128, "seq_len": 4096}
# L·H·Q·T = 32 × 32 × 128 × 4096 = 536,870,912.
LHQT = 32 * 32 * 128 * 4096


def test_model_flops_default_to_the_palm_convention() -> None:
    # 6N + 12·LHQT = 4.2e10 + 6,442,450,944.
    estimate, fallback = ModelShape(n_params=7e9, **FULL).model_flops()
    assert estimate is not None and estimate.flops_per_token == pytest.approx(4.2e10 + 12 * LHQT)
    assert fallback is False


def test_no_parameter_count_is_no_model_flops_and_no_fallback() -> None:
    assert ModelShape(n_params=None).model_flops("palm") == (None, False)
    assert ModelShape(n_params=None).hardware_flops() is None


def test_moe_flops_count_the_active_parameters() -> None:
    # 47e9 total, 13e9 active: 6 × 13e9 = 7.8e10 for both model and hardware FLOPs (no recomputation).
    shape = ModelShape(n_params=47e9, active_params=13e9)
    model, _ = shape.model_flops("palm")
    hardware = shape.hardware_flops()
    assert model is not None and model.flops_per_token == pytest.approx(7.8e10)
    assert hardware is not None and hardware.flops_per_token == pytest.approx(7.8e10)
    assert model.variant.endswith(", N = active parameters (MoE)")
    assert hardware.variant.endswith(", N = active parameters (MoE)")


def test_dense_flops_are_not_labelled_moe() -> None:
    shape = ModelShape(n_params=7e9)
    model, _ = shape.model_flops("palm")
    hardware = shape.hardware_flops()
    assert model is not None and "MoE" not in model.variant
    assert hardware is not None and "MoE" not in hardware.variant


def test_hardware_flops_without_recomputation_are_6n() -> None:
    hardware = ModelShape(n_params=7e9).hardware_flops()
    assert hardware is not None and hardware.flops_per_token == pytest.approx(4.2e10)


def test_selective_recomputation_with_a_known_shape_repeats_the_attention_forward() -> None:
    # 6N + 16·LHQT (formulas: selective recomputation re-runs the attention core's forward, 4·LHQT).
    hardware = ModelShape(n_params=7e9, recompute="selective", **FULL).hardware_flops()
    assert hardware is not None and hardware.flops_per_token == pytest.approx(4.2e10 + 16 * LHQT)


def test_selective_recomputation_without_a_shape_is_counted_as_full() -> None:
    # Without the attention shape the selective part cannot be sized: counted as a full forward, 8N = 5.6e10.
    hardware = ModelShape(n_params=7e9, recompute="selective").hardware_flops()
    assert hardware is not None and hardware.flops_per_token == pytest.approx(5.6e10)


def test_shape_from_a_stored_config() -> None:
    # head_dim from hidden ÷ heads = 4096 ÷ 32 = 128; strings are converted; no recompute means "none".
    shape = ModelShape.from_config(
        {"n_params": "7e9", "n_layers": "32", "n_heads": 32, "hidden": 4096, "seq_len": 4096}, ""
    )
    assert shape == ModelShape(
        n_params=7e9,
        active_params=None,
        n_layers=32,
        n_heads=32,
        head_dim=128,
        seq_len=4096,
        recompute="none",
    )


def test_head_dim_from_hidden_is_a_whole_number() -> None:
    # 4100 ÷ 32 = 128.125: head_dim is the integer part, 128.
    shape = ModelShape.from_config({"n_params": 7e9, "n_heads": 32, "hidden": 4100}, "")
    assert shape.head_dim == 128 and isinstance(shape.head_dim, int)


def test_shape_from_a_config_with_an_explicit_head_dim_and_moe() -> None:
    shape = ModelShape.from_config(
        {"n_params": 47e9, "active_params": 13e9, "n_heads": 32, "hidden": 4096, "head_dim": 64}, "full"
    )
    assert shape.active_params == 13e9 and shape.head_dim == 64 and shape.recompute == "full"
    assert shape.n_layers is None and shape.seq_len is None


def test_shape_from_an_empty_config_knows_nothing() -> None:
    assert ModelShape.from_config({"n_params": 0, "hidden": 4096}, "") == ModelShape(n_params=None)


# --------------------------------------------------------------------------------- progress → throughput


def test_two_progress_points_give_a_rate_over_their_interval() -> None:
    # 1000 tokens in 10 s = 100 tokens/s on [0, 10); the grid point at 10 s is past the last interval.
    out = tokens_per_second_from_progress(
        np.array([0.0, 10.0]), np.array([0.0, 1000.0]), np.array([0.0, 5.0, 10.0])
    )
    assert out[0] == pytest.approx(100.0) and out[1] == pytest.approx(100.0)
    assert np.isnan(out[2])


def test_a_flat_counter_is_zero_throughput_and_a_backwards_one_is_unknown() -> None:
    times = np.array([0.0, 10.0, 20.0, 30.0])
    tokens = np.array([0.0, 1000.0, 1000.0, 500.0])  # 100 tokens/s, then 0, then a restart
    out = tokens_per_second_from_progress(times, tokens, np.array([5.0, 15.0, 25.0]))
    assert out[0] == pytest.approx(100.0)
    assert out[1] == 0.0
    assert np.isnan(out[2])


def test_a_sub_second_interval_is_a_rate_per_second() -> None:
    # 100 tokens in 0.5 s = 200 tokens/s.
    out = tokens_per_second_from_progress(np.array([0.0, 0.5]), np.array([0.0, 100.0]), np.array([0.25]))
    assert out[0] == pytest.approx(200.0)


def test_duplicate_progress_timestamps_do_not_break_the_rate() -> None:
    # [0, 10]: 100 tokens/s; the duplicate at 10 s is a zero-width interval; [10, 20]: 100 tokens/s.
    times = np.array([0.0, 10.0, 10.0, 20.0])
    tokens = np.array([0.0, 1000.0, 1000.0, 2000.0])
    out = tokens_per_second_from_progress(times, tokens, np.array([5.0, 15.0]))
    assert out == pytest.approx([100.0, 100.0])


def test_the_missing_mfu_reason_is_the_throughput_sources_own_reason_when_it_gives_one() -> None:
    # load_context passes why the job's own source gave nothing (e.g. a free-form query not run).
    why = "the throughput PromQL is free-form and was not set by staff"
    k = _kpis(tokens_per_second=None, throughput_source=why)
    assert k.waste is not None and k.waste.reason is not None
    assert k.waste.reason.startswith(f"MFU unknown (no throughput: {why})")


def test_the_evaluations_mfu_is_the_mfu_commands_for_the_same_run() -> None:
    # One definition (flops.utilisation): the evaluation over 60 steps at 800 tokens/s on one 6e12 GPU and
    # `manage.py mfu` (flops.mfu) with the same numbers give 6e9 x 800 / 6e12 = 0.8, as do their HFUs.
    from jobs.evaluation import flops

    k = _kpis(**ONE_GPU, tokens_per_second=np.full(60, 800.0))
    cli = flops.mfu(flops.model_flops_per_token(1e9, attention=False), 800.0, 1, 6e12)
    assert cli.value == pytest.approx(0.8)
    assert k.mfu == pytest.approx(cli.value, rel=1e-12)
    assert k.mfu_series is not None and np.allclose(k.mfu_series, cli.value)
