"""A job's key numbers from its signals, throughput, config and price: pure computation, no Django.

Inputs are plain values and numpy arrays so the same code serves ingestion, the simulator's
evaluation and tests. Every number carries the definition it used (`variants`), and anything that
cannot be computed is None with a reason in `notes`: a missing signal is never a zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from jobs import costs
from jobs.flops import (
    CrossCheck,
    FlopsEstimate,
    cross_check_mfu,
    hardware_flops_per_token,
    model_flops_per_token,
)


@dataclass(frozen=True)
class ModelShape:
    """What FLOPs per token need from a job's config (None where the job did not say)."""

    n_params: float | None
    active_params: float | None = None
    n_layers: int | None = None
    n_heads: int | None = None
    head_dim: int | None = None
    seq_len: int | None = None
    recompute: str = "none"

    @classmethod
    def from_config(cls, config: dict[str, Any], recompute: str) -> ModelShape:
        """From a job's stored model config dict."""

        def _int(key: str) -> int | None:
            value = config.get(key)
            return int(value) if value else None

        def _float(key: str) -> float | None:
            value = config.get(key)
            return float(value) if value else None

        return cls(
            n_params=_float("n_params"),
            active_params=_float("active_params"),
            n_layers=_int("n_layers"),
            n_heads=_int("n_heads"),
            head_dim=_int("head_dim") or _head_dim(config),
            seq_len=_int("seq_len"),
            recompute=recompute or "none",
        )

    def _attention_known(self) -> bool:
        return all(v for v in (self.n_layers, self.n_heads, self.head_dim, self.seq_len))

    def model_flops(self) -> FlopsEstimate | None:
        """6N (+ 12·L·H·Q·T when the shape is known); None without a parameter count."""
        n = self.active_params or self.n_params
        if not n:
            return None
        return model_flops_per_token(
            n,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            head_dim=self.head_dim,
            seq_len=self.seq_len,
            attention=self._attention_known(),
            moe=self.active_params is not None,
        )

    def hardware_flops(self) -> FlopsEstimate | None:
        """FLOPs executed per token including recomputation (for HFU)."""
        n = self.active_params or self.n_params
        if not n:
            return None
        attention = self._attention_known()
        recompute = self.recompute if attention or self.recompute in ("none", "full") else "full"
        return hardware_flops_per_token(
            n,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            head_dim=self.head_dim,
            seq_len=self.seq_len,
            recompute=recompute,
            attention=attention,
            moe=self.active_params is not None,
        )


def _head_dim(config: dict[str, Any]) -> int | None:
    hidden, heads = config.get("hidden"), config.get("n_heads")
    return int(hidden) // int(heads) if hidden and heads else None


@dataclass
class Kpis:
    """A job's summary numbers; None means "cannot be computed" and `notes` says why."""

    duration_s: float
    gpu_hours: float
    mfu: float | None = None
    hfu: float | None = None
    tokens_per_second: float | None = None
    mfu_series: np.ndarray | None = None
    gpu_util_mean: float | None = None
    sm_active_mean: float | None = None
    tensor_active_mean: float | None = None
    cost_usd: float | None = None
    cost_per_day_usd: float | None = None
    waste_per_day_usd: float | None = None
    reference_mfu: float | None = None
    reference_source: str = ""
    energy_kwh: float | None = None
    energy_cost_usd: float | None = None
    cross_check: CrossCheck | None = None
    variants: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def details(self) -> dict[str, Any]:
        """JSON-safe details for Job.summary."""
        out: dict[str, Any] = {
            "duration_s": self.duration_s,
            "reference_mfu": self.reference_mfu,
            "reference_source": self.reference_source,
            "energy_kwh": self.energy_kwh,
            "energy_cost_usd": self.energy_cost_usd,
            "variants": self.variants,
            "notes": self.notes,
        }
        if self.cross_check is not None:
            cc = self.cross_check
            out["cross_check"] = {
                "tensor_upper_mfu": cc.tensor_estimate,
                "disagrees": cc.disagrees,
                "direction": cc.direction,
                "explanation": cc.explanation,
            }
        return out


def time_mean(values: np.ndarray | None) -> float | None:
    """Mean over time ignoring missing samples; None when there is no sample at all."""
    if values is None or values.size == 0 or np.isnan(values).all():
        return None
    return float(np.nanmean(values))


def tokens_per_second_from_progress(times: np.ndarray, tokens: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Throughput on `grid` from cumulative (time, tokens) progress points; NaN outside the pushed range.

    The rate between consecutive points is held over that interval; a counter that goes backwards
    (a restart from a checkpoint) starts a new interval instead of producing a negative rate.
    """
    out = np.full(grid.shape, np.nan)
    if len(times) < 2:
        return out
    order = np.argsort(times)
    t, k = np.asarray(times, float)[order], np.asarray(tokens, float)[order]
    dt, dk = np.diff(t), np.diff(k)
    rate = np.where((dt > 0) & (dk >= 0), dk / np.where(dt > 0, dt, 1), np.nan)
    idx = np.searchsorted(t, grid, side="right") - 1
    inside = (idx >= 0) & (idx < len(rate))
    out[inside] = rate[idx[inside]]
    return out


def compute_kpis(
    *,
    start: datetime,
    end: datetime,
    gpu_count: int,
    shape: ModelShape,
    peak_flops_per_gpu: float | None,
    peak_clock_mhz: float | None,
    grid_step_s: float,
    tokens_per_second: np.ndarray | None,
    throughput_source: str,
    gpu_util: np.ndarray | None,
    sm_active: np.ndarray | None,
    tensor_active: np.ndarray | None,
    sm_clock: np.ndarray | None,
    prices: list[tuple[datetime, float]],
    price_label: str,
    reference_mfu: float,
    reference_source: str,
    energy_increase_j: float | None = None,
    power_w: np.ndarray | None = None,
    power_times: np.ndarray | None = None,
    usd_per_kwh: float = 0.0,
) -> Kpis:
    """All of a job's summary numbers over [start, end]; see reference/formulas.md for the definitions."""
    duration = max((end - start).total_seconds(), 0.0)
    k = Kpis(duration_s=duration, gpu_hours=gpu_count * duration / 3600.0)
    k.gpu_util_mean = time_mean(gpu_util)
    k.sm_active_mean = time_mean(sm_active)
    k.tensor_active_mean = time_mean(tensor_active)
    k.reference_mfu, k.reference_source = reference_mfu, reference_source

    _throughput_and_mfu(
        k, shape, peak_flops_per_gpu, gpu_count, grid_step_s, tokens_per_second, throughput_source
    )
    _cost(k, start, end, gpu_count, prices, price_label)
    if k.cost_per_day_usd is not None and k.mfu is not None:
        k.waste_per_day_usd = costs.waste_per_day(k.cost_per_day_usd, k.mfu, reference_mfu)
        k.variants["waste"] = (
            f"cost/day × max(0, 1 − MFU ÷ {reference_mfu:.1%} reference MFU ({reference_source}))"
        )
    elif k.cost_per_day_usd is not None:
        k.notes.append("waste/day needs MFU, which needs throughput and the model's parameter count")
    if k.mfu is not None and k.tensor_active_mean is not None:
        clock = time_mean(sm_clock)
        k.cross_check = cross_check_mfu(k.mfu, k.tensor_active_mean, clock, peak_clock_mhz)
    _energy(k, gpu_count, energy_increase_j, power_w, power_times, usd_per_kwh)
    return k


def _throughput_and_mfu(
    k: Kpis,
    shape: ModelShape,
    peak: float | None,
    gpu_count: int,
    step_s: float,
    tps: np.ndarray | None,
    source: str,
) -> None:
    if tps is None or tps.size == 0 or np.isnan(tps).all():
        k.notes.append(
            "no throughput: push progress (POST /api/v1/jobs/{id}/progress/), set a throughput PromQL "
            "expression, or upload a profiler trace with tokens per step"
        )
        return
    valid = ~np.isnan(tps)
    tokens = float(np.sum(tps[valid]) * step_s)
    covered_s = float(valid.sum() * step_s)
    k.tokens_per_second = tokens / covered_s if covered_s else None
    k.variants["throughput"] = source
    model, hardware = shape.model_flops(), shape.hardware_flops()
    if model is None:
        k.notes.append("MFU needs the model's parameter count (model.n_params in the job registration)")
        return
    if peak is None:
        k.notes.append("MFU needs the GPU's dense peak for the job's dtype: unknown GPU model or dtype")
        return
    capacity = gpu_count * peak
    # Token-weighted: total model FLOPs over total peak FLOPs in the covered time, not a mean of ratios.
    k.mfu = model.flops_per_token * tokens / (capacity * covered_s)
    k.mfu_series = model.flops_per_token * tps / capacity
    k.variants["mfu"] = f"MFU, {model.variant}"
    if hardware is not None:
        k.hfu = hardware.flops_per_token * tokens / (capacity * covered_s)
        k.variants["hfu"] = hardware.variant
    if k.mfu > 1.0:
        k.notes.append("MFU above 100 %: the parameter count, dtype or tokens are wrong")


def _cost(
    k: Kpis, start: datetime, end: datetime, gpu_count: int, prices: list[tuple[datetime, float]], label: str
) -> None:
    if not prices:
        k.notes.append(f"no price in the price book for {label}")
        return
    usable = sorted(prices)
    if usable[0][0] > start:
        # The book starts after the job did: charge the earliest known price rather than nothing, and say so.
        k.notes.append(
            f"the price book for {label} starts {usable[0][0]:%Y-%m-%d}; earlier hours use that price"
        )
        usable[0] = (start, usable[0][1])
    if end > start:
        k.cost_usd = costs.window_cost(usable, start, end, gpu_count).usd
    current = max((p for p in usable if p[0] <= end), default=usable[0])
    k.cost_per_day_usd = costs.cost_per_day(gpu_count, current[1])
    k.variants["cost"] = f"{gpu_count} GPUs × ${current[1]:.2f}/GPU-h ({label}) × 24 h"


def _energy(
    k: Kpis,
    gpu_count: int,
    increase_j: float | None,
    power_w: np.ndarray | None,
    power_times: np.ndarray | None,
    usd_per_kwh: float,
) -> None:
    if increase_j is not None and math.isfinite(increase_j) and increase_j > 0:
        k.energy_kwh = increase_j / costs.J_PER_KWH
        k.variants["energy"] = "increase of DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION over the job"
    elif power_w is not None and power_times is not None and not np.isnan(power_w).all():
        estimate = costs.energy_kwh_from_power(
            [
                (float(t), None if math.isnan(w) else float(w))
                for t, w in zip(power_times, power_w, strict=True)
            ]
        )
        k.energy_kwh = estimate.kwh * gpu_count
        k.variants["energy"] = "integral of mean board power × GPUs (trapezoid, gaps not bridged)"
    if k.energy_kwh is not None and usd_per_kwh > 0:
        k.energy_cost_usd = costs.energy_cost(k.energy_kwh, usd_per_kwh)
