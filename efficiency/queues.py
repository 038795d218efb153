"""The Celery queues and which task runs on which: one definition, read by the settings (declared queues,
routes), the /metrics queue lengths and the tests. A task not listed runs on the default queue.

Each kind of work has its own queue so that a 15-minute parse or a slow webhook never delays the one-minute
polls (README "Workers and queues")."""

from __future__ import annotations

from enum import StrEnum


class QueueName(StrEnum):
    """A named Celery queue."""

    DEFAULT = "celery"
    POLL = "poll"
    PARSE = "parse"
    NOTIFY = "notify"
    REPORTS = "reports"


#: Task name -> queue. Routes are the only place a task's queue is set (no `queue=` on a decorator).
TASK_QUEUES: dict[str, QueueName] = {
    "jobs.tasks.poll_running_jobs": QueueName.POLL,
    "jobs.tasks.poll_job": QueueName.POLL,
    "jobs.tasks.poll_shard": QueueName.POLL,
    "jobs.tasks.finalize_ended_jobs": QueueName.POLL,
    "jobs.tasks.finalize_job": QueueName.POLL,
    "jobs.tasks.discover_jobs": QueueName.POLL,
    "jobs.tasks.reevaluate_jobs": QueueName.POLL,
    "jobs.tasks.parse_artifact": QueueName.PARSE,
    "jobs.tasks.sweep_stuck_artifacts": QueueName.PARSE,
    "jobs.tasks.deliver_alert": QueueName.NOTIFY,
    "jobs.tasks.sweep_alerts": QueueName.NOTIFY,
    "jobs.tasks.apply_idle_policy": QueueName.NOTIFY,
    "jobs.tasks.send_weekly_reports": QueueName.REPORTS,
}


def routes() -> dict[str, dict[str, str]]:
    """CELERY_TASK_ROUTES from TASK_QUEUES."""
    return {task: {"queue": str(queue)} for task, queue in TASK_QUEUES.items()}
