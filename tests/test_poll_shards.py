"""The sharded poll cycle (#26 item 1) against the real Prometheus of tests/test_cluster_poll.py: the cycle
reads once, shards run each batch's per-job work from the inputs it stored; results equal the unsharded
cycle's, a shard run twice leaves the state one run leaves, and a shard whose worker died mid-shard and
that the broker delivers again completes the cycle's work. Shards run in this process through the cycle's
`dispatch` (the Celery task is a thin wrapper: jobs.tasks.poll_shard), so a worker's death is simulated
by an exception no `except Exception` catches, raised between two jobs of a shard."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from jobs.metrics.prometheus import PrometheusClient
from jobs.models import Job, JobSeries
from jobs.pipeline import poll as pipeline
from jobs.pipeline import shards
from tests.test_cluster_poll import START, _client, _register, local_cache, prom, pytestmark, sims

__all__ = ["local_cache", "prom", "pytestmark", "sims"]  # the module's fixtures and marks, shared

NOW = START + timedelta(minutes=40)
#: Job columns that differ between two runs for reasons other than the poll's results.
_VOLATILE = {"id", "updated_at", "created_at"}


class WorkerDied(BaseException):
    """A worker process killed mid-shard: nothing in the shard catches it (as nothing survives SIGKILL)."""


@pytest.fixture
def cluster_jobs(make_team, sims, settings, local_cache, monkeypatch) -> list[Job]:
    # A fixed clock: a running job's evaluation counts GPU-hours up to the wall clock (load_context
    # without `now`), which would differ between two runs of the same cycle by the seconds between them.
    monkeypatch.setattr(timezone, "now", lambda: NOW)
    settings.PROMETHEUS_SCRAPE_INTERVAL_S = 30.0
    settings.PROMETHEUS_INGESTION_LAG_S = 60.0
    team = make_team("llm")
    return [
        _register(sims["a1"], team, labels={"hpc_job": "3001"}),
        _register(sims["a2"], team, labels={"hpc_job": "3002"}),
        _register(sims["a3"], team, labels={"hpc_job": "3003"}),
        _register(sims["k"], team, labels={"namespace": "llm", "pod": "train-7-worker-0"}),
        _register(sims["g2"], team, external_id="g2"),
    ]


def _state() -> tuple[list[dict[str, Any]], list[tuple[Any, ...]]]:
    """Every job's columns and every archive row: what a cycle leaves."""
    jobs = [
        {k: v for k, v in row.items() if k not in _VOLATILE} for row in Job.objects.order_by("pk").values()
    ]
    series = [
        (s.job_id, s.signal, s.stat, s.gpu_key, s.step_seconds, s.start, s.end, bytes(s.values))
        for s in JobSeries.objects.order_by("job_id", "signal", "stat", "gpu_key", "step_seconds", "start")
    ]
    return jobs, series


def _unsharded_state(client: PrometheusClient) -> tuple[list[dict[str, Any]], list[tuple[Any, ...]]]:
    """The state the in-process cycle leaves, rolled back afterwards."""

    class Undo(Exception):
        pass

    seen: dict[str, Any] = {}
    try:
        with transaction.atomic():
            report = pipeline.poll_cycle(client, now=NOW, shard_size=0)
            seen["report"] = report
            seen["state"] = _state()
            raise Undo
    except Undo:
        pass
    assert seen["report"]["stale_jobs"] == [] and len(seen["report"]["polled"]) == 5
    assert Job.objects.filter(data_until__isnull=False).count() == 0  # rolled back
    return seen["state"]


@pytest.mark.django_db
def test_sharded_cycle_with_a_worker_death_stores_what_the_unsharded_cycle_stores(prom, cluster_jobs):
    client = _client(prom)
    expected = _unsharded_state(client)
    calls: list[int] = []
    store_locked = pipeline._store_locked

    def dying_store(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:  # the first shard's second job: its batch's transaction rolls back whole
            raise WorkerDied
        return store_locked(*args, **kwargs)

    deliveries: list[int] = []

    def broker(spec: shards.ShardSpec) -> None:
        """Runs the shard as a worker would; a dead worker's task is delivered again (acks_late)."""
        deliveries.append(spec.index)
        try:
            pipeline.poll_shard(spec, client)
        except WorkerDied:
            deliveries.append(spec.index)
            pipeline.poll_shard(spec, client)

    pipeline._store_locked = dying_store  # type: ignore[assignment]
    try:
        report = pipeline.poll_cycle(client, now=NOW, shard_size=2, dispatch=broker)
    finally:
        pipeline._store_locked = store_locked  # type: ignore[assignment]
    assert deliveries == [0, 0, 1, 2]  # 5 jobs in shards of 2; shard 0 delivered twice
    assert report["shards_pending"] == [] and report["stale_jobs"] == []
    assert sorted(report["polled"]) == sorted(j.external_id for j in cluster_jobs)
    jobs, series = _state()
    assert series == expected[1]
    for mine, theirs in zip(jobs, expected[0], strict=True):
        assert {k: (v, theirs[k]) for k, v in mine.items() if theirs[k] != v} == {}, mine["external_id"]


@pytest.mark.django_db
def test_a_shard_run_twice_leaves_the_state_one_run_leaves(prom, cluster_jobs):
    client = _client(prom)
    sent: list[shards.ShardSpec] = []

    def broker(spec: shards.ShardSpec) -> None:
        sent.append(spec)
        pipeline.poll_shard(spec, client)

    pipeline.poll_cycle(client, now=NOW, shard_size=3, dispatch=broker)
    assert [s.index for s in sent] == [0, 1]
    once = _state()
    assert all(job["data_until"] is not None for job in once[0])
    for spec in sent:
        pipeline.poll_shard(spec, client)
    assert _state() == once


@pytest.mark.django_db
def test_a_late_shard_whose_inputs_expired_reads_its_jobs_again_and_never_undoes_a_newer_poll(
    prom, cluster_jobs, settings, local_cache
):
    settings.POLL_SHARD_WAIT_S = 1.0
    client = _client(prom)
    lost: list[shards.ShardSpec] = []
    report = pipeline.poll_cycle(client, now=NOW, shard_size=4, dispatch=lost.append)  # no worker takes them
    assert report["shards_pending"] == [0, 1]
    assert Job.objects.filter(data_until__isnull=False).count() == 0
    # Shard 1's job is polled by a newer cycle (in-process); then both shards arrive, their inputs expired.
    later = NOW + timedelta(minutes=1)
    newer = Job.objects.get(pk=lost[1].job_ids[0])
    pipeline.poll_job(newer, client, later)
    newer.refresh_from_db()
    local_cache.clear()
    for spec in lost:
        pipeline.poll_shard(spec, client)
    for job in Job.objects.filter(pk__in=lost[0].job_ids):
        assert job.ingest_error == "" and job.data_until is not None and job.last_polled_at == NOW
    again = Job.objects.get(pk=newer.pk)
    assert again.last_polled_at == later and again.data_until == newer.data_until
