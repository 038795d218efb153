"""The poll cycle stores its jobs a batch at a time (#26 item 2, jobs.pipeline.poll._store_batch): one
transaction per batch with one row lock and one UPDATE per set of changed columns, and a savepoint per job.
One job's failure (a failed query, a value its column refuses) still marks only that job stale; a worker
that dies mid-batch leaves none of the batch written. The batched UPDATE writes what `save` writes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models.signals import post_save

from jobs.models import Job
from jobs.pipeline import poll as pipeline
from tests.prom_server import needs_prometheus
from tests.test_cluster_poll import START, _client, _register, local_cache, prom, sims  # noqa: F401

JOBS = (("a1", {"hpc_job": "3001"}), ("a2", {"hpc_job": "3002"}), ("a3", {"hpc_job": "3003"}))


class WorkerDied(BaseException):
    """A worker process killed mid-batch: nothing in the cycle catches it (as nothing survives SIGKILL)."""


@pytest.fixture
def three_jobs(prom, sims, make_team, local_cache, settings):  # noqa: F811
    """JOBS registered and polled once (at minute 40): their rows as that cycle left them, and a client."""
    settings.PROMETHEUS_SCRAPE_INTERVAL_S = 30.0
    settings.PROMETHEUS_INGESTION_LAG_S = 60.0
    team = make_team("llm")
    jobs = [_register(sims[key], team, labels=labels) for key, labels in JOBS]
    client = _client(prom)
    report = pipeline.poll_cycle(client, now=START + timedelta(minutes=40))
    assert report["stale_jobs"] == [] and len(report["polled"]) == len(JOBS)
    return jobs, client


def _rows(jobs: list[Job]) -> dict[str, tuple[Any, ...]]:
    return {
        j.external_id: (j.data_until, j.last_polled_at, j.ingest_error, j.gpu_hours, j.evaluation)
        for j in Job.objects.filter(pk__in=[j.pk for j in jobs])
    }


@pytest.mark.prometheus
@needs_prometheus
@pytest.mark.django_db
def test_a_failed_query_in_one_job_marks_only_that_job_stale_and_its_batch_commits(three_jobs, monkeypatch):
    jobs, client = three_jobs
    bad = jobs[1]
    before = _rows(jobs)
    real = pipeline.evaluate_and_store

    def failing(job: Job, *args: Any, **kwargs: Any) -> Any:
        if job.pk == bad.pk:  # a query that fails aborts the transaction: only a savepoint saves the rest
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 / 0")
        return real(job, *args, **kwargs)

    monkeypatch.setattr(pipeline, "evaluate_and_store", failing)
    now = START + timedelta(minutes=45)
    report = pipeline.poll_cycle(client, now=now)
    assert report["stale_jobs"] == [bad.external_id]
    assert sorted(report["polled"]) == sorted(j.external_id for j in jobs if j.pk != bad.pk)
    after = _rows(jobs)
    data_until, polled_at, error, *_ = after[bad.external_id]
    assert "division by zero" in error and polled_at == now
    assert data_until == before[bad.external_id][0]  # its poll was rolled back: nothing advanced
    for job in jobs:
        if job.pk != bad.pk:
            data_until, polled_at, error, *_ = after[job.external_id]
            assert error == "" and polled_at == now and data_until > before[job.external_id][0]


@pytest.mark.prometheus
@needs_prometheus
@pytest.mark.django_db
def test_a_value_its_column_refuses_fails_only_that_job_in_the_batchs_update(three_jobs, monkeypatch):
    jobs, client = three_jobs
    bad = jobs[2]
    before = _rows(jobs)
    real = pipeline._store_locked

    def too_long(job: Job, *args: Any, **kwargs: Any) -> Any:
        step = real(job, *args, **kwargs)
        if job.pk == bad.pk:  # varchar(300): Postgres refuses it in the UPDATE, not Python before it
            job.waste_unknown_reason = "x" * 400
        return step

    monkeypatch.setattr(pipeline, "_store_locked", too_long)
    now = START + timedelta(minutes=45)
    report = pipeline.poll_cycle(client, now=now)
    assert report["stale_jobs"] == [bad.external_id]
    after = _rows(jobs)
    assert "too long" in after[bad.external_id][2] and after[bad.external_id][0] == before[bad.external_id][0]
    for job in jobs:
        if job.pk != bad.pk:
            assert after[job.external_id][2] == "" and after[job.external_id][0] > before[job.external_id][0]


@pytest.mark.prometheus
@needs_prometheus
@pytest.mark.django_db
def test_a_worker_dying_mid_batch_leaves_none_of_the_batch_written(three_jobs, monkeypatch):
    jobs, client = three_jobs
    before = _rows(jobs)
    calls: list[int] = []
    real = pipeline._store_locked

    def dying(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:  # the batch's last job: the first two are stored in its transaction
            raise WorkerDied
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "_store_locked", dying)
    with pytest.raises(WorkerDied):
        pipeline.poll_cycle(client, now=START + timedelta(minutes=45))
    assert len(calls) == 3
    assert _rows(jobs) == before  # not the first two jobs' polls either


@pytest.mark.django_db
def test_the_batched_update_writes_what_save_writes_and_sends_its_signals(make_team):
    team = make_team("llm")
    common = {"team": team, "started_at": START, "gpu_count": 8, "status": Job.Status.RUNNING}
    mine = Job.objects.create(external_id="u-1", **common)
    theirs = Job.objects.create(external_id="u-2", **common)
    columns = (
        "data_until", "energy_j", "evaluation", "mfu", "missing_reasons", "missing_signals", "flops_variant",
        "mfu_fallback", "updated_at",
    )  # fmt: skip
    for job in (mine, theirs):
        job.data_until = START + timedelta(minutes=5)
        job.energy_j = None
        job.evaluation = {"mfu": 0.41, "notes": ["a", 'b "quoted"'], "nested": {"n": None}}
        job.mfu = 0.41
        job.missing_reasons = {"sm_active": "off in the exporter's default set"}
        job.missing_signals = ["sm_active", "pipe_tensor_active"]
        job.flops_variant = "6N+12LHQT (PaLM)"
        job.mfu_fallback = True
    seen: list[tuple[int, frozenset[str] | None]] = []

    def saved(instance: Job, update_fields: frozenset[str] | None = None, **kwargs: Any) -> None:
        seen.append((instance.pk, update_fields))

    post_save.connect(saved, sender=Job, dispatch_uid="test-batched-update")
    try:
        theirs.save(update_fields=list(columns))
        pipeline._update_columns([mine], columns)
    finally:
        post_save.disconnect(sender=Job, dispatch_uid="test-batched-update")
    assert seen == [(theirs.pk, frozenset(columns)), (mine.pk, frozenset(columns))]
    mine_row, theirs_row = Job.objects.get(pk=mine.pk), Job.objects.get(pk=theirs.pk)
    for name in columns[:-1]:
        assert getattr(mine_row, name) == getattr(theirs_row, name), name
    assert mine_row.updated_at == mine.updated_at > mine.created_at  # auto_now: set as save sets it


@pytest.mark.django_db
def test_the_batched_update_refuses_a_row_that_is_gone(make_team):
    team = make_team("llm")
    job = Job.objects.create(external_id="gone", team=team, started_at=START, gpu_count=8)
    Job.objects.filter(pk=job.pk).delete()
    job.mfu = 0.3
    with pytest.raises(Exception, match="affected 0 rows"):
        pipeline._update_columns([job], ("mfu",))


def _diagnosis(code: str, title: str, waste: float | None, windows: list[tuple[float, float]]) -> Any:
    from jobs.diagnosis import Finding as Diagnosis
    from jobs.diagnosis.base import Evidence, Severity

    return Diagnosis(
        code=code, severity=Severity.WARNING, confidence=0.8, title=title, recommendation="fix it",
        evidence=[Evidence("SM active", 0.42, "ratio")], windows=windows, missing_signals=["sm_active"],
        waste_per_day_usd=waste,
    )  # fmt: skip


@pytest.mark.django_db
def test_a_diagnosis_updates_found_codes_in_place_inserts_new_ones_and_deletes_the_rest(make_team):
    """jobs.pipeline.findings._store_findings: one read, one UPDATE, one INSERT (#26 item 2) instead of an
    update_or_create per code; the rows as update_or_create left them (pk and first_seen_at of a code
    found again kept, updated_at advanced; an incident's link to a deleted finding cleared)."""
    from django.test.utils import CaptureQueriesContext

    from jobs.models import AlertIncident, Finding
    from jobs.pipeline.findings import _store_findings

    team = make_team("llm")
    job = Job.objects.create(external_id="f-1", team=team, started_at=START, gpu_count=8)
    first = _store_findings(
        job, [_diagnosis("launch_overhead", "old", 10.0, []), _diagnosis("idle_gpus", "i", None, [])]
    )
    kept, gone = (Finding.objects.get(job=job, code=c) for c in ("launch_overhead", "idle_gpus"))
    assert (
        [f.pk for f in first] == [kept.pk, gone.pk] and kept.title == "old" and gone.waste_per_day_usd is None
    )
    incident = AlertIncident.objects.create(
        rule="gpus_idle",
        job=job,
        team=team,
        started_at=START,
        opened_at=START,
        last_seen_at=START,
        finding=gone,
    )
    found = [
        _diagnosis("throttling", "hot", 3.456, [(1.0, 2.0)]),
        _diagnosis("launch_overhead", "new", 12.349, [(5.0, 9.0)]),
    ]
    with CaptureQueriesContext(connection) as ctx:
        second = _store_findings(job, found)
    writes = [q["sql"].split()[0] for q in ctx.captured_queries]
    assert writes.count("UPDATE") == 2 and writes.count("INSERT") == 1  # the kept row; the incident's link
    assert [f.code for f in second] == ["throttling", "launch_overhead"] and second[1].pk == kept.pk
    rows = {f.code: f for f in Finding.objects.filter(job=job)}
    assert set(rows) == {"throttling", "launch_overhead"}
    again = rows["launch_overhead"]
    assert (
        again.pk == kept.pk
        and again.first_seen_at == kept.first_seen_at
        and again.updated_at > kept.updated_at
    )
    assert again.title == "new" and again.waste_per_day_usd == 12.34  # cents rounded down, as before
    assert (again.window_start.timestamp(), again.window_end.timestamp()) == (5.0, 9.0)
    assert again.windows == [[5.0, 9.0]] and again.evidence == [
        {"label": "SM active", "value": 0.42, "unit": "ratio"}
    ]
    assert rows["throttling"].missing_signals == ["sm_active"] and rows["throttling"].severity == "warning"
    incident.refresh_from_db()
    assert incident.finding_id is None  # on_delete=SET_NULL, as the queryset delete did


def test_the_store_keeps_full_collections_off_older_objects_and_hands_them_back(monkeypatch):
    import gc

    assert gc.get_freeze_count() == 0
    with pipeline._collect_young_only():
        frozen = gc.get_freeze_count()
        assert frozen > 0  # what existed before is out of the collector's generations meanwhile
        assert gc.collect() >= 0  # collections still run, on what was made meanwhile
    assert gc.get_freeze_count() == 0  # handed back
    gc.freeze()  # someone else's freeze (a preloading server): left as it is
    try:
        # Neither frozen again nor handed back: the count itself is no witness (a frozen object that is
        # freed leaves the permanent generation, so it can fall by a few meanwhile), the calls are.
        calls: list[str] = []
        with monkeypatch.context() as patch:
            patch.setattr(gc, "freeze", lambda: calls.append("freeze"))
            patch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
            with pipeline._collect_young_only():
                assert gc.get_freeze_count() > 0
        assert calls == []
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


@pytest.mark.django_db
def test_the_whole_cycle_runs_with_the_older_objects_frozen_and_hands_them_back(monkeypatch, local_cache):  # noqa: F811
    import gc

    seen: list[int] = []

    def body(client: Any, now: Any, **options: Any) -> dict[str, Any]:
        seen.append(gc.get_freeze_count())
        with pipeline._collect_young_only():  # the store's own use inside the cycle: left as it is
            seen.append(gc.get_freeze_count())
        return {"duration_s": 0.1, "jobs": 0, "stale": 0, "requests": 0}

    monkeypatch.setattr(pipeline, "_poll_cycle", body)
    pipeline.poll_cycle(object(), now=START)  # type: ignore[arg-type]
    assert seen[0] > 0 and seen[1] == seen[0]
    assert gc.get_freeze_count() == 0
