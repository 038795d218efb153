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

from jobs.diagnosis.thresholds import IDLE_UTIL_MAX as IDLE_THRESHOLD
from jobs.evaluation import costs
from jobs.evaluation.catalog import FP8, normalise_dtype
from jobs.evaluation.flops import (
    CrossCheck,
    FlopsEstimate,
    cross_check_mfu,
    forward_flops_per_token,
    hardware_flops_per_token,
    model_flops_per_token,
    utilisation,
)
from jobs.evaluation.totals import gpu_hours

#: The organisation-wide FLOPs conventions a setting can choose (MFU_FLOPS_CONVENTION).
FLOPS_CONVENTIONS = ("palm", "6n")
CONVENTION_LABELS = {"palm": "6N + 12·L·H·Q·T (PaLM, attention counted)", "6n": "6N (attention not counted)"}
#: GPU_UTIL at or below this is "idle" (same threshold as the idle_gpus rule: NVML's utilisation is the
#: share of its sample window with a kernel running, so ~0 means no kernel at all, not "slow kernels").
IDLE_UTIL_MAX = IDLE_THRESHOLD


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
    #: What the job does (jobs.models.Job.Kind): "inference" counts forward FLOPs only (serving).
    kind: str = "training"
    #: Serving: the mean context (tokens) each served token attends to; None = half of seq_len (a causal
    #: pass over full sequences), stated in the variant.
    context_len: float | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any], recompute: str, kind: str = "training") -> ModelShape:
        """From a job's stored model config dict and the job's kind (serving counts forward FLOPs only;
        its optional `context_len` is the mean context a served token attends to)."""

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
            kind=kind or "training",
            context_len=_float("context_len"),
        )

    @property
    def serving(self) -> bool:
        """The job serves requests: a forward pass per token, no backward."""
        return self.kind == "inference"

    def _context(self) -> tuple[float | None, str]:
        """The serving context C and where it came from."""
        if self.context_len:
            return float(self.context_len), f"C = {self.context_len:g} tokens (the job's context_len)"
        if self.seq_len:
            return (
                self.seq_len / 2.0,
                f"C = seq_len / 2 = {self.seq_len / 2.0:g} (assumed: causal, full sequences)",
            )
        return None, ""

    def _forward(self, attention: bool) -> FlopsEstimate | None:
        n = self.active_params or self.n_params
        if not n:
            return None
        context, note = self._context()
        use = (
            attention and context is not None and all(v for v in (self.n_layers, self.n_heads, self.head_dim))
        )
        return forward_flops_per_token(
            n,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            head_dim=self.head_dim,
            context_len=context if use else None,
            attention=use,
            context_note=note,
            moe=self.active_params is not None,
        )

    def _attention_known(self) -> bool:
        return all(v for v in (self.n_layers, self.n_heads, self.head_dim, self.seq_len))

    def model_flops(self, convention: str = "palm") -> tuple[FlopsEstimate | None, bool]:
        """Model FLOPs per token under the organisation's `convention`, and whether a fallback was used.

        "palm": 6N + 12·L·H·Q·T (PaLM appendix B, formulas.md); a shape without layers, heads, head dim and
        sequence length is computed as 6N and flagged as a fallback (MFU then reads ~2-10 % low for long
        sequences). "6n": 6N for every job (no fallback possible). None without a parameter count.
        """
        if convention not in FLOPS_CONVENTIONS:
            raise ValueError(f"unknown FLOPs convention {convention!r}; expected one of {FLOPS_CONVENTIONS}")
        n = self.active_params or self.n_params
        if not n:
            return None, False
        if self.serving:
            # Forward only: 2N (+ 4·L·H·Q·C under the attention-counting convention).
            forward = self._forward(convention == "palm")
            counted = forward is not None and forward.attention_flops_per_token > 0
            return forward, convention == "palm" and not counted
        attention = convention == "palm" and self._attention_known()
        estimate = model_flops_per_token(
            n,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            head_dim=self.head_dim,
            seq_len=self.seq_len,
            attention=attention,
            moe=self.active_params is not None,
        )
        return estimate, convention == "palm" and not attention

    def hardware_flops(self) -> FlopsEstimate | None:
        """FLOPs executed per token including recomputation (for HFU; serving executes the forward only)."""
        n = self.active_params or self.n_params
        if not n:
            return None
        if self.serving:
            return self._forward(True)
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
    waste: costs.Waste | None = None
    idle_share: float | None = None
    idle_share_exact: bool = False
    flops_fallback: bool = False
    mfu_unknown_reason: str = ""
    reference_mfu: float | None = None
    reference_source: str = ""
    energy_kwh: float | None = None
    energy_cost_usd: float | None = None
    cross_check: CrossCheck | None = None
    #: Which MFU `mfu` is: "engine" (a serving engine's own FLOP counter) or "flops" (FLOPs per token from
    #: the config x tokens/s); "" when MFU is unknown.
    mfu_source: str = ""
    #: The serving engine's own MFU (its FLOP/s per GPU over the GPU's dense peak); None with
    #: `engine_mfu_reason` when the engine exports no FLOP counter for the job (never 0).
    engine_mfu: float | None = None
    engine_mfu_reason: str = ""
    engine_flops_per_gpu: float | None = None
    #: Our forward-FLOPs MFU, kept beside the engine's as a cross-check when the engine's is shown.
    flops_mfu: float | None = None
    variants: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def waste_per_day_usd(self) -> float | None:
        """Total waste per day; None when it cannot be computed (see `waste.reason`)."""
        return self.waste.total_per_day if self.waste is not None else None


def time_mean(values: np.ndarray | None) -> float | None:
    """Mean over time ignoring missing samples; None when there is no sample at all."""
    if values is None or values.size == 0 or np.isnan(values).all():
        return None
    return float(np.nanmean(values))


def target_mfu(dtype: str, target: float, fp8_target: float) -> tuple[float, str]:
    """The organisation's reference MFU for a job of `dtype` and where it comes from.

    MFU is a fraction of the dense peak *for the job's dtype*; FP8's peak is twice BF16's on Hopper, so an
    FP8 job with the same kernels' efficiency reads about half the MFU and needs its own target.
    """
    if normalise_dtype(dtype) == FP8:
        return fp8_target, "organisation target for FP8 (of the FP8 dense peak)"
    return target, "organisation target"


def idle_share_per_gpu(util: np.ndarray) -> float | None:
    """Share of the observed GPU samples (GPUs × time, missing cells excluded) at ~0 % utilisation.

    Each cell of the per-GPU matrix is one GPU over one grid step; a missing cell is neither idle nor busy,
    so the share is over observed cells only and can never exceed 100 %.
    """
    observed = np.isfinite(util)
    n = int(observed.sum())
    if n == 0:
        return None
    share = float((util[observed] <= IDLE_UTIL_MAX).sum()) / n
    assert 0.0 <= share <= 1.0
    return share


def idle_share_lower_bound(
    mean: np.ndarray, minimum: np.ndarray | None, maximum: np.ndarray | None, gpu_count: int
) -> float | None:
    """A lower bound on the idle share from cross-GPU statistics when per-GPU rows are not at hand.

    At each observed step with c = `gpu_count` GPUs: all are idle when the max is ≤ the threshold θ; at
    least one when the min is; and since a busy GPU reads > θ, c·mean > (c − k)·θ gives k > c·(1 − mean/θ).
    The bound is exact when all or none of the GPUs are idle, and low when only some are (one idle node of
    four shows as at least one idle GPU): it is shown as "at least".
    """
    observed = np.isfinite(mean)
    if not observed.any() or gpu_count < 1:
        return None
    c = float(gpu_count)
    theta = IDLE_UTIL_MAX
    k = np.clip(np.ceil(c * (1.0 - mean[observed] / theta) - 1e-9), 0.0, c)
    if minimum is not None:
        lo = minimum[observed]
        k = np.where(np.isfinite(lo) & (lo <= theta), np.maximum(k, 1.0), k)
    if maximum is not None:
        hi = maximum[observed]
        k = np.where(np.isfinite(hi) & (hi <= theta), c, k)
    return float(k.sum() / (c * observed.sum()))


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
    gpu_util_per_gpu: np.ndarray | None = None,
    gpu_util_min: np.ndarray | None = None,
    gpu_util_max: np.ndarray | None = None,
    idle_mean: np.ndarray | None = None,
    idle_signal: str = "GPU_UTIL",
    flops_convention: str = "palm",
    gpu_equivalents: float | None = None,
    peak_equivalents: float | None = None,
    engine_flops_per_gpu: np.ndarray | None = None,
    engine_missing_reason: str = "",
) -> Kpis:
    """All of a job's summary numbers over [start, end]; see reference/formulas.md for the definitions.

    Shared GPUs (jobs.evaluation.sharing): `gpu_equivalents` is what the job is charged for (GPUs x its share
    of their time; a MIG slice's compute slices / 7), used for GPU-hours, cost, energy and so waste;
    `peak_equivalents` is how many whole-GPU dense peaks it could reach (MFU's capacity; a MIG slice's SMs
    / the GPU's SMs). Both default to `gpu_count` (the job's GPUs were its own).

    Idle share: from `gpu_util_per_gpu` (exact) or the cross-GPU mean/min/max (a lower bound) of the signal
    named by `idle_signal`: GPU_UTIL, or GR_ENGINE_ACTIVE where a MIG instance has no GPU_UTIL; `idle_mean`
    is that signal's mean when it is not `gpu_util` (which stays the GPU_UTIL KPI).

    Serving jobs (`shape.serving`): `engine_flops_per_gpu` is the serving engine's own FLOP/s per GPU on
    the grid (vLLM/SGLang `estimated_flops_per_gpu_total`, rate()'d; jobs.metrics.engine_signals). When it
    has samples, its MFU is the job's MFU (`mfu_source` "engine") and the forward-FLOPs MFU is kept in
    `flops_mfu` as the cross-check; without it the forward-FLOPs MFU stays and `engine_mfu_reason` says why
    the engine's is absent (`engine_missing_reason`, or "no engine FLOPs series").
    """
    duration = max((end - start).total_seconds(), 0.0)
    billed = float(gpu_count) if gpu_equivalents is None else max(float(gpu_equivalents), 0.0)
    peak_gpus = billed if peak_equivalents is None else max(float(peak_equivalents), 0.0)
    k = Kpis(duration_s=duration, gpu_hours=gpu_hours(billed, duration / costs.SECONDS_PER_HOUR))
    k.gpu_util_mean = time_mean(gpu_util)
    k.sm_active_mean = time_mean(sm_active)
    k.tensor_active_mean = time_mean(tensor_active)
    k.reference_mfu, k.reference_source = reference_mfu, reference_source

    _throughput_and_mfu(
        k, shape, peak_flops_per_gpu, peak_gpus, grid_step_s, tokens_per_second, throughput_source,
        flops_convention,
    )  # fmt: skip
    k.mfu_source = "flops" if k.mfu is not None else ""
    if shape.serving:
        share = peak_gpus / gpu_count if gpu_count > 0 else 1.0
        _engine_mfu(k, engine_flops_per_gpu, peak_flops_per_gpu, share, engine_missing_reason)
    if k.mfu is not None and abs(peak_gpus - gpu_count) > 1e-9:
        k.variants["mfu"] += (
            f"; against {peak_gpus:.3g} GPU peaks: this job's share of its {gpu_count} shared or MIG GPU(s)"
        )
    _cost(k, start, end, billed, prices, price_label, gpu_count)
    busy = idle_mean if idle_mean is not None else gpu_util
    if gpu_util_per_gpu is not None and np.isfinite(gpu_util_per_gpu).any():
        k.idle_share, k.idle_share_exact = idle_share_per_gpu(gpu_util_per_gpu), True
        k.variants["idle"] = f"share of observed GPU samples with {idle_signal} ≤ {IDLE_UTIL_MAX:.0%}"
    elif busy is not None:
        k.idle_share = idle_share_lower_bound(busy, gpu_util_min, gpu_util_max, gpu_count)
        if k.idle_share is not None:
            k.variants["idle"] = (
                f"lower bound from the cross-GPU mean/min/max of {idle_signal} (≤ {IDLE_UTIL_MAX:.0%} = idle)"
            )
    reason = k.mfu_unknown_reason or "MFU unknown"
    k.waste = costs.split_waste(
        k.cost_per_day_usd,
        mfu=k.mfu,
        reference_mfu=reference_mfu,
        idle_share=k.idle_share,
        mfu_missing_reason=f"MFU unknown ({reason})" if k.mfu is None else "",
    )
    if k.waste.known:
        k.variants["waste"] = (
            f"cost/day × max(idle share, 1 − MFU ÷ {reference_mfu:.1%} reference MFU ({reference_source}))"
        )
    elif k.waste.lower_bound_per_day is not None:
        k.variants["waste"] = "at least the idle part: cost/day × idle share (MFU unknown)"
    if k.cost_per_day_usd is not None and not k.waste.known:
        k.notes.append(f"waste/day unknown: {k.waste.reason}")
    if k.mfu is not None and k.tensor_active_mean is not None:
        clock = time_mean(sm_clock)
        k.cross_check = cross_check_mfu(k.mfu, k.tensor_active_mean, clock, peak_clock_mhz)
    # The energy counter and board power are the whole GPU's: a shared GPU's energy is split like its cost.
    share = billed / gpu_count if gpu_count > 0 else 1.0
    _energy(k, billed, energy_increase_j, power_w, power_times, usd_per_kwh, share)
    return k


def _mfu_unknown(k: Kpis, reason: str) -> None:
    k.mfu_unknown_reason = reason
    k.notes.append(reason)


def _throughput_and_mfu(
    k: Kpis,
    shape: ModelShape,
    peak: float | None,
    gpu_count: float,
    step_s: float,
    tps: np.ndarray | None,
    source: str,
    convention: str = "palm",
) -> None:
    if tps is None or tps.size == 0 or np.isnan(tps).all():
        # Without a series, `source` (when given) says why the job's own throughput source gave none.
        _mfu_unknown(
            k,
            f"no throughput: {source}"
            if tps is None and source
            else "no throughput: push progress (POST /api/v1/jobs/{id}/progress/), set a throughput PromQL "
            "expression, or upload a profiler trace with tokens per step",
        )
        return
    valid = ~np.isnan(tps)
    tokens = float(np.sum(tps[valid]) * step_s)
    covered_s = float(valid.sum() * step_s)
    k.tokens_per_second = tokens / covered_s if covered_s else None
    k.variants["throughput"] = source
    (model, k.flops_fallback), hardware = shape.model_flops(convention), shape.hardware_flops()
    if model is None:
        _mfu_unknown(k, "MFU needs the model's parameter count (model.n_params in the job registration)")
        return
    if peak is None:
        _mfu_unknown(k, "MFU needs the GPU's dense peak for the job's dtype: unknown GPU model or dtype")
        return
    capacity = gpu_count * peak
    # Token-weighted: total model FLOPs over total peak FLOPs in the covered time (the covered time's mean
    # tokens/s), not a mean of per-step ratios. The formula is flops.utilisation, the one MFU definition.
    rate = tokens / covered_s
    k.mfu = utilisation(model.flops_per_token, rate, capacity)
    k.mfu_series = utilisation(model.flops_per_token, tps, capacity)
    k.variants["mfu"] = f"MFU, {model.variant}"
    if k.flops_fallback and shape.serving:
        k.variants["mfu"] += " — fallback: the attention term needs n_layers, n_heads, head_dim and a context"
        k.notes.append(
            "serving MFU computed as 2N (no attention term): register n_layers, n_heads, head_dim (or "
            "hidden) and context_len (mean context per served token) or seq_len"
        )
    elif k.flops_fallback:
        k.variants["mfu"] += (
            " — fallback: the organisation's convention is 6N + 12·L·H·Q·T, but the job's shape"
            " lacks layers, heads, head dim or sequence length"
        )
        k.notes.append(
            "MFU computed as 6N (no attention term): register n_layers, n_heads, head_dim (or hidden) and "
            "seq_len for the organisation's 6N + 12·L·H·Q·T convention"
        )
    if hardware is not None:
        k.hfu = utilisation(hardware.flops_per_token, rate, capacity)
        k.variants["hfu"] = hardware.variant
    if k.mfu > 1.0:
        k.notes.append("MFU above 100 %: the parameter count, dtype or tokens are wrong")


#: How the MFU is labelled when the serving engine's own figure is the job's MFU.
ENGINE_MFU_CONVENTION = "engine-reported FLOPs (vLLM/SGLang estimated_flops_per_gpu_total)"


def engine_mfu(flops_per_s_per_gpu: float, peak_flops_per_gpu: float, share: float = 1.0) -> float:
    """A serving engine's MFU: its FLOP/s per GPU over the dense peak of the job's share of one GPU, by
    the one utilisation formula (flops.utilisation with 1 FLOP per "token" at the engine's FLOP/s)."""
    if not peak_flops_per_gpu > 0 or not share > 0:
        raise ValueError("engine MFU needs a positive dense peak and GPU share")
    return utilisation(1.0, flops_per_s_per_gpu, peak_flops_per_gpu * share)


def _engine_mfu(
    k: Kpis, flops: np.ndarray | None, peak: float | None, share: float, missing_reason: str
) -> None:
    """Use the serving engine's own MFU as the job's when its FLOP counter has samples, keeping the
    forward-FLOPs MFU beside it; otherwise leave the forward-FLOPs MFU and say why the engine's is absent."""
    mean = time_mean(flops)
    if mean is None:
        k.engine_mfu_reason = missing_reason or "no engine FLOPs series for this job in the window"
        return
    k.engine_flops_per_gpu = mean
    if peak is None:
        k.engine_mfu_reason = "the engine's FLOPs need the GPU's dense peak for the job's dtype"
        return
    assert flops is not None
    k.engine_mfu = engine_mfu(mean, peak, share)
    forward, forward_variant = k.mfu, k.variants.get("mfu", "") or k.mfu_unknown_reason
    k.flops_mfu = forward
    if forward is None and k.mfu_unknown_reason in k.notes:
        # The forward-FLOPs MFU's reason stays in `variants`, not as the job's MFU being unknown.
        k.notes.remove(k.mfu_unknown_reason)
    k.mfu, k.mfu_source, k.mfu_unknown_reason = k.engine_mfu, "engine", ""
    k.flops_fallback = False  # the shown MFU is the engine's; the forward estimate's fallback is in its text
    k.mfu_series = utilisation(1.0, flops, peak * share)
    k.variants["mfu"] = (
        f"MFU, {ENGINE_MFU_CONVENTION}: {mean / 1e12:.4g} TFLOP/s per GPU ÷ dense peak "
        f"{peak * share / 1e12:.4g} TFLOP/s"
    )
    k.variants["mfu_cross_check"] = (
        f"forward-FLOPs MFU {forward:.1%} ({forward_variant.removeprefix('MFU, ')})"
        if forward is not None
        else f"forward-FLOPs MFU unknown ({forward_variant or 'no throughput'})"
    )
    if forward is not None and forward > 0 and not 0.5 <= k.engine_mfu / forward <= 2.0:
        k.notes.append(
            f"the engine's MFU ({k.engine_mfu:.1%}) and the forward-FLOPs MFU ({forward:.1%}) differ by more "
            "than 2x: check the registered parameter count and context, or the engine's FLOP estimate"
        )


def _cost(
    k: Kpis,
    start: datetime,
    end: datetime,
    gpu_count: float,
    prices: list[tuple[datetime, float]],
    label: str,
    held: int | None = None,
) -> None:
    """Cost of `gpu_count` GPU equivalents (the job's share of `held` GPUs when they were shared)."""
    if not prices:
        k.notes.append(f"no price in the price book for {label}")
        return
    usable = sorted(prices)
    first = usable[0][0]
    if first > start:
        # The book starts after the job did: costs.book_cost charges the earliest known price for the
        # hours before it (the same rule as a period's cost, jobs.evaluation.totals); say so on the job.
        k.notes.append(f"the price book for {label} starts {first:%Y-%m-%d}; earlier hours use that price")
    if end > start:
        k.cost_usd = costs.book_cost(usable, start, end, gpu_count).usd
    current = max((p for p in usable if p[0] <= end), default=usable[0])
    k.cost_per_day_usd = costs.cost_per_day(gpu_count, current[1])
    if held is None or abs(gpu_count - held) < 1e-9:
        gpus = f"{held if held is not None else gpu_count:g} GPUs"
    else:
        gpus = f"{gpu_count:.2f} GPU equivalents (this job's share of {held} shared GPUs)"
    k.variants["cost"] = f"{gpus} × ${current[1]:.2f}/GPU-h ({label}) × 24 h"


def _energy(
    k: Kpis,
    gpu_count: float,
    increase_j: float | None,
    power_w: np.ndarray | None,
    power_times: np.ndarray | None,
    usd_per_kwh: float,
    share: float = 1.0,
) -> None:
    if increase_j is not None and math.isfinite(increase_j) and increase_j > 0:
        k.energy_kwh = increase_j / costs.J_PER_KWH * share
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
