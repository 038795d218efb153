"""The Celery application: Redis broker, CELERY_* settings, beat schedule from one module."""

from __future__ import annotations

import os

from celery import Celery, signals

from efficiency import task_metrics

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "efficiency.settings")

app = Celery("efficiency")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Every task's runs, failures, retries and duration, for /metrics (efficiency.task_metrics).
task_metrics.connect(signals)


@app.on_after_finalize.connect
def _install_schedule(sender: Celery, **_: object) -> None:
    # Imported late: the schedule reads Django settings, which are ready only after finalize.
    from efficiency.schedule import beat_schedule

    sender.conf.beat_schedule = beat_schedule()
