"""Every periodic task, in one place, as crontab entries (read by Celery beat)."""

from __future__ import annotations

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


def beat_schedule() -> dict[str, dict[str, object]]:
    """The beat schedule: poll running jobs every minute, finalize ended ones, discover jobs, sweep stuck
    artifact parses, sweep alerts, weekly reports."""
    return {
        "poll-running-jobs": {"task": "jobs.tasks.poll_running_jobs", "schedule": crontab(minute="*")},
        "finalize-ended-jobs": {"task": "jobs.tasks.finalize_ended_jobs", "schedule": crontab(minute="*/5")},
        "discover-jobs": {"task": "jobs.tasks.discover_jobs", "schedule": crontab(minute="*/5")},
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
        "weekly-reports": {
            "task": "jobs.tasks.send_weekly_reports",
            "schedule": _crontab_from(settings.WEEKLY_REPORT_CRON),
        },
    }
