"""Every periodic task, in one place, as crontab entries (read by Celery beat).

Every entry expires before its next run is due: a run that waited in its queue past that (workers behind or
down) is dropped by the worker instead of piling up behind the runs that replace it. `tests/test_queues.py`
checks this for every entry, including ones added later.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from typing import Any

from celery.schedules import crontab
from django.conf import settings


def _crontab_from(expr: str) -> crontab:
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(
            f"WEEKLY_REPORT_CRON={expr!r} must have 5 fields: minute hour day-of-month month day-of-week"
        )
    minute, hour, day_of_month, month, day_of_week = fields
    return crontab(
        minute=minute, hour=hour, day_of_month=day_of_month, month_of_year=month, day_of_week=day_of_week
    )


def _shortest_gap_s(schedule: crontab, days: int = 8) -> float | None:
    """The shortest time between two consecutive runs of `schedule` over `days` days from a fixed Monday
    (None when it runs at most once in that span); celery numbers days of the week from 0 = Sunday."""
    start = datetime(2026, 11, 30)
    cron: Any = schedule  # celery-types does not declare crontab's parsed field sets
    fires = [
        t
        for m in range(days * 24 * 60)
        if (t := start + timedelta(minutes=m)).minute in cron.minute
        and t.hour in cron.hour
        and t.day in cron.day_of_month
        and t.month in cron.month_of_year
        and t.isoweekday() % 7 in cron.day_of_week
    ]
    return min(((b - a).total_seconds() for a, b in itertools.pairwise(fires)), default=None)


def _report_expiry_s(schedule: crontab) -> float:
    """20 h (a worker down overnight still sends the week's report), less for a WEEKLY_REPORT_CRON that runs
    more often than daily: half its shortest gap, so a run always expires before the next one is due."""
    gap = _shortest_gap_s(schedule)
    return 20 * 3600.0 if gap is None else min(20 * 3600.0, gap / 2)


def beat_schedule() -> dict[str, dict[str, object]]:
    """The beat schedule: poll running jobs every minute, finalize ended ones, discover jobs, sweep stuck
    artifact parses, sweep alerts, weekly reports."""
    reports = _crontab_from(settings.WEEKLY_REPORT_CRON)
    return {
        "poll-running-jobs": {
            "task": "jobs.tasks.poll_running_jobs",
            "schedule": crontab(minute="*"),
            "options": {"expires": 50},
        },
        "finalize-ended-jobs": {
            "task": "jobs.tasks.finalize_ended_jobs",
            "schedule": crontab(minute="*/5"),
            "options": {"expires": 240},
        },
        "discover-jobs": {
            "task": "jobs.tasks.discover_jobs",
            "schedule": crontab(minute="*/5"),
            "options": {"expires": 240},
        },
        # Fails artifacts whose worker was lost mid-parse; a sweep that waited in the queue is dropped.
        "sweep-stuck-artifacts": {
            "task": "jobs.tasks.sweep_stuck_artifacts",
            "schedule": crontab(minute="*/5"),
            "options": {"expires": 240},
        },
        # Alert rules on jobs whose polls stopped, ended jobs' incidents, and due alert deliveries.
        "sweep-alerts": {
            "task": "jobs.tasks.sweep_alerts",
            "schedule": crontab(minute="*"),
            "options": {"expires": 50},
        },
        # Per-GPU raw archive past its retention (the downsampled tiers stay); a run that waited an hour
        # in the queue is dropped, the next day's does the same work.
        "prune-archive": {
            "task": "jobs.tasks.prune_archive",
            "schedule": crontab(minute="17", hour="3"),
            "options": {"expires": 3600},
        },
        # Long enough for a worker that was down overnight and for the task's own retries (12 x 10 min,
        # which keep this expiry); a week that expired is sent with `send_weekly_reports.delay(week)`.
        "weekly-reports": {
            "task": "jobs.tasks.send_weekly_reports",
            "schedule": reports,
            "options": {"expires": _report_expiry_s(reports)},
        },
    }
