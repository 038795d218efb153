"""The pipeline for new data: a poll of a running job (one job, or the cluster-wide cycle) and the finalize of
an ended one. Each reads through jobs.metrics.ingest / jobs.metrics.cluster, archives (jobs.metrics.archive),
then runs the pipeline's steps: evaluate and store (`steps.evaluate_and_store`), archive the derived series,
diagnose (jobs.pipeline.findings; a running job every DIAGNOSE_RUNNING_EVERY) and, after a poll, the alert
rules
(jobs.alerts.incidents). Prometheus down: the job keeps its archive and `ingest_error` says why."""

from __future__ import annotations

import gc
import logging
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import DatabaseError, connection, transaction
from django.db.models import Field
from django.db.models.signals import post_save, pre_save
from django.utils import timezone

from jobs.alerts import incidents as alerts
from jobs.evaluation.cycle import CycleContext
from jobs.evaluation.sharing import Neighbours
from jobs.metrics import archive, cluster
from jobs.metrics.ingest import (
    POLL_PER_GPU_STEP_S,
    POLL_STEP_S,
    READ_ERRORS,
    archive_cycle,
    cycle_target,
    derived_since,
    ended_jobs,
    energy_due,
    energy_total,
    host_join,
    job_selector,
    mark_stale,
    poll_window,
    prometheus_client,
    read_finalize,
    read_poll,
    record_missing,
    running_jobs,
    settled_data_until,
)
from jobs.metrics.prometheus import PrometheusClient, PrometheusError
from jobs.metrics.signals import JobSignals
from jobs.models import Job, JobSeries
from jobs.pipeline import shards
from jobs.pipeline.discovery import discover
from jobs.pipeline.findings import run_diagnosis
from jobs.pipeline.reads import prepare_cycle
from jobs.pipeline.steps import evaluate_and_store
from jobs.runtime import locks, service_health

log = logging.getLogger(__name__)

DIAGNOSE_RUNNING_EVERY = timedelta(minutes=10)
#: The Django cache key of the last cycle's figures (read by /metrics): finished_at (Unix s), duration_s,
#: requests (to Prometheus), jobs (polled), stale (jobs left with an ingest error).
POLL_CYCLE_CACHE_KEY = "efficiency:poll_cycle"
#: The cycle's lock (jobs.runtime.locks.named_lock): one cycle at a time across workers.
LOCK_KEY = "efficiency:poll_cycle_lock"


def poll_job(job: Job, client: PrometheusClient | None = None, now: datetime | None = None) -> Job:
    """Archive a running job's new data (idempotent) and recompute its summary; records failures.

    The per-job path: `poll_cycle` reads all groupable jobs at once and uses this for the others."""
    client = client or prometheus_client()
    now = now or timezone.now()
    win = poll_window(job, now)
    if win.end <= win.start:
        return job
    try:
        read = read_poll(job, client, win)
    except READ_ERRORS as exc:
        return mark_stale(job, exc, now)
    return store_poll(job, read.signals, win.end, now, client, energy_j=read.energy_j)


_KEEP = object()  # store_poll: keep the job's energy from the last read


def store_poll(
    job: Job, sigs: JobSignals, end: float, now: datetime, client: PrometheusClient | None, *,
    energy_j: object = _KEEP,
) -> Job:  # fmt: skip
    """Archive one poll's signals, re-evaluate the job and advance `data_until` to where its data has
    settled (`settled_data_until`); then the diagnosis (when due) and the alert rules.

    The per-job path (`poll_job`); the cycle stores its jobs a batch at a time (`_store_batch`), each job
    through the same `_store_locked`, with its rows archived already, its snapshot read for the batch and
    the cycle's sharing index and shared reads."""
    with transaction.atomic():
        job = _locked([job.pk])[job.pk]
        step = _store_locked(job, sigs, end, now, client, energy_j=energy_j, archived_rows=False,
                             neighbours=None, cycle=None, snapshot_rows=None)  # fmt: skip
        archive.upsert(step.derived)
        # Only the columns this poll changed (the evaluation's JSON is most of the row and often the same).
        job.save(update_fields=_changed_columns(job, step.stored))
    _after_store(step, now, None)
    return job


@dataclass
class _Stored:
    """One job stored under its row lock (`_store_locked`), not saved yet: what the rest of its poll
    needs once the row is written (its derived rows, its archive snapshot, whether the diagnosis is due)."""

    job: Job
    stored: dict[str, Any]  # the columns as locked (`_column_values`)
    snapshot: archive.Snapshot
    derived: list[Any]
    due: bool


def _locked(pks: Sequence[int]) -> dict[int, Job]:
    """Jobs `pks` with their GPU models, each row locked (`FOR UPDATE OF` the job only) in one statement,
    in pk order (two batches that share jobs lock them in the same order)."""
    query = Job.objects.select_for_update(of=("self",)).select_related("gpu_model").order_by("pk")
    found = {job.pk: job for job in query.filter(pk__in=list(pks))}
    missing = [pk for pk in pks if pk not in found]
    if missing:
        raise Job.DoesNotExist(f"jobs {missing} do not exist")
    return found


def _store_locked(
    job: Job,
    sigs: JobSignals,
    end: float,
    now: datetime,
    client: PrometheusClient | None,
    *,
    energy_j: object,
    archived_rows: bool,
    neighbours: Neighbours | None,
    cycle: CycleContext | None,
    snapshot_rows: Sequence[archive.SnapshotRow] | None,
) -> _Stored:
    """`store_poll`'s work on the locked `job` (in the caller's transaction; the row not saved)."""
    stored = _column_values(job)
    if energy_j is not _KEEP:
        job.energy_j = energy_j if isinstance(energy_j, float) else None
    if not archived_rows:
        archive.upsert(archive.rows_for(job, sigs, {}))
    # One read of the archive for the summary and the alert rules below (#14): GPU_UTIL per GPU for the
    # exact idle share; the other per-GPU rows are the bulk of the archive.
    held = snapshot_rows if archived_rows else None  # rows read before this job's write are not its own
    snapshot = archive.Snapshot(job, per_gpu=_SNAPSHOT_GPU, rows=held)
    archived = snapshot.load_job_signals(per_gpu=("gpu_util",))
    derived = evaluate_and_store(job, archived, client, neighbours, cycle=cycle)
    rows: list[Any] = []
    if archived is not None:
        rows = archive.derived_rows(*derived_since(job, archived, derived, sigs.start))
        # The rules read the archive as it is once these rows are written: their signals only.
        snapshot.merge(rows, only=alerts.RULE_SIGNALS)
    # The ingestion state after the evaluation, which does not read it: the poll's metrics-side work
    # stays together instead of interleaving with the evaluation's.
    record_missing(job, sigs)
    job.data_until = archive.utc(settled_data_until(sigs, end, now, job.data_until or job.started_at))
    job.last_polled_at = now
    job.ingest_error = ""
    due = _diagnosis_due(job, now)
    return _Stored(job, stored, snapshot, rows, due)


def _after_store(step: _Stored, now: datetime, cycle: CycleContext | None) -> None:
    """The diagnosis (when due) and the alert rules of a job whose poll is committed."""
    job = step.job
    if step.due:
        run_diagnosis(job)
    try:
        alerts.evaluate_job(job, now, archived=step.snapshot, cycle=cycle)
    except Exception:  # alerting must never fail a poll
        log.exception("job %s: alert rules failed", job.external_id)


#: The per-GPU signals a poll's archive snapshot holds (GPU_UTIL: the summary's idle share, the idle rule).
_SNAPSHOT_GPU = ("gpu_util",)


#: Jobs whose archive snapshots the cycle reads in one query (`_snapshot_rows`): a batch's rows are held
#: until its jobs are stored, so this bounds the cycle's memory as well as its statements.
SNAPSHOT_BATCH = 50


def _snapshot_rows(job_ids: list[int]) -> dict[int, list[archive.SnapshotRow]]:
    """The archive snapshot rows of a batch of the cycle's jobs, in one query (#26 item 2); none when the
    read fails (each job then reads its own)."""
    try:
        return archive.Snapshot.rows_of(job_ids, _SNAPSHOT_GPU)
    except Exception:  # a failed batch read must not fail its jobs' polls
        log.exception("poll cycle: reading the archive snapshots of %d jobs failed", len(job_ids))
        return {}


def _diagnosis_due(job: Job, now: datetime) -> bool:
    """Running jobs are re-diagnosed every DIAGNOSE_RUNNING_EVERY, not on every one-minute poll: the
    diagnosis reads the whole per-GPU archive, which for a large job costs far more than the poll.
    When due, sets `diagnosed_at` to `now` on `job` (the caller saves it with the poll's other columns,
    under the row lock, so two polls never both run it)."""
    last = job.diagnosed_at
    if last is not None and now - last < DIAGNOSE_RUNNING_EVERY:
        return False
    job.diagnosed_at = now
    return True


def _column_values(job: Job) -> dict[str, Any]:
    """The job's column values as loaded (what `_changed_columns` compares against)."""
    return {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}


def _changed_columns(job: Job, stored: dict[str, Any]) -> list[str]:
    """Columns whose value differs from `stored` (values are assigned, never mutated in place, by the
    poll), plus `updated_at` (auto_now: saved only when named)."""
    changed = [name for name, value in stored.items() if getattr(job, name) != value]
    return sorted({*changed, "updated_at"} - {"id"})


def finalize_job(job: Job, client: PrometheusClient | None = None, now: datetime | None = None) -> Job:
    """Merge an ended job's whole window, at a resolution suited to its length, into its archive; evaluate
    the merged archive and diagnose it."""
    client = client or prometheus_client()
    now = now or timezone.now()
    if job.ended_at is None:
        raise ValueError(f"job {job.external_id} has not ended")
    try:
        read = read_finalize(job, client)
    except READ_ERRORS as exc:
        return mark_stale(job, exc, now)
    sigs = read.signals
    if not sigs.signals and JobSeries.objects.filter(job=job).exists():
        # Prometheus no longer has the data (retention): keep the archive from the polls.
        job = _finish(job, now, note="Prometheus had no data for the window; kept the archive from polling")
    else:
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job.pk)
            job.energy_j = read.energy_j
            record_missing(job, sigs)
            # Merge, never replace (#13.6): chunks Prometheus no longer holds (a job longer than its
            # retention) stay as polling archived them, and the summary is of the merged archive.
            archive.upsert(archive.rows_for(job, sigs, {}))
            merged = archive.load_job_signals(job, per_gpu=("gpu_util",))
            derived = evaluate_and_store(job, merged, client)
            if merged is not None:
                archive.upsert(archive.derived_rows(job, merged, derived))
            job.data_until = job.ended_at
            job = _finish(job, now)
    run_diagnosis(job)
    return job


def _finish(job: Job, now: datetime, note: str = "") -> Job:
    if note:
        job.finalize_note = note[:300]
    job.status = Job.Status.FINALIZED
    job.finalized_at = now
    job.last_polled_at = now
    job.ingest_error = ""
    job.save()
    return job


def ingest_once(client: PrometheusClient | None = None) -> dict[str, Any]:
    """Discover unregistered jobs (when configured), poll every running job (one cycle) and finalize every
    ended one, synchronously (the `ingest --once` command)."""
    client = client or prometheus_client()
    report: dict[str, Any] = {"polled": [], "finalized": [], "stale": []}
    report["discovered"] = discover(client)["created"]
    cycle = poll_cycle(client)
    report["polled"] += cycle["polled"]
    report["stale"] += cycle["stale_jobs"]
    for job in ended_jobs():
        job = finalize_job(job, client)
        report["stale" if job.ingest_error else "finalized"].append(job.external_id)
    return report


def poll_cycle(
    client: PrometheusClient | None = None,
    now: datetime | None = None,
    *,
    shard_size: int | None = None,
    dispatch: shards.Dispatch | None = None,
) -> dict[str, Any]:
    """One poll of every running job: the groupable ones read cluster-wide (`jobs.metrics.cluster`, a
    fixed number of queries per signal), the others per job; each job archived and evaluated as
    `poll_job` does. One bad job (a stored selector that cannot be queried, an evaluation error) gets an
    `ingest_error` and never stops the cycle. Writes the cycle's figures to the cache
    (POLL_CYCLE_CACHE_KEY) and its end as the service's heartbeat (jobs.runtime.service_health). A second
    cycle while
    one runs returns at once (`skipped`). The lock has a short TTL renewed while the cycle runs
    (jobs.runtime.locks), so a worker killed mid-cycle delays the next cycle by at most POLL_CYCLE_LOCK_TTL_S.

    Sharded (#26 item 1; `shard_size` jobs per shard, default POLL_SHARD_JOBS, 0 = in this process): after
    the cluster-wide read and archive write, each batch's per-job work runs as a `poll_shard` task
    (`dispatch`, default Celery; see jobs.pipeline.shards) and the cycle waits for them under its lock;
    `shards_pending` lists the shards not done by POLL_SHARD_WAIT_S."""
    lock = locks.named_lock(LOCK_KEY, settings.POLL_CYCLE_LOCK_TTL_S)
    if not lock.acquire():
        return {"skipped": True, "polled": [], "stale_jobs": [], "jobs": 0}
    try:
        now = now or timezone.now()
        # Only the options given (the cycle's body is replaced by (client, now) stand-ins in tests).
        options: dict[str, Any] = {"shard_size": shard_size} if shard_size is not None else {}
        if dispatch is not None:
            options["dispatch"] = dispatch
        with _collect_young_only():  # the whole cycle, not only its per-job store (see there)
            report = _poll_cycle(client or prometheus_client(), now, **options)
        duration = float(report["duration_s"])
        service_health.record_cycle(
            service_health.cycle_end(now, duration),
            duration,
            {"jobs": report["jobs"], "stale": report["stale"], "requests": report["requests"]},
        )
        return report
    finally:
        lock.release()


@contextmanager
def _collect_young_only() -> Iterator[None]:
    """Keep the cyclic GC's full collections off the objects that existed before (`gc.freeze`): a cycle
    allocates many small containers (series, archive chunks, ORM rows), so full collections ran 5-7 times
    per 800-GPU cycle, each scanning the whole heap (Django, numpy, the cycle's signals): 0.28-0.29
    CPU-s of ~2.9 (the per-job store's share 0.10-0.17 of ~1.4), #26 item 2. Collections of the
    objects made meanwhile still run, and `unfreeze` hands the frozen ones back to the oldest generation.
    Used around the whole cycle and around a shard's store; nested, or when something else froze objects
    (a server preloading its app for copy-on-write), it leaves the freeze as it is."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@_collect_young_only()  # a ContextDecorator: each call freezes anew
def _store_jobs(
    client: PrometheusClient,
    now: datetime,
    jobs: dict[int, Job],
    inputs: dict[int, tuple[JobSignals, float]],
    archived_rows: bool,
    neighbours: Neighbours | None,
    shared: CycleContext | None,
) -> dict[int, Job]:
    """Store, evaluate, diagnose (when due) and alert on each job of `inputs` (its new signals and window
    end), then write their derived rows in one upsert: the cycle's per-job work, in the cycle's process or
    in one shard. One job's failure marks that job stale, never the others."""
    done: dict[int, Job] = {}
    derived: list[Any] = []
    keys = list(inputs)
    for i in range(0, len(keys), SNAPSHOT_BATCH):
        batch = keys[i : i + SNAPSHOT_BATCH]
        # The batch's archive snapshots in one query (the archive write above holds their rows).
        held = _snapshot_rows(batch) if archived_rows else {}
        stored = _store_batch(client, now, jobs, inputs, batch, archived_rows, neighbours, shared, held, done)
        for key, step in stored.items():
            derived += step.derived
            try:
                _after_store(step, now, shared)
                done[key] = step.job
            except Exception as exc:  # the diagnosis failed: the job's poll is stored, but it is stale
                log.exception("job %s: poll failed", step.job.external_id)
                done[key] = mark_stale(step.job, exc, now)
    if shared is not None:
        derived += shared.repair_rows(jobs)
    try:
        archive.upsert(derived)
    except Exception:  # the next poll writes them again (merges are idempotent)
        log.exception("poll cycle: writing the derived series failed")
    return done


def _store_batch(
    client: PrometheusClient,
    now: datetime,
    jobs: dict[int, Job],
    inputs: dict[int, tuple[JobSignals, float]],
    keys: list[int],
    archived_rows: bool,
    neighbours: Neighbours | None,
    shared: CycleContext | None,
    held: dict[int, list[archive.SnapshotRow]],
    done: dict[int, Job],
) -> dict[int, _Stored]:
    """Store a batch of the cycle's jobs in one transaction (#26 item 2): their rows locked by one
    SELECT ... FOR UPDATE, each job's work in a savepoint of its own (`_store_locked`), their columns
    written by one UPDATE per set of changed columns (`_update_rows`). A job that fails is rolled back to
    its savepoint and marked stale in `done` (after the transaction, as `store_poll`'s caller does); the
    others are returned, committed, for their diagnosis and alert rules. A worker that dies mid-batch
    leaves none of it written: the transaction commits whole or not at all."""
    failed: dict[int, Exception] = {}
    energy: dict[int, object] = {}
    for key in keys:  # Prometheus reads before any row is locked
        job = jobs[key]
        try:
            energy[key] = _KEEP
            if energy_due(job, now):
                energy[key] = energy_total(
                    client, job_selector(job), job.started_at.timestamp(), inputs[key][1]
                )
        except Exception as exc:  # one job's failure must not stop the cycle
            failed[key] = exc
    ready = [key for key in keys if key not in failed]
    stored: dict[int, _Stored] = {}
    try:
        with transaction.atomic():
            locked = _locked(ready) if ready else {}
            for key in ready:
                sigs, end = inputs[key]
                try:
                    with transaction.atomic():  # a savepoint: a failed query rolls back this job only
                        stored[key] = _store_locked(
                            locked[key], sigs, end, now, client, energy_j=energy[key],
                            archived_rows=archived_rows, neighbours=neighbours, cycle=shared,
                            snapshot_rows=held.pop(key, None),
                        )  # fmt: skip
                except Exception as exc:
                    failed[key] = exc
                    continue
                if neighbours is not None:
                    neighbours.update(stored[key].job)
            for key, error in _update_rows(list(stored.values())).items():
                del stored[key]
                failed[key] = error
    except Exception as exc:  # the lock or the commit failed: nothing of the batch was written
        failed.update({key: exc for key in ready if key not in failed})
        stored = {}
    for key in keys:
        if key in failed:
            log.error("job %s: poll failed", jobs[key].external_id, exc_info=failed[key])
            done[key] = mark_stale(jobs[key], failed[key], now)
    return stored


def _update_rows(steps: list[_Stored]) -> dict[int, Exception]:
    """Write the stored jobs' changed columns (`_changed_columns`), one UPDATE for all the jobs that
    changed the same columns (in a steady cycle, nearly all); when one fails, each of its jobs again on
    its own in a savepoint, so one bad value fails only its job. Returns the jobs that failed."""
    groups: dict[tuple[str, ...], list[Job]] = {}
    for step in steps:
        groups.setdefault(tuple(_changed_columns(step.job, step.stored)), []).append(step.job)
    failed: dict[int, Exception] = {}
    for columns, group in groups.items():
        try:
            with transaction.atomic():
                _update_columns(group, columns)
            continue
        except Exception as exc:
            if len(group) == 1:
                failed[group[0].pk] = exc
                continue
            log.warning("poll cycle: updating %d jobs at once failed (%s); one by one", len(group), exc)
        for job in group:  # the group's update failed: find the job(s) it failed on
            try:
                with transaction.atomic():
                    _update_columns([job], columns)
            except Exception as err:
                failed[job.pk] = err
    return failed


def _field(name: str) -> Field[Any, Any]:
    """Job's concrete field of attribute `name` (its column has the same name)."""
    field = Job._meta.get_field(name)
    if not isinstance(field, Field) or field.column != field.attname:
        raise ValueError(f"Job.{name} is not a column of its own name")
    return field


def _cast(field: Field[Any, Any]) -> str:
    """The type a VALUES column of `field` is cast to: its column's, less a varchar's length (also of a
    varchar array's elements): an explicit cast to varchar(n) truncates, while the assignment to the
    column refuses a value too long, as `save` does."""
    return re.sub(r"^(varchar|character varying)\(\d+\)", r"\1", str(field.db_type(connection)))


def _update_columns(group: list[Job], columns: tuple[str, ...]) -> None:
    """`job.save(update_fields=columns)` for every job of `group` in one statement (UPDATE ... FROM
    VALUES): the same values as each save would write (each field's `pre_save`, so `updated_at` is now,
    and `get_db_prep_save`), and the same pre_save / post_save signals. Without the ORM's compile of an
    UPDATE per job, most of that save's CPU (#26 item 2)."""
    fields = [_field(name) for name in columns]
    using = connection.alias
    for job in group:
        pre_save.send(sender=Job, instance=job, raw=False, using=using, update_fields=frozenset(columns))
    quote = connection.ops.quote_name
    pk = _field("id")
    casts = [_cast(pk), *(_cast(f) for f in fields)]
    row = "(" + ", ".join(f"%s::{cast}" for cast in casts) + ")"
    params: list[Any] = []
    for job in group:
        params.append(job.pk)
        params += [f.get_db_prep_save(f.pre_save(job, False), connection) for f in fields]
    key = quote(pk.attname)
    names = [quote(f.attname) for f in fields]  # the poll's columns are plain ones: attname = column
    table = quote(Job._meta.db_table)
    sql = (
        f"UPDATE {table} SET " + ", ".join(f"{n} = v.{n}" for n in names)
        + f" FROM (VALUES {', '.join([row] * len(group))}) AS v({key}, {', '.join(names)})"
        + f" WHERE {table}.{key} = v.{key}"
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        if cursor.rowcount != len(group):  # as Model.save(update_fields=...) refuses to update nothing
            raise DatabaseError(f"the update of {len(group)} jobs affected {cursor.rowcount} rows")
    for job in group:
        post_save.send(
            sender=Job, instance=job, created=False, update_fields=frozenset(columns), raw=False, using=using
        )


def _run_shards(
    inputs: dict[int, tuple[JobSignals, float]],
    archived_rows: bool,
    shared: CycleContext | None,
    now: datetime,
    size: int,
    dispatch: shards.Dispatch,
) -> tuple[dict[int, Mapping[str, list[str]]], list[int]]:
    """Store each batch's inputs, hand the batches to the workers and wait for them (under the cycle's
    heartbeat lock, at most POLL_SHARD_WAIT_S). Returns the finished shards' done markers (their polled
    and stale jobs) by shard index and the indexes of shards still pending at the deadline (they finish
    later; the next cycle re-polls what they have not stored)."""
    cycle_id = shards.new_cycle_id()
    specs = []
    for index, keys in enumerate(shards.batches(sorted(inputs), size)):
        spec = shards.ShardSpec(cycle_id, index, keys, now)
        part = {k: inputs[k] for k in keys}
        data = shards.ShardInput(part, archived_rows, shards.context_for(shared, keys))
        shards.store_input(spec, data)
        specs.append(spec)
    for spec in specs:
        dispatch(spec)
    finished, pending = shards.wait(specs, float(settings.POLL_SHARD_WAIT_S))
    if pending:
        log.warning("poll cycle: %d of %d shards not done after %.0f s", len(pending), len(specs),
                    settings.POLL_SHARD_WAIT_S)  # fmt: skip
    return finished, pending


def poll_shard(spec: shards.ShardSpec, client: PrometheusClient | None = None) -> dict[str, list[str]]:
    """Run one shard of a cycle (the `poll_shard` task): its jobs' evaluation, diagnosis and alert rules
    from the inputs the cycle stored, then its done marker. Idempotent: run twice (a redelivery after a
    worker died mid-shard), it leaves the state one run leaves. Inputs past their TTL: each job is polled
    again on its own (`poll_job`). A job a newer cycle has polled since is left alone."""
    client = client or prometheus_client()
    data = shards.load_input(spec)
    found = {j.pk: j for j in Job.objects.select_related("gpu_model").filter(pk__in=spec.job_ids)}
    # Polled by a later cycle since (this shard was redelivered late): its state is newer than ours.
    newer = {pk for pk, j in found.items() if j.last_polled_at is not None and j.last_polled_at > spec.now}
    jobs = {pk: j for pk, j in found.items() if pk not in newer and j.status == Job.Status.RUNNING}
    done: dict[int, Job] = {}
    if data is None:
        log.warning("poll shard %s/%d: inputs expired; polling its %d jobs one by one", spec.cycle_id,
                    spec.index, len(jobs))  # fmt: skip
        for key, job in jobs.items():
            try:
                done[key] = poll_job(job, client, spec.now)
            except Exception as exc:
                log.exception("job %s: poll failed", job.external_id)
                done[key] = mark_stale(job, exc, spec.now)
    else:
        inputs = {k: v for k, v in data.signals.items() if k in jobs}
        neighbours = Neighbours(list(jobs.values())) if data.archived_rows and inputs else None
        done = _store_jobs(client, spec.now, jobs, inputs, data.archived_rows, neighbours, data.context)
    polled = sorted(j.external_id for j in done.values() if not j.ingest_error)
    stale = sorted(j.external_id for j in done.values() if j.ingest_error)
    polled += sorted(found[pk].external_id for pk in newer)
    shards.mark_done(spec, polled, stale)
    return {"polled": polled, "stale": stale}


def _poll_cycle(
    client: PrometheusClient,
    now: datetime,
    *,
    shard_size: int | None = None,
    dispatch: shards.Dispatch | None = None,
) -> dict[str, Any]:
    t0 = time.monotonic()
    requests0 = client.requests
    jobs = {job.pk: job for job in running_jobs()}
    targets: list[cluster.Target] = []
    fallback: list[int] = []
    done: dict[int, Job] = {}
    for job in jobs.values():
        try:
            target = cycle_target(job, now)
        except Exception as exc:  # a stored selector the builder refuses: that job only
            done[job.pk] = mark_stale(job, exc, now)
            continue
        if target is not None:
            targets.append(target)
        else:
            done[job.pk] = job
    grouped = targets
    with_gpu = sum(t.per_gpu for t in grouped)  # jobs whose per-GPU rows this cycle reads
    scrape = settings.PROMETHEUS_SCRAPE_INTERVAL_S
    try:
        result = cluster.read_cycle(
            client, grouped, step=POLL_STEP_S, per_gpu_step=POLL_PER_GPU_STEP_S,
            scrape_interval_s=scrape, workers=cluster.CYCLE_QUERY_WORKERS, host_join=host_join(),
        )  # fmt: skip
    except PrometheusError as exc:  # discovery failed: Prometheus is down for everyone
        for t in grouped:
            done[t.key] = mark_stale(jobs[t.key], exc, now)
        result = cluster.CycleResult()
    fallback += result.fallback
    by_key = {t.key: t for t in grouped}
    for key, reason in result.errors.items():
        done[key] = mark_stale(jobs[key], RuntimeError(reason), now)
    archived_rows = archive_cycle(jobs, result.signals)
    # MIG instances, the new window's throughput (one query per template) and the price/baseline memo,
    # read once for the cycle's evaluations instead of once per job (jobs.evaluation.cycle).
    shared: CycleContext | None = None
    if result.signals:
        try:
            shared = prepare_cycle(client, [jobs[k] for k in result.signals], result.signals, now)
        except Exception:  # the evaluations then read per job, as poll_job does
            log.exception("poll cycle: the shared reads for the evaluations failed; reading per job")
    inputs = {key: (sigs, by_key[key].end) for key, sigs in result.signals.items()}
    shard_jobs = int(settings.POLL_SHARD_JOBS) if shard_size is None else shard_size
    pending: list[int] = []
    sharded: dict[str, list[str]] = {"polled": [], "stale": []}
    t_jobs = time.monotonic()
    if shard_jobs > 0 and inputs:
        # #26 item 1: the per-job work as shards on the poll queue (jobs.pipeline.shards); each shard
        # reads its own sharing look-up.
        send = dispatch or shards.send
        finished, pending = _run_shards(inputs, archived_rows, shared, now, shard_jobs, send)
        for marker in finished.values():
            sharded["polled"] += marker["polled"]
            sharded["stale"] += marker["stale"]
    else:
        # The sharing look-up of every evaluation from one read (after the archive write, which brings the
        # per-GPU keys; when it failed each job writes its own rows, so each reads its own keys).
        neighbours = Neighbours(list(jobs.values())) if archived_rows and inputs else None
        done.update(_store_jobs(client, now, jobs, inputs, archived_rows, neighbours, shared))
    per_job_s = time.monotonic() - t_jobs
    for key in fallback:
        try:
            done[key] = poll_job(jobs[key], client, now)
        except Exception as exc:
            log.exception("job %s: poll failed", jobs[key].external_id)
            done[key] = mark_stale(jobs[key], exc, now)
    stale = sorted([*(j.external_id for j in done.values() if j.ingest_error), *sharded["stale"]])
    polled = sorted([*(j.external_id for j in done.values() if not j.ingest_error), *sharded["polled"]])
    stats = {
        "finished_at": time.time(),
        "duration_s": time.monotonic() - t0,
        "requests": client.requests - requests0,
        "jobs": len(jobs),
        "stale": len(stale),
    }
    cache.set(POLL_CYCLE_CACHE_KEY, stats, None)
    return {**stats, "polled": polled, "stale_jobs": stale, "per_gpu": with_gpu, "grouped": len(grouped),
            "per_job": len(fallback), "shards_pending": pending, "per_job_s": per_job_s}  # fmt: skip
