"""The job summary: one JSON shape for the API, the `job_summary` command and the job page."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from jobs.diagnosis.engine import usd_or_unknown
from jobs.evaluation.baselines import compare
from jobs.evaluation.kpis import target_mfu
from jobs.models import Job
from jobs.outputs.roofline import job_roofline_data


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def job_summary(job: Job) -> dict[str, Any]:
    """Everything known about a job, with units in key names and the definition behind each number."""
    findings = list(job.findings.all())
    evaluated = job.evaluated
    artifacts = list(job.artifacts.all())
    return {
        "external_id": job.external_id,
        "name": job.name,
        "team": job.team.slug,
        "owner": job.owner,
        # Who vouches for the job's identity (jobs.access.ownership): only `scheduler` jobs may be cancelled.
        "registered_by": job.registered_by,
        "cluster": job.cluster,
        "status": job.status,
        "kind": job.kind,
        "model": {"name": job.model_name, **(job.model_config or {})},
        "dtype": job.dtype,
        "parallelism": job.parallelism,
        "micro_batch": job.micro_batch,
        "global_batch": job.global_batch,
        "recompute": job.recompute,
        "gpu_model": job.gpu_model.name if job.gpu_model else None,
        "gpu_model_reported": job.gpu_model_name,
        "gpu_model_known": job.gpu_model is not None,
        "gpu_count": job.gpu_count,
        "gpus": job.gpus,
        "selector": job.selector,
        "started_at": _iso(job.started_at),
        "ended_at": _iso(job.ended_at),
        "config_fingerprint": job.config_fingerprint,
        "ingestion": {
            "last_polled_at": _iso(job.last_polled_at),
            "data_until": _iso(job.data_until),
            "finalized_at": _iso(job.finalized_at),
            "stale": bool(job.ingest_error),
            "error": job.ingest_error or None,
            "missing_signals": job.missing_signals,
        },
        "metrics": {
            "mfu": job.mfu,
            "hfu": job.hfu,
            "tokens_per_second": job.tokens_per_second,
            "gpu_util_mean": job.gpu_util_mean,
            "sm_active_mean": job.sm_active_mean,
            "tensor_active_mean": job.tensor_active_mean,
            "gpu_hours": job.gpu_hours,
            "cost_usd": job.cost_usd,
            "cost_per_day_usd": job.cost_per_day_usd,
            # null when it cannot be computed (never 0); the lower bound and the reason say what is known.
            "waste_per_day_usd": job.waste_per_day_usd,
            "waste_lower_bound_per_day_usd": job.waste_lower_bound_per_day_usd,
            "idle_waste_per_day_usd": job.idle_waste_per_day_usd,
            "efficiency_waste_per_day_usd": job.efficiency_waste_per_day_usd,
            "waste_unknown_reason": job.waste_unknown_reason or None,
            "flops_variant": job.flops_variant or None,
            # Which MFU `mfu` is: "engine" (a serving engine's own FLOP counter) or "flops" (FLOPs per token
            # x tokens/s); the other one beside it (the forward-FLOPs cross-check, or why no engine MFU).
            "mfu_source": (evaluated.mfu_source or None) if evaluated is not None else None,
            "engine_mfu": evaluated.engine_mfu if evaluated is not None else None,
            "engine_mfu_reason": (evaluated.engine_mfu_reason or None) if evaluated is not None else None,
            "flops_mfu": evaluated.flops_mfu if evaluated is not None else None,
            "mfu_fallback": job.mfu_fallback,
            "mfu_convention": settings.MFU_FLOPS_CONVENTION,
            "target_mfu": target_mfu(job.dtype, settings.TARGET_MFU, settings.TARGET_MFU_FP8)[0],
            # Share of the job's window with samples, per signal (0-1); a mean below 0.9 rests on part of it.
            "coverage": dict(evaluated.coverage) if evaluated is not None else {},
            "details": job.evaluation or None,
        },
        "baseline": baseline_comparison(job),
        # The GPU roofline from DCGM activities (jobs.evaluation.roofline): unknowns null, with the reason.
        "roofline": job_roofline_data(job)["summary"],
        "findings": [
            {
                "code": f.code,
                "severity": f.severity,
                "confidence": f.confidence,
                "title": f.title,
                "window_start": _iso(f.window_start),
                "window_end": _iso(f.window_end),
                "windows": f.windows,
                "evidence": f.evidence,
                "recommendation": f.recommendation,
                "waste_per_day_usd": f.waste_per_day_usd,
                "missing_signals": f.missing_signals,
            }
            for f in sorted(findings, key=lambda f: (-usd_or_unknown(f.waste_per_day_usd), f.code))
        ],
        "artifacts": [
            {
                "id": a.pk,
                "kind": a.kind,
                "rank": a.rank,
                "name": a.original_name,
                "sha256": a.sha256,
                "size_bytes": a.size_bytes,
                "status": a.status,
                "error": a.error or None,
                "uploaded_at": _iso(a.uploaded_at),
                "run_check": a.run_check,
                "run_mismatches": list(a.run_mismatches),
                "confirmed_at": _iso(a.confirmed_at),
                "excluded_at": _iso(a.excluded_at),
                "used_in_diagnosis": a.used_in_diagnosis,
            }
            for a in artifacts
        ],
    }


def baseline_comparison(job: Job) -> dict[str, Any] | None:
    """The job against its config's active baseline: per metric, deviation in % and in robust spreads."""
    comparison = compare(job)
    if comparison is None:
        return None
    return {
        "id": comparison.baseline.pk,
        "fingerprint": comparison.baseline.fingerprint,
        "runs": sorted(run.external_id for run in comparison.baseline.runs.all()),
        "metrics": [
            {
                "metric": row.metric.key,
                "unit": row.metric.unit,
                "value": row.value,
                "baseline_median": row.baseline.median if row.baseline else None,
                "deviation_pct": row.check.deviation_pct if row.check else None,
                "robust_z": row.check.robust_z if row.check else None,
                "verdict": row.verdict,
            }
            for row in comparison.rows
        ],
    }


def summary_queryset() -> Any:
    """Jobs with what job_summary reads, fetched in a fixed number of queries."""
    return Job.objects.select_related("team", "gpu_model").prefetch_related("findings", "artifacts")
