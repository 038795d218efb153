"""Server-rendered pages. Login is required everywhere except /healthz (see efficiency.middleware)."""

from jobs.views.job import (
    job_artifact_reparse,
    job_artifact_upload,
    job_detail,
    job_figures,
    job_promote_baseline,
)
from jobs.views.pages import (
    baseline_list,
    baseline_retire,
    cluster_readiness,
    gpu_catalog,
    healthz,
    job_list,
    leaderboard,
    team_budget,
    team_detail,
    team_list,
)

__all__ = [
    "baseline_list",
    "baseline_retire",
    "cluster_readiness",
    "gpu_catalog",
    "healthz",
    "job_artifact_reparse",
    "job_artifact_upload",
    "job_detail",
    "job_figures",
    "job_list",
    "job_promote_baseline",
    "leaderboard",
    "team_budget",
    "team_detail",
    "team_list",
]
