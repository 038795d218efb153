"""Loading the demo (``manage.py load_demo``): `load` simulates the planned jobs, backfills their metrics
into Prometheus' TSDB with promtool and registers them; `finish`, once Prometheus serves the blocks, waits
for the live exporter's data, ingests, attaches the traces, promotes healthy history to baselines and
diagnoses again."""

from __future__ import annotations

import io
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from jobs.demo.cluster import HOST_SYNC_JOB, engine_series, ensure_people, plan, register, simulate_job
from jobs.demo.live import LIVE_SPECS_FILE, SERVING_KEY
from jobs.demo.traces import SEED_TRACES, host_sync_trace
from jobs.evaluation.baselines import SYSTEM, promote
from jobs.intake.artifacts import parse_artifact, store_upload
from jobs.metrics.ingest import prometheus_client
from jobs.metrics.prometheus import PrometheusClient, PrometheusError
from jobs.models import Finding, Job
from jobs.pipeline.findings import run_diagnosis
from jobs.pipeline.poll import ingest_once
from jobs.simulate import SimResult, backfill, openmetrics_lines, vllm

BACKFILL_TIMEOUT_S = 1800.0


#: Progress lines: one per this many jobs backfilled (promtool is most of `load`'s minutes).
PROGRESS_EVERY_JOBS = 10


Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


def backfill_results(
    results: list[SimResult],
    tsdb_dir: Path,
    progress: Progress = _quiet,
    engines: Mapping[str, vllm.EngineSeries] | None = None,
) -> None:
    """Write the jobs' series as TSDB blocks into `tsdb_dir` with promtool, all or nothing. A model
    server's engine counters (`engines`, by job id) go into its job's file: its series, as Prometheus
    stores them, are its GPUs' and its engine's (no training token counter)."""
    tsdb_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        # Blocks are written to a staging directory and moved into tsdb_dir only once every job's
        # backfill succeeded: an interrupted run must not leave blocks behind, since a rerun simulates
        # the same series at a slightly different `now` and the two would interleave (counter resets
        # everywhere: rate() and so MFU many times too high).
        staging = Path(tmp) / "blocks"
        # One OpenMetrics file per job: promtool (2.42 has no --max-block-duration) parses its whole
        # input once per 2 h block it writes, so one file of six weeks (550 MB) costs 504 passes over
        # 550 MB; per job it is each job's own blocks over its own samples. Overlapping blocks of
        # jobs that ran at the same time are merged by Prometheus.
        for i, result in enumerate(results):
            path = Path(tmp) / f"demo-{i}.om"
            engine = (engines or {}).get(str(result.spec.job_id))
            with path.open("w", encoding="utf-8") as fh:
                for line in openmetrics_lines([result], throughput=engine is None):
                    if engine is not None and line == "# EOF\n":
                        fh.writelines(vllm.openmetrics_lines(engine))
                    fh.write(line)
            # The limit only stops a hung promtool (a busy machine makes it slow, not stuck).
            backfill(path, staging, timeout_s=BACKFILL_TIMEOUT_S)
            path.unlink()
            done = i + 1
            if done % PROGRESS_EVERY_JOBS == 0 or done == len(results):
                progress(f"backfill: {done}/{len(results)} jobs written")
        for block in staging.iterdir():
            shutil.move(block, tsdb_dir / block.name)


def load(
    tsdb_dir: Path, state_dir: Path, now: datetime | None = None, progress: Progress = _quiet
) -> dict[str, Any]:
    """Create people and jobs, backfill their metrics into `tsdb_dir`; idempotent (skips loaded jobs).

    The running jobs are simulated and backfilled last, up to the moment just before their own backfill
    (not the start of `load`): the minutes the history takes to backfill are not a hole in their data.
    """
    began = time.monotonic()
    now = now or datetime.now(UTC)
    teams = ensure_people()
    planned = plan(now)
    known = set(
        Job.objects.filter(external_id__in=[d.spec.job_id for d in planned]).values_list(
            "external_id", flat=True
        )
    )
    new = [d for d in planned if d.spec.job_id not in known]
    ended = [d for d in new if d.ended]
    running = [d for d in new if not d.ended]
    if new:
        progress(f"simulate: {len(ended)} ended jobs")
        results = [simulate_job(d, now) for d in ended]
        progress(f"backfill: {len(ended)} ended jobs into {tsdb_dir}")
        backfill_results(results, tsdb_dir, progress)
        # `now` moved on while the history was backfilled (minutes on a busy machine).
        live_until = now + timedelta(seconds=time.monotonic() - began)
        progress(f"simulate and backfill: {len(running)} running jobs up to {live_until:%H:%M:%S} UTC")
        live_results = [simulate_job(d, live_until) for d in running]
        engines = {d.spec.job_id: e for d in running if d.spec.job_id and (e := engine_series(d, live_until))}
        if engines:  # the model server's engine counters go with its GPUs' series
            backfill_results(live_results, tsdb_dir, progress, engines=engines)
        else:
            backfill_results(live_results, tsdb_dir, progress)
        progress(f"register: {len(new)} jobs")
        for demo, result in zip([*ended, *running], [*results, *live_results], strict=True):
            register(demo, result, teams, now)
    live = [
        asdict(d.spec)
        | {"disabled": sorted(d.spec.disabled)}
        | ({SERVING_KEY: asdict(d.serving)} if d.serving is not None else {})
        for d in planned
        if not d.ended
    ]  # step-level (workload) jobs have all ended: live specs stay plain JSON
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / LIVE_SPECS_FILE).write_text(json.dumps(live, indent=1))
    return {"jobs_created": len(new), "jobs_existing": len(known), "live_jobs": len(live)}


#: How long `finish` waits for Prometheus to scrape the simulated exporter before its first poll.
LIVE_WAIT_S = 180.0


def live_data_until(
    client: PrometheusClient, job_ids: list[str], pods: Mapping[str, str] | None = None
) -> dict[str, float]:
    """The newest GPU_UTIL sample Prometheus holds for each running demo job (Unix s; absent = none in
    Prometheus' 5 min lookback). `pods` maps a job labelled by Kubernetes (the model server) to the pod its
    GPUs' series carry instead of hpc_job."""
    pods = dict(pods or {})
    out: dict[str, float] = {}
    # Demo ids and pod names: letters, digits and '-', nothing a regex would read specially.
    ids = "|".join(j for j in job_ids if j not in pods)
    if ids:
        query = f'max by (hpc_job) (timestamp(DCGM_FI_DEV_GPU_UTIL{{hpc_job=~"{ids}"}}))'
        out |= {s.labels.get("hpc_job", ""): s.value for s in client.instant(query)}
    if pods:
        by_pod = {pod: job for job, pod in pods.items()}
        query = f'max by (pod) (timestamp(DCGM_FI_DEV_GPU_UTIL{{pod=~"{"|".join(sorted(by_pod))}"}}))'
        out |= {
            by_pod[s.labels["pod"]]: s.value for s in client.instant(query) if s.labels.get("pod") in by_pod
        }
    return out


def wait_for_live_data(
    client: PrometheusClient,
    job_ids: list[str],
    since: float,
    timeout_s: float = LIVE_WAIT_S,
    progress: Progress = _quiet,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
    pods: Mapping[str, str] | None = None,
) -> bool:
    """Wait until Prometheus holds a sample newer than `since` for every running demo job, i.e. it has
    scraped the simulated exporter since `finish` began; True when it has, False after `timeout_s`.

    Why (issue 28 item 3): the running jobs' backfilled data ends when `load` wrote it; a poll before the
    exporter is scraped sees data minutes old, and the demo opened with "Ingestion stale" alerts."""
    deadline = clock() + timeout_s
    while True:
        try:
            latest = live_data_until(client, job_ids, pods)
        except PrometheusError as exc:
            latest, error = {}, str(exc)
        else:
            error = ""
        behind = [j for j in job_ids if latest.get(j, 0.0) < since]
        if not behind:
            return True
        if clock() >= deadline:
            progress(
                f"live data: Prometheus has not scraped {', '.join(behind)} from the simulated exporter "
                f"in {timeout_s:.0f} s{f' ({error})' if error else ''}; is the web server running with "
                "DEMO_STATE_DIR? Their first poll reads the backfilled data only"
            )
            return False
        sleep(5.0)


def attach_traces(progress: Progress = _quiet) -> int:
    """Upload and parse each demo trace (the host-sync job's, every seed run's) once; returns how many
    were attached now."""
    attached = 0
    makers: dict[str, Callable[[float], bytes]] = {
        HOST_SYNC_JOB: lambda _start: host_sync_trace(),
        **SEED_TRACES,
    }
    for job_id, make in makers.items():
        job = Job.objects.filter(external_id=job_id).first()
        if job is None or job.artifacts.exists():
            continue
        doc = make(job.started_at.timestamp() + 1800.0)
        artifact = store_upload(job, io.BytesIO(doc), filename="rank0.pt.trace.json", parse=False)
        parse_artifact(artifact.pk)
        attached += 1
    progress(f"traces: {attached} attached and parsed")
    return attached


def finish(
    progress: Progress = _quiet, *, wait_live_s: float = LIVE_WAIT_S, client: PrometheusClient | None = None
) -> dict[str, Any]:
    """After Prometheus has loaded the demo blocks (and, in `make demo`, the web server serving the
    simulated exporter has started): wait until the running jobs' data is being scraped, ingest everything,
    attach the profiler traces, promote the healthy history runs to baselines, and diagnose again so every
    finding code appears somewhere."""
    began = time.time()
    client = client or prometheus_client()
    running = list(
        Job.objects.filter(registered_by=Job.Provenance.DEMO, status=Job.Status.RUNNING)
        .order_by("external_id")
        .values_list("external_id", "selector")
    )
    live = [job_id for job_id, _ in running]
    # The model server's GPUs are found by its pod (Kubernetes labels), the others' by hpc_job.
    pods = {job_id: str(sel["pod"]) for job_id, sel in running if isinstance(sel, dict) and sel.get("pod")}
    caught_up = True
    if live and wait_live_s > 0:
        progress(f"live data: waiting for Prometheus to scrape {len(live)} running jobs")
        if pods:
            caught_up = wait_for_live_data(client, live, began, wait_live_s, progress, pods=pods)
        else:
            caught_up = wait_for_live_data(client, live, began, wait_live_s, progress)
    progress("ingest: polling running jobs and finalizing ended ones")
    report = ingest_once(client)
    progress(
        f"ingest: polled {len(report['polled'])}, finalized {len(report['finalized'])}, "
        f"stale {len(report['stale'])}"
    )
    attach_traces(progress)
    promoted = 0
    for candidate in Job.objects.filter(external_id__startswith="demo-h", status=Job.Status.FINALIZED):
        healthy = (
            candidate.mfu is not None
            and candidate.mfu >= 0.4
            and not candidate.findings.exclude(severity=Finding.Severity.INFO).exists()
        )
        if healthy and not candidate.baselines.exists():
            promote(candidate, SYSTEM)
            promoted += 1
    progress(f"baselines: {promoted} runs promoted")
    for other in Job.objects.filter(external_id__startswith="demo-h"):
        run_diagnosis(other)
    progress("diagnosis: history re-diagnosed against the baselines")
    return {**report, "baselines_promoted_runs": promoted, "live_caught_up": caught_up}
