"""The evaluation spine's pure parts: `evaluate(context)` on a hand-built context (no database) and the
stored schema (versioned, refusing what it cannot read). Expected values are derived in the comments."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from jobs.evaluation.context import EvaluationContext
from jobs.evaluation.evaluate import evaluate
from jobs.evaluation.kpis import ModelShape
from jobs.evaluation.schema import DERIVED_MFU, SCHEMA_VERSION, Evaluation, decode, encode
from jobs.metrics.signals import JobSignals, SignalSeries

T0 = datetime(2026, 11, 30, tzinfo=UTC)


def _context(**overrides):  # type: ignore[no-untyped-def]
    ts = T0.timestamp() + np.arange(1, 61) * 60.0  # one hour on a 60 s grid
    values = {
        "start": T0,
        "end": T0 + timedelta(hours=1),
        "gpu_count": 8,
        "shape": ModelShape(n_params=7e9),
        "dtype": "bf16",
        "gpu_known": True,
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "peak_flops_per_gpu": 989.5e12,
        "peak_clock_mhz": 1830.0,
        "signals": None,
        "timestamps": ts,
        "step_s": 60.0,
        "tokens_per_second": None,
        "throughput_source": "",
        "prices": ((T0 - timedelta(days=1), 2.0),),
        "price_label": "H100 SXM, spot",
        "reference_mfu": 0.45,
        "reference_source": "organisation target",
        "flops_convention": "palm",
        "energy_j": None,
        "usd_per_kwh": 0.0,
    }
    values.update(overrides)
    return EvaluationContext(**values)


def test_evaluate_computes_mfu_cost_and_waste_from_the_context_alone() -> None:
    # 6N = 4.2e10 FLOPs/token (shape lacks layers etc: the PaLM convention falls back to 6N, flagged).
    # Throughput chosen for MFU 0.30: tps = 0.30 × 8 × 989.5e12 / 4.2e10 = 56,542.857 tokens/s.
    # cost/day = 8 GPUs × $2/GPU-h × 24 = $384; efficiency waste = 384 × (1 − 0.30/0.45) = $128.
    tps = 0.30 * 8 * 989.5e12 / 4.2e10
    ev = evaluate(_context(tokens_per_second=np.full(60, tps), throughput_source="test")).evaluation
    assert ev.mfu == pytest.approx(0.30)
    assert ev.mfu_fallback is True and "6N" in ev.flops_variant
    assert ev.cost_per_day_usd == pytest.approx(384.0)
    assert ev.cost_usd == pytest.approx(8 * 2.0 * 1.0)  # 8 GPU-h at $2
    assert ev.waste.total_per_day_usd == pytest.approx(128.0)
    assert ev.waste.idle_per_day_usd is None  # no utilisation signal: the idle part is unknown
    assert ev.waste.efficiency_per_day_usd == pytest.approx(128.0)


def test_evaluate_uses_per_gpu_utilisation_for_the_idle_share_and_reports_peak_memory() -> None:
    # 8 GPUs × 60 steps; GPU 7 idle throughout: idle share = 60 / 480 = 1/8 exactly; no MFU, so the waste
    # is unknown and at least cost/day × 1/8 = 384 / 8 = $48/day. Peak memory: the max of fb_used's max.
    ts = T0.timestamp() + np.arange(1, 61) * 60.0
    per_gpu = np.full((8, 60), 0.95)
    per_gpu[7] = 0.0
    util = SignalSeries("gpu_util", "ratio", ts, {"mean": per_gpu.mean(axis=0)})
    util.per_gpu, util.gpu_timestamps = per_gpu, ts
    fb = SignalSeries("fb_used", "MiB", ts, {"max": np.linspace(1000.0, 70000.0, 60)})
    sigs = JobSignals(ts[0], ts[-1], 60, ts)
    sigs.signals = {"gpu_util": util, "fb_used": fb}
    ev = evaluate(_context(signals=sigs)).evaluation
    assert ev.mfu is None
    assert ev.idle_share == pytest.approx(1 / 8) and ev.idle_share_exact
    assert ev.waste.total_per_day_usd is None
    assert ev.waste.lower_bound_per_day_usd == pytest.approx(48.0)
    assert "MFU unknown" in ev.waste.unknown_reason
    assert ev.peak_memory_mib == pytest.approx(70000.0)


def test_a_mig_job_without_gpu_util_gets_its_idle_share_from_gr_engine_active() -> None:
    # MIG instances report GR_ENGINE_ACTIVE but no GPU_UTIL. 8 instances, 60 steps: steps 0-29 all idle
    # (max 0.0 <= 5 %: all 8 idle), steps 30-59 all busy (min 0.9): idle share >= 30 × 8 / (60 × 8) = 1/2.
    # No MFU: waste unknown, at least cost/day × 1/2 = 384 / 2 = $192/day.
    ts = T0.timestamp() + np.arange(1, 61) * 60.0
    level = np.where(np.arange(60) < 30, 0.0, 0.9)
    gr = SignalSeries("gr_engine_active", "ratio", ts, {"mean": level, "min": level, "max": level})
    sigs = JobSignals(ts[0], ts[-1], 60, ts)
    sigs.signals = {"gr_engine_active": gr}
    ev = evaluate(_context(signals=sigs)).evaluation
    assert ev.gpu_util_mean is None  # GPU_UTIL itself stays unknown
    assert ev.idle_share == pytest.approx(0.5) and not ev.idle_share_exact
    assert "GR_ENGINE_ACTIVE" in ev.variants["idle"]
    assert ev.waste.lower_bound_per_day_usd == pytest.approx(192.0)


def test_evaluate_returns_the_mfu_series_to_archive() -> None:
    tps = np.array([1e4] * 30 + [np.nan] * 30)
    evaluated = evaluate(_context(tokens_per_second=tps, throughput_source="t"))
    mfu = evaluated.derived[DERIVED_MFU]
    # Per step: 4.2e10 × 1e4 / (8 × 989.5e12) = 5.306e-5; missing throughput stays missing.
    assert mfu[0] == pytest.approx(4.2e10 * 1e4 / (8 * 989.5e12))
    assert np.isnan(mfu[-1])


def test_unknown_gpu_model_is_stated_first() -> None:
    ev = evaluate(_context(gpu_known=False, gpu_name="NVIDIA X1", peak_flops_per_gpu=None)).evaluation
    assert ev.notes[0].startswith("unknown GPU model 'NVIDIA X1'")


def test_schema_round_trips_and_refuses_other_versions_and_garbage() -> None:
    ev = Evaluation(duration_s=10.0, gpu_hours=1.0, mfu=0.4, notes=["x"], variants={"mfu": "6N"})
    payload = encode(ev)
    assert payload["schema_version"] == SCHEMA_VERSION
    assert decode(payload) == ev
    assert decode({**payload, "schema_version": SCHEMA_VERSION + 1}) is None
    assert decode({**payload, "mfu": "high"}) is None
    assert decode(None) is None and decode({}) is None


def test_encode_makes_what_postgres_refuses_storable() -> None:
    # Postgres' jsonb refuses NaN/Infinity and NUL characters: they must not make the save fail.
    ev = Evaluation(duration_s=float("nan"), gpu_hours=float("inf"), notes=["a\x00b"])
    payload = encode(ev)
    assert payload["duration_s"] is None and payload["gpu_hours"] is None
    assert payload["notes"] == ["ab"]


def test_coverage_of_each_mean_is_kept_and_noted_below_90_percent() -> None:
    # 4 GPUs over 10 windows; in each window the samples cover 2.2 GPUs' worth (a pod missing 45 % of its
    # scrapes): coverage = (10 × 2.2) / (4 GPUs × 10 windows) = 0.55, which the page notes as "coverage 55 %".
    from jobs.metrics.sampling import coverage_note

    ts = T0.timestamp() + np.arange(1, 11) * 60.0
    util = SignalSeries(
        "gpu_util",
        "ratio",
        ts,
        {"mean": np.full(10, 0.27), "count": np.full(10, 4.0), "sampled": np.full(10, 2.2)},
    )
    sigs = JobSignals(ts[0], ts[-1], 60, ts)
    sigs.signals = {"gpu_util": util}
    ev = evaluate(_context(signals=sigs, timestamps=ts)).evaluation
    assert ev.coverage["gpu_util"] == pytest.approx(0.55)
    assert "sm_active" not in ev.coverage  # a missing signal has no coverage, not 0
    assert coverage_note(ev.coverage["gpu_util"]) == "coverage 55 %"
