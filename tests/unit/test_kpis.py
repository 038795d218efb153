"""The production KPI path (jobs.evaluation.kpis.compute_kpis) and the waste split
(jobs.evaluation.costs.split_waste), on
hand-worked cases: every expected value is derived in the comments from the definitions in
shared/reference/formulas.md, not copied from the program's output."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from jobs.evaluation import costs
from jobs.evaluation.kpis import (
    IDLE_UTIL_MAX,
    ModelShape,
    compute_kpis,
    idle_share_lower_bound,
    idle_share_per_gpu,
    target_mfu,
    tokens_per_second_from_progress,
)

T0 = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)


def _kpis(**overrides):  # type: ignore[no-untyped-def]
    args = {
        "start": T0,
        "end": T0 + timedelta(hours=1),
        "gpu_count": 2,
        "shape": ModelShape(n_params=1e9),
        "peak_flops_per_gpu": 1e15,
        "peak_clock_mhz": None,
        "grid_step_s": 60.0,
        "tokens_per_second": None,
        "throughput_source": "test",
        "gpu_util": None,
        "sm_active": None,
        "tensor_active": None,
        "sm_clock": None,
        "prices": [(T0 - timedelta(days=1), 2.5)],
        "price_label": "H100, on-demand",
        "reference_mfu": 0.45,
        "reference_source": "organisation target",
    }
    args.update(overrides)
    return compute_kpis(**args)


def test_mfu_is_total_model_flops_over_total_peak_flops_of_the_covered_time() -> None:
    # 6N with N = 1e9: 6e9 FLOPs per token. Four 60 s steps, the last without a sample.
    # Tokens = (1e5 + 1e5 + 3e5) tokens/s × 60 s = 3e7; covered time = 3 × 60 = 180 s (the empty step is
    # not time at zero throughput). MFU = 6e9 × 3e7 / (2 GPUs × 1e15 FLOP/s × 180 s) = 1.8e17 / 3.6e17 = 0.5.
    # Counting the empty step as covered would give 1.8e17 / 4.8e17 = 0.375.
    tps = np.array([1e5, 1e5, 3e5, np.nan])
    k = _kpis(tokens_per_second=tps, flops_convention="6n")
    assert k.mfu == pytest.approx(0.5)
    # Throughput: 3e7 tokens / 180 s.
    assert k.tokens_per_second == pytest.approx(3e7 / 180)
    assert not k.flops_fallback


def test_palm_convention_adds_attention_and_marks_jobs_without_a_shape_as_fallbacks() -> None:
    # 7B-like shape: 6N = 4.2e10; 12·L·H·Q·T = 12 × 32 × 32 × 128 × 4096 = 6,442,450,944.
    full = ModelShape(n_params=7e9, n_layers=32, n_heads=32, head_dim=128, seq_len=4096)
    est, fallback = full.model_flops("palm")
    assert est is not None and est.flops_per_token == pytest.approx(4.2e10 + 6_442_450_944)
    assert fallback is False
    # Without layers/heads/seq the organisation's convention cannot be applied: 6N, flagged.
    est, fallback = ModelShape(n_params=7e9).model_flops("palm")
    assert est is not None and est.flops_per_token == pytest.approx(4.2e10)
    assert fallback is True
    # The "6n" convention never needs the shape, so nothing falls back.
    est, fallback = full.model_flops("6n")
    assert est is not None and est.flops_per_token == pytest.approx(4.2e10) and fallback is False
    with pytest.raises(ValueError, match="unknown FLOPs convention"):
        full.model_flops("chinchilla")


def test_fallback_is_stated_on_the_job_kpis() -> None:
    k = _kpis(tokens_per_second=np.full(4, 1e5))
    assert k.flops_fallback is True
    assert "fallback" in k.variants["mfu"]


def test_price_change_mid_job_bills_each_part_at_its_price_and_cost_per_day_uses_the_current_one() -> None:
    # 8 GPUs for 24 h; $4/GPU-h until T0+10 h, then $2. Cost = 8 × (10 h × 4 + 14 h × 2) = 8 × 68 = $544.
    # Cost/day is the rate in force at the end of the window: 8 × $2 × 24 = $384 (not the earliest $4:
    # 8 × 4 × 24 = $768).
    prices = [(T0 - timedelta(days=30), 4.0), (T0 + timedelta(hours=10), 2.0)]
    k = _kpis(gpu_count=8, end=T0 + timedelta(hours=24), prices=prices)
    assert k.cost_usd == pytest.approx(544.0)
    assert k.cost_per_day_usd == pytest.approx(384.0)


def test_energy_from_board_power_is_multiplied_by_the_gpu_count() -> None:
    # Mean board power 500 W per GPU for one hour (61 samples, 60 s apart): 0.5 kWh per GPU; 8 GPUs: 4 kWh.
    times = T0.timestamp() + np.arange(61) * 60.0
    k = _kpis(gpu_count=8, power_w=np.full(61, 500.0), power_times=times, usd_per_kwh=0.10)
    assert k.energy_kwh == pytest.approx(4.0)
    assert k.energy_cost_usd == pytest.approx(0.40)


def test_a_progress_counter_reset_starts_a_new_interval_instead_of_a_negative_rate() -> None:
    # Tokens 0 → 1000 over 100 s (10 tokens/s), then a restart from a checkpoint reads 50 (a drop, not
    # -9.5 tokens/s), then 50 → 1050 over 100 s (10 tokens/s). Grid points inside each interval read its rate.
    times = np.array([0.0, 100.0, 200.0, 300.0])
    tokens = np.array([0.0, 1000.0, 50.0, 1050.0])
    rate = tokens_per_second_from_progress(times, tokens, np.array([50.0, 150.0, 250.0, 350.0]))
    assert rate[0] == pytest.approx(10.0)
    assert np.isnan(rate[1])
    assert rate[2] == pytest.approx(10.0)
    assert np.isnan(rate[3])  # after the last pushed point nothing is known


def test_unknown_mfu_with_idle_gpus_gives_unknown_waste_with_the_idle_part_as_lower_bound() -> None:
    # 4 GPUs at $2.5/GPU-h: cost/day = 4 × 2.5 × 24 = $240. Per-GPU GPU_UTIL over 10 steps: GPU 0 and 1
    # busy (0.9), GPU 2 idle for 2 steps, GPU 3 idle all 10 steps, and 5 of GPU 1's cells missing.
    # Observed cells = 40 − 5 = 35; idle cells = 2 + 10 = 12; idle share = 12/35; idle waste = 240 × 12/35.
    util = np.full((4, 10), 0.9)
    util[2, :2] = 0.0
    util[3, :] = 0.01
    util[1, 5:] = np.nan
    k = _kpis(gpu_count=4, gpu_util=np.nanmean(util, axis=0), gpu_util_per_gpu=util)
    assert k.mfu is None
    assert k.waste is not None
    assert k.waste_per_day_usd is None
    assert k.idle_share == pytest.approx(12 / 35)
    assert k.waste.lower_bound_per_day == pytest.approx(240 * 12 / 35)
    assert k.waste.idle_per_day == pytest.approx(240 * 12 / 35)
    assert "MFU unknown" in k.waste.reason
    assert any("waste/day unknown" in n for n in k.notes)


def test_known_mfu_waste_is_the_larger_of_idle_and_efficiency_waste() -> None:
    # cost/day $1000, MFU 0.30 vs reference 0.45: efficiency waste = 1000 × (1 − 0.30/0.45) = $333.33.
    low_idle = costs.split_waste(1000.0, mfu=0.30, reference_mfu=0.45, idle_share=0.10)
    assert low_idle.total_per_day == pytest.approx(1000 / 3)
    assert low_idle.idle_per_day == pytest.approx(100.0)
    # Half the GPU-time idle while the busy half beats the reference (job MFU 0.30 = 0.5 × 0.60): the idle
    # $500 is really lost even though MFU alone says $333.
    high_idle = costs.split_waste(1000.0, mfu=0.30, reference_mfu=0.45, idle_share=0.5)
    assert high_idle.total_per_day == pytest.approx(500.0)
    assert high_idle.lower_bound_per_day == pytest.approx(500.0)


def test_waste_without_price_is_unknown_not_zero() -> None:
    w = costs.split_waste(None, mfu=0.2, reference_mfu=0.45, idle_share=0.5)
    assert w.total_per_day is None and w.lower_bound_per_day is None
    assert "price" in w.reason


def test_no_utilisation_and_no_mfu_leaves_no_lower_bound() -> None:
    w = costs.split_waste(240.0, mfu=None, reference_mfu=0.45, idle_share=None)
    assert w.total_per_day is None and w.lower_bound_per_day is None
    assert "not even the idle part" in w.reason


def test_idle_share_can_never_exceed_one() -> None:
    with pytest.raises(ValueError, match="at most 1"):
        costs.split_waste(100.0, mfu=None, reference_mfu=0.45, idle_share=1.5)
    assert idle_share_per_gpu(np.zeros((8, 100))) == 1.0
    assert idle_share_per_gpu(np.full((2, 3), np.nan)) is None


def test_idle_lower_bound_from_cross_gpu_statistics() -> None:
    # 8 GPUs, θ = 5 %. Step 1: max 1 % ≤ θ → all 8 idle. Step 2: min 0 ≤ θ → at least 1 (the mean of 50 %
    # gives no bound). Step 3: mean 2 %: busy GPUs read > 5 %, so 8 × 0.02 = 0.16 > (8 − k) × 0.05 gives
    # k > 4.8 → at least 5. Step 4 has no sample and is not counted. Share ≥ (8 + 1 + 5) / (8 × 3) = 14/24.
    assert IDLE_UTIL_MAX == 0.05
    mean = np.array([0.0, 0.5, 0.02, np.nan])
    lo = np.array([0.0, 0.0, 0.0, np.nan])
    hi = np.array([0.01, 0.9, 0.16, np.nan])
    assert idle_share_lower_bound(mean, lo, hi, 8) == pytest.approx(14 / 24)
    assert idle_share_lower_bound(np.full(3, np.nan), None, None, 8) is None


def test_fp8_jobs_are_measured_against_the_fp8_target() -> None:
    # NVIDIA's Llama-2-70B FP8 recipe: 38 % of the FP8 dense peak. Against the BF16 target of 45 % it would
    # "waste" 1 − 0.38/0.45 = 15.6 % of its cost; against the FP8 target (38 %) it wastes nothing.
    ref, source = target_mfu("fp8", 0.45, 0.38)
    assert ref == 0.38 and "FP8" in source
    assert target_mfu("bf16", 0.45, 0.38)[0] == 0.45
    assert costs.split_waste(1000.0, mfu=0.38, reference_mfu=ref, idle_share=0.0).total_per_day == 0.0
    assert costs.waste_per_day(1000.0, 0.38, 0.45) == pytest.approx(1000 * (1 - 0.38 / 0.45))


def test_amounts_render_exact_lower_bound_and_unknown_distinctly() -> None:
    assert costs.Amount(1234.4).text() == "$1,234"
    assert costs.Amount(12.5, lower_bound=True, reason="MFU unknown for 3").text("/day") == (
        "at least $12.50/day (MFU unknown for 3)"
    )
    assert costs.Amount(None, reason="no price").text() == "unknown (no price)"
    assert costs.Amount.of(None, 5.0, "r") == costs.Amount(5.0, lower_bound=True, reason="r")
    assert costs.Amount.of(7.0, 5.0, "r") == costs.Amount(7.0)
