"""Issue 25 item 3: a serving job's MFU counts forward FLOPs (2N + 4·L·H·Q·C over the context actually
attended), not training's 6N + 12·L·H·Q·T. Expected values are derived by hand in the comments."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from jobs.evaluation.flops import forward_flops_per_token
from jobs.evaluation.kpis import ModelShape, compute_kpis

T0 = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)
# A 7B-class model: N = 6.7e9, L = 32 layers, H = 32 heads, Q = 128 (L·H·Q = 131,072).
SHAPE = {"n_params": 6.7e9, "n_layers": 32, "n_heads": 32, "head_dim": 128, "seq_len": 4096}


def test_forward_flops_are_2n_plus_4lhqc() -> None:
    # 2 × 6.7e9 = 1.34e10; 4 × 131,072 × 2,048 = 1,073,741,824; total 14,473,741,824.
    f = forward_flops_per_token(6.7e9, n_layers=32, n_heads=32, head_dim=128, context_len=2048)
    assert f.parameter_flops_per_token == pytest.approx(1.34e10)
    assert f.attention_flops_per_token == pytest.approx(1_073_741_824)
    assert f.flops_per_token == pytest.approx(14_473_741_824)
    assert f.variant.startswith("2N+4LHQC (forward only (serving)")
    assert forward_flops_per_token(6.7e9, attention=False).flops_per_token == pytest.approx(1.34e10)
    with pytest.raises(ValueError):
        forward_flops_per_token(6.7e9, n_layers=32, n_heads=32, head_dim=128, context_len=0)


def test_serving_shape_uses_the_registered_context_or_half_the_sequence() -> None:
    with_context = ModelShape.from_config({**SHAPE, "context_len": 2048}, "none", "inference")
    est, fallback = with_context.model_flops("palm")
    assert est is not None and not fallback
    assert est.flops_per_token == pytest.approx(14_473_741_824)
    assert "C = 2048 tokens (the job's context_len)" in est.variant
    # Without context_len: C = seq_len / 2 = 2,048 (a causal pass over full 4,096-token sequences), said so.
    halved, _ = ModelShape.from_config(SHAPE, "none", "inference").model_flops("palm")
    assert halved is not None and halved.flops_per_token == pytest.approx(14_473_741_824)
    assert "assumed" in halved.variant
    # The 6N convention for serving is 2N.
    two_n, _ = with_context.model_flops("6n")
    assert two_n is not None and two_n.flops_per_token == pytest.approx(1.34e10)
    # HFU of a forward pass: nothing is recomputed.
    hw = with_context.hardware_flops()
    assert hw is not None and hw.flops_per_token == pytest.approx(14_473_741_824)


def _kpis(kind: str) -> float | None:
    k = compute_kpis(
        start=T0, end=T0 + timedelta(hours=1), gpu_count=1,
        shape=ModelShape.from_config({**SHAPE, "context_len": 2048}, "none", kind),
        peak_flops_per_gpu=989e12, peak_clock_mhz=None, grid_step_s=60.0,
        tokens_per_second=np.full(60, 1e4), throughput_source="test", gpu_util=None, sm_active=None,
        tensor_active=None, sm_clock=None, prices=[(T0 - timedelta(days=1), 2.5)], price_label="H100",
        reference_mfu=0.45, reference_source="organisation target",
    )  # fmt: skip
    if kind == "inference":
        assert "forward only (serving)" in k.variants["mfu"]
    return k.mfu


def test_serving_mfu_is_about_a_third_of_the_training_formula() -> None:
    # 10,000 tokens/s on one H100 (989 TFLOP/s dense BF16): forward 1.4474e10 × 1e4 / 9.89e14 = 14.63 %.
    # Read with training FLOPs (6N + 12·L·H·Q·T at T = 4,096: 4.02e10 + 6.442e9 = 4.664e10) it was 47.2 %.
    assert _kpis("inference") == pytest.approx(0.14635, abs=1e-4)
    assert _kpis("training") == pytest.approx(0.4716, abs=1e-3)
