"""What one evaluation reads from the floors below, read by the driver before it hands plain data to
jobs.evaluation (issue 27 item 2): the grid the evaluation runs on and the job's throughput (pushed
progress; else its PromQL, from Prometheus or, without a client, as the last poll archived it).
`load_context` takes these `Readings` instead of calling jobs.metrics mid-way, so each trigger reads,
then evaluates, then stores.

The order inside `read_inputs` is the data's: what the job and its last evaluation say (progress, the
query, whether the archive holds that query's earlier values) first, then the reads from Prometheus and
the archive."""

from __future__ import annotations

import logging
from datetime import datetime

import numpy as np
from django.conf import settings

from jobs.evaluation.cycle import CycleContext
from jobs.evaluation.load import DEFAULT_STEP_S, Readings, ThroughputRead, template_checker
from jobs.evaluation.schema import DERIVED_THROUGHPUT
from jobs.evaluation.sharing import Neighbours, look_up
from jobs.metrics.grid_read import read_on_grid
from jobs.metrics.prometheus import PrometheusClient, PrometheusError
from jobs.metrics.signals import JobSignals, grid
from jobs.metrics.throughput import runnable_query
from jobs.models import Job

log = logging.getLogger(__name__)

#: Why a job has no PromQL throughput when its query returned nothing (`.format(query)`). The evaluation
#: notes it as "no throughput: <this>", which is how a later poll knows the archive holds no values of
#: that query (`_archived_claim`).
NO_SERIES = "the throughput query returned no series in the job's window: {}"
#: The throughput source of a PromQL series (`.format(query)`), as the evaluation records it.
PROMQL_SOURCE = "PromQL: {}"


def read_inputs(
    job: Job,
    sigs: JobSignals | None,
    client: PrometheusClient | None,
    now: datetime,
    neighbours: Neighbours | None = None,
    cycle: CycleContext | None = None,
) -> Readings:
    """The grid `job` is evaluated on (the signals' own, else its window at DEFAULT_STEP_S) and its
    throughput on that grid, in order: pushed progress (two points or more), the job's PromQL expression
    (from Prometheus when a client is given, else from the series the last poll archived), nothing (the
    evaluation then falls back to profiler step times, or says why: `reason`). A failed query is kept as
    `failed` with the error, not raised: the evaluation goes on without throughput.

    In a poll cycle (`cycle`), the PromQL part reads only the job's new window (the cycle's grouped read,
    else the job's own query over that window) and takes the earlier part of the grid from the archived
    derived series (jobs.metrics.grid_read); what it had to read in full is recorded in `cycle.repairs`
    for the cycle to archive.

    The sharing look-up (the other jobs on its GPUs, MIG instances, the ownership rule's answer:
    jobs.evaluation.sharing.look_up) comes with them; `neighbours`: the cycle's sharing index, and the
    cycle's MIG instances, used where they cover the job."""
    end = min(job.ended_at or now, now)
    points = _progress(job, cycle)
    spliced = cycle is not None and job.pk in cycle.recent_start
    last_source, no_series_notes = _archived_claim(job) if spliced else (None, frozenset[str]())
    sharing = look_up(job, client, now, neighbours, cycle.mig if cycle is not None else None)
    runnable = None
    if len(points) < 2:
        # The PromQL the server runs for the job: its template expanded with the job's own matchers, or
        # staff's free-form query; None with the reason for an unmarked free-form one. In a cycle each
        # distinct template is parsed once.
        runnable = runnable_query(
            job.throughput_query or "",
            job.external_id,
            job_label=settings.THROUGHPUT_JOB_LABEL,
            max_lookback_s=settings.THROUGHPUT_MAX_LOOKBACK_S,
            validated=template_checker(cycle) if cycle is not None else None,
        )
    if sigs is not None:
        ts, step = sigs.timestamps, float(sigs.step)
    else:
        ts, step = grid(job.started_at.timestamp(), end.timestamp(), DEFAULT_STEP_S), float(DEFAULT_STEP_S)
    if runnable is None:
        times = np.array([p[0].timestamp() for p in points])
        tokens = np.array([float(p[1]) for p in points])
        return Readings(ts, step, end, sharing, ThroughputRead(progress=(times, tokens)))
    throughput = ThroughputRead(reason=runnable.reason)
    query = runnable.query
    if query and client is not None and ts.size:
        read_step = float(ts[1] - ts[0]) if ts.size > 1 else float(DEFAULT_STEP_S)
        since = earlier = recent = None
        if cycle is not None and spliced:
            since = cycle.recent_start[job.pk]
            recent = cycle.throughput.get(job.pk)
            # What the archive holds of this query before the new window: its values when the last
            # evaluation's throughput was this query's (each poll archives the series it evaluated on), none
            # when that query returned no series then; otherwise (a changed template, a failed query, another
            # source in between) nothing to vouch for, and the whole window is read.
            if last_source == PROMQL_SOURCE.format(query):
                archived = sigs.get(DERIVED_THROUGHPUT) if sigs is not None else None
                earlier = archived.mean if archived is not None else None
            elif f"no throughput: {NO_SERIES.format(query)}" in no_series_notes:
                earlier = np.full(ts.size, np.nan)  # nothing then: only the new window can hold a value
        try:
            got = read_on_grid(
                client, query, ts, read_step, timeout_s=settings.THROUGHPUT_QUERY_TIMEOUT_S,
                since=since, earlier=earlier, recent=recent,
            )  # fmt: skip
        except PrometheusError as exc:
            log.warning("job %s: throughput query failed: %s", job.external_id, exc)
            throughput = ThroughputRead(reason=f"the throughput query failed: {exc}", failed=True)
        else:
            if cycle is not None and got.repair is not None:
                cycle.repairs[job.pk] = (*got.repair, read_step)
            if got.values is not None:
                throughput = ThroughputRead(values=got.values, source=PROMQL_SOURCE.format(query))
            else:
                throughput = ThroughputRead(reason=NO_SERIES.format(query))
    elif query and client is None and sigs is not None:
        archived = sigs.get(DERIVED_THROUGHPUT)
        if archived is not None and archived.mean is not None and np.isfinite(archived.mean).any():
            source = f"{PROMQL_SOURCE.format(query)} (as archived by the last poll)"
            throughput = ThroughputRead(values=archived.mean, source=source)
    return Readings(ts, step, end, sharing, throughput)


def _progress(job: Job, cycle: CycleContext | None) -> list[tuple[datetime, float]]:
    """The job's pushed progress points (time, tokens), oldest first; none when the cycle's one look-up
    found fewer than two for it."""
    if cycle is not None and cycle.progress is not None and job.pk not in cycle.progress:
        return []
    return list(job.progress.order_by("timestamp").values_list("timestamp", "tokens"))


def _archived_claim(job: Job) -> tuple[str | None, frozenset[str]]:
    """What the job's last evaluation says of its throughput: the source it was read from, and its notes
    (one says so when a query returned no series)."""
    evaluated = job.evaluated
    if evaluated is None:
        return None, frozenset()
    return evaluated.variants.get("throughput"), frozenset(evaluated.notes)
