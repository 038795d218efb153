"""Job discovery from exporter labels: jobs that nobody registered, found by a label such as `hpc_job`.

dcgm-exporter with `--hpc-job-mapping-dir` labels each GPU's series with the Slurm job id (`hpc_job`), and
with `-k` with the Kubernetes `pod`. A value seen on DCGM series and unknown to the registry becomes a
job with a label selector; a discovered job whose label has not been seen for a while is ended at its
last sample. Registered jobs are never touched: the scheduler's word wins.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.utils import timezone

from jobs.intake.registry import register_discovered, resolve_gpu_model
from jobs.metrics.prometheus import PrometheusClient, PrometheusError
from jobs.metrics.promql import label_matcher, validate_label_name
from jobs.models import Job, Team

log = logging.getLogger(__name__)

PRESENCE_METRIC = "DCGM_FI_DEV_GPU_UTIL"  # in dcgm-exporter's default set, so every GPU has it
LOOKBACK = timedelta(hours=1)
ENDED_AFTER = timedelta(minutes=10)  # a label unseen this long means the job is gone


@dataclass(frozen=True)
class Seen:
    """What Prometheus shows for one label value: GPUs, the model name, first and last sample."""

    value: str
    gpu_count: int
    model_name: str
    first_seen: datetime
    last_seen: datetime


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def observe(
    client: PrometheusClient, label: str, now: datetime, lookback: timedelta = LOOKBACK
) -> list[Seen]:
    """Label values on DCGM series in the lookback window, with GPU counts and first/last sample times."""
    validate_label_name(label)
    selector = f'{PRESENCE_METRIC}{{{label}!=""}}'
    window = f"{max(int(lookback.total_seconds()), 60)}s"
    at = now.timestamp()
    first = {s.labels.get(label): s.value for s in client.instant(
        f"min by ({label}) (min_over_time(timestamp({selector})[{window}:1m]))", at)}  # fmt: skip
    last = {s.labels.get(label): s.value for s in client.instant(
        f"max by ({label}) (max_over_time(timestamp({selector})[{window}:1m]))", at)}  # fmt: skip
    gpus = {s.labels.get(label): s.value for s in client.instant(
        f"count by ({label}) (max_over_time({selector}[{window}]))", at)}  # fmt: skip
    models: dict[str, str] = {}
    for sample in client.instant(f"count by ({label}, modelName) (max_over_time({selector}[{window}]))", at):
        models.setdefault(sample.labels.get(label, ""), sample.labels.get("modelName", ""))
    seen = []
    for value, count in gpus.items():
        if not value or not math.isfinite(count):
            continue
        seen.append(
            Seen(
                value=value,
                gpu_count=int(count),
                model_name=models.get(value, ""),
                first_seen=_utc(first.get(value, at)),
                last_seen=_utc(last.get(value, at)),
            )
        )
    return sorted(seen, key=lambda s: s.value)


def discover(client: PrometheusClient, now: datetime | None = None) -> dict[str, list[str]]:
    """Register unknown label values as jobs and end discovered jobs whose label went away."""
    label, team_slug = settings.DISCOVERY_LABEL, settings.DISCOVERY_TEAM
    report: dict[str, list[str]] = {"created": [], "ended": []}
    if not label:
        return report
    now = now or timezone.now()
    team = Team.objects.filter(slug=team_slug).first()
    if team is None:
        raise ValueError(f"DISCOVERY_TEAM={team_slug!r} is not an existing team slug")
    try:
        seen = observe(client, label, now)
    except PrometheusError as exc:
        log.warning("job discovery skipped: %s", exc)
        return report
    by_value = {s.value: s for s in seen}
    prefix = f"{label}:"
    known = set(
        Job.objects.filter(external_id__in=[prefix + v for v in by_value]).values_list(
            "external_id", flat=True
        )
    )
    for value, s in by_value.items():
        if prefix + value in known:
            continue
        job = register_discovered(
            Job(
                external_id=prefix + value,
                name=f"{label}={value}",
                team=team,
                model_name="unknown (discovered)",
                kind=settings.DISCOVERY_JOB_KIND,
                gpu_model=resolve_gpu_model(s.model_name),
                gpu_model_name=s.model_name,
                gpu_count=max(s.gpu_count, 1),
                selector={label: value},
                started_at=s.first_seen,
                discovered_by=label_matcher(label, value)[:300],
            ),
            f"discovery on {label}",
        )
        report["created"].append(job.external_id)
    for job in Job.objects.filter(
        external_id__startswith=prefix, ended_at__isnull=True, discovered_by__gt=""
    ):
        value = job.external_id.removeprefix(prefix)
        last = by_value[value].last_seen if value in by_value else None
        if last is None or now - last > ENDED_AFTER:
            job.ended_at = max(last or job.data_until or job.started_at, job.started_at)
            job.status = Job.Status.ENDED
            job.save(update_fields=["ended_at", "status", "updated_at"])
            report["ended"].append(job.external_id)
    return report
