"""`evaluate(context)` and the stored schema: behaviours the mutation benchmark (benchmarks/mutation.py) found
untested. Every field of the evaluation is checked on one full context; expected values are derived in the
comments (definitions: reference/formulas.md, jobs.evaluation.costs and jobs.evaluation.kpis docstrings)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from jobs.evaluation.context import EvaluationContext
from jobs.evaluation.evaluate import evaluate
from jobs.evaluation.kpis import ModelShape
from jobs.evaluation.schema import DERIVED_THROUGHPUT, Evaluation, encode
from jobs.metrics.signals import JobSignals, SignalSeries

T0 = datetime(2026, 11, 30, tzinfo=UTC)
TS = T0.timestamp() + np.arange(1, 61) * 60.0  # one hour on a 60 s grid
PEAK = 989.5e12
# 6N = 4.2e10 FLOPs/token (7e9 parameters); MFU 0.30 on 8 GPUs: 0.30 × 8 × 989.5e12 / 4.2e10 tokens/s.
TPS = 0.30 * 8 * PEAK / 4.2e10


def _context(**overrides):  # type: ignore[no-untyped-def]
    values = {
        "start": T0,
        "end": T0 + timedelta(hours=1),
        "gpu_count": 8,
        "shape": ModelShape(n_params=7e9, recompute="full"),
        "dtype": "bf16",
        "gpu_known": True,
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "peak_flops_per_gpu": PEAK,
        "peak_clock_mhz": 1830.0,
        "signals": None,
        "timestamps": TS,
        "step_s": 60.0,
        "tokens_per_second": np.full(60, TPS),
        "throughput_source": "progress pushes",
        "prices": ((T0 - timedelta(days=1), 2.0),),
        "price_label": "H100 SXM, spot",
        "reference_mfu": 0.45,
        "reference_source": "organisation target",
        "flops_convention": "palm",
        "energy_j": None,
        "usd_per_kwh": 0.15,
    }
    values.update(overrides)
    return EvaluationContext(**values)


def _series(key: str, **stats: np.ndarray) -> SignalSeries:
    return SignalSeries(key, "", TS, dict(stats))


def _signals(*series: SignalSeries) -> JobSignals:
    sigs = JobSignals(TS[0], TS[-1], 60, TS)
    sigs.signals = {s.key: s for s in series}
    return sigs


def _full_signals() -> JobSignals:
    # GPU_UTIL across 8 GPUs in three 20-step blocks (no per-GPU rows: the cross-GPU lower bound is used):
    #   all eight at 0.04 (max ≤ 5 %: 8 idle), one at 0 and seven at 1.0 (min ≤ 5 %: ≥ 1 idle; mean 0.875),
    #   all busy (min 0.9, mean 0.95, max 1): 0 idle.
    #   Idle share ≥ (20 × 8 + 20 × 1) / (8 × 60) = 180/480 = 0.375.
    #   Mean GPU_UTIL over time = (20 × 0.04 + 20 × 0.875 + 20 × 0.95) / 60 = 37.3 / 60.
    util = _series(
        "gpu_util",
        mean=np.array([0.04] * 20 + [0.875] * 20 + [0.95] * 20),
        min=np.array([0.04] * 20 + [0.0] * 20 + [0.9] * 20),
        max=np.array([0.04] * 20 + [1.0] * 20 + [1.0] * 20),
    )
    return _signals(
        util,
        _series("sm_active", mean=np.full(60, 0.6)),
        _series("tensor_active", mean=np.full(60, 0.5)),
        _series("sm_clock", mean=np.full(60, 1464.0)),  # 0.8 × the 1830 MHz peak clock
        _series("power_usage", mean=np.full(60, 700.0)),
        _series("fb_used", max=np.linspace(1000.0, 70000.0, 60)),
    )


def test_every_number_of_a_fully_instrumented_job() -> None:
    evaluated = evaluate(_context(signals=_full_signals()))
    ev = evaluated.evaluation
    assert ev.duration_s == 3600.0
    assert ev.gpu_hours == pytest.approx(8.0)  # 8 GPUs × 1 h
    assert ev.mfu == pytest.approx(0.30)
    # Full recomputation executes 8N = 5.6e10 FLOPs/token: HFU = 0.30 × 8/6 = 0.40.
    assert ev.hfu == pytest.approx(0.40)
    assert ev.tokens_per_second == pytest.approx(TPS)
    assert ev.gpu_util_mean == pytest.approx(37.3 / 60)
    assert ev.sm_active_mean == pytest.approx(0.6)
    assert ev.tensor_active_mean == pytest.approx(0.5)
    assert ev.cost_usd == pytest.approx(16.0)  # 8 GPU-h × $2
    assert ev.cost_per_day_usd == pytest.approx(384.0)  # 8 × $2 × 24
    assert ev.idle_share == pytest.approx(0.375) and ev.idle_share_exact is False
    # idle = 384 × 0.375 = $144; efficiency = 384 × (1 − 0.30/0.45) = $128; total = max = $144.
    assert ev.waste.total_per_day_usd == pytest.approx(144.0)
    assert ev.waste.lower_bound_per_day_usd == pytest.approx(144.0)
    assert ev.waste.idle_per_day_usd == pytest.approx(144.0)
    assert ev.waste.efficiency_per_day_usd == pytest.approx(128.0)
    assert ev.waste.unknown_reason == ""
    assert ev.reference_mfu == 0.45 and ev.reference_source == "organisation target"
    assert ev.mfu_fallback is True and ev.flops_variant == ev.variants["mfu"]
    assert ev.flops_variant.startswith("MFU, 6N")
    # Power: 700 W over the 59 intervals of 60 s = 3540 s: 2,478,000 J = 0.68833 kWh per GPU, × 8 GPUs.
    assert ev.energy_kwh == pytest.approx(8 * 700.0 * 3540.0 / 3.6e6)
    assert ev.energy_cost_usd == pytest.approx(8 * 700.0 * 3540.0 / 3.6e6 * 0.15)
    assert ev.peak_memory_mib == pytest.approx(70000.0)
    # Tensor estimate 0.5 × 1464/1830 = 0.40; MFU/estimate = 0.75 lies in [1/2, 1.1]: agree.
    assert ev.cross_check is not None
    assert ev.cross_check.tensor_upper_mfu == pytest.approx(0.40)
    assert ev.cross_check.disagrees is False and ev.cross_check.direction == "agree"
    assert ev.cross_check.explanation == "MFU 30.0% is consistent with the tensor-pipe upper estimate 40.0%"
    assert ev.price_note == "8 GPUs × $2.00/GPU-h (H100 SXM, spot) × 24 h" == ev.variants["cost"]
    assert ev.variants["throughput"] == "progress pushes"
    assert "8N" in ev.variants["hfu"]
    assert ev.notes == [
        "MFU computed as 6N (no attention term): register n_layers, n_heads, head_dim (or hidden) and "
        "seq_len for the organisation's 6N + 12·L·H·Q·T convention"
    ]
    assert evaluated.derived[DERIVED_THROUGHPUT] is not None
    assert evaluated.derived[DERIVED_THROUGHPUT][0] == pytest.approx(TPS)


def test_energy_from_the_counter_wins_over_power() -> None:
    # 7.2e7 J / 3.6e6 = 20 kWh for the job; at $0.15/kWh: $3.
    ev = evaluate(_context(signals=_full_signals(), energy_j=7.2e7)).evaluation
    assert ev.energy_kwh == pytest.approx(20.0)
    assert ev.energy_cost_usd == pytest.approx(3.0)


def test_without_throughput_nothing_derived_and_no_mfu_variant() -> None:
    evaluated = evaluate(_context(tokens_per_second=None))
    assert DERIVED_THROUGHPUT not in evaluated.derived
    assert evaluated.evaluation.flops_variant == ""
    assert evaluated.evaluation.cross_check is None


def test_without_prices_there_is_no_price_note() -> None:
    assert evaluate(_context(prices=())).evaluation.price_note == ""


def test_the_jobs_flops_convention_is_applied() -> None:
    # "6n": 6N = 4.2e10 FLOPs/token even for a full shape (no fallback); PaLM would add 12·L·H·Q·T.
    shape = ModelShape(n_params=7e9, n_layers=32, n_heads=32, head_dim=128, seq_len=4096)
    ev = evaluate(_context(shape=shape, flops_convention="6n")).evaluation
    assert ev.mfu == pytest.approx(0.30)
    assert ev.mfu_fallback is False


def _per_gpu_context(first_per_gpu_step: int) -> EvaluationContext:
    # GPU 7 of 8 idle: exact share 1/8 when the per-GPU rows are used. The cross-GPU mean (7 × 0.95 / 8 =
    # 0.83125, no min/max) bounds it at 0. Rows starting `first_per_gpu_step` steps late.
    gts = TS[first_per_gpu_step:]
    per_gpu = np.full((8, gts.size), 0.95)
    per_gpu[7] = 0.0
    util = _series("gpu_util", mean=np.full(60, 7 * 0.95 / 8))
    util.per_gpu, util.gpu_timestamps = per_gpu, gts
    return _context(signals=_signals(util))


def test_per_gpu_rows_from_the_grid_start_give_the_exact_idle_share() -> None:
    ev = evaluate(_per_gpu_context(0)).evaluation
    assert ev.idle_share == pytest.approx(1 / 8) and ev.idle_share_exact


def test_per_gpu_rows_one_step_late_still_span_the_window() -> None:
    ev = evaluate(_per_gpu_context(1)).evaluation
    assert ev.idle_share == pytest.approx(1 / 8) and ev.idle_share_exact


def test_per_gpu_rows_two_steps_late_fall_back_to_the_cross_gpu_bound() -> None:
    ev = evaluate(_per_gpu_context(2)).evaluation
    assert ev.idle_share == 0.0 and not ev.idle_share_exact


def test_encode_replaces_a_lone_surrogate() -> None:
    # A lone surrogate cannot be stored as UTF-8: the one sanitiser (safe_json.make_storable) turns it
    # into U+FFFD, the Unicode replacement character.
    payload = encode(Evaluation(duration_s=1.0, gpu_hours=1.0, notes=["a\ud800b"]))
    assert payload["notes"] == ["a\ufffdb"]
