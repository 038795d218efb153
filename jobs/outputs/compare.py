"""Compare two runs (A = "before", B = "after"): config diff, KPIs side by side with whether each change is
beyond run-to-run noise, findings diff and per-GPU summary (the trace diff: jobs.outputs.compare_traces).
Pure: no Django, no ORM, no settings.

Every number comes from what the evaluation stored (jobs.outputs.compare_data reads it); nothing here
defines MFU, cost or waste again. A change is always B − A (HTA's TraceDiff: test − control).

Significance ("beyond run-to-run noise") uses jobs.evaluation.robust: the noise σ is, in order,
1. the spread of the config's baseline over its runs (robust sd across healthy runs: run-to-run noise
   itself), when the baseline has at least two runs;
2. else the runs' own archived samples by batch means (`mean_noise`: the robust spread of the means of
   consecutive batches ÷ √batches, per run; σ = √(σ_A² + σ_B²)): how much each whole-run mean would
   move by chance within the run.
A change is beyond noise when it is outside robust.check_regression's band around A: more than BAND_Z σ
and more than BAND_MIN_PCT % of A.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from jobs.evaluation.costs import format_usd
from jobs.evaluation.robust import Summary, check_regression, summarize
from jobs.outputs.numbers import format_number

Direction = Literal["higher", "lower", "neutral"]

# ------------------------------------------------------------------------------------------ config diff

#: The fingerprint fields (jobs.evaluation.robust.canonical_config) in the order the page lists them.
CONFIG_FIELDS: tuple[tuple[str, str], ...] = (
    ("model", "Model"),
    ("gpu_model", "GPU model"),
    ("gpu_count", "GPUs"),
    ("dtype", "dtype"),
    ("tp", "Tensor parallel"),
    ("pp", "Pipeline parallel"),
    ("dp", "Data parallel"),
    ("ep", "Expert parallel"),
    ("micro_batch", "Micro-batch"),
    ("global_batch", "Global batch"),
    ("seq_len", "Sequence length"),
    ("recompute", "Recompute"),
)


@dataclass(frozen=True)
class RunFacts:
    """What the config diff needs of one run: its canonical config and the definitions behind its numbers."""

    external_id: str
    config: Mapping[str, object]
    config_error: str = ""
    kind: str = ""
    flops_variant: str = ""
    mfu_fallback: bool = False
    reference_mfu: float | None = None
    reference_source: str = ""
    price_note: str = ""


def _shown(value: object) -> str:
    return "unknown" if value is None or value == "" else str(value)


def config_diff(a: RunFacts, b: RunFacts) -> dict[str, Any]:
    """Field by field: A's and B's value and whether it changed; warnings when the runs are not like for
    like (different model, GPU model, dtype or MFU convention) and notes for what merely differs."""
    rows = []
    for key, label in CONFIG_FIELDS:
        va, vb = a.config.get(key), b.config.get(key)
        rows.append({"field": key, "label": label, "a": _shown(va), "b": _shown(vb), "changed": va != vb})
    rows.append(
        {
            "field": "kind",
            "label": "Kind",
            "a": _shown(a.kind),
            "b": _shown(b.kind),
            "changed": a.kind != b.kind,
        }
    )
    changed = [r["field"] for r in rows if r["changed"]]
    warnings: list[str] = []
    notes: list[str] = []
    for run in (a, b):
        if run.config_error:
            warnings.append(
                f"{run.external_id}: config unreadable ({run.config_error}); fields shown as unknown"
            )
    ca, cb = a.config, b.config
    unreadable = len(warnings)
    if ca.get("model") != cb.get("model"):
        warnings.append(
            f"different models ({_shown(ca.get('model'))} vs {_shown(cb.get('model'))}): MFU and tokens/s "
            "measure different work"
        )
    if ca.get("gpu_model") != cb.get("gpu_model"):
        warnings.append(
            f"different GPU models ({_shown(ca.get('gpu_model'))} vs {_shown(cb.get('gpu_model'))}): each "
            "MFU is a share of its own GPU's dense peak; tokens/s per GPU and dollars are not like for like"
        )
    if ca.get("dtype") != cb.get("dtype"):
        warnings.append(
            f"different dtypes ({_shown(ca.get('dtype'))} vs {_shown(cb.get('dtype'))}): each MFU is a share "
            "of its dtype's dense peak (FP8's is twice BF16's on Hopper), and the reference MFU differs"
        )
    if a.flops_variant != b.flops_variant or a.mfu_fallback != b.mfu_fallback:
        warnings.append(
            f"MFU computed with different FLOPs conventions: {a.external_id}: {_shown(a.flops_variant)}"
            f"{' (fallback)' if a.mfu_fallback else ''}; {b.external_id}: {_shown(b.flops_variant)}"
            f"{' (fallback)' if b.mfu_fallback else ''}"
        )
    if ca.get("gpu_count") != cb.get("gpu_count"):
        notes.append(
            "different GPU counts: compare the per-GPU figures; totals (tokens/s, $/day) scale with the GPUs"
        )
    if a.reference_mfu != b.reference_mfu or a.reference_source != b.reference_source:
        notes.append(
            f"waste is measured against different reference MFUs: {a.external_id} {_ratio(a.reference_mfu)}"
            f" ({a.reference_source or 'unknown'}), {b.external_id} {_ratio(b.reference_mfu)}"
            f" ({b.reference_source or 'unknown'})"
        )
    if a.price_note != b.price_note:
        notes.append(
            f"prices differ: {a.external_id}: {_shown(a.price_note)}; {b.external_id}: {_shown(b.price_note)}"
        )
    return {
        "rows": rows,
        "changed": changed,
        "comparable": len(warnings) == unreadable,
        "warnings": warnings,
        "notes": notes,
    }


# ------------------------------------------------------------------------------------------ significance


@dataclass(frozen=True)
class Noise:
    """The run-to-run noise σ a change is judged against, and where it comes from (None: not assessable)."""

    sigma: float | None
    method: Literal["baseline", "samples", "none"]
    detail: str


def noise_from_baseline(summary: Summary | None, label: str = "the baseline") -> Noise | None:
    """σ = the baseline's robust spread over its runs (scaled MAD, else IQR/1.349; 0 when its runs agree);
    None when the baseline has fewer than two runs of this metric."""
    if summary is None or summary.n < 2 or summary.median is None:
        return None
    return Noise(summary.spread or 0.0, "baseline", f"spread of {label} over its {summary.n} runs")


#: Consecutive batches each run's samples are cut into for the noise of its mean (batch means).
BATCHES = 8


def _batches(values: list[float], k: int) -> list[list[float]]:
    bounds = [round(i * len(values) / k) for i in range(k + 1)]
    return [values[bounds[i] : bounds[i + 1]] for i in range(k)]


def mean_noise(values: Iterable[float | None]) -> tuple[float | None, int, int]:
    """The noise of a run's whole-run mean from its own samples, by batch means: the samples (in time
    order, missing ones dropped) are cut into k = min(BATCHES, n // 2) consecutive batches; the robust
    spread of the batch means (scaled MAD, else IQR/1.349, 0 when they agree) ÷ √k estimates the spread
    of the mean of all k (consecutive samples are correlated, so single samples' spread would not do).
    Returns (σ of the mean or None with fewer than 4 samples, n, k)."""
    xs = _finite_list(values)
    k = min(BATCHES, len(xs) // 2)
    if k < 2:
        return None, len(xs), k
    means = [sum(b) / len(b) for b in _batches(xs, k)]
    return (summarize(means).spread or 0.0) / math.sqrt(k), len(xs), k


def noise_from_samples(
    a: Iterable[float | None], b: Iterable[float | None], step_s: float | None = None
) -> Noise:
    """σ of B − A from the runs' own samples: √(σ_A² + σ_B²) with each σ from `mean_noise` (batch means).
    Needs at least four finite samples in each run."""
    (sa, na, ka), (sb, nb, kb) = mean_noise(a), mean_noise(b)
    if sa is None or sb is None:
        return Noise(None, "none", f"too few samples to judge noise ({na} and {nb})")
    every = f" every {step_s:g} s" if step_s else ""
    return Noise(
        math.hypot(sa, sb),
        "samples",
        f"batch means within the runs ({na} and {nb} samples{every}, {ka} and {kb} batches)",
    )


def _finite_list(values: Iterable[float | None]) -> list[float]:
    out = []
    for v in values:
        if v is not None and isinstance(v, int | float) and math.isfinite(v):
            out.append(float(v))
    return out


def significance(a: float | None, b: float | None, noise: Noise, direction: Direction) -> dict[str, Any]:
    """Whether B − A is beyond noise: outside robust.check_regression's band around A (half-width
    max(BAND_Z σ, BAND_MIN_PCT % of |A|)). Verdict: better / worse / changed (no preferred direction) /
    within noise / not assessed (no σ) / unknown (a value is unknown)."""
    base: dict[str, Any] = {
        "method": noise.method,
        "sigma": noise.sigma,
        "detail": noise.detail,
        "band_half_width": None,
        "robust_z": None,
        "beyond_noise": None,
    }
    if a is None or b is None:
        return base | {"verdict": "unknown"}
    if noise.sigma is None:
        return base | {"verdict": "not assessed"}
    summary = Summary(median=a, mad=noise.sigma, iqr=None, n=2, min=a, max=a)
    check = check_regression(b, summary, higher_is_better=direction != "lower")
    half = check.band_high - a
    if not check.outside_band:
        verdict = "within noise"
    elif direction == "neutral":
        verdict = "changed"
    else:
        verdict = "better" if check.verdict == "improvement" else "worse"
    return base | {
        "band_half_width": half,
        "robust_z": check.robust_z,
        "beyond_noise": check.outside_band,
        "verdict": verdict,
    }


# -------------------------------------------------------------------------------------------------- KPIs

Unit = Literal["ratio", "tokens/s", "ms", "W", "MHz", "B/s", "MiB", "usd/day", "usd", "kWh", "J/token", "h"]


@dataclass(frozen=True)
class Kpi:
    """One row of the KPI table: key, label, unit, which way is better, its definition, and whether a
    change can be judged against noise (dollars follow MFU and price: they are not measured)."""

    key: str
    label: str
    unit: Unit
    direction: Direction
    definition: str
    judged: bool = True
    #: An unjudged change's verdict and why it has no noise verdict (issue 28 item 6: energy is measured by
    #: DCGM's energy counters and GPU-hours are counted, "not judged"; only dollars are "not measured").
    unjudged: str = "not measured"
    unjudged_why: str = "computed from price, MFU and idle share, not sampled"


KPIS: tuple[Kpi, ...] = (
    Kpi("mfu", "MFU", "ratio", "higher", "model FLOPs utilisation, token-weighted over the run (evaluation)"),
    Kpi("hfu", "HFU", "ratio", "higher", "hardware FLOPs utilisation incl. recomputation (evaluation)"),
    Kpi(
        "tokens_per_second_per_gpu",
        "Tokens/s per GPU",
        "tokens/s",
        "higher",
        "whole-run tokens/s ÷ GPUs (as the baselines define it)",
    ),
    Kpi("step_time_ms", "Step time", "ms", "lower", "median ProfilerStep of the latest parsed trace"),
    Kpi("gpu_util", "nvidia-smi util", "ratio", "neutral", "GPU_UTIL time-mean (evaluation)"),
    Kpi("sm_active", "SM active", "ratio", "higher", "DCGM SM_ACTIVE time-mean (evaluation)"),
    Kpi(
        "tensor_active", "Tensor active", "ratio", "higher", "DCGM PIPE_TENSOR_ACTIVE time-mean (evaluation)"
    ),
    Kpi("dram_active", "DRAM active", "ratio", "neutral", "DCGM DRAM_ACTIVE, time-mean of the archived mean"),
    Kpi("pcie_bytes", "PCIe RX + TX", "B/s", "neutral", "DCGM PCIE_RX/TX_BYTES per GPU, time-mean"),
    Kpi(
        "nvlink_bytes",
        "NVLink RX + TX",
        "B/s",
        "neutral",
        "DCGM NVLINK_RX/TX_BYTES (else NVLINK_BANDWIDTH_TOTAL) per GPU, time-mean",
    ),
    Kpi("power_w", "Board power", "W", "neutral", "DCGM POWER_USAGE per GPU, time-mean"),
    Kpi("sm_clock_mhz", "SM clock", "MHz", "neutral", "DCGM SM_CLOCK, time-mean"),
    Kpi(
        "peak_memory_mib",
        "Peak memory",
        "MiB",
        "neutral",
        "highest frame buffer used on any GPU (evaluation)",
    ),
    Kpi("cost_per_day", "Cost", "usd/day", "lower", "GPUs × price per GPU-hour × 24 (evaluation)", False),
    Kpi(
        "waste_per_day",
        "Waste",
        "usd/day",
        "lower",
        "cost/day × max(idle share, 1 − MFU ÷ reference MFU) (evaluation)",
        False,
    ),
    Kpi(
        "idle_waste_per_day",
        "Waste: idle GPUs",
        "usd/day",
        "lower",
        "cost/day × share of GPU-time at ~0 % GPU_UTIL (needs no MFU)",
        False,
    ),
    Kpi(
        "efficiency_waste_per_day",
        "Waste: below reference MFU",
        "usd/day",
        "lower",
        "cost/day × max(0, 1 − MFU ÷ reference MFU) (needs MFU)",
        False,
    ),
    Kpi(
        "energy_kwh",
        "Energy",
        "kWh",
        "neutral",
        "DCGM energy counter or board power × GPUs (evaluation)",
        False,
        "not judged",
        "measured (DCGM energy counter, else board power over time) once per run: no spread to judge it by",
    ),
    Kpi(
        "energy_per_token_j",
        "Energy per token",
        "J/token",
        "lower",
        "the evaluation's energy ÷ (its tokens/s × duration)",
        False,
        "not judged",
        "the run's measured energy over its tokens: one value per run, no spread to judge a change against",
    ),
    Kpi("cost_usd", "Cost (total)", "usd", "neutral", "price book over the run's window (evaluation)", False),
    Kpi(
        "waste_usd",
        "Waste (total)",
        "usd",
        "lower",
        "share of the spend wasted × the total cost from the price book (costs.waste_of_cost)",
        False,
    ),
    Kpi(
        "gpu_hours",
        "GPU-hours",
        "h",
        "neutral",
        "GPUs × duration (evaluation)",
        False,
        "not judged",
        "GPUs × the run's window: counted, not sampled",
    ),
)
KPI_BY_KEY = {k.key: k for k in KPIS}


@dataclass(frozen=True)
class Value:
    """One run's value of a KPI: the number (None = unknown, with `reason`), and whether it is only a lower
    bound (waste without MFU: "at least")."""

    number: float | None
    reason: str = ""
    lower_bound: bool = False


def fmt(value: float | None, unit: Unit) -> str:
    """A value as the page prints it (the API sends the same text next to the number)."""
    if value is None:
        return "unknown"
    if unit == "ratio":
        return f"{value * 100:.1f} %"
    if unit == "usd/day":
        return f"{format_usd(value)}/day"
    if unit == "usd":
        return f"{format_usd(value)} total"
    if unit == "B/s":
        return f"{value / 1e9:,.2f} GB/s"
    if unit in ("tokens/s", "W", "MHz", "MiB"):
        return f"{value:,.0f} {unit}"
    if unit == "ms":
        return f"{value:,.1f} {unit}"
    return f"{format_number(value)} {unit}"


def fmt_delta(delta: float | None, unit: Unit) -> str:
    """A change with its sign; ratios change in percentage points."""
    if delta is None:
        return "unknown"
    sign = "+" if delta >= 0 else "\u2212"
    size = abs(delta)
    if unit == "ratio":
        return f"{sign}{size * 100:.1f} pts"
    if unit in ("usd/day", "usd"):
        return f"{sign}{format_usd(size)}{'/day' if unit == 'usd/day' else ' total'}"
    return sign + fmt(size, unit)


def _value_text(v: Value, unit: Unit) -> str:
    if v.number is None:
        return "unknown"
    return ("at least " if v.lower_bound else "") + fmt(v.number, unit)


def kpi_rows(
    a: Mapping[str, Value], b: Mapping[str, Value], noises: Mapping[str, Noise], kpis: Sequence[Kpi] = KPIS
) -> list[dict[str, Any]]:
    """Per KPI: A, B, B − A (absolute and % of A), and the significance of the change. A change is unknown
    when either value is unknown or only a lower bound (never computed against a 0)."""
    rows = []
    for k in kpis:
        va, vb = a.get(k.key, Value(None, "not available")), b.get(k.key, Value(None, "not available"))
        exact = va.number is not None and vb.number is not None and not (va.lower_bound or vb.lower_bound)
        delta = vb.number - va.number if exact else None  # type: ignore[operator]
        delta_pct = delta / abs(va.number) * 100 if delta is not None and va.number else None
        if not k.judged:
            sig: dict[str, Any] = {
                "verdict": k.unjudged,
                "method": "none",
                "beyond_noise": None,
                "detail": k.unjudged_why,
                "sigma": None,
                "band_half_width": None,
                "robust_z": None,
            }
        else:
            noise = noises.get(k.key, Noise(None, "none", "no samples archived"))
            sig = significance(va.number if exact else None, vb.number if exact else None, noise, k.direction)
        rows.append(
            {
                "key": k.key,
                "label": k.label,
                "unit": k.unit,
                "definition": k.definition,
                "direction": k.direction,
                "a": va.number,
                "b": vb.number,
                "a_lower_bound": va.lower_bound,
                "b_lower_bound": vb.lower_bound,
                "a_reason": va.reason if va.number is None or va.lower_bound else "",
                "b_reason": vb.reason if vb.number is None or vb.lower_bound else "",
                "a_text": _value_text(va, k.unit),
                "b_text": _value_text(vb, k.unit),
                "delta": delta,
                "delta_pct": delta_pct,
                "delta_text": fmt_delta(delta, k.unit),
                "significance": sig,
            }
        )
    return rows


# ------------------------------------------------------------------------------------------ findings diff


@dataclass(frozen=True)
class FindingFact:
    """A stored finding as the diff needs it; `usd_per_day` None = impact unknown (never 0)."""

    code: str
    title: str
    severity: str
    usd_per_day: float | None


def _usd_text(value: float | None) -> str:
    return "impact unknown" if value is None else f"{format_usd(value)}/day"


def findings_diff(a: Sequence[FindingFact], b: Sequence[FindingFact]) -> dict[str, Any]:
    """Findings by code: resolved (A only), new (B only), persisting (both), each with its $/day in A and B
    and the change (unknown when either side's impact is unknown), most dollars first; totals of the known
    dollars with how many were unknown."""
    by_a = {f.code: f for f in a}
    by_b = {f.code: f for f in b}

    def item(code: str) -> dict[str, Any]:
        fa, fb = by_a.get(code), by_b.get(code)
        ua = fa.usd_per_day if fa else None
        ub = fb.usd_per_day if fb else None
        delta = ub - ua if fa and fb and ua is not None and ub is not None else None
        shown = fb or fa
        assert shown is not None
        return {
            "code": code,
            "title": shown.title,
            "severity_a": fa.severity if fa else None,
            "severity_b": fb.severity if fb else None,
            "a_usd_per_day": ua,
            "b_usd_per_day": ub,
            "a_text": _usd_text(ua) if fa else "—",
            "b_text": _usd_text(ub) if fb else "—",
            "delta_usd_per_day": delta,
            "delta_text": fmt_delta(delta, "usd/day") if delta is not None else "",
        }

    def order(items: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
        return sorted(items, key=lambda i: (i[key] is None, -(i[key] or 0.0), i["code"]))

    resolved = order([item(c) for c in by_a if c not in by_b], "a_usd_per_day")
    new = order([item(c) for c in by_b if c not in by_a], "b_usd_per_day")
    persisting = order([item(c) for c in by_a if c in by_b], "b_usd_per_day")

    def total(items: list[dict[str, Any]], key: str) -> dict[str, Any]:
        known = [i[key] for i in items if i[key] is not None]
        unknown = sum(1 for i in items if i[key] is None)
        usd = sum(known) if known else (None if unknown else 0.0)
        return {"usd_per_day": usd, "unknown": unknown, "text": _total_text(usd, unknown)}

    return {
        "resolved": resolved,
        "new": new,
        "persisting": persisting,
        "totals": {
            "resolved": total(resolved, "a_usd_per_day"),
            "new": total(new, "b_usd_per_day"),
            "persisting_a": total(persisting, "a_usd_per_day"),
            "persisting_b": total(persisting, "b_usd_per_day"),
        },
    }


def _total_text(usd: float | None, unknown: int) -> str:
    if usd is None:
        return "impact unknown"
    text = f"{format_usd(usd)}/day"
    return f"{text} + {unknown} of unknown impact" if unknown else text


# ------------------------------------------------------------------------------------------ per-GPU


def per_gpu_summary(
    signal: str, gpus: Sequence[str], means: Sequence[float | None], stragglers: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """One run's per-GPU time-means of `signal` (ratio): median, lowest and highest GPU, their spread, and
    the straggler candidates (jobs.charts.gpu_outliers: below the peers' band)."""
    known = [(g, m) for g, m in zip(gpus, means, strict=True) if m is not None and math.isfinite(m)]
    if not known:
        return {"signal": signal, "gpus": len(gpus), "available": False}
    values = sorted(m for _, m in known)
    low = min(known, key=lambda p: p[1])
    high = max(known, key=lambda p: p[1])
    median = summarize(values).median
    return {
        "signal": signal,
        "gpus": len(gpus),
        "available": True,
        "median": median,
        "lowest": {"gpu": low[0], "mean": low[1]},
        "highest": {"gpu": high[0], "mean": high[1]},
        "spread": high[1] - low[1],
        "stragglers": [dict(s) for s in stragglers],
        "text": f"median {fmt(median, 'ratio')}, lowest {low[0]} {fmt(low[1], 'ratio')}, "
        f"spread {fmt(high[1] - low[1], 'ratio')}",
    }


def _ratio(value: float | None) -> str:
    return fmt(value, "ratio")
