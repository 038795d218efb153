"""SQL statements of a poll cycle per job, counted with CaptureQueriesContext against a real Prometheus
(#14): one archive read per job serves the summary and the alert rules, and the cycle's alert verdicts
equal the standalone evaluation's (which reads the archive itself)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.alerts import incidents
from jobs.models import AlertIncident, Job
from jobs.pipeline import poll as pipeline
from tests.prom_server import PROMETHEUS_MODULE
from tests.test_cluster_poll import START, _client, _register, local_cache, prom, sims  # noqa: F401

pytestmark = PROMETHEUS_MODULE

#: The jobs polled: a healthy one, a straggler with low MFU, one with XID errors (incidents open and stay).
JOBS = (("a1", {"hpc_job": "3001"}), ("a2", {"hpc_job": "3002"}), ("a3", {"hpc_job": "3003"}))


#: How an archive snapshot's read begins (jobs.metrics.archive.Snapshot.rows_of: one job's, or a batch's).
SNAPSHOT_READ = "SELECT job_id, signal, stat, gpu_key, step_seconds, extract(epoch from start)::float8"


def _archive_reads(queries: list[dict[str, Any]]) -> list[str]:
    """Reads of archived chunks: the per-job readers and the poll's snapshot (not the writer's)."""
    return [q["sql"] for q in queries if q["sql"].startswith(("SELECT signal, stat, gpu_key", SNAPSHOT_READ))]


@pytest.fixture
def polled(prom, sims, make_team, local_cache, settings, monkeypatch):  # noqa: F811
    """Two cycles of JOBS (the second steady), with each alert evaluation of the second one recorded:
    (job, now, snapshot, verdicts, statements)."""
    settings.PROMETHEUS_SCRAPE_INTERVAL_S = 30.0
    settings.PROMETHEUS_INGESTION_LAG_S = 60.0
    settings.ALERTS_ENABLED = True
    settings.ALERT_IDLE_MIN_GPUS = 2  # the idle-GPU count: the rules read per-GPU rows too
    team = make_team("llm")
    for key, labels in JOBS:
        _register(sims[key], team, labels=labels)
    client = _client(prom)
    pipeline.poll_cycle(client, now=START + timedelta(minutes=40))
    recorded: list[tuple[Job, Any, Any, dict[str, Any], int]] = []
    real = incidents.evaluate_job

    def recording(job: Job, now: Any = None, *, archived: Any = None, cycle: Any = None) -> Any:
        with CaptureQueriesContext(connection) as ctx:
            verdicts = real(job, now, archived=archived, cycle=cycle)
        recorded.append((job, now, archived, verdicts, len(ctx.captured_queries)))
        return verdicts

    monkeypatch.setattr(incidents, "evaluate_job", recording)
    with CaptureQueriesContext(connection) as ctx:
        pipeline.poll_cycle(client, now=START + timedelta(minutes=45))  # new minutes (and MFU) in the window
    monkeypatch.setattr(incidents, "evaluate_job", real)
    return recorded, ctx.captured_queries


@pytest.mark.django_db
def test_the_cycles_alert_rules_read_no_archive_and_give_the_standalone_verdicts(polled):
    recorded, _ = polled
    assert len(recorded) == len(JOBS)
    assert AlertIncident.objects.filter(resolved_at__isnull=True).exists()  # the rules have work to do
    for job, now, snapshot, verdicts, _ in recorded:
        assert snapshot is not None
        fresh = Job.objects.select_related("gpu_model").get(pk=job.pk)  # after the cycle's derived write
        configs = incidents.rule_configs()
        mine = incidents.job_view(fresh, now, configs, snapshot)
        theirs = incidents.job_view(fresh, now, configs)
        assert set(mine.series) == set(theirs.series)
        for line, series in mine.series.items():
            np.testing.assert_array_equal(series.timestamps, theirs.series[line].timestamps, err_msg=line)
            np.testing.assert_array_equal(series.values, theirs.series[line].values, err_msg=line)
        assert mine.idle_gpus_now == theirs.idle_gpus_now is not None
        open_before = set(AlertIncident.objects.filter(job=fresh, resolved_at__isnull=True).values_list(
            "rule", "started_at", "title"))  # fmt: skip
        # The standalone evaluation (the sweep's) on the same data: the same verdicts, no incident changes.
        with CaptureQueriesContext(connection) as standalone:
            assert incidents.evaluate_job(fresh, now) == verdicts
        open_after = set(AlertIncident.objects.filter(job=fresh, resolved_at__isnull=True).values_list(
            "rule", "started_at", "title"))  # fmt: skip
        assert open_after == open_before
        # Standalone it reads the archive twice (the recent aggregates, the latest per-GPU GPU_UTIL).
        assert len(_archive_reads(standalone.captured_queries)) == 2


@pytest.mark.django_db
def test_the_cycles_alert_rules_issue_three_fewer_statements_than_the_standalone_path(polled):
    recorded, _ = polled
    for job, now, snapshot, _, _ in recorded:
        fresh = Job.objects.select_related("gpu_model").get(pk=job.pk)
        with CaptureQueriesContext(connection) as cycle_path:
            incidents.evaluate_job(fresh, now, archived=snapshot)
        with CaptureQueriesContext(connection) as standalone:
            incidents.evaluate_job(fresh, now)
        assert _archive_reads(cycle_path.captured_queries) == []
        # Standalone (the sweep's path) also reads the poll cycle's heartbeat: a stalled poller holds
        # ingestion_stale there (jobs.runtime.service_health); right after a poll the job was just polled.
        assert len(standalone.captured_queries) - len(cycle_path.captured_queries) == 3


@pytest.mark.django_db
def test_a_steady_cycle_reads_its_jobs_archives_and_alert_look_ups_once_and_writes_only_changed_columns(
    polled,
):
    recorded, queries = polled
    n = len(JOBS)
    sql = [q["sql"] for q in queries]
    # The jobs' archive snapshots in one read for the batch (#26 item 2), none by the summary or the rules.
    assert len(_archive_reads(queries)) == 1
    assert all(snapshot is not None for _, _, snapshot, _, _ in recorded)
    updates = [s for s in sql if s.startswith('UPDATE "jobs_job" SET')]
    assert len(updates) == n  # one UPDATE per job: no separate diagnosed_at update
    assert not any('"external_id" =' in s for s in updates)  # only the columns the poll changed
    assert not any(s.startswith('SELECT "jobs_gpumodel"') for s in sql)  # fetched with the locked row
    assert sum("pg_advisory_xact_lock" in s for s in sql) <= 2  # one per archive write, not per job
    # The alert rules' look-ups, once for the cycle's jobs: the open incidents and the findings in one
    # query each (a job diagnosed in this cycle reads its own new findings), the active baselines' stats
    # in at most one (none without a config fingerprint), never one per job.
    assert len([s for s in sql if s.startswith('SELECT "jobs_alertincident"')]) == 1
    diagnosed = Job.objects.filter(diagnosed_at=START + timedelta(minutes=45)).count()
    finding_reads = [s for s in sql if s.startswith('SELECT "jobs_finding"."job_id" AS "job_id"')]
    own_reads = [s for s in sql if s.startswith('SELECT "jobs_finding"."code" AS "code"')]
    assert len(finding_reads) == 1 and len(own_reads) == diagnosed
    assert not any(s.startswith('SELECT "jobs_baseline"."stats"') for s in sql)
    assert len([s for s in sql if s.startswith('SELECT "jobs_baseline"."team_id"')]) <= 1
    per_job = sorted(stmts for *_, stmts in recorded)
    print(f"statements in the cycle: {len(sql)} for {n} jobs; alert evaluations: {per_job}")
    print(Counter(" ".join(x.split())[:80] for x in sql).most_common())


def _steady_statements(client: Any, at: Any) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        pipeline.poll_cycle(client, now=at)
    return [q["sql"] for q in ctx.captured_queries]


def _savepoint(sql: str) -> bool:
    # The test's transaction turns each job's atomic block into SAVEPOINT / RELEASE; a deployment's
    # BEGIN / COMMIT never pass through the statement log.
    return sql.startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))


@pytest.mark.django_db
def test_a_steady_cycles_statements_grow_by_a_savepoint_per_added_job_not_a_lock_and_update(
    prom,  # noqa: F811
    sims,  # noqa: F811
    make_team,
    local_cache,  # noqa: F811
    settings,
):
    """#26 item 2: the cycle's reads for its jobs (archive snapshots, open incidents, findings, baselines)
    do not grow with the jobs, nor does the lock of their rows (one SELECT ... FOR UPDATE per batch) or
    their update (one UPDATE per set of changed columns); what does is each job's savepoint pair (one
    job's failure rolls back that job only). Three jobs on the same series do the same work."""
    settings.PROMETHEUS_SCRAPE_INTERVAL_S = 30.0
    settings.PROMETHEUS_INGESTION_LAG_S = 60.0
    settings.ALERTS_ENABLED = True
    team = make_team("llm")
    client = _client(prom)
    _register(sims["a2"], team, labels={"hpc_job": "3002"}, external_id="s-0")
    pipeline.poll_cycle(client, now=START + timedelta(minutes=40))
    one = _steady_statements(client, START + timedelta(minutes=45))
    for i in (1, 2, 3):
        _register(sims["a2"], team, labels={"hpc_job": "3002"}, external_id=f"s-{i}")
    pipeline.poll_cycle(client, now=START + timedelta(minutes=50))  # the new jobs' first poll
    four = _steady_statements(client, START + timedelta(minutes=55))
    assert Job.objects.filter(status=Job.Status.RUNNING, ingest_error="").count() == 4
    assert AlertIncident.objects.filter(resolved_at__isnull=True).count() >= 4  # the rules have work
    added = 3
    # Statement shapes: their beginning, before any literal value (the cycles' times differ).
    growth = Counter(" ".join(s.split())[:40] for s in four if not _savepoint(s))
    growth.subtract(Counter(" ".join(s.split())[:40] for s in one if not _savepoint(s)))
    grown = {shape: n for shape, n in growth.items() if n > 0}
    per_job = sum(grown.values()) / added
    print(f"statements: {len(one)} for 1 job, {len(four)} for 4; grown per added job: {grown}")
    # Each job's savepoint pair, and one pair around each UPDATE of a set of changed columns.
    updates = [s for s in four if s.startswith('UPDATE "jobs_job" SET')]
    assert sum(map(_savepoint, four)) - sum(map(_savepoint, one)) <= 2 * added + 2 * (len(updates) - 1)
    assert len(updates) <= 2  # the first-polled job's columns, and the three others' (the same set)
    selects = ('SELECT "jobs_job"."id"', "SELECT count(pg_advisory_xact_lock")  # rows; the archive write's
    assert [s[:60] for s in four if s.startswith(selects)] == [s[:60] for s in one if s.startswith(selects)]
    assert sum("FOR UPDATE" in s for s in four if s.startswith(selects)) == 1  # the batch's rows, at once
    # Beyond the savepoints: the refresh of each job's open incidents, and at most one UPDATE more.
    refreshes = {s: n for s, n in grown.items() if s.startswith('UPDATE "jobs_alertincident"')}
    assert sum(grown.values()) - sum(refreshes.values()) <= 1, grown
    assert all(shape.startswith('UPDATE "jobs_job" SET') for shape in set(grown) - set(refreshes)), grown
    assert per_job >= 1.0  # the rules have work (the incidents' refreshes): the count is not vacuous
