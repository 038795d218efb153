"""The service's own state: when its periodic work last completed (jobs.runtime.service_health reads it)."""

from __future__ import annotations

from django.db import models


class ServiceHeartbeat(models.Model):
    """The last completed run of one piece of periodic work (`name`: "poll_cycle"). Stored in Postgres, not
    the cache, so a Redis restart does not forget it and each test's transaction sees only its own.
    `finished_at` is the end of the run on the clock it ran by (the cycle's `now` plus its duration)."""

    name = models.CharField(max_length=64, unique=True)
    finished_at = models.DateTimeField()
    duration_s = models.FloatField(default=0.0)
    detail = models.JSONField(default=dict, blank=True, help_text="The run's figures (jobs, stale, ...).")

    def __str__(self) -> str:
        return f"{self.name} finished {self.finished_at:%Y-%m-%d %H:%M:%S}"
