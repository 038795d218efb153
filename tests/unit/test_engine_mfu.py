"""Issue 25 item 3: a serving engine's own MFU (vLLM / SGLang `estimated_flops_per_gpu_total`) is the
serving job's MFU when exported, with our forward-FLOPs MFU kept beside it; absent, the forward-FLOPs MFU
stays and the engine's is unknown with a reason, never 0. Pure: no Django, no Prometheus. Expected values
are derived by hand in the comments."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from jobs.evaluation.catalog import gpu_by_name
from jobs.evaluation.kpis import ENGINE_MFU_CONVENTION, Kpis, ModelShape, compute_kpis, engine_mfu
from jobs.metrics.engine_signals import ENGINE_SIGNALS, engine_readiness
from jobs.metrics.signals import Reading

T0 = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)
H100 = gpu_by_name("H100 SXM")
assert H100 is not None
PEAK = H100.peak_flops("bf16") or 0.0  # 989.5 TFLOP/s dense BF16 (the catalog's H100 SXM row)
N_POINTS = 60  # one hour on a 60 s grid


def _kpis(
    engine: np.ndarray | None, *, kind: str = "inference", tps: float | None = 3000.0, reason: str = ""
) -> Kpis:
    # A 7B model registered without its attention shape: forward FLOPs 2N = 1.4e10 per token.
    return compute_kpis(
        start=T0, end=T0 + timedelta(hours=1), gpu_count=1,
        shape=ModelShape.from_config({"n_params": 7e9}, "none", kind), peak_flops_per_gpu=PEAK,
        peak_clock_mhz=None, grid_step_s=60.0,
        tokens_per_second=None if tps is None else np.full(N_POINTS, tps), throughput_source="test",
        gpu_util=None, sm_active=None, tensor_active=None, sm_clock=None,
        prices=[(T0 - timedelta(days=1), 2.5)], price_label="H100", reference_mfu=0.45,
        reference_source="organisation target", engine_flops_per_gpu=engine, engine_missing_reason=reason,
    )  # fmt: skip


def test_the_engines_flops_are_the_serving_jobs_mfu_with_the_forward_mfu_beside_it() -> None:
    assert pytest.approx(989.5e12) == PEAK
    # The engine reports 296.85 TFLOP/s per GPU: 296.85 / 989.5 = 30.0 % of the H100's dense BF16 peak.
    # Our forward FLOPs at 3,000 tokens/s: 2 x 7e9 x 3,000 = 4.2e13 FLOP/s, 4.2e13 / 9.895e14 = 4.245 %.
    k = _kpis(np.full(N_POINTS, 296.85e12))
    assert k.mfu == pytest.approx(0.30)
    assert k.engine_mfu == pytest.approx(0.30) and k.mfu_source == "engine"
    assert k.engine_flops_per_gpu == pytest.approx(296.85e12)
    assert k.flops_mfu == pytest.approx(0.042446, abs=1e-5)
    assert ENGINE_MFU_CONVENTION in k.variants["mfu"] and "296.9 TFLOP/s per GPU" in k.variants["mfu"]
    assert k.variants["mfu_cross_check"].startswith("forward-FLOPs MFU 4.2% (2N (forward only (serving)")
    assert k.mfu_series is not None and np.allclose(k.mfu_series, 0.30)
    assert any("differ by more than 2x" in n for n in k.notes)  # 30 % vs 4.2 %: one of them is wrong
    # The waste uses the MFU shown: efficiency waste = cost/day x (1 - 0.30 / 0.45).
    assert k.waste is not None and k.waste.known
    assert k.waste.efficiency_per_day == pytest.approx(2.5 * 24 * (1 - 0.30 / 0.45))


def test_no_engine_series_keeps_the_forward_mfu_and_says_why_the_engines_is_absent() -> None:
    k = _kpis(None, reason="not exported: no vllm:estimated_flops_per_gpu_total series")
    assert k.mfu == pytest.approx(0.042446, abs=1e-5) and k.mfu_source == "flops"
    assert k.engine_mfu is None and k.engine_mfu_reason.startswith("not exported")
    assert "mfu_cross_check" not in k.variants
    # A series without a single sample is absent too, not 0 % MFU.
    empty = _kpis(np.full(N_POINTS, np.nan))
    assert empty.engine_mfu is None and empty.mfu == pytest.approx(0.042446, abs=1e-5)
    assert "no engine FLOPs series" in empty.engine_mfu_reason


def test_the_engines_mfu_needs_no_throughput_series() -> None:
    # A server whose tokens/s nobody exports: the engine's counter alone gives the MFU (and the waste).
    k = _kpis(np.full(N_POINTS, 98.95e12), tps=None)
    assert k.mfu == pytest.approx(0.10) and k.mfu_source == "engine" and k.flops_mfu is None
    assert not k.mfu_unknown_reason and not any(n.startswith("no throughput") for n in k.notes)
    assert k.variants["mfu_cross_check"].startswith("forward-FLOPs MFU unknown (no throughput")
    assert k.waste is not None and k.waste.known


def test_the_engine_mfu_is_the_time_mean_of_its_rate_ignoring_gaps() -> None:
    # Half the hour at 197.9 TFLOP/s, a gap (no scrape), half at 395.8: mean 296.85 -> 30 %.
    flops = np.concatenate([np.full(29, 197.9e12), [np.nan, np.nan], np.full(29, 395.8e12)])
    k = _kpis(flops)
    assert k.mfu == pytest.approx(0.30)
    assert k.mfu_series is not None and np.isnan(k.mfu_series[29])


def test_a_training_job_ignores_engine_counters() -> None:
    k = _kpis(np.full(N_POINTS, 296.85e12), kind="training")
    assert k.mfu_source == "flops" and k.engine_mfu is None and not k.engine_mfu_reason
    # Training's 6N: 6 x 7e9 x 3,000 / 9.895e14 = 12.73 %.
    assert k.mfu == pytest.approx(0.12734, abs=1e-4)


def test_engine_mfu_of_a_shared_gpu_is_against_the_jobs_share_of_the_peak() -> None:
    # Half of one H100 (time-sliced): 148.4 TFLOP/s per GPU is 30 % of 494.75.
    assert engine_mfu(148.425e12, PEAK, 0.5) == pytest.approx(0.30)
    with pytest.raises(ValueError):
        engine_mfu(1e12, 0.0)


def test_engine_signals_are_registered_as_the_servers_emit_them() -> None:
    flops = ENGINE_SIGNALS["engine_flops"]
    # vLLM docs, "Model Flops Utilization (MFU) Performance Metrics"; SGLang's metrics_collector.py.
    assert flops.metrics == ("vllm:estimated_flops_per_gpu_total", "sglang:estimated_flops_per_gpu_total")
    assert flops.reading is Reading.COUNTER and flops.prom_type == "counter" and flops.unit == "FLOP/s"
    assert ENGINE_SIGNALS["engine_read_bytes"].metrics[0] == "vllm:estimated_read_bytes_per_gpu_total"
    assert ENGINE_SIGNALS["engine_write_bytes"].unit == "B/s"
    assert "--enable-mfu-metrics" in flops.enable_line and "pod" in flops.enable_line
    lines = {r.key: r for r in engine_readiness(["vllm:estimated_flops_per_gpu_total"])}
    assert lines["engine_flops"].present and not lines["engine_read_bytes"].present
