"""FLOPs per token, MFU/HFU and the tensor-pipe cross-check (jobs/evaluation/flops.py)."""

from __future__ import annotations

import math

import pytest

from jobs.evaluation import flops

# PaLM 540B, Table 3 inputs (reference/formulas.md).
PALM_N = 540.35e9
PALM_SHAPE = {"n_layers": 118, "n_heads": 48, "head_dim": 256, "seq_len": 2048}
PALM_TOKENS_PER_S = 238.3e3
PALM_DEVICES = 6144
TPU_V4_BF16 = 275e12


def _palm_utilization(estimate: flops.FlopsEstimate) -> float:
    compute = flops.mfu if estimate.kind == "model" else flops.hfu
    return compute(estimate, PALM_TOKENS_PER_S, PALM_DEVICES, TPU_V4_BF16).value


def test_palm_540b_mfu_reproduces_46_2_percent() -> None:
    estimate = flops.model_flops_per_token(PALM_N, **PALM_SHAPE)
    assert _palm_utilization(estimate) == pytest.approx(0.4623, abs=5e-5)
    assert estimate.variant == "6N+12LHQT (PaLM, no causal halving)"


def test_palm_540b_mfu_without_attention_is_45_73_percent() -> None:
    estimate = flops.model_flops_per_token(PALM_N, attention=False)
    assert _palm_utilization(estimate) == pytest.approx(0.4573, abs=5e-5)
    assert estimate.attention_flops_per_token == 0
    assert "attention not counted" in estimate.variant


def test_palm_540b_hfu_full_recompute_is_61_6_percent() -> None:
    estimate = flops.hardware_flops_per_token(PALM_N, recompute="full", **PALM_SHAPE)
    assert _palm_utilization(estimate) == pytest.approx(0.616, abs=5e-4)
    assert estimate.variant.startswith("8N+16LHQT")


def test_palm_540b_hfu_with_recompute_fraction_0_751_is_57_8_percent() -> None:
    estimate = flops.hardware_flops_per_token(PALM_N, recompute=0.751, **PALM_SHAPE)
    assert _palm_utilization(estimate) == pytest.approx(0.578, abs=5e-4)
    assert "0.751" in estimate.variant


def test_hfu_without_recompute_equals_mfu() -> None:
    model = flops.model_flops_per_token(PALM_N, **PALM_SHAPE)
    hardware = flops.hardware_flops_per_token(PALM_N, recompute="none", **PALM_SHAPE)
    assert hardware.flops_per_token == model.flops_per_token
    assert hardware.kind == "hardware"


def test_recompute_mode_is_case_insensitive() -> None:
    upper = flops.hardware_flops_per_token(1e9, attention=False, recompute="FULL")  # type: ignore[arg-type]
    assert upper.flops_per_token == pytest.approx(8e9)


def test_selective_recompute_adds_only_attention_forward() -> None:
    core = 118 * 48 * 256 * 2048
    estimate = flops.hardware_flops_per_token(PALM_N, recompute="selective", **PALM_SHAPE)
    assert estimate.parameter_flops_per_token == pytest.approx(6 * PALM_N)
    assert estimate.attention_flops_per_token == pytest.approx(16 * core)


def test_recompute_fraction_endpoints_match_named_modes() -> None:
    none = flops.hardware_flops_per_token(PALM_N, recompute="none", **PALM_SHAPE)
    full = flops.hardware_flops_per_token(PALM_N, recompute="full", **PALM_SHAPE)
    assert flops.hardware_flops_per_token(
        PALM_N, recompute=0.0, **PALM_SHAPE
    ).flops_per_token == pytest.approx(none.flops_per_token)
    assert flops.hardware_flops_per_token(
        PALM_N, recompute=1.0, **PALM_SHAPE
    ).flops_per_token == pytest.approx(full.flops_per_token)


def test_causal_halving_halves_attention_term_and_says_so() -> None:
    plain = flops.model_flops_per_token(PALM_N, **PALM_SHAPE)
    causal = flops.model_flops_per_token(PALM_N, causal=True, **PALM_SHAPE)
    assert causal.attention_flops_per_token == pytest.approx(plain.attention_flops_per_token / 2)
    assert causal.parameter_flops_per_token == plain.parameter_flops_per_token
    assert "causal halving" in causal.variant and "6N+6LHQT" in causal.variant
    full_causal = flops.hardware_flops_per_token(PALM_N, recompute="full", causal=True, **PALM_SHAPE)
    assert full_causal.variant.startswith("8N+8LHQT")


def test_moe_uses_active_parameters() -> None:
    # 8 experts of 5e9 each, top-2, plus 7e9 always-on parameters: 7e9 + 40e9 * 2/8 = 17e9 active.
    active = flops.moe_active_params(47e9, 40e9, num_experts=8, top_k=2)
    assert active == pytest.approx(17e9)
    estimate = flops.model_flops_per_token(active, attention=False, moe=True)
    assert estimate.flops_per_token == pytest.approx(6 * 17e9)
    assert "active parameters (MoE)" in estimate.variant


def test_moe_rejects_top_k_above_expert_count() -> None:
    with pytest.raises(ValueError, match="top_k"):
        flops.moe_active_params(47e9, 40e9, num_experts=8, top_k=9)


def test_mfu_refuses_hardware_estimate_and_hfu_refuses_model_estimate() -> None:
    hardware = flops.hardware_flops_per_token(PALM_N, recompute="full", **PALM_SHAPE)
    model = flops.model_flops_per_token(PALM_N, **PALM_SHAPE)
    with pytest.raises(ValueError, match="MFU needs model FLOPs"):
        flops.mfu(hardware, 1.0, 1, 1e12)
    with pytest.raises(ValueError, match="HFU needs hardware FLOPs"):
        flops.hfu(model, 1.0, 1, 1e12)


def test_mfu_from_plain_float_reports_caller_variant_and_flags_above_peak() -> None:
    result = flops.mfu(6e9, 200e12 / 6e9 * 2, 1, 100e12)
    assert result.value == pytest.approx(4.0)
    assert result.exceeds_peak
    assert result.variant == "FLOPs per token given by the caller"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_params": -1.0}, "n_params must be positive"),
        ({"n_params": 0}, "n_params must be positive"),
        ({"n_params": math.nan}, "finite"),
        ({"n_params": True}, "must be a number"),
        ({"n_params": 1e9, "n_layers": 2, "n_heads": 2, "head_dim": 64}, "missing seq_len"),
        ({"n_params": 1e9, "n_layers": -2, "n_heads": 2, "head_dim": 64, "seq_len": 8}, "n_layers"),
    ],
)
def test_model_flops_input_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        flops.model_flops_per_token(**kwargs)


@pytest.mark.parametrize("recompute", ["partial", 1.5, -0.1])
def test_hardware_flops_rejects_unknown_recompute(recompute: object) -> None:
    with pytest.raises(ValueError, match="recompute"):
        flops.hardware_flops_per_token(1e9, attention=False, recompute=recompute)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((6e9, 1000.0, 0, 1e15), "devices must be at least 1"),
        ((6e9, 1000.0, 2.0, 1e15), "devices must be a whole number"),
        ((6e9, -1.0, 1, 1e15), "tokens_per_s must not be negative"),
        ((6e9, 1000.0, 1, 0.0), "peak_flops_per_device must be positive"),
        ((-6e9, 1000.0, 1, 1e15), "flops_per_token must be positive"),
    ],
)
def test_mfu_input_validation(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        flops.mfu(*args)


def test_tensor_estimate_scales_by_sm_clock_over_peak_clock() -> None:
    estimate = flops.tensor_flops_upper_estimate(0.5, 989.5e12, sm_clock_mhz=1372.5, peak_clock_mhz=1830)
    assert estimate.clock_ratio == pytest.approx(0.75)
    assert estimate.flops_per_s == pytest.approx(0.5 * 989.5e12 * 0.75)
    assert "SM clock / peak clock" in estimate.variant


def test_tensor_estimate_above_the_peaks_clock_exceeds_tensor_active() -> None:
    # An H100 SXM boosting to its 1980 MHz max runs 1980 / 1830 = 1.0820 times the clock its peak assumes.
    estimate = flops.tensor_flops_upper_estimate(0.5, 989.5e12, sm_clock_mhz=1980, peak_clock_mhz=1830)
    assert estimate.clock_ratio == pytest.approx(1.0820, abs=1e-4)
    assert estimate.fraction_of_peak == pytest.approx(0.5410, abs=1e-4)


def test_tensor_estimate_without_clocks_is_uncorrected_and_says_so() -> None:
    estimate = flops.tensor_flops_upper_estimate(0.4, 1e15)
    assert estimate.clock_ratio == 1.0 and "no clock correction" in estimate.variant


def test_tensor_estimate_rejects_percentages() -> None:
    with pytest.raises(ValueError, match="percentage"):
        flops.tensor_flops_upper_estimate(45.0, 1e15)


def test_cross_check_agrees_within_factor() -> None:
    check = flops.cross_check_mfu(0.40, 0.55, sm_clock_mhz=1830, peak_clock_mhz=1830)
    assert not check.disagrees and check.direction == "agree"


def test_cross_check_flags_mfu_far_above_tensor_activity() -> None:
    check = flops.cross_check_mfu(0.45, 0.10)
    assert check.disagrees and check.direction == "mfu_above_hardware"
    assert check.ratio == pytest.approx(4.5)
    assert check.factor == flops.CROSS_CHECK_FACTOR


def test_cross_check_flags_mfu_far_below_tensor_activity() -> None:
    # e.g. FP8 peak configured for a BF16 job halves MFU while the tensor pipes stay busy.
    check = flops.cross_check_mfu(0.15, 0.70)
    assert check.disagrees and check.direction == "mfu_far_below_hardware"


def test_cross_check_throttled_clock_lowers_the_estimate() -> None:
    unthrottled = flops.cross_check_mfu(0.35, 0.6, sm_clock_mhz=1830, peak_clock_mhz=1830)
    throttled = flops.cross_check_mfu(0.35, 0.6, sm_clock_mhz=900, peak_clock_mhz=1830)
    assert not unthrottled.disagrees
    assert throttled.tensor_estimate < unthrottled.tensor_estimate


def test_cross_check_near_zero_signals_are_not_compared() -> None:
    check = flops.cross_check_mfu(0.001, 0.005)
    assert not check.disagrees and check.direction == "insufficient_signal" and check.ratio is None


def test_cross_check_accepts_utilization_object() -> None:
    utilization = flops.mfu(1e9, 4e5, 1, 1e15)
    check = flops.cross_check_mfu(utilization, 0.5)
    assert check.mfu == pytest.approx(0.4)


def test_cross_check_mfu_13_percent_against_an_8_9_percent_estimate_disagrees_above() -> None:
    # The case. An H100 at 1464 MHz = 0.8 x its 1830 MHz peak clock with tensor_active 0.11125:
    # upper estimate = 0.11125 x 1464 / 1830 = 0.11125 x 0.8 = 0.0890. MFU 0.13 is 0.13 / 0.089 = 1.46x
    # what the tensor pipes could deliver: impossible for correct inputs (it used to pass as "consistent",
    # being inside the factor of 2).
    check = flops.cross_check_mfu(0.13, 0.11125, sm_clock_mhz=1464, peak_clock_mhz=1830)
    assert check.tensor_estimate == pytest.approx(0.089)
    assert check.ratio == pytest.approx(1.4607, abs=1e-4)
    assert check.disagrees and check.direction == "mfu_above_hardware"
    assert "MFU exceeds what the tensor pipes could deliver" in check.explanation
    assert "check the model shape (n_params, layers, seq_len) or dtype" in check.explanation
    assert "consistent" not in check.explanation


def test_cross_check_tolerates_mfu_slightly_above_the_estimate_as_sampling_noise() -> None:
    # Estimate 0.40 (no clock correction). MFU 0.42 is 5 % above: inside the 10 % tolerance for
    # PIPE_TENSOR_ACTIVE's sampling; 0.45 is 12.5 % above: beyond it.
    assert flops.CROSS_CHECK_ABOVE_TOLERANCE == 0.10
    inside = flops.cross_check_mfu(0.42, 0.40)
    beyond = flops.cross_check_mfu(0.45, 0.40)
    assert not inside.disagrees and inside.direction == "agree"
    assert beyond.disagrees and beyond.direction == "mfu_above_hardware"


def test_cross_check_mfu_at_half_the_estimate_still_agrees_and_below_half_disagrees() -> None:
    # MFU below the upper estimate is normal (non-model tensor work, recomputation) down to 1 / factor = 0.5.
    at_half = flops.cross_check_mfu(0.25, 0.50)
    below = flops.cross_check_mfu(0.24, 0.50)
    assert not at_half.disagrees
    assert below.disagrees and below.direction == "mfu_far_below_hardware"


def test_cross_check_uses_the_peaks_clock_so_a_max_boost_job_gets_the_higher_estimate() -> None:
    # tensor_active 0.40 at 1980 MHz: 0.40 x 1980 / 1830 = 0.4328. MFU 0.46 is 0.46 / 0.4328 = 1.063x: inside
    # the tolerance. Against the max clock (1980 / 1980 = 1) the estimate would be 0.40 and 0.46 / 0.40 =
    # 1.15x would wrongly disagree.
    check = flops.cross_check_mfu(0.46, 0.40, sm_clock_mhz=1980, peak_clock_mhz=1830)
    assert check.tensor_estimate == pytest.approx(0.4328, abs=1e-4)
    assert not check.disagrees
