"""Celery queues, routing, beat expiries and the single-beat lock (issue #14, workers that scale out)."""

from __future__ import annotations

import itertools
import threading
import uuid
from datetime import datetime, timedelta

import pytest
import redis
from celery import Celery
from celery.beat import Service
from celery.schedules import crontab
from django.conf import settings

from efficiency.celery import app
from efficiency.schedule import beat_schedule

# Written out here on purpose (not read from efficiency.queues): a task moved to another queue must be a
# deliberate change of this test too.
EXPECTED_QUEUES = {
    "jobs.tasks.poll_running_jobs": "poll",
    "jobs.tasks.poll_job": "poll",
    "jobs.tasks.finalize_ended_jobs": "poll",
    "jobs.tasks.finalize_job": "poll",
    "jobs.tasks.discover_jobs": "poll",
    "jobs.tasks.reevaluate_jobs": "poll",
    "jobs.tasks.parse_artifact": "parse",
    "jobs.tasks.sweep_stuck_artifacts": "parse",
    "jobs.tasks.deliver_alert": "notify",
    "jobs.tasks.sweep_alerts": "notify",
    "jobs.tasks.apply_idle_policy": "notify",
    "jobs.tasks.send_weekly_reports": "reports",
}


def test_no_task_names_its_queue_outside_efficiency_queues():
    """One definition of the routes: no `queue=` on a task decorator, no queue string in the settings."""
    from tests.conftest import REPO_ROOT

    tasks = (REPO_ROOT / "jobs" / "tasks.py").read_text()
    assert "queue=" not in tasks
    assert '"queue":' not in (REPO_ROOT / "efficiency" / "settings.py").read_text()


def _routed_queue(task_name: str) -> str:
    return app.amqp.router.route({}, task_name)["queue"].name


def test_the_named_queues_are_declared_with_the_default_queue():
    assert {q.name for q in settings.CELERY_TASK_QUEUES} == {"celery", "poll", "parse", "notify", "reports"}
    assert settings.CELERY_TASK_DEFAULT_QUEUE == "celery"


@pytest.mark.parametrize(("task_name", "queue"), sorted(EXPECTED_QUEUES.items()))
def test_each_task_is_routed_to_its_queue(task_name, queue):
    assert task_name in app.tasks
    assert _routed_queue(task_name) == queue


def test_every_task_of_the_app_lands_on_a_declared_queue():
    declared = {q.name for q in settings.CELERY_TASK_QUEUES}
    ours = [name for name in app.tasks if name.startswith("jobs.")]
    assert set(EXPECTED_QUEUES) <= set(ours)
    assert {name: _routed_queue(name) for name in ours if _routed_queue(name) not in declared} == {}


@pytest.mark.parametrize(
    ("task_name", "args"),
    [
        ("jobs.tasks.poll_job", (1,)),
        ("jobs.tasks.parse_artifact", (1,)),
        ("jobs.tasks.deliver_alert", (1,)),
        ("jobs.tasks.send_weekly_reports", ()),
    ],
)
def test_a_queued_task_message_is_published_on_its_queue(task_name, args):
    # tests/conftest.py points the app at the in-memory broker: read the message back from the queue.
    queue = EXPECTED_QUEUES[task_name]
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for name in EXPECTED_QUEUES.values():
            app.amqp.queues[name](channel).declare()
            channel.queue_purge(name)
        app.tasks[task_name].apply_async(args, connection=conn)
        found = {name: channel.basic_get(name, no_ack=True) for name in set(EXPECTED_QUEUES.values())}
    assert found[queue] is not None and found[queue].headers["task"] == task_name
    assert [name for name, message in found.items() if message is not None] == [queue]


def test_the_poll_task_runs_one_cluster_wide_cycle_not_a_fan_out(monkeypatch):
    from jobs import tasks

    cycles: list[int] = []
    monkeypatch.setattr(tasks.pipeline, "poll_cycle", lambda: cycles.append(1) or {"jobs": 2})
    monkeypatch.setattr(tasks.poll_job, "apply_async", lambda *a, **k: pytest.fail("fanned out"))
    assert tasks.poll_running_jobs() == 2
    assert cycles == [1]


class _Ids:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def values_list(self, *_: object, flat: bool = False) -> list[int]:
        return self.ids


def _fire_times(schedule: crontab, start: datetime, days: int) -> list[datetime]:
    """Every minute in `days` days from `start` at which the crontab fires (celery: 0 = Sunday)."""
    times = []
    for minute in range(days * 24 * 60):
        t = start + timedelta(minutes=minute)
        if (
            t.minute in schedule.minute
            and t.hour in schedule.hour
            and t.day in schedule.day_of_month
            and t.month in schedule.month_of_year
            and t.isoweekday() % 7 in schedule.day_of_week
        ):
            times.append(t)
    return times


@pytest.mark.parametrize("cron", ["0 8 * * 1", "30 6 * * *", "0 */2 * * *"])
def test_every_beat_entry_expires_before_its_next_run(settings, cron):
    settings.WEEKLY_REPORT_CRON = cron
    entries = beat_schedule()
    assert entries
    for name, entry in entries.items():
        schedule = entry["schedule"]
        assert isinstance(schedule, crontab), name
        times = _fire_times(schedule, datetime(2026, 11, 30), days=15)
        gap_s = min((b - a).total_seconds() for a, b in itertools.pairwise(times))
        expires = entry.get("options", {}).get("expires")  # type: ignore[union-attr]
        assert isinstance(expires, int | float) and 0 < expires < gap_s, (name, expires, gap_s)


# ------------------------------------------------------------------------------------------- one beat


def test_beat_uses_redbeat_with_a_lock():
    assert app.conf.beat_scheduler == "redbeat.RedBeatScheduler"
    assert app.conf.redbeat_lock_timeout >= 3 * app.conf.beat_max_loop_interval  # renewed every tick
    assert app.conf.redbeat_redis_url


@pytest.fixture
def private_redbeat():
    """A Celery app configured like ours but on Redis db 15 under a private key prefix; keys removed after."""
    url = settings.REDIS_URL.rsplit("/", 1)[0] + "/15"
    prefix = f"test-h3-redbeat:{uuid.uuid4().hex}:"
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip(f"no Redis at {url}")

    def make() -> Celery:
        beat_app = Celery("beat-lock-test", set_as_current=False)
        beat_app.conf.update(
            broker_url="memory://",
            beat_scheduler=app.conf.beat_scheduler,
            beat_max_loop_interval=0.2,  # how often a waiting beat retries the lock
            redbeat_redis_url=url,
            redbeat_redis_options={},
            redbeat_key_prefix=prefix,
            redbeat_lock_timeout=app.conf.redbeat_lock_timeout,
            beat_schedule={"noop": {"task": "noop", "schedule": 60.0, "options": {"expires": 50}}},
        )
        return beat_app

    yield make
    keys = client.keys(prefix + "*")
    if keys:
        client.delete(*keys)


def _beat(beat_app: Celery) -> Service:
    return Service(app=beat_app, scheduler_cls=beat_app.conf.beat_scheduler)


def test_a_second_beat_cannot_acquire_the_lock_until_the_first_releases_it(private_redbeat):
    # What `celery beat` runs on start: the beat_init signal, on which redbeat takes its lock (blocking).
    from redbeat.schedulers import acquire_distributed_beat_lock, get_redis

    first = _beat(private_redbeat())
    acquire_distributed_beat_lock(sender=first)
    assert first.scheduler.lock is not None and first.scheduler.lock.owned()
    client = get_redis(first.scheduler.app)
    lock_key = first.scheduler.lock_key
    assert 0 < client.ttl(lock_key) <= first.scheduler.lock_timeout

    second = _beat(private_redbeat())
    waiting = threading.Thread(target=acquire_distributed_beat_lock, kwargs={"sender": second}, daemon=True)
    waiting.start()
    waiting.join(timeout=2)  # about ten retries of the lock
    assert waiting.is_alive() and second.scheduler.lock is None

    first.scheduler.close()  # a clean stop releases the lock: the waiting beat takes over
    waiting.join(timeout=10)
    assert not waiting.is_alive() and second.scheduler.lock is not None
    assert client.get(lock_key)  # held again, by the second beat (redis-py keeps its token per thread)
