"""Diagnosis: findings from a job's signals, KPIs, baseline and artifact analyses (pure: no Django).

    from jobs.diagnosis import DiagnosisInput, diagnose
    findings = diagnose(DiagnosisInput(signals=sigs, gpu_count=8, mfu=0.21, ...))

One rule module per finding code in `rules/`, thresholds in `thresholds.py`, detectors (periodicity,
synchrony, robust z-scores, change points, idle gaps) in `detectors.py`; `engine.diagnose` runs the rules
and apportions the job's waste in dollars per day. Django glue lives in `jobs.pipeline.findings`.
"""

from jobs.diagnosis.base import (
    CODES,
    SYMPTOM_CODES,
    ArtifactAnalysis,
    DiagnosisInput,
    Evidence,
    Finding,
    Severity,
)
from jobs.diagnosis.engine import apportion, diagnose

__all__ = [
    "CODES",
    "SYMPTOM_CODES",
    "ArtifactAnalysis",
    "DiagnosisInput",
    "Evidence",
    "Finding",
    "Severity",
    "apportion",
    "diagnose",
]
