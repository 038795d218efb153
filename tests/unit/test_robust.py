"""Robust baseline statistics, the regression band and the config fingerprint (jobs/evaluation/robust.py)."""

from __future__ import annotations

import math

import pytest

from jobs.evaluation import robust


def test_median_odd_and_even() -> None:
    assert robust.median([3.0, 1.0, 2.0]) == 2.0
    assert robust.median([4.0, 1.0, 2.0, 3.0]) == 2.5


def test_mad_is_scaled_by_1_4826() -> None:
    # deviations from median 3: 2,1,0,1,2 -> median 1
    assert robust.mad([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(1.4826)
    assert robust.mad([1.0, 2.0, 3.0, 4.0, 5.0], scale=1.0) == pytest.approx(1.0)


def test_iqr_matches_linear_interpolation_quartiles() -> None:
    # numpy.percentile([1..8], [25, 75]) = 2.75, 6.25
    assert robust.iqr([1, 2, 3, 4, 5, 6, 7, 8]) == pytest.approx(3.5)


def test_statistics_ignore_nan_and_none() -> None:
    values = [0.40, None, math.nan, 0.42, 0.41]
    assert robust.median(values) == pytest.approx(0.41)
    summary = robust.summarize(values)
    assert summary.n == 3
    assert summary.min == pytest.approx(0.40) and summary.max == pytest.approx(0.42)
    assert summary.mad == pytest.approx(0.01 * 1.4826)


def test_summary_of_only_missing_values_is_empty_not_zero() -> None:
    summary = robust.summarize([None, math.nan])
    assert summary.n == 0 and summary.median is None and summary.mad is None and summary.spread is None
    assert robust.median([]) is None


def test_median_and_mad_resist_one_bad_run() -> None:
    summary = robust.summarize([0.41, 0.42, 0.40, 0.41, 0.05])
    assert summary.median == pytest.approx(0.41)
    assert summary.mad == pytest.approx(0.01 * 1.4826)


def test_statistics_reject_non_numbers_and_infinity() -> None:
    with pytest.raises(ValueError):
        robust.summarize(["0.4"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="finite"):
        robust.median([math.inf])


def test_regression_reports_percent_and_robust_z() -> None:
    baseline = robust.summarize([0.40, 0.41, 0.42, 0.41, 0.40, 0.42])
    check = robust.check_regression(0.30, baseline)
    assert check.deviation_pct == pytest.approx((0.30 - 0.41) / 0.41 * 100)
    assert check.robust_z == pytest.approx((0.30 - 0.41) / baseline.mad)
    assert check.outside_band and check.verdict == "regression"


def test_value_inside_band_is_within() -> None:
    baseline = robust.summarize([0.40, 0.41, 0.42])
    check = robust.check_regression(0.405, baseline)
    assert not check.outside_band and check.verdict == "within"
    assert check.band_low < 0.405 < check.band_high


def test_single_run_baseline_uses_percentage_floor_not_zero_spread() -> None:
    baseline = robust.summarize([0.40])
    assert baseline.spread is None
    small_dip = robust.check_regression(0.39, baseline)  # 2.5 % below
    big_dip = robust.check_regression(0.36, baseline)  # 10 % below
    assert small_dip.robust_z is None and not small_dip.outside_band
    assert big_dip.verdict == "regression"
    assert small_dip.band_low == pytest.approx(0.40 * (1 - robust.BAND_MIN_PCT / 100))


def test_lower_is_better_metric_flags_slower_step_time() -> None:
    baseline = robust.summarize([1.00, 1.02, 0.98, 1.01])
    slower = robust.check_regression(1.30, baseline, higher_is_better=False)
    faster = robust.check_regression(0.70, baseline, higher_is_better=False)
    assert slower.verdict == "regression" and faster.verdict == "improvement"


def test_iqr_used_as_spread_when_mad_is_zero() -> None:
    baseline = robust.summarize([1.0, 1.0, 1.0, 2.0, 3.0])
    assert baseline.mad == 0.0
    assert baseline.spread == pytest.approx(baseline.iqr / robust.IQR_TO_SIGMA)


def test_regression_rejects_empty_baseline_and_missing_value() -> None:
    with pytest.raises(ValueError, match="no values"):
        robust.check_regression(0.3, robust.summarize([]))
    with pytest.raises(ValueError, match="finite"):
        robust.check_regression(math.nan, robust.summarize([0.4]))


BASE_CONFIG = {
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "gpu_count": 64,
    "dtype": "bf16",
    "tp": 2,
    "pp": 4,
    "dp": 8,
    "ep": 1,
    "micro_batch": 1,
    "global_batch": 512,
    "seq_len": 4096,
    "recompute": "selective",
}


def test_fingerprint_is_stable_short_hex() -> None:
    first = robust.config_fingerprint("llama-3-70b", BASE_CONFIG)
    assert first == robust.config_fingerprint("llama-3-70b", dict(BASE_CONFIG))
    assert len(first) == robust.FINGERPRINT_LENGTH
    int(first, 16)


def test_fingerprint_ignores_key_order() -> None:
    reordered = dict(reversed(list(BASE_CONFIG.items())))
    assert robust.config_fingerprint("llama-3-70b", reordered) == robust.config_fingerprint(
        "llama-3-70b", BASE_CONFIG
    )


def test_fingerprint_normalises_aliases() -> None:
    aliased = {
        "gpu": "H100 SXM",
        "num_gpus": "64",
        "precision": "torch.bfloat16",
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 4,
        "micro_batch_size": 1,
        "global_batch_size": 512,
        "seq_length": 4096,
        "recompute_granularity": "Selective",
        "learning_rate": 3e-4,  # not part of the fingerprint
    }
    assert robust.config_fingerprint(" Llama-3-70B ", aliased) == robust.config_fingerprint(
        "llama-3-70b", BASE_CONFIG
    )


@pytest.mark.parametrize(
    ("alias", "canonical"), [("bfloat16", "bf16"), ("half", "fp16"), ("float16", "fp16")]
)
def test_fingerprint_dtype_aliases(alias: str, canonical: str) -> None:
    assert robust.config_fingerprint("m", BASE_CONFIG, dtype=alias) == robust.config_fingerprint(
        "m", BASE_CONFIG, dtype=canonical
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpu_count", 128),
        ("dtype", "fp8"),
        ("tp", 4),
        ("micro_batch", 2),
        ("seq_len", 8192),
        ("recompute", "full"),
    ],
)
def test_fingerprint_changes_with_each_config_field(field: str, value: object) -> None:
    assert robust.config_fingerprint("m", BASE_CONFIG, **{field: value}) != robust.config_fingerprint(
        "m", BASE_CONFIG
    )


def test_fingerprint_changes_with_model_name() -> None:
    assert robust.config_fingerprint("a", BASE_CONFIG) != robust.config_fingerprint("b", BASE_CONFIG)


def test_fingerprint_defaults_parallelism_and_derives_dp() -> None:
    explicit = robust.canonical_config("m", gpu_count=8, tp=1, pp=1, dp=8, ep=1)
    implicit = robust.canonical_config("m", gpu_count=8)
    assert explicit == implicit
    assert implicit["dp"] == 8


def test_fingerprint_rejects_conflicting_aliases_and_bad_values() -> None:
    with pytest.raises(ValueError, match="conflicting"):
        robust.config_fingerprint("m", {"tp": 2, "tensor_model_parallel_size": 4})
    with pytest.raises(ValueError, match="positive whole number"):
        robust.config_fingerprint("m", {"tp": 0})
    with pytest.raises(ValueError, match="model_name"):
        robust.config_fingerprint("", BASE_CONFIG)
    with pytest.raises(ValueError, match="recompute"):
        robust.config_fingerprint("m", recompute="sometimes")
