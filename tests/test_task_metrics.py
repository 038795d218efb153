"""Every Celery task reports its runs, failures, retries and duration (issue 27 item 4: "no task reports its
duration or failures"), recorded through Celery's signals into Redis by whichever worker ran it."""

from __future__ import annotations

import pytest
import redis
from celery import Celery

from efficiency import task_metrics

pytestmark = pytest.mark.django_db


@pytest.fixture
def metrics_redis(settings):
    """A private Redis database for the counters (the services' Redis, DB 11), emptied before and after."""
    settings.REDIS_URL = settings.REDIS_URL.rsplit("/", 1)[0] + "/11"
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip("Redis is not running (make test starts it)")
    client.delete(task_metrics.KEY)
    yield client
    client.delete(task_metrics.KEY)


def test_runs_failures_and_retries_are_counted_with_their_durations(metrics_redis):
    app = Celery("task-metrics-test")
    app.conf.task_always_eager = True

    @app.task(name="t.ok")
    def ok() -> int:
        return 1

    @app.task(name="t.boom")
    def boom() -> None:
        raise RuntimeError("boom")

    @app.task(name="t.again", bind=True, max_retries=3)
    def again(self) -> None:
        raise self.retry(countdown=0)

    ok.apply()
    ok.apply()
    boom.apply()
    again.apply()
    stats = {s.task: s for s in task_metrics.read(metrics_redis)}
    assert stats["t.ok"].outcomes == {"succeeded": 2} and stats["t.ok"].duration_count == 2
    assert stats["t.boom"].outcomes == {"failed": 1}
    assert stats["t.again"].outcomes.get("retried", 0) >= 1
    cumulative = dict(stats["t.ok"].cumulative())
    assert cumulative["0.1"] == 2 and cumulative["+Inf"] == 2  # trivial runs land in the first bucket
    assert 0 <= stats["t.ok"].duration_sum_s < 1.0


def test_a_redis_outage_never_fails_the_task(settings, caplog):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    app = Celery("task-metrics-outage")
    app.conf.task_always_eager = True

    @app.task(name="t.fine")
    def fine() -> int:
        return 7

    assert fine.apply().get() == 7
    assert "task metrics: could not record t.fine succeeded" in caplog.text


def test_the_buckets_are_cumulative_as_prometheus_reads_them():
    s = task_metrics.TaskStats("x", duration_count=3, buckets={0.5: 1, 1.0: 2, 5.0: 3})
    assert s.cumulative()[:3] == [("0.1", 0), ("0.5", 1), ("1", 2)]
    assert s.cumulative()[-1] == ("+Inf", 3)
