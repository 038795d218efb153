"""`store(job, evaluation)`: the one writer of a job's evaluated numbers (columns and typed JSON)."""

from __future__ import annotations

from jobs.evaluation.schema import Evaluation, encode
from jobs.evaluation.sharing import refresh_neighbours_on_commit
from jobs.models import Job

#: Job columns that `store` writes (everything code filters, sorts or aggregates on).
COLUMNS = (
    "mfu", "hfu", "tokens_per_second", "gpu_util_mean", "sm_active_mean", "tensor_active_mean", "gpu_hours",
    "cost_usd", "cost_per_day_usd", "waste_per_day_usd", "waste_lower_bound_per_day_usd",
    "idle_waste_per_day_usd", "efficiency_waste_per_day_usd", "waste_unknown_reason", "flops_variant",
    "mfu_fallback", "util_coverage", "evaluation",
)  # fmt: skip


def store(job: Job, ev: Evaluation) -> None:
    """Copy the evaluation onto `job` (not saved: the caller saves inside its transaction)."""
    job.mfu, job.hfu, job.tokens_per_second = ev.mfu, ev.hfu, ev.tokens_per_second
    job.gpu_util_mean, job.sm_active_mean = ev.gpu_util_mean, ev.sm_active_mean
    job.tensor_active_mean, job.gpu_hours = ev.tensor_active_mean, ev.gpu_hours
    job.cost_usd, job.cost_per_day_usd = ev.cost_usd, ev.cost_per_day_usd
    job.waste_per_day_usd = ev.waste.total_per_day_usd
    job.waste_lower_bound_per_day_usd = ev.waste.lower_bound_per_day_usd
    job.idle_waste_per_day_usd = ev.waste.idle_per_day_usd
    job.efficiency_waste_per_day_usd = ev.waste.efficiency_per_day_usd
    job.waste_unknown_reason = ev.waste.unknown_reason[:300]
    job.flops_variant = ev.flops_variant[:200]
    job.mfu_fallback = ev.mfu_fallback
    job.util_coverage = ev.coverage.get("gpu_util")
    job.evaluation = encode(ev)
    # Sharing is symmetric: jobs on the same GPUs evaluated before this one appeared are re-evaluated.
    refresh_neighbours_on_commit(job, ev.sharing)
