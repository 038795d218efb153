"""Every Celery task's runs, failures, retries and duration, recorded by the workers and exported on /metrics.

Celery signals (not a decorator on each task, so no task can be left out) count each run's outcome and add
its wall time to a histogram, in one Redis hash shared by every worker process and machine; the web process's
/metrics reads the hash at scrape time (jobs.outputs.exporter). Recording never fails or slows a task
beyond one pipelined Redis round trip: a Redis error is logged and the run goes uncounted.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import redis

log = logging.getLogger(__name__)

KEY = "efficiency:task-metrics"
#: Histogram bucket bounds, seconds: one-minute polls, parses of up to 15 minutes, webhook sends.
BUCKETS: tuple[float, ...] = (0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
OUTCOMES = ("succeeded", "failed", "retried")

_started: dict[str, float] = {}


def record(client: Any, task: str, outcome: str, duration_s: float | None) -> None:
    """Count one run of `task` with `outcome` (succeeded/failed/retried) and, when known, its duration."""
    pipe = client.pipeline(transaction=False)
    pipe.hincrby(KEY, f"{task}|{outcome}", 1)
    if duration_s is not None:
        pipe.hincrbyfloat(KEY, f"{task}|sum", duration_s)
        pipe.hincrby(KEY, f"{task}|count", 1)
        for bound in BUCKETS:
            if duration_s <= bound:
                pipe.hincrby(KEY, f"{task}|le={bound:g}", 1)
    pipe.execute()


@dataclass
class TaskStats:
    """One task's counters as read back: outcomes, and a cumulative duration histogram."""

    task: str
    outcomes: dict[str, int] = field(default_factory=dict)
    duration_sum_s: float = 0.0
    duration_count: int = 0
    buckets: dict[float, int] = field(default_factory=dict)

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus histogram buckets: (le, count of runs at most that long), +Inf last."""
        return [(f"{b:g}", self.buckets.get(b, 0)) for b in BUCKETS] + [("+Inf", self.duration_count)]


def read(client: Any) -> list[TaskStats]:
    """Every task's counters from the shared hash, sorted by task name."""
    raw = client.hgetall(KEY)
    stats: dict[str, TaskStats] = {}
    for key_b, value_b in raw.items():
        key = key_b.decode() if isinstance(key_b, bytes) else str(key_b)
        value = value_b.decode() if isinstance(value_b, bytes) else str(value_b)
        task, _, part = key.rpartition("|")
        s = stats.setdefault(task, TaskStats(task))
        if part in OUTCOMES:
            s.outcomes[part] = int(value)
        elif part == "sum":
            s.duration_sum_s = float(value)
        elif part == "count":
            s.duration_count = int(value)
        elif part.startswith("le="):
            s.buckets[float(part[3:])] = int(value)
    return [stats[name] for name in sorted(stats)]


def _client() -> Any:
    from django.conf import settings

    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2.0, socket_connect_timeout=2.0)


def _safe_record(task: str, outcome: str, duration_s: float | None) -> None:
    try:
        record(_client(), task, outcome, duration_s)
    except (redis.RedisError, OSError, ValueError):
        log.warning("task metrics: could not record %s %s", task, outcome, exc_info=True)


def on_prerun(task_id: str | None = None, **_: Any) -> None:
    """Celery task_prerun: note the start."""
    if task_id:
        _started[task_id] = time.monotonic()


def on_postrun(task_id: str | None = None, task: Any = None, state: str | None = None, **_: Any) -> None:
    """Celery task_postrun: a finished run (success or failure; a retry is counted by on_retry)."""
    started = _started.pop(task_id, None) if task_id else None
    duration = time.monotonic() - started if started is not None else None
    name = getattr(task, "name", "unknown")
    if state == "SUCCESS":
        _safe_record(name, "succeeded", duration)
    elif state in ("FAILURE", "REVOKED", "REJECTED"):
        _safe_record(name, "failed", duration)
    elif state == "RETRY":
        _safe_record(name, "retried", duration)


def connect(app_signals: Any) -> None:
    """Connect the recorders to Celery's signals (efficiency.celery calls this once)."""
    app_signals.task_prerun.connect(on_prerun, weak=False)
    app_signals.task_postrun.connect(on_postrun, weak=False)
