"""Incidents: run the alert rules on a running job after each poll, open, keep and resolve incidents, and
queue their notifications.

Cheap by design (it runs after every one-minute poll): it reads the job's stored columns and evaluation,
its findings, and only the archive's recent cross-GPU aggregates of a few signals (one query). Per-GPU rows
of the recent window only when the aggregates say they matter: a GPU idle at the latest sample (the idle
alert then runs the idle_gpus finding's computation on them) or a mean SM clock below the throttle
threshold (the throttling alert then judges only the GPUs that are busy).

In a poll cycle (`cycle`, jobs.evaluation.cycle.CycleContext) the rules' own look-ups are read once for
the cycle's jobs, not once per job (#26 item 2): the open incidents and the findings in one query each,
the active baselines' stats in two. A job diagnosed in this cycle (its findings were just rewritten,
after that read) reads its own findings, as does every evaluation outside a cycle (the sweep, a
standalone call). The rows are read when the first job asks for them; what another process changes in
the cycle's remaining seconds (a finding an artifact's parse writes, an incident the sweep resolves) the
next cycle reads: opening stays exactly once (the partial unique constraint), resolving conditional.

Exactly once: an incident is one row per (job, rule) while open (a partial unique constraint); opening and
resolving create one AlertDelivery row per (incident, subscription, event) with INSERT ... ON CONFLICT DO
NOTHING, so repeated or concurrent polls create each message once; jobs.alerts.notify claims and sends it.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import numpy as np
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from jobs.access.permissions import can_read_team
from jobs.alerts import policy, rules
from jobs.alerts.rules import FindingView, JobView, RuleConfig, Series, State, Verdict
from jobs.diagnosis.thresholds import BUSY_UTIL_MIN, IDLE_UTIL_MAX, THROTTLE_REASON_SHARE
from jobs.evaluation.cycle import CycleContext
from jobs.evaluation.robust import Summary, check_regression
from jobs.metrics import archive
from jobs.models import AlertDelivery, AlertIncident, AlertSubscription, Baseline, Finding, Job
from jobs.runtime import service_health
from jobs.runtime.enqueue import enqueue

log = logging.getLogger(__name__)

#: Archive lines the rules read ("signal.stat").
_LINES = (
    "gpu_util.min",
    "gpu_util.max",
    "gpu_util.mean",
    f"{archive.MFU}.mean",
    "sm_clock.mean",
    "power_violation.mean",
    "thermal_violation.mean",
    "xid_errors.nonzero",
)

#: The signals the rules read of a job's archive (`job_view`): the cross-GPU lines above, and of them
#: GPU_UTIL, GR_ENGINE_ACTIVE and SM_CLOCK per GPU. The poll merges its derived rows of these alone into
#: the snapshot it hands `evaluate_job` (jobs.pipeline.poll; the snapshot refuses reads of any other).
RULE_SIGNALS = frozenset(
    {line.split(".")[0] for line in _LINES} | {"gpu_util", "gr_engine_active", "sm_clock"}
)


def rule_configs() -> dict[str, RuleConfig]:
    """Each rule's threshold and minimum duration from settings (read at call time)."""
    s = settings
    return {
        rules.GPUS_IDLE: RuleConfig(s.ALERT_IDLE_MIN_GPUS, s.ALERT_IDLE_MINUTES),
        rules.MFU_LOW: RuleConfig(s.ALERT_MFU_REFERENCE_SHARE, s.ALERT_MFU_MINUTES),
        rules.THROTTLING: RuleConfig(s.ALERT_THROTTLE_CLOCK_RATIO, s.ALERT_THROTTLE_MINUTES),
        rules.XID_ERRORS: RuleConfig(s.ALERT_XID_MIN_GPUS, s.ALERT_XID_MINUTES),
        rules.STRAGGLER: RuleConfig(s.ALERT_STRAGGLER_MIN_CONFIDENCE, s.ALERT_STRAGGLER_MINUTES),
        rules.WASTE: RuleConfig(s.ALERT_WASTE_USD_PER_DAY, s.ALERT_WASTE_MINUTES),
        rules.INGESTION_STALE: RuleConfig(1.0, s.ALERT_STALE_MINUTES),
    }


# ---------------------------------------------------------------------------------------------- view


def _recent_series(
    job: Job, start: float, end: float, archived: archive.Snapshot | None = None
) -> tuple[dict[str, Series], float]:
    signals = sorted({line.split(".")[0] for line in _LINES})
    if archived is not None:  # the poll's own read of the archive: the same rows, no second query
        sigs = archived.load_job_signals(per_gpu=False, signals=signals, window=(start, end))
    else:
        sigs = archive.load_job_signals(job, per_gpu=False, signals=signals, window=(start, end))
    if sigs is None:
        return {}, 30.0
    keep = (sigs.timestamps > start) & (sigs.timestamps <= end)
    ts = sigs.timestamps[keep]
    out: dict[str, Series] = {}
    for line in _LINES:
        signal, stat = line.split(".")
        series = sigs.signals.get(signal)
        if series is None or stat not in series.stats:
            continue
        out[line] = Series(ts, np.asarray(series.stats[stat], dtype=np.float64)[keep], float(sigs.step))
    return out, float(sigs.step)


def _idle_gpus_now(job: Job, end: float, archived: archive.Snapshot | None = None) -> int | None:
    window = (end - 900.0, end)
    if archived is not None and "gpu_util" in archived.gpu_signals:
        per_gpu = archived.load_per_gpu("gpu_util", window=window)
    else:
        per_gpu = archive.load_per_gpu(job, "gpu_util", window=window)
    if per_gpu is None or per_gpu.per_gpu is None or per_gpu.gpu_timestamps is None:
        return None
    rows = per_gpu.per_gpu[:, per_gpu.gpu_timestamps <= end + 1e-6]
    count = 0
    for row in rows:
        finite = row[np.isfinite(row)]
        if finite.size and finite[-1] <= IDLE_UTIL_MAX:
            count += 1
    return count


def _gpu_rows(job: Job, signal: str, window: tuple[float, float], archived: archive.Snapshot | None) -> Any:
    if archived is not None and signal in archived.gpu_signals:
        return archived.load_per_gpu(signal, window=window)
    return archive.load_per_gpu(job, signal, window=window)


def _aligned(base: Any, other: Any) -> np.ndarray | None:
    """`other`'s per-GPU rows on `base`'s GPUs and timestamps (NaN where it has no sample)."""
    if other is None or other.per_gpu is None or other.gpu_timestamps is None:
        return None
    col = {float(t): j for j, t in enumerate(base.gpu_timestamps)}
    row = {str(g): i for i, g in enumerate(base.gpus)}
    out = np.full(base.per_gpu.shape, np.nan)
    cols = np.array([col.get(float(t), -1) for t in other.gpu_timestamps], dtype=np.int64)
    ok = cols >= 0
    for g, values in zip(other.gpus, np.asarray(other.per_gpu, dtype=np.float64), strict=True):
        i = row.get(str(g))
        if i is not None:
            out[i, cols[ok]] = values[ok]
    return out


def _per_gpu_view(
    job: Job,
    series: dict[str, Series],
    window: tuple[float, float],
    configs: dict[str, RuleConfig],
    max_clock_mhz: float | None,
    archived: archive.Snapshot | None = None,
) -> rules.PerGpu | None:
    """The recent per-GPU rows the idle and throttling rules prefer, read only when the aggregates say
    they could matter (cheap by design: most polls read none): some GPU idle at the latest sample, or the
    cross-GPU mean SM clock below the throttle threshold in the window (idle GPUs in the mean, or real
    throttling: the per-GPU clocks of the busy GPUs tell them apart)."""
    low = series.get("gpu_util.min")
    finite = low.values[np.isfinite(low.values)] if low is not None else np.array([])
    idle_now = rules.GPUS_IDLE in configs and finite.size > 0 and float(finite[-1]) <= IDLE_UTIL_MAX
    clock = series.get("sm_clock.mean")
    throttle = configs.get(rules.THROTTLING)
    slow_clock = bool(
        throttle is not None
        and clock is not None
        and max_clock_mhz
        and np.nanmin(np.append(clock.values, np.inf)) < throttle.threshold * max_clock_mhz
    )
    if not (idle_now or slow_clock):
        return None
    util = _gpu_rows(job, "gpu_util", window, archived)
    if util is None or util.per_gpu is None or util.gpu_timestamps is None or util.per_gpu.size == 0:
        return None
    ts = np.asarray(util.gpu_timestamps, dtype=np.float64)
    step = float(ts[1] - ts[0]) if ts.size > 1 else (low.step if low is not None else 30.0)
    engine = _aligned(util, _gpu_rows(job, "gr_engine_active", window, archived)) if idle_now else None
    sm_clock = _aligned(util, _gpu_rows(job, "sm_clock", window, archived)) if slow_clock else None
    return rules.PerGpu(ts, step, np.asarray(util.per_gpu, dtype=np.float64), engine, sm_clock)


def _baselines_of(pks: list[int]) -> dict[int, tuple[int, str, dict[str, Any]]]:
    """Each of jobs `pks`' (team, config fingerprint, active baseline's stats; {} without one) in two
    queries for them all: active_baseline's filter and order (jobs.evaluation.baselines: the first of the
    team's unretired baselines of that fingerprint in the model's order), the stats column alone."""
    keys = {
        pk: (team_id, fingerprint)
        for pk, team_id, fingerprint in Job.objects.filter(pk__in=pks).values_list(
            "pk", "team_id", "config_fingerprint"
        )
    }
    wanted = {key for key in keys.values() if key[1]}
    active: dict[tuple[int, str], dict[str, Any]] = {}
    if wanted:
        found = Baseline.objects.filter(
            retired_at__isnull=True,
            team_id__in={team for team, _ in wanted},
            fingerprint__in={fingerprint for _, fingerprint in wanted},
        ).values_list("team_id", "fingerprint", "stats")
        for team_id, fingerprint, stats in found:
            active.setdefault((team_id, fingerprint), stats or {})  # the first in order is the active one
    return {pk: (team, fp, active.get((team, fp), {})) for pk, (team, fp) in keys.items()}


def _baseline_mfu_low(job: Job, cycle: CycleContext | None = None) -> float | None:
    if not job.config_fingerprint:
        return None
    read = cycle.rows("alert_baselines", _baselines_of).pop(job.pk, None) if cycle is not None else None
    if read is not None and read[:2] == (job.team_id, job.config_fingerprint):
        active: dict[str, Any] | None = read[2]  # the cycle's read for its jobs
    else:
        # Only the active baseline's stats: active_baseline's filter and order (jobs.evaluation.baselines)
        # without its runs or a model row, one query after every poll. The job's own team's baseline
        # only: another team's run of the same config never sets this team's alert band (issue 23 item 3).
        active = (
            Baseline.objects.filter(
                team_id=job.team_id, fingerprint=job.config_fingerprint, retired_at__isnull=True
            )
            .values_list("stats", flat=True)
            .first()
        )
    stats = (active or {}).get("mfu") if active is not None else None
    if not isinstance(stats, dict) or stats.get("median") is None or not stats.get("n"):
        return None
    summary = Summary(
        median=stats.get("median"),
        mad=stats.get("mad"),
        iqr=stats.get("iqr"),
        n=int(stats.get("n") or 0),
        min=stats.get("min"),
        max=stats.get("max"),
    )
    return check_regression(float(stats["median"]), summary).band_low


#: The Finding columns the rules read (`_finding_view`), in this order.
_FINDING_COLUMNS = ("code", "title", "waste_per_day_usd", "confidence", "first_seen_at", "windows")
_FindingRow = tuple[Any, ...]


def _finding_view(row: _FindingRow) -> FindingView:
    code, title, waste, confidence, first_seen_at, raw_windows = row
    windows = tuple(
        (float(w[0]), float(w[1])) for w in (raw_windows or []) if isinstance(w, list | tuple) and len(w) == 2
    )
    return FindingView(
        code=code,
        title=title,
        waste_per_day_usd=waste,
        confidence=confidence,
        first_seen=first_seen_at.timestamp(),
        windows=windows,
    )


def _findings_of(pks: list[int]) -> dict[int, list[_FindingRow]]:
    """The rules' columns of the findings of jobs `pks` (each job's list, empty without any), in one query,
    each job's in the model's order (FINDING_RANK_ORDER ends with the code, unique per job: the order a
    per-job read gives)."""
    out: dict[int, list[_FindingRow]] = {pk: [] for pk in pks}
    for job_id, *row in Finding.objects.filter(job_id__in=pks).values_list("job_id", *_FINDING_COLUMNS):
        out[job_id].append(tuple(row))
    return out


def _findings(job: Job, cycle: CycleContext | None = None) -> list[FindingView]:
    rows: list[_FindingRow] | None = None
    # A job diagnosed in this cycle has findings newer than the cycle's read (the diagnosis stamps
    # diagnosed_at with the poll's time, jobs.pipeline.poll._diagnosis_due): it reads its own.
    if cycle is not None and not (job.diagnosed_at is not None and job.diagnosed_at >= cycle.now):
        rows = cycle.rows("alert_findings", _findings_of).pop(job.pk, None)
    if rows is None:
        # The columns the rules read, not model rows (this runs after every poll of every job).
        rows = [tuple(r) for r in Finding.objects.filter(job=job).values_list(*_FINDING_COLUMNS)]
    return [_finding_view(row) for row in rows]


def job_view(
    job: Job,
    now: datetime,
    configs: dict[str, RuleConfig],
    archived: archive.Snapshot | None = None,
    cycle: CycleContext | None = None,
) -> JobView:
    """What the rules read of `job` at `now` (stored columns, evaluation, findings, recent aggregates);
    `archived`: the poll's snapshot of the job's archive (read from it instead of the database); `cycle`:
    the poll cycle's shared reads (the findings and the baseline from them, see the module docstring)."""
    end = min(now, job.data_until or now).timestamp()
    start = end - rules.lookback_s(configs)
    series, _ = _recent_series(job, start, end, archived)
    evaluated = job.evaluated
    need_count = configs.get(rules.GPUS_IDLE, RuleConfig(1, 0)).threshold > 1
    gpu_model = job.gpu_model
    max_clock = float(gpu_model.max_clock_mhz) if gpu_model and gpu_model.max_clock_mhz else None
    per_gpu = _per_gpu_view(job, series, (start, end), configs, max_clock, archived)
    return JobView(
        now=now.timestamp(),
        started_at=job.started_at.timestamp(),
        data_until=job.data_until.timestamp() if job.data_until else None,
        ingest_error=job.ingest_error,
        gpu_count=job.gpu_count,
        series=series,
        idle_gpus_now=_idle_gpus_now(job, end, archived) if need_count and per_gpu is None else None,
        per_gpu=per_gpu,
        idle_util_max=IDLE_UTIL_MAX,
        max_clock_mhz=max_clock,
        busy_util_min=BUSY_UTIL_MIN,
        violation_share=THROTTLE_REASON_SHARE,
        reference_mfu=evaluated.reference_mfu if evaluated else None,
        reference_source=evaluated.reference_source if evaluated else "",
        baseline_mfu_low=_baseline_mfu_low(job, cycle),
        findings=_findings(job, cycle),
    )


# ------------------------------------------------------------------------------------------ incidents


def _evidence(verdict: Verdict) -> list[dict[str, Any]]:
    return [{"label": label, "value": value, "unit": unit} for label, value, unit in verdict.evidence]


def _utc(ts: float) -> datetime:
    return archive.utc(ts)


def open_incidents(job: Job) -> QuerySet[AlertIncident]:
    return AlertIncident.objects.filter(job=job, resolved_at__isnull=True)


def _open_incidents_of(pks: list[int]) -> dict[int, list[AlertIncident]]:
    """The open incidents of jobs `pks` (each job's list, empty without any), in one query."""
    out: dict[int, list[AlertIncident]] = {pk: [] for pk in pks}
    for incident in AlertIncident.objects.filter(job_id__in=pks, resolved_at__isnull=True):
        out[incident.job_id].append(incident)
    return out


def evaluate_job(
    job: Job,
    now: datetime | None = None,
    *,
    archived: archive.Snapshot | None = None,
    cycle: CycleContext | None = None,
) -> dict[str, Verdict]:
    """Run every rule on `job` and open / keep / resolve its incidents; returns the verdicts.

    A job that is no longer running has its open incidents resolved ("job ended") and no rule runs.
    `archived`: the poll's snapshot of the job's archive (after its writes, `archive.Snapshot.merge`), so
    the rules read no archive rows again; without it they read the database (the sweep, a standalone call).
    `cycle`: the poll cycle's shared reads; the open incidents and findings come from its one read for all
    its jobs (see the module docstring).
    """
    now = now or timezone.now()
    if not settings.ALERTS_ENABLED:
        return {}
    if job.status != Job.Status.RUNNING:
        for ended in open_incidents(job):
            _resolve(ended, now, "the job ended")
        return {}
    configs = rule_configs()
    if (
        archived is None
        and rules.INGESTION_STALE in configs
        and service_health.holds_ingestion_stale(
            service_health.poller(now), job_read=job.last_polled_at is not None or job.data_until is not None
        )
    ):
        # Outside a poll (the sweep) while the service itself stopped polling, or before its first cycle
        # ever completed and this job was never read: the job's data looks old and the job is not at fault.
        # The rule is held (an open incident is neither refreshed nor resolved); /healthz and /metrics carry
        # the one "service degraded" signal instead. Right after the job's own poll (`archived` given) the
        # service is polling it, so old data is the job's own.
        del configs[rules.INGESTION_STALE]
    view = job_view(job, now, configs, archived, cycle)
    verdicts = rules.evaluate(view, configs)
    # The findings the view read: an incident links its finding only when the job has one with that code
    # (no query per open incident and cycle for a finding the job does not have).
    found = frozenset(f.code for f in view.findings)
    read = cycle.rows("alert_open_incidents", _open_incidents_of).pop(job.pk, None) if cycle else None
    current = {i.rule: i for i in (read if read is not None else open_incidents(job))}
    for held in current.values():
        held.job = job  # its deliveries read the job (owner): no query for the row we have
    # Whether a GPUS_IDLE incident is open after this evaluation, from what it did (no second query): one
    # that stays open, or one this evaluation opened (or a concurrent poll did: the insert's conflict).
    idle_open = False
    for rule, verdict in verdicts.items():
        if (incident := current.get(rule)) is not None:
            if verdict.state is State.CLEAR:  # resolved now, or by a concurrent poll: not open either way
                _resolve(incident, now, verdict.reason or "the condition cleared")
            else:
                idle_open |= rule == rules.GPUS_IDLE
                if verdict.holds:
                    _refresh(incident, verdict, now, found)
        elif verdict.state is State.FIRING:
            _open(job, verdict, now, found)
            idle_open |= rule == rules.GPUS_IDLE
    idle_open |= rules.GPUS_IDLE in current and rules.GPUS_IDLE not in verdicts
    if idle_open and policy.enabled_for(job):
        enqueue("apply_idle_policy", job.pk, now.isoformat())  # judged at the poll's time
    return verdicts


def _finding_for(job: Job, code: str, found: frozenset[str] | None = None) -> Finding | None:
    """The job's finding with `code` (None without one); `found`: the codes the job's findings have (from
    the rules' read of them), so a code not among them needs no query."""
    if not code or (found is not None and code not in found):
        return None
    return Finding.objects.filter(job=job, code=code).first()


def _open(
    job: Job, verdict: Verdict, now: datetime, found: frozenset[str] | None = None
) -> AlertIncident | None:
    since = _utc(verdict.since) if verdict.since is not None else now
    try:
        with transaction.atomic():
            incident = AlertIncident.objects.create(
                rule=verdict.rule,
                job=job,
                team_id=job.team_id,
                started_at=min(since, now),
                opened_at=now,
                last_seen_at=now,
                finding=_finding_for(job, verdict.finding_code, found),
                finding_code=verdict.finding_code,
                title=verdict.title[:300],
                evidence=_evidence(verdict),
            )
    except IntegrityError:  # a concurrent poll opened it first: one open incident per (job, rule)
        return None
    log.info("job %s: incident %s opened (%s)", job.external_id, verdict.rule, verdict.title)
    queue_deliveries(incident, AlertDelivery.Event.OPENED)
    return incident


def _refresh(
    incident: AlertIncident, verdict: Verdict, now: datetime, found: frozenset[str] | None = None
) -> None:
    fields: dict[str, Any] = {"last_seen_at": now}
    if verdict.title:
        fields.update(title=verdict.title[:300], evidence=_evidence(verdict))
    if incident.finding_id is None and verdict.finding_code:
        finding = _finding_for(incident.job, verdict.finding_code, found)
        if finding is not None:
            fields.update(finding=finding, finding_code=finding.code)
    AlertIncident.objects.filter(pk=incident.pk).update(**fields)


def _resolve(incident: AlertIncident, now: datetime, reason: str) -> bool:
    done = AlertIncident.objects.filter(pk=incident.pk, resolved_at__isnull=True).update(
        resolved_at=now, resolve_reason=reason[:300]
    )
    if done:  # only the evaluation that resolved it queues the "resolved" messages
        incident.resolved_at, incident.resolve_reason = now, reason[:300]
        log.info("incident %s on job %s resolved: %s", incident.rule, incident.job_id, reason)
        queue_deliveries(incident, AlertDelivery.Event.RESOLVED)
    return bool(done)


# ------------------------------------------------------------------------------------------ deliveries


def subscriptions_for(incident: AlertIncident) -> list[AlertSubscription]:
    """Enabled subscriptions of the incident's team, and personal ones of the job's owner, for its rule."""
    owner = incident.job.owner
    scope = Q(team_id=incident.team_id)
    if owner:
        scope |= Q(user__username=owner, user__is_active=True)
    subs = AlertSubscription.objects.filter(scope, enabled=True).select_related("user")
    # `owner` is free text from the registration: a personal subscription receives the job only when its
    # user may read the job's team (read policy), or anyone could name themselves owner of another's job.
    return [
        s
        for s in subs
        if (not s.rules or incident.rule in s.rules)
        and (s.user is None or can_read_team(s.user, incident.team_id))
    ]


def queue_deliveries(incident: AlertIncident, event: str) -> list[int]:
    """Create the (incident, subscription, event) delivery rows once and queue each for sending after the
    transaction commits; returns the ids of rows still to send."""
    subs = subscriptions_for(incident)
    AlertDelivery.objects.bulk_create(
        [
            AlertDelivery(
                incident=incident, subscription=s, event=event, channel=s.channel, destination=s.destination
            )
            for s in subs
        ],
        ignore_conflicts=True,
    )
    ids = list(
        AlertDelivery.objects.filter(
            incident=incident, event=event, status=AlertDelivery.Status.PENDING
        ).values_list("id", flat=True)
    )
    for delivery_id in ids:
        transaction.on_commit(partial(enqueue, "deliver_alert", delivery_id))
    return ids


# --------------------------------------------------------------------------------------------- sweep


def sweep(now: datetime | None = None) -> int:
    """Evaluate running jobs whose polls stopped (the stale rule has no poll to run after) and resolve the
    incidents of jobs that ended; returns the number of jobs looked at."""
    now = now or timezone.now()
    stale_before = now - timedelta(minutes=settings.ALERT_STALE_MINUTES)
    running = Job.objects.filter(status=Job.Status.RUNNING).filter(
        Q(data_until__lt=stale_before) | Q(data_until__isnull=True, started_at__lt=stale_before)
    )
    ended = Job.objects.exclude(status=Job.Status.RUNNING).filter(incidents__resolved_at__isnull=True)
    seen = 0
    for job in list(running.select_related("gpu_model")) + list(ended.distinct()):
        try:
            evaluate_job(job, now)
        except Exception:  # one job's broken data must not stop the sweep
            log.exception("alerts: evaluating job %s failed", job.external_id)
        seen += 1
    return seen
