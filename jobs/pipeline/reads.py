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
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

import numpy as np
from django.conf import settings
from django.db.models import Count

from jobs.evaluation.cycle import CycleContext, RecentThroughput
from jobs.evaluation.load import DEFAULT_STEP_S, Readings, ThroughputRead
from jobs.evaluation.mig import mig_instances_of
from jobs.evaluation.schema import DERIVED_THROUGHPUT
from jobs.evaluation.sharing import Neighbours, look_up
from jobs.metrics.grid_read import read_on_grid
from jobs.metrics.prometheus import PrometheusClient, PrometheusError, Series, capped_timeout, summed_on_grid
from jobs.metrics.signals import JobSignals, grid
from jobs.metrics.throughput import (
    TemplateError,
    groupable,
    grouped_query,
    id_batches,
    is_free_form,
    runnable_query,
    validate_template,
)
from jobs.models import Job, ProgressSample

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


# ------------------------------------------------------------------------------ the cycle's shared reads


def template_checker(cycle: CycleContext) -> Callable[[str], str]:
    """`validate_template` (with THROUGHPUT_MAX_LOOKBACK_S) memoised for the cycle: the template, or the
    TemplateError it raised, raised again."""
    lookback = settings.THROUGHPUT_MAX_LOOKBACK_S

    def check(text: str) -> str:
        def run() -> str | TemplateError:
            try:
                return validate_template(text, max_lookback_s=lookback)
            except TemplateError as exc:
                return exc

        got = cycle.lookups.get(("template", text, lookback), run)
        if isinstance(got, TemplateError):
            raise got
        return got

    return check


def read_recent_throughput(
    client: PrometheusClient,
    jobs: Sequence[Job],
    grids: Mapping[int, np.ndarray],
    validated: Callable[[str], str] | None = None,
) -> dict[int, RecentThroughput]:
    """Each job's throughput on `grids[pk]` (its new window) for the jobs whose template is `groupable`:
    one range query per template, grid step and phase, round of nearby windows and batch of ids
    (`id_batches`), `sum by (<job label>)` split per job by its id. Other jobs (free-form staff queries,
    other templates, no template) are left out: `read_inputs` runs their own query.

    Windows differ per job (each its own `data_until`): a batch reads the union of its jobs' windows and
    each job takes its own grid; a job whose window starts more than ROUND_SPREAD_S after its round's
    first is read in another round, so a job far behind does not widen everyone's query. A failed query
    gives each of its jobs the error (as their own query would have: `load_context` reports it).
    `validated`: a memoised `validate_template` (`template_checker`)."""
    label = settings.THROUGHPUT_JOB_LABEL
    groups: dict[tuple[str, float, float], list[tuple[Job, np.ndarray]]] = defaultdict(list)
    for job in jobs:
        ts = grids.get(job.pk)
        stored = job.throughput_query or ""
        if ts is None or ts.size < 2 or not stored.strip() or is_free_form(stored):
            continue
        try:
            if validated is not None:
                template = validated(stored)
            else:
                template = validate_template(stored, max_lookback_s=settings.THROUGHPUT_MAX_LOOKBACK_S)
        except TemplateError:
            continue
        if groupable(template):
            step = float(ts[1] - ts[0])
            groups[(template, step, float(ts[0]) % step)].append((job, ts))
    out: dict[int, RecentThroughput] = {}
    for (template, step, _), members in sorted(groups.items(), key=lambda kv: kv[0]):
        members.sort(key=lambda m: float(m[1][0]))
        rounds: list[list[tuple[Job, np.ndarray]]] = []
        for member in members:
            if rounds and float(member[1][0]) - float(rounds[-1][0][1][0]) <= ROUND_SPREAD_S:
                rounds[-1].append(member)
            else:
                rounds.append([member])
        for round_ in rounds:
            by_id = {job.external_id: (job, ts) for job, ts in round_}
            for ids in id_batches(list(by_id)):
                batch = [by_id[i] for i in ids]
                lo = min(float(ts[0]) for _, ts in batch)
                hi = max(float(ts[-1]) for _, ts in batch)
                try:
                    with capped_timeout(client, settings.THROUGHPUT_QUERY_TIMEOUT_S):
                        series = client.range(grouped_query(template, label, ids), lo, hi, step)
                except PrometheusError as exc:
                    out.update({job.pk: RecentThroughput(ts, error=exc) for job, ts in batch})
                    continue
                found: dict[str, list[Series]] = defaultdict(list)
                for s in series:
                    found[s.labels.get(label, "")].append(s)
                for job, ts in batch:
                    mine = found.get(job.external_id)
                    out[job.pk] = RecentThroughput(ts, summed_on_grid(mine, ts) if mine else None)
    return out


#: Seconds between window starts beyond which `read_recent_throughput` reads jobs in separate rounds
#: (as jobs.metrics.cluster.read_cycle does for the signals).
ROUND_SPREAD_S = 900.0


def prepare_cycle(
    client: PrometheusClient, jobs: Sequence[Job], fresh: Mapping[int, JobSignals], now: datetime
) -> CycleContext:
    """The cycle's shared reads for `jobs`, whose new windows are the grids of `fresh` (the cycle's
    signals per job pk): MIG instances, grouped throughput, which jobs have pushed progress (one query),
    and the memo primed with the GPU models the jobs were loaded with."""
    cycle = CycleContext(now)
    for job in jobs:
        sigs = fresh.get(job.pk)
        if sigs is not None:
            cycle.recent_start[job.pk] = float(sigs.timestamps[0]) if sigs.timestamps.size else sigs.start
        if job.gpu_model_id is not None and Job.gpu_model.is_cached(job):
            cycle.lookups.put(("gpu_model", job.gpu_model_id), job.gpu_model)
    pks = [job.pk for job in jobs]
    cycle.progress = frozenset(
        ProgressSample.objects.filter(job_id__in=pks)
        .values("job_id")
        .annotate(n=Count("pk"))
        .filter(n__gte=2)
        .values_list("job_id", flat=True)
    )
    cycle.mig = mig_instances_of(client, jobs, now)
    grids = {pk: s.timestamps for pk, s in fresh.items()}
    cycle.throughput = read_recent_throughput(
        client, [j for j in jobs if j.pk not in cycle.progress], grids, template_checker(cycle)
    )
    return cycle
