"""The job page's headline: the KPIs as display strings (the refresh endpoint sends the same), what each
means for this job, the utilisation verdict, and the signal readiness lines."""

from __future__ import annotations

from typing import Any

from django.utils.html import strip_tags

from jobs.evaluation.costs import format_usd
from jobs.evaluation.schema import encode
from jobs.metrics.engine_signals import ENGINE_SIGNALS, engine_readiness
from jobs.metrics.ingest import NO_GPUS_MATCHED
from jobs.metrics.sampling import coverage_note
from jobs.metrics.signals import SIGNALS, readiness
from jobs.models import Job
from jobs.outputs.numbers import format_number
from jobs.templatetags.units import job_cost_total, job_waste_total, money, num, pct, usd


def kpis(job: Job) -> dict[str, str]:
    """The headline numbers as display strings; the page prints each unit next to its number, the refresh
    endpoint sends the same strings so the script can update them in place."""
    details = evaluation_details(job)

    def plain(text: str) -> str:
        return strip_tags(text).strip()

    return {
        "mfu": plain(pct(job.mfu)),
        "hfu": plain(pct(job.hfu)),
        "tokens_per_second": plain(num(job.tokens_per_second, 0)),
        "gpu_util": plain(pct(job.gpu_util_mean, 0)),
        "sm_active": plain(pct(job.sm_active_mean, 0)),
        "tensor_active": plain(pct(job.tensor_active_mean, 0)),
        "cost_per_day": plain(usd(job.cost_per_day_usd)),
        "waste_per_day": _waste_headline(job),
        "gpu_hours": plain(num(job.gpu_hours, 0)),
        # One format with the compare page (1.84 kWh, not "2"): two runs of 1.8 and 2.4 kWh read as 2 and 2.
        "energy": format_number(details.get("energy_kwh")),
        "cost_total": plain(money(job_cost_total(job), "total")),
        "waste_total": plain(money(job_waste_total(job), "total")),
    }


def with_coverage(job: Job, key: str, definition: str) -> str:
    """The definition, plus "coverage 55 %" when the mean rests on less than 90 % of the job's GPU-time."""
    evaluated = job.evaluated
    note = coverage_note(evaluated.coverage.get(key)) if evaluated and key in evaluated.coverage else None
    return f"{definition}; {note} of the job's GPU-time has samples" if note else definition


def evaluation_details(job: Job) -> dict[str, Any]:
    """The stored evaluation decoded through its schema, as a dict for the template ({} before the first)."""
    evaluated = job.evaluated
    return encode(evaluated) if evaluated is not None else {}


def _waste_headline(job: Job) -> str:
    """'$1,234', 'at least $56' or 'unknown' (the definition line under it gives the reason)."""
    waste = job.waste_amount
    if waste.usd is None:
        return "unknown"
    value = format_usd(waste.usd)
    return f"at least {value}" if waste.lower_bound else value


def definitions(job: Job) -> dict[str, str]:
    """What each KPI means for this job: the MFU/HFU variant, throughput source, price and tier, waste
    reference (from the stored evaluation), with a generic fallback before the first evaluation."""
    details = evaluation_details(job)
    variants = details.get("variants") or {}
    return {
        "mfu": variants.get("mfu") or "model FLOPs per token × tokens/s ÷ (GPUs × dense peak FLOP/s)",
        "hfu": variants.get("hfu")
        or f"hardware FLOPs incl. recomputation ({job.get_recompute_display().lower()})",
        "throughput": variants.get("throughput") or "none yet: push progress or set a throughput query",
        "cost": details.get("price_note")
        or variants.get("cost")
        or "no price for this GPU model and tier in the price book",
        "waste": (variants.get("waste") or "cost/day × max(idle share, 1 − MFU ÷ reference MFU)")
        + (f"; total unknown: {job.waste_unknown_reason}" if job.waste_per_day_usd is None else ""),
        "energy": variants.get("energy") or "from DCGM energy counters or board power",
    }


def utilisation_verdict(job: Job) -> str:
    """One sentence contrasting nvidia-smi util with SM and tensor activity."""
    util, sm, tensor = job.gpu_util_mean, job.sm_active_mean, job.tensor_active_mean
    if util is None:
        return "No utilisation data yet."
    if sm is None:
        return (
            f"nvidia-smi reports {util * 100:.0f} % busy, but SM active is not collected, so busy cannot "
            "be told from saturated: enable DCGM_FI_PROF_SM_ACTIVE (see Signal readiness)."
        )
    tensor_text = f" and tensor cores {tensor * 100:.0f} % of cycles" if tensor is not None else ""
    if util >= 0.9 and sm < 0.5:
        return (
            f"nvidia-smi reports {util * 100:.0f} % busy, yet the SMs are active only {sm * 100:.0f} % of "
            f"cycles{tensor_text}: “busy” only means a kernel was running (false saturation)."
        )
    return (
        f"nvidia-smi reports {util * 100:.0f} % busy; SMs are active {sm * 100:.0f} % of cycles{tensor_text}."
    )


def no_gpus_matched(job: Job) -> str:
    """The ingestion's "selector matched 0 GPUs: ... PromQL" when no signal was found at all, else ''."""
    reasons = set((job.missing_reasons or {}).values())
    if len(reasons) == 1 and (reason := reasons.pop()).startswith(NO_GPUS_MATCHED):
        return str(reason)
    return ""


def signal_readiness(job: Job) -> dict[str, Any]:
    if job.last_polled_at is None:
        return {"polled": False, "missing": [], "present": []}
    missing_keys = set(job.missing_signals or [])
    reasons = job.missing_reasons or {}
    lines = readiness(k for k in SIGNALS if k not in missing_keys)
    if job.kind == Job.Kind.INFERENCE:  # a serving job also reads its engine's FLOP counters (#25)
        lines += engine_readiness(k for k in ENGINE_SIGNALS if k not in missing_keys)
    no_gpus = no_gpus_matched(job)
    if no_gpus:  # one ingestion error with the PromQL, not one "missing field" row per signal
        return {"polled": True, "missing": [], "present": [], "no_gpus": no_gpus}
    return {
        "polled": True,
        "missing": [(line, reasons.get(line.key, "")) for line in lines if not line.present],
        "present": [line for line in lines if line.present],
    }
