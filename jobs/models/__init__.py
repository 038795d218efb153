"""Data model: teams, the GPU catalog and price book, jobs with their archived series, artifacts,
findings, baselines, API tokens, report and alert deliveries. One module per concern; every model is
importable from `jobs.models` (Django finds them here)."""

from jobs.models.artifacts import Artifact, ArtifactQuerySet
from jobs.models.catalog import GpuModel, PriceEntry
from jobs.models.identity import SsoIdentity
from jobs.models.jobs import Baseline, Finding, Job, JobSeries, ProgressSample, PromotionOverride
from jobs.models.notifications import (
    AlertDelivery,
    AlertIncident,
    AlertSubscription,
    IdlePolicy,
    PolicyAction,
    ReportDelivery,
)
from jobs.models.service import ServiceHeartbeat
from jobs.models.teams import ApiToken, Membership, Team

__all__ = [
    "AlertDelivery",
    "AlertIncident",
    "AlertSubscription",
    "ApiToken",
    "Artifact",
    "ArtifactQuerySet",
    "Baseline",
    "Finding",
    "GpuModel",
    "IdlePolicy",
    "Job",
    "JobSeries",
    "Membership",
    "PolicyAction",
    "PriceEntry",
    "ProgressSample",
    "PromotionOverride",
    "ReportDelivery",
    "ServiceHeartbeat",
    "SsoIdentity",
    "Team",
]
