"""Django glue for the diagnosis: build a job's DiagnosisInput from the database and store its findings.

`run_diagnosis(job)` is called after each poll and finalize and after each artifact parse. Findings are
updated in place on (job, code) and codes no longer found are deleted, in one transaction that holds the
job's row lock, so concurrent runs (a poll and an artifact parse) serialise instead of racing.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs.diagnosis import ArtifactAnalysis, DiagnosisInput
from jobs.diagnosis import Finding as Diagnosis
from jobs.diagnosis.belonging import diagnose_checked
from jobs.diagnosis.features import PER_GPU_KEYS
from jobs.evaluation.baselines import active_baseline
from jobs.evaluation.load import DEFAULT_STEP_S, reference_mfu
from jobs.evaluation.monitoring_logs import with_monitoring_logs
from jobs.metrics.archive import load_for_evaluation
from jobs.metrics.signals import JobSignals, grid
from jobs.models import Artifact, Finding, Job

log = logging.getLogger(__name__)


def _step_time_ms(job: Job, artifacts: list[ArtifactAnalysis]) -> float | None:
    value = job.profiler_step_time_ms
    if value is not None and value > 0:
        return float(value)
    medians = sorted(
        median
        for art in artifacts
        for rank in art.trace.ranks
        if (median := rank.step_times.median_ms) is not None and median > 0
    )
    return medians[len(medians) // 2] if medians else None


def _with_logs(
    job: Job, signals: JobSignals | None, used: list[Artifact]
) -> tuple[JobSignals | None, float | None]:
    """The signals with the job's uploaded nvidia-smi logs where DCGM has none (as the evaluation reads
    them: jobs.evaluation.monitoring_logs), and the log's interval when GPU utilisation came from one.
    `used`: the job's artifacts used in diagnosis, already read (the logs are among them)."""
    end = min(job.ended_at or timezone.now(), timezone.now()).timestamp()
    if signals is not None:
        ts, step = signals.timestamps, float(signals.step)
    else:
        ts, step = grid(job.started_at.timestamp(), end, DEFAULT_STEP_S), float(DEFAULT_STEP_S)
    got = with_monitoring_logs(job, signals, ts, step, end, used=used)
    return got.signals, got.interval_s


def build_input(job: Job) -> DiagnosisInput:
    """Everything the rules read about `job`: archived signals, KPIs, active baseline, parsed artifacts."""
    return build_checked_input(job)[0]


def build_checked_input(job: Job) -> tuple[DiagnosisInput, list[ArtifactAnalysis]]:
    """`build_input` and the artifacts in it whose run check could verify nothing (no GPU, time, rank or
    host to compare; `jobs.diagnosis.belonging`) and that no user has confirmed."""
    artifacts: list[ArtifactAnalysis] = []
    unverified: list[ArtifactAnalysis] = []
    used = list(job.artifacts.used_in_diagnosis().order_by("uploaded_at", "pk"))
    for a in used:
        if not isinstance(a.analysis, dict) or not a.analysis:
            continue
        art = ArtifactAnalysis(kind=a.kind, analysis=a.analysis, name=a.original_name, rank=a.rank)
        artifacts.append(art)
        if a.run_check == Artifact.RunCheck.UNVERIFIABLE and a.confirmed_at is None:
            unverified.append(art)
    gpu = job.gpu_model
    baseline = active_baseline(job)
    # At the resolution the evaluation reads (archive.EVALUATION_MAX_POINTS: the tiers for a long job), so a
    # running job's re-diagnosis costs the same every 10 minutes instead of growing with its GPU-hours;
    # per-GPU rows only of the signals the rules read per GPU (features.PER_GPU_KEYS, #26 item 2).
    signals = load_for_evaluation(job, per_gpu=PER_GPU_KEYS)
    evaluated = job.evaluated
    # The coarser of the scrape interval and the archive's step is what a pattern must outlast to be seen.
    scrape = float(settings.PROMETHEUS_SCRAPE_INTERVAL_S)
    interval = max(scrape, float(signals.step)) if signals is not None else scrape
    signals, log_interval = _with_logs(job, signals, used)
    if log_interval is not None:  # utilisation from an uploaded nvidia-smi log: its own sampling interval
        interval = log_interval
    inp = DiagnosisInput(
        signals=signals,
        gpu_count=job.gpu_count,
        dtype=job.dtype,
        mfu=job.mfu,
        reference_mfu=reference_mfu(job),
        tokens_per_second=job.tokens_per_second,
        cost_per_day_usd=job.cost_per_day_usd,
        waste_per_day_usd=job.waste_per_day_usd,
        idle_waste_per_day_usd=job.idle_waste_per_day_usd,
        gpu_memory_mib=float(gpu.memory_mib) if gpu is not None and gpu.memory_mib else None,
        max_clock_mhz=float(gpu.max_clock_mhz) if gpu is not None and gpu.max_clock_mhz else None,
        tdp_w=gpu.tdp_w if gpu is not None else None,
        baseline=baseline.stats if baseline is not None and isinstance(baseline.stats, dict) else None,
        artifacts=artifacts,
        step_time_ms=_step_time_ms(job, artifacts),
        kind=job.kind,
        idle_share=evaluated.idle_share if evaluated is not None else None,
        sample_interval_s=interval,
        material_waste_usd_per_day=settings.UNEXPLAINED_WASTE_MIN_USD_PER_DAY,
        sharing=evaluated.sharing if evaluated is not None else None,
    )
    return inp, unverified


def _utc(ts: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts, tz=UTC) if ts is not None else None


def _fields(d: Diagnosis) -> dict[str, Any]:
    return {
        "severity": d.severity.value,
        "confidence": d.confidence,
        "title": d.title[:300],
        "window_start": _utc(d.window_start),
        "window_end": _utc(d.window_end),
        "windows": [[float(a), float(b)] for a, b in d.windows],
        "evidence": [e.as_dict() for e in d.evidence],
        "recommendation": d.recommendation,
        # Cents rounded down, so the stored findings never add up to more than the job's waste.
        "waste_per_day_usd": (
            None if d.waste_per_day_usd is None else math.floor(max(d.waste_per_day_usd, 0.0) * 100) / 100
        ),
        "missing_signals": list(d.missing_signals),
    }


def run_diagnosis(job: Job) -> list[Finding]:
    """Diagnose `job` and store its findings in place (one row per code); returns them, costliest first."""
    with transaction.atomic():
        locked = Job.objects.select_for_update(of=("self",)).select_related("gpu_model").get(pk=job.pk)
        inp, unverified = build_checked_input(locked)
        diagnoses = diagnose_checked(inp, unverified)
        stored = _store_findings(locked, diagnoses)
    log.debug("job %s: %d findings (%s)", job.external_id, len(stored), ", ".join(d.code for d in diagnoses))
    return stored


def _store_findings(job: Job, diagnoses: list[Diagnosis]) -> list[Finding]:
    """Write `diagnoses` as `job`'s findings (the caller holds the job's row lock, so no other diagnosis
    writes them meanwhile): a code the job has is updated in place (its row, its first_seen_at kept), a
    new code inserted, a code no longer found deleted. What one `update_or_create` per code did, in one
    read, one UPDATE and one INSERT (#26 item 2: each update_or_create was a savepoint, a locked read and
    a write). Returns the rows in the order of `diagnoses`."""
    existing = {row.code: row for row in Finding.objects.filter(job=job)}
    now = timezone.now()
    stored: list[Finding] = []
    new: list[Finding] = []
    changed: list[Finding] = []
    columns: list[str] = []
    for d in diagnoses:
        fields = _fields(d)
        columns = list(fields)
        row = existing.pop(d.code, None)
        if row is None:
            row = Finding(job=job, code=d.code, **fields)
            new.append(row)
        else:
            for name, value in fields.items():
                setattr(row, name, value)
            row.updated_at = now  # auto_now: bulk_update does not call pre_save
            changed.append(row)
        stored.append(row)
    if changed:
        Finding.objects.bulk_update(changed, [*columns, "updated_at"])
    if new:
        Finding.objects.bulk_create(new)
    if existing:  # codes no longer found (the delete's collector also clears incidents' links to them)
        Finding.objects.filter(pk__in=[row.pk for row in existing.values()]).delete()
    return stored
