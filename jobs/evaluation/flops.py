"""Training and serving FLOPs per token, MFU, HFU and the DCGM tensor-pipe cross-check.

Pure Python (no Django) so the management command, the API and the tests share one definition.
Definitions follow ``reference/formulas.md``:

- model FLOPs per token: 6N, plus the PaLM attention term 12·L·H·Q·T (optionally halved for causal masks);
  N is the non-embedding parameter count, for MoE the parameters ACTIVE per token;
- serving (inference) counts a forward pass only: 2N + 4·L·H·Q·C over the context C actually attended
  (`forward_flops_per_token`): the training formula reads ~3x too high on a serving job;
- hardware FLOPs per token (HFU) add what recomputation executes again;
- Megatron (Narayanan et al. 2021, eq. 3) per iteration, divided here by B·s to give a per-token figure.

Published tables disagree by which variant they use, so every estimate carries a ``variant`` string that
the pages show next to the number.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

if TYPE_CHECKING:
    import numpy as np

from jobs.evaluation.checks import non_negative as _non_negative
from jobs.evaluation.checks import positive as _positive

RecomputeMode = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")

# MFU far BELOW the tensor-pipe estimate: a factor of two is the size of the config mistakes we want to
# catch (FP8 vs BF16 peak, sparse vs dense datasheet peak, total vs active MoE parameters are each >= 2x),
# while honest jobs stay inside it: recomputation adds at most 4/3 tensor work MFU does not count, and the
# attention variants differ by well under 2x.
CROSS_CHECK_FACTOR = 2.0
# MFU ABOVE the estimate is impossible for correct inputs (the estimate is an upper bound), so any excess
# beyond sampling noise disagrees. 10 % relative covers the noise: PIPE_TENSOR_ACTIVE and SM clock are
# means of 15-60 s samples (reference/sampling.md) over windows that do not line up exactly with the
# throughput windows of MFU, and a clock change inside a sample is averaged, not tracked.
CROSS_CHECK_ABOVE_TOLERANCE = 0.10
# Below this level (2 % of peak) both numbers are dominated by noise and idle time; a ratio means nothing.
CROSS_CHECK_MIN_LEVEL = 0.02
# DCGM ratios are 0-1; a value above this is almost certainly a percentage passed by mistake.
_RATIO_INPUT_LIMIT = 1.05


@dataclass(frozen=True)
class FlopsEstimate:
    """FLOPs per token and the definition that produced them.

    ``kind`` is "model" (what MFU counts) or "hardware" (what HFU counts, recomputation included).
    """

    flops_per_token: float
    variant: str
    kind: Literal["model", "hardware"]
    parameter_flops_per_token: float
    attention_flops_per_token: float


@dataclass(frozen=True)
class Utilization:
    """MFU or HFU of a job: achieved FLOP/s over the peak FLOP/s of all its devices."""

    value: float
    kind: Literal["MFU", "HFU"]
    variant: str
    achieved_flops_per_s: float
    peak_flops_per_s: float

    @property
    def exceeds_peak(self) -> bool:
        """True when the value is above 1: physically impossible, so the inputs are wrong."""
        return self.value > 1.0


@dataclass(frozen=True)
class TensorEstimate:
    """Upper estimate of the tensor FLOP/s one device delivers, read from DCGM PIPE_TENSOR_ACTIVE."""

    flops_per_s: float
    fraction_of_peak: float
    clock_ratio: float
    variant: str


@dataclass(frozen=True)
class CrossCheck:
    """MFU compared with the tensor-pipe upper estimate (both as fractions of the same dense peak)."""

    mfu: float
    tensor_estimate: float
    ratio: float | None
    disagrees: bool
    direction: Literal["agree", "mfu_above_hardware", "mfu_far_below_hardware", "insufficient_signal"]
    explanation: str
    factor: float


# --------------------------------------------------------------------------------------------- validation


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be at least 1, got {value!r}")
    return int(value)


def _devices(value: object) -> int:
    return _count("devices", value)


def _ratio(name: str, value: object) -> float:
    number = _non_negative(name, value)
    if number > _RATIO_INPUT_LIMIT:
        raise ValueError(f"{name} must be a ratio between 0 and 1, got {value!r} (a percentage?)")
    # Rates computed from counters can overshoot 1 by a hair; that is not information.
    return min(number, 1.0)


def _attention_core(
    n_layers: object, n_heads: object, head_dim: object, seq_len: object, attention: bool
) -> float:
    """L·H·Q·T, or 0 when attention is not counted. Raises when the shape is needed but incomplete."""
    if not attention:
        return 0.0
    shape = {"n_layers": n_layers, "n_heads": n_heads, "head_dim": head_dim, "seq_len": seq_len}
    missing = [name for name, value in shape.items() if value is None]
    if missing:
        raise ValueError(
            f"the attention term needs n_layers, n_heads, head_dim and seq_len; missing {', '.join(missing)} "
            "(pass attention=False for the 6N variant)"
        )
    product = 1.0
    for name, value in shape.items():
        product *= _positive(name, value)
    return product


# Share of one forward pass repeated, as (weights part 2N, attention part 4LHQT, label).
_RECOMPUTE_EXTRA: dict[str, tuple[float, float, str]] = {
    "none": (0.0, 0.0, "no recomputation"),
    "selective": (0.0, 1.0, "selective recomputation: attention core recomputed"),
    "full": (1.0, 1.0, "full recomputation: one extra forward"),
}


def _attention_label(attention: bool, causal: bool) -> str:
    if not attention:
        return "attention not counted"
    if causal:
        return "PaLM attention with causal halving"
    return "PaLM, no causal halving"


def _fmt(value: float) -> str:
    return f"{value:g}"


# ------------------------------------------------------------------------------------- FLOPs per token


def moe_active_params(
    total_params: float, routed_expert_params: float, num_experts: int, top_k: int
) -> float:
    """Parameters used per token by a mixture-of-experts model (torchtitan's rule).

    ``routed_expert_params`` is the size of ALL routed experts together; each token visits ``top_k`` of
    ``num_experts``, while router, attention, dense and shared-expert weights are always used.
    """
    total = _positive("total_params", total_params)
    routed = _non_negative("routed_expert_params", routed_expert_params)
    if routed > total:
        raise ValueError(f"routed_expert_params ({routed:g}) cannot exceed total_params ({total:g})")
    experts = _count("num_experts", num_experts)
    k = _count("top_k", top_k)
    if k > experts:
        raise ValueError(f"top_k ({k}) cannot exceed num_experts ({experts})")
    return total - routed + routed * k / experts


def model_flops_per_token(
    n_params: float,
    *,
    n_layers: int | None = None,
    n_heads: int | None = None,
    head_dim: int | None = None,
    seq_len: int | None = None,
    attention: bool = True,
    causal: bool = False,
    moe: bool = False,
) -> FlopsEstimate:
    """Model FLOPs per training token (what MFU counts): 6N + 12·L·H·Q·T (PaLM appendix B).

    ``causal=True`` halves the attention term as Megatron-LM does for causal masks. ``moe=True`` only
    labels the variant: pass the ACTIVE parameter count (see :func:`moe_active_params`) as ``n_params``.
    """
    n = _positive("n_params", n_params)
    core = _attention_core(n_layers, n_heads, head_dim, seq_len, attention)
    attention_factor = 6.0 if causal else 12.0
    parameter_flops = 6.0 * n
    attention_flops = attention_factor * core
    formula = "6N" if not attention else f"6N+{attention_factor:g}LHQT"
    variant = f"{formula} ({_attention_label(attention, causal)})"
    if moe:
        variant += ", N = active parameters (MoE)"
    return FlopsEstimate(
        flops_per_token=parameter_flops + attention_flops,
        variant=variant,
        kind="model",
        parameter_flops_per_token=parameter_flops,
        attention_flops_per_token=attention_flops,
    )


def forward_flops_per_token(
    n_params: float,
    *,
    n_layers: int | None = None,
    n_heads: int | None = None,
    head_dim: int | None = None,
    context_len: float | None = None,
    attention: bool = True,
    context_note: str = "",
    moe: bool = False,
) -> FlopsEstimate:
    """Model FLOPs per token of a forward pass only (serving / inference): 2N + 4·L·H·Q·C.

    2N: one multiply-add per parameter per token (Kaplan et al. 2020, C_forward ~ 2N; the training 6N is
    this forward plus a backward of ~4N). Attention: per layer and token, QK^T and the weighted sum over V
    each take 2·H·Q·C FLOPs for C context tokens attended: 4·L·H·Q·C, the forward third of PaLM's
    12·L·H·Q·T. C is the context the tokens actually attend to (the mean over the served tokens: prompt
    plus generated so far for decode, about half the prompt for a causal prefill), not the model's
    maximum sequence length. ``context_note`` says where C came from.
    """
    n = _positive("n_params", n_params)
    if attention:
        core = _attention_core(n_layers, n_heads, head_dim, 1, True) * _positive("context_len", context_len)
    else:
        core = 0.0
    parameter_flops = 2.0 * n
    attention_flops = 4.0 * core
    formula = "2N+4LHQC" if attention else "2N"
    label = (
        f"forward only (serving), attention over {context_note or 'C context tokens'}"
        if attention
        else ("forward only (serving), attention not counted")
    )
    variant = f"{formula} ({label})"
    if moe:
        variant += ", N = active parameters (MoE)"
    return FlopsEstimate(
        flops_per_token=parameter_flops + attention_flops,
        variant=variant,
        kind="model",
        parameter_flops_per_token=parameter_flops,
        attention_flops_per_token=attention_flops,
    )


def hardware_flops_per_token(
    n_params: float,
    *,
    n_layers: int | None = None,
    n_heads: int | None = None,
    head_dim: int | None = None,
    seq_len: int | None = None,
    recompute: RecomputeMode | str | float = "none",  # any case/spacing of a mode; validated below
    attention: bool = True,
    causal: bool = False,
    moe: bool = False,
) -> FlopsEstimate:
    """FLOPs executed per training token (what HFU counts), recomputation included.

    ``recompute``: "none" (= model FLOPs), "selective" (the attention core's forward is run again:
    6N + 16LHQT), "full" (one more forward of everything: 8N + 16LHQT), or a fraction f in [0, 1] of the
    forward pass recomputed: 6N + 12LHQT + f·(2N + 4LHQT). With ``causal=True`` every attention term halves.
    """
    n = _positive("n_params", n_params)
    core = _attention_core(n_layers, n_heads, head_dim, seq_len, attention)
    half = 0.5 if causal else 1.0
    # One forward pass costs 2N for the weights and 4LHQT for attention; recomputation repeats part of it.
    named = isinstance(recompute, str)
    if isinstance(recompute, str):
        mode = recompute.strip().lower()
        if mode not in _RECOMPUTE_EXTRA:
            raise ValueError(f"recompute must be one of {RECOMPUTE_MODES} or a fraction, got {recompute!r}")
        extra_param, extra_attention, label = _RECOMPUTE_EXTRA[mode]
    else:
        fraction = _non_negative("recompute fraction", recompute)
        if fraction > 1.0:
            raise ValueError(f"recompute fraction must be between 0 and 1, got {recompute!r}")
        extra_param = extra_attention = fraction
        label = f"recompute fraction {_fmt(fraction)} of the forward pass"

    parameter_flops = (6.0 + 2.0 * extra_param) * n
    attention_flops = (12.0 + 4.0 * extra_attention) * half * core
    if named:
        formula = f"{_fmt(6.0 + 2.0 * extra_param)}N"
        if attention:
            formula += f"+{_fmt((12.0 + 4.0 * extra_attention) * half)}LHQT"
    elif attention:
        formula = f"6N+{_fmt(12.0 * half)}LHQT+{_fmt(extra_param)}·(2N+{_fmt(4.0 * half)}LHQT)"
    else:
        formula = f"6N+{_fmt(extra_param)}·2N"
    variant = f"{formula} (HFU, {label}; {_attention_label(attention, causal)})"
    if moe:
        variant += ", N = active parameters (MoE)"
    return FlopsEstimate(
        flops_per_token=parameter_flops + attention_flops,
        variant=variant,
        kind="hardware",
        parameter_flops_per_token=parameter_flops,
        attention_flops_per_token=attention_flops,
    )


# ---------------------------------------------------------------------------------------- MFU and HFU


_Rate = TypeVar("_Rate", float, "np.ndarray")


def utilisation(flops_per_token: float, tokens_per_s: _Rate, peak_flops_per_s: float) -> _Rate:
    """The one MFU / HFU formula (PaLM, Chowdhery et al. 2022, appendix B): achieved FLOP/s (FLOPs per
    token x tokens/s) over the dense peak FLOP/s of every device the job holds. With model FLOPs it is MFU,
    with executed FLOPs (recomputation included) HFU. A job's MFU (jobs.evaluation.kpis, over the tokens
    of its covered time, and per grid step as a series) and `manage.py mfu` (`mfu` below) both compute it
    here; MFU across jobs is jobs.evaluation.totals.weighted_mfu. Callers validate their inputs."""
    return flops_per_token * tokens_per_s / peak_flops_per_s


def _utilization(
    kind: Literal["MFU", "HFU"],
    flops_per_token: float | FlopsEstimate,
    tokens_per_s: float,
    devices: int,
    peak_flops_per_device: float,
) -> Utilization:
    if isinstance(flops_per_token, FlopsEstimate):
        expected = "model" if kind == "MFU" else "hardware"
        if flops_per_token.kind != expected:
            raise ValueError(
                f"{kind} needs {expected} FLOPs per token, got a {flops_per_token.kind} estimate "
                f"({flops_per_token.variant})"
            )
        fpt = flops_per_token.flops_per_token
        variant = flops_per_token.variant
    else:
        fpt = _positive("flops_per_token", flops_per_token)
        variant = "FLOPs per token given by the caller"
    rate = _non_negative("tokens_per_s", tokens_per_s)
    count = _devices(devices)
    peak = _positive("peak_flops_per_device", peak_flops_per_device)
    achieved = fpt * rate
    total_peak = count * peak
    return Utilization(
        value=utilisation(fpt, rate, total_peak),
        kind=kind,
        variant=variant,
        achieved_flops_per_s=achieved,
        peak_flops_per_s=total_peak,
    )


def mfu(
    flops_per_token: float | FlopsEstimate, tokens_per_s: float, devices: int, peak_flops_per_device: float
) -> Utilization:
    """Model FLOPs utilisation of one run, validated and labelled: FLOPs/token x tokens/s / (devices x dense
    peak FLOP/s per device), computed by `utilisation`, the formula the evaluation's MFU uses too
    (jobs.evaluation.kpis). `manage.py mfu` calls this; MFU across jobs is totals.weighted_mfu."""
    return _utilization("MFU", flops_per_token, tokens_per_s, devices, peak_flops_per_device)


def hfu(
    flops_per_token: float | FlopsEstimate, tokens_per_s: float, devices: int, peak_flops_per_device: float
) -> Utilization:
    """Hardware FLOPs utilisation: like :func:`mfu` but with executed FLOPs (recomputation included)."""
    return _utilization("HFU", flops_per_token, tokens_per_s, devices, peak_flops_per_device)


def tensor_flops_upper_estimate(
    tensor_active: float,
    dense_peak_flops: float,
    sm_clock_mhz: float | None = None,
    peak_clock_mhz: float | None = None,
) -> TensorEstimate:
    """Upper estimate of one device's tensor FLOP/s: tensor_active x dense peak x SM clock / peak clock.

    The dense peak assumes one SM clock (H100 SXM: 1830 MHz, reference/gpus.md), not the max boost clock; an
    SM clock below it scales the estimate down and one above it (H100s boost to 1980 MHz) up. Without both
    clocks the estimate is left uncorrected (and the variant says so).
    """
    active = _ratio("tensor_active", tensor_active)
    peak = _positive("dense_peak_flops", dense_peak_flops)
    if sm_clock_mhz is not None and peak_clock_mhz is not None:
        ratio = _non_negative("sm_clock_mhz", sm_clock_mhz) / _positive("peak_clock_mhz", peak_clock_mhz)
        variant = "tensor_active x dense peak x SM clock / peak clock"
    else:
        ratio = 1.0
        variant = "tensor_active x dense peak (no clock correction: SM clock or peak clock unknown)"
    fraction = active * ratio
    return TensorEstimate(
        flops_per_s=fraction * peak, fraction_of_peak=fraction, clock_ratio=ratio, variant=variant
    )


def cross_check_mfu(
    mfu_value: float | Utilization,
    tensor_active: float,
    sm_clock_mhz: float | None = None,
    peak_clock_mhz: float | None = None,
    *,
    factor: float = CROSS_CHECK_FACTOR,
    above_tolerance: float = CROSS_CHECK_ABOVE_TOLERANCE,
) -> CrossCheck:
    """Compare MFU with the tensor-pipe upper estimate (tensor_active x SM clock / peak clock, as a fraction
    of the dense peak; the peak itself cancels).

    The estimate is an upper bound on the tensor FLOPs done, and the FLOPs MFU counts are matmuls that run
    on the tensor pipes, so MFU above it is impossible for correct inputs: beyond ``above_tolerance``
    (relative) it "disagrees" with direction ``mfu_above_hardware`` — the model shape (n_params, layers,
    seq_len) or the dtype is wrong. MFU more than ``factor`` times below the estimate also disagrees
    (``mfu_far_below_hardware``): the tensor pipes do work MFU does not count, or the peak is too high.

    What the estimate cannot see: FLOPs on non-tensor pipes (an FP32 model without TF32 can legitimately
    exceed it: its matmuls never touch the tensor cores), 2:4 sparsity (a sparse kernel does twice the
    nominal FLOPs per tensor cycle) and the resolution of PIPE_TENSOR_ACTIVE (a DCGM average over its watch
    interval, collected every 1-30 s and scraped every 15-60 s, reference/sampling.md) — a job whose
    throughput and tensor samples cover slightly different windows can sit a few per cent above it.
    """
    value = mfu_value.value if isinstance(mfu_value, Utilization) else _non_negative("mfu", mfu_value)
    limit = _positive("factor", factor)
    if limit < 1.0:
        raise ValueError(f"factor must be at least 1, got {factor!r}")
    tolerance = _non_negative("above_tolerance", above_tolerance)
    estimate = tensor_flops_upper_estimate(tensor_active, 1.0, sm_clock_mhz, peak_clock_mhz).fraction_of_peak
    if value < CROSS_CHECK_MIN_LEVEL and estimate < CROSS_CHECK_MIN_LEVEL:
        return CrossCheck(
            mfu=value,
            tensor_estimate=estimate,
            ratio=None,
            disagrees=False,
            direction="insufficient_signal",
            explanation="MFU and tensor activity are both near zero; nothing to compare",
            factor=limit,
        )
    ratio = value / estimate if estimate > 0 else math.inf
    if ratio > 1.0 + tolerance:
        direction: Literal["agree", "mfu_above_hardware", "mfu_far_below_hardware"] = "mfu_above_hardware"
        explanation = (
            f"MFU {value:.1%} is above the tensor-pipe upper estimate {estimate:.1%}. MFU exceeds what the "
            "tensor pipes could deliver: check the model shape (n_params, layers, seq_len) or dtype "
            "(total vs active parameters for MoE, the dtype's peak)"
        )
    elif ratio < 1.0 / limit:
        direction = "mfu_far_below_hardware"
        explanation = (
            f"MFU {value:.1%} is far below the tensor-pipe estimate {estimate:.1%}: the tensor cores do work "
            "MFU does not count (recomputation, padding, understated parameters) or the configured peak is "
            "too high for the dtype actually used"
        )
    else:
        direction = "agree"
        explanation = f"MFU {value:.1%} is consistent with the tensor-pipe upper estimate {estimate:.1%}"
    return CrossCheck(
        mfu=value,
        tensor_estimate=estimate,
        ratio=None if math.isinf(ratio) else ratio,
        disagrees=direction != "agree",
        direction=direction,
        explanation=explanation,
        factor=limit,
    )
