"""Robust statistics for baselines, the regression band, and the config fingerprint. Pure Python.

A baseline is a handful of healthy runs, often with one odd run among them (a slow node, a warm-up that
leaked into the window). Median and MAD ignore such a run where mean and standard deviation would not.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from jobs.evaluation.catalog import match_gpu_name, normalise_dtype

# MAD x 1.4826 estimates the standard deviation of normally distributed data.
MAD_SCALE = 1.4826
# IQR / 1.349 is the same estimate from the quartiles; used when MAD is 0 (more than half the values equal).
IQR_TO_SIGMA = 1.349
# Band rule: a value is outside the baseline band when it is more than BAND_Z robust standard deviations
# AND more than BAND_MIN_PCT percent away from the median. The percentage floor keeps a baseline of one run
# (spread 0) or of nearly identical runs from flagging ordinary run-to-run noise.
BAND_Z = 3.0
BAND_MIN_PCT = 5.0
FINGERPRINT_LENGTH = 16


@dataclass(frozen=True)
class Summary:
    """Robust summary of a metric over baseline runs; None fields when there are no usable values."""

    median: float | None
    mad: float | None
    iqr: float | None
    n: int
    min: float | None
    max: float | None

    @property
    def spread(self) -> float | None:
        """Robust standard deviation: scaled MAD, else IQR / 1.349, else None when both are 0 or unknown."""
        if self.mad:
            return self.mad
        if self.iqr:
            return self.iqr / IQR_TO_SIGMA
        return None


@dataclass(frozen=True)
class RegressionCheck:
    """How far a value is from its baseline, and whether it falls outside the band."""

    value: float
    median: float
    deviation_pct: float | None
    robust_z: float | None
    band_low: float
    band_high: float
    outside_band: bool
    verdict: Literal["regression", "improvement", "within"]


def _clean(values: Iterable[float | None]) -> list[float]:
    """Finite numbers only: None and NaN are missing values, not zeros."""
    cleaned: list[float] = []
    for value in values:
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"values must be numbers or None, got {value!r}")
        number = float(value)
        if math.isnan(number):
            continue
        if math.isinf(number):
            raise ValueError(f"values must be finite, got {value!r}")
        cleaned.append(number)
    return cleaned


def _median_sorted(ordered: list[float]) -> float:
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2.0


def _quantile_sorted(ordered: list[float], q: float) -> float:
    # Linear interpolation between order statistics (numpy's default, Hyndman-Fan type 7).
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: Iterable[float | None]) -> float | None:
    """Median of the finite values (None and NaN ignored); None when there are none."""
    cleaned = sorted(_clean(values))
    return _median_sorted(cleaned) if cleaned else None


def mad(values: Iterable[float | None], scale: float = MAD_SCALE) -> float | None:
    """Median absolute deviation x ``scale`` (1.4826: comparable to a standard deviation); None if empty."""
    cleaned = sorted(_clean(values))
    if not cleaned:
        return None
    centre = _median_sorted(cleaned)
    return scale * _median_sorted(sorted(abs(value - centre) for value in cleaned))


def iqr(values: Iterable[float | None]) -> float | None:
    """Interquartile range (Q3 - Q1, linear interpolation) of the finite values; None if empty."""
    cleaned = sorted(_clean(values))
    if not cleaned:
        return None
    return _quantile_sorted(cleaned, 0.75) - _quantile_sorted(cleaned, 0.25)


def summarize(values: Iterable[float | None]) -> Summary:
    """Median, scaled MAD, IQR, count, min and max of the finite values (None and NaN ignored)."""
    cleaned = _clean(values)
    if not cleaned:
        return Summary(median=None, mad=None, iqr=None, n=0, min=None, max=None)
    return Summary(
        median=median(cleaned),
        mad=mad(cleaned),
        iqr=iqr(cleaned),
        n=len(cleaned),
        min=min(cleaned),
        max=max(cleaned),
    )


def check_regression(
    value: float,
    baseline: Summary,
    *,
    higher_is_better: bool = True,
    band_z: float = BAND_Z,
    band_min_pct: float = BAND_MIN_PCT,
) -> RegressionCheck:
    """Compare ``value`` with a baseline summary; see BAND_Z / BAND_MIN_PCT for the band rule.

    ``deviation_pct`` is (value - median) / |median| x 100 (None when the median is 0); ``robust_z`` is
    (value - median) / spread (None when the baseline has no spread). For metrics where lower is better
    (step time), pass ``higher_is_better=False``.
    """
    cleaned = _clean([value])
    if not cleaned:
        raise ValueError(f"value must be a finite number, got {value!r}")
    number = cleaned[0]
    if baseline.median is None or baseline.n == 0:
        raise ValueError("the baseline has no values")
    if band_z < 0 or band_min_pct < 0:
        raise ValueError("band_z and band_min_pct must not be negative")
    centre = baseline.median
    spread = baseline.spread
    delta = number - centre
    deviation_pct = delta / abs(centre) * 100.0 if centre else None
    robust_z = delta / spread if spread else None
    half_width = max(band_z * (spread or 0.0), band_min_pct / 100.0 * abs(centre))
    low, high = centre - half_width, centre + half_width
    # With a zero-width band (one run at exactly 0) any difference is outside it.
    outside = number < low or number > high
    if not outside:
        verdict: Literal["regression", "improvement", "within"] = "within"
    elif (number < low) == higher_is_better:
        verdict = "regression"
    else:
        verdict = "improvement"
    return RegressionCheck(
        value=number,
        median=centre,
        deviation_pct=deviation_pct,
        robust_z=robust_z,
        band_low=low,
        band_high=high,
        outside_band=outside,
        verdict=verdict,
    )


# ----------------------------------------------------------------------------------- config fingerprint

# Accepted spellings of each fingerprint field (Megatron, torchtitan, Lightning, our own API).
_FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "gpu_model": ("gpu_model", "gpu", "gpu_name"),
    "gpu_count": ("gpu_count", "gpus", "n_gpus", "num_gpus", "world_size"),
    "dtype": ("dtype", "precision", "mixed_precision", "params_dtype"),
    "tp": ("tp", "tp_size", "tensor_parallel", "tensor_model_parallel_size", "tensor_parallel_degree"),
    "pp": ("pp", "pp_size", "pipeline_parallel", "pipeline_model_parallel_size", "pipeline_parallel_degree"),
    "dp": ("dp", "dp_size", "data_parallel", "data_parallel_size", "data_parallel_degree"),
    "ep": ("ep", "ep_size", "expert_parallel", "expert_model_parallel_size", "expert_parallel_degree"),
    "micro_batch": ("micro_batch", "micro_batch_size", "mbs", "local_batch_size"),
    "global_batch": ("global_batch", "global_batch_size", "gbs"),
    "seq_len": ("seq_len", "seq_length", "sequence_length", "max_seq_len", "max_seq_length"),
    "recompute": ("recompute", "recompute_granularity", "activation_checkpointing", "ac_mode"),
}
_INT_FIELDS = ("gpu_count", "tp", "pp", "dp", "ep", "micro_batch", "global_batch", "seq_len")
_RECOMPUTE_ALIASES = {
    "none": "none", "no": "none", "off": "none", "false": "none", "0": "none", "": "none",
    "selective": "selective", "sel": "selective",
    "full": "full", "true": "full", "on": "full", "yes": "full", "1": "full",
}  # fmt: skip


def _lookup(merged: Mapping[str, object], field_name: str) -> object:
    found = [(alias, merged[alias]) for alias in _FIELD_ALIASES[field_name] if alias in merged]
    values = {repr(value) for _, value in found if value is not None}
    if len(values) > 1:
        names = ", ".join(alias for alias, _ in found)
        raise ValueError(f"conflicting values for {field_name} ({names})")
    return next((value for _, value in found if value is not None), None)


def _whole(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    return value


def _recompute(value: object) -> str:
    if value is None or isinstance(value, bool):
        return "full" if value else "none"
    if isinstance(value, numbers.Real):
        fraction = float(value)
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"recompute fraction must be between 0 and 1, got {value!r}")
        return {0.0: "none", 1.0: "full"}.get(fraction, f"{fraction:g}")
    if isinstance(value, str):
        key = value.strip().lower()
        if key in _RECOMPUTE_ALIASES:
            return _RECOMPUTE_ALIASES[key]
        raise ValueError(f"unknown recompute setting {value!r} (none, selective, full or a fraction)")
    raise ValueError(f"unknown recompute setting {value!r}")


def _text(value: object) -> str:
    return re.sub(r"[\s_\-]+", " ", str(value).strip().lower())


def canonical_config(
    model_name: str, config: Mapping[str, object] | None = None, **fields: object
) -> dict[str, object]:
    """The normalised dict the fingerprint hashes (shown on the baselines page to explain a match).

    Only the fingerprint fields count; other keys are ignored so learning rate or run names do not split
    baselines. tp, pp and ep default to 1 (the frameworks' default); dp defaults to gpu_count / (tp x pp).
    """
    if not isinstance(model_name, str) or not model_name.strip():
        raise ValueError("model_name must be a non-empty string")
    merged: dict[str, object] = {**(config or {}), **fields}
    gpu = _lookup(merged, "gpu_model")
    spec = match_gpu_name(gpu) if isinstance(gpu, str) else None
    dtype = _lookup(merged, "dtype")
    canonical: dict[str, object] = {
        "model": _text(model_name),
        "gpu_model": spec.name if spec else (_text(gpu) if gpu is not None else None),
        # Lightning accepts precision=16 as an int, hence str() before the alias lookup.
        "dtype": None if dtype is None else (normalise_dtype(str(dtype)) or _text(dtype)),
        "recompute": _recompute(_lookup(merged, "recompute")),
    }
    for name in _INT_FIELDS:
        canonical[name] = _whole(name, _lookup(merged, name))
    for name in ("tp", "pp", "ep"):
        if canonical[name] is None:
            canonical[name] = 1
    count, tp, pp = canonical["gpu_count"], canonical["tp"], canonical["pp"]
    if (
        canonical["dp"] is None
        and isinstance(count, int)
        and isinstance(tp, int)
        and isinstance(pp, int)
        and count % (tp * pp) == 0
    ):
        canonical["dp"] = count // (tp * pp)
    return canonical


def config_fingerprint(model_name: str, config: Mapping[str, object] | None = None, **fields: object) -> str:
    """Short stable hex id of model + training config, the key that pairs a job with its baseline.

    Insensitive to key order and to spelling (dtype and GPU aliases, field aliases such as
    ``tensor_model_parallel_size``). Fields may come as a mapping, keywords, or both.
    """
    canonical = canonical_config(model_name, config, **fields)
    payload = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:FINGERPRINT_LENGTH]
