"""Whether the service itself is polling: one "service degraded" signal instead of an ingestion_stale
incident on every job when the poller stopped (issue 23 item 7).

Each completed poll cycle records its end (`record_cycle`, a ServiceHeartbeat row). When the last one is
older than POLL_STALLED_AFTER_S (2.5 one-minute cycles by default: one missed cycle is normal jitter, two are
not), the poller is stalled: /healthz reports `degraded` with the reason, /metrics exports
`efficiency_service_degraded{reason="poll_stalled"} 1`, and the alert rules hold `ingestion_stale` (no job's
data can be fresh when nobody polls, so the rule would only say the same thing once per job). When polling
resumes, the first cycle reads each job's data since its `data_until` (the archive merges windows), so the
jobs catch up before the rule is judged again; a job whose own data stopped still fires once the poller
is healthy. Before the first cycle ever completes the state is "unknown" (not degraded): a fresh install
has nothing to compare with.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from jobs.models import ServiceHeartbeat

POLL_CYCLE = "poll_cycle"
#: Reason codes (the `reason` label of efficiency_service_degraded): stable, unlike the sentence.
OK, UNKNOWN, POLL_STALLED = "ok", "unknown", "poll_stalled"


@dataclass(frozen=True)
class PollerState:
    """The poller's state at `now`: `degraded` only when a cycle completed once and none since the limit."""

    code: str
    reason: str
    last_finished_at: datetime | None
    age_s: float | None

    @property
    def degraded(self) -> bool:
        return self.code == POLL_STALLED

    def as_json(self) -> dict[str, Any]:
        return {
            "status": "degraded" if self.degraded else self.code,
            "reason": self.reason,
            "last_poll_cycle_at": self.last_finished_at.isoformat() if self.last_finished_at else None,
            "age_s": round(self.age_s, 1) if self.age_s is not None else None,
        }


def judge_poller(last_finished_at: datetime | None, now: datetime, stalled_after_s: float) -> PollerState:
    """The rule on its own (no database): stalled when the last completed cycle is older than
    `stalled_after_s` seconds at `now`."""
    if last_finished_at is None:
        return PollerState(UNKNOWN, "no poll cycle has completed yet", None, None)
    age = (now - last_finished_at).total_seconds()
    if age > stalled_after_s:
        minutes = age / 60.0
        return PollerState(
            POLL_STALLED,
            f"no poll cycle has completed for {minutes:.0f} min (last at "
            f"{last_finished_at:%Y-%m-%d %H:%M:%S} UTC): job data is not being read, and ingestion_stale "
            "alerts are held until polling resumes",
            last_finished_at,
            age,
        )
    return PollerState(OK, f"last poll cycle completed {max(age, 0.0):.0f} s ago", last_finished_at, age)


def holds_ingestion_stale(state: PollerState, *, job_read: bool) -> bool:
    """Whether the sweep (outside a job's own poll) must hold the `ingestion_stale` rule for a job.

    Held while the poller is stalled (every job's data looks old and none is at fault), and, before any poll
    cycle has ever completed (`unknown`: a fresh install whose first cycle is still catching up), for a job
    whose data was never read (not polled, nothing archived): its age says nothing about its exporter yet. A
    job read once is judged as usual; once a cycle completes the state is `ok` and every job is judged.
    """
    if state.degraded:
        return True
    return state.code == UNKNOWN and not job_read


def record_cycle(finished_at: datetime, duration_s: float, detail: dict[str, Any] | None = None) -> None:
    """Record a completed poll cycle (one upsert); a later record never moves the time back."""
    row, created = ServiceHeartbeat.objects.get_or_create(
        name=POLL_CYCLE,
        defaults={"finished_at": finished_at, "duration_s": duration_s, "detail": detail or {}},
    )
    if not created:
        ServiceHeartbeat.objects.filter(pk=row.pk, finished_at__lte=finished_at).update(
            finished_at=finished_at, duration_s=duration_s, detail=detail or {}
        )


def poller(now: datetime | None = None) -> PollerState:
    """The poller's state now (one indexed query), judged with POLL_STALLED_AFTER_S."""
    now = now or timezone.now()
    last = ServiceHeartbeat.objects.filter(name=POLL_CYCLE).values_list("finished_at", flat=True).first()
    return judge_poller(last, now, settings.POLL_STALLED_AFTER_S)


def cycle_end(now: datetime, duration_s: float) -> datetime:
    """When a cycle that started at `now` (its clock) and ran `duration_s` ended, on the same clock."""
    return now + timedelta(seconds=duration_s)
