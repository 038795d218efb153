"""One poll cycle of a simulated cluster behind a real Prometheus, in a throwaway database.

Usage (from the repository root, services started):

    .venv/bin/python benchmarks/poll_cycle.py --gpus 1000 [--cycles 6] [--mode cycle|per-job]

Builds N running jobs x 8 GPUs (one node each, `hpc_job` labels as dcgm-exporter's
`--hpc-job-mapping-dir` writes them, a default exporter's counters plus SM_ACTIVE, 30 s samples, the
exporter's label set: gpu, UUID, pci_bus_id, device, modelName, Hostname, driver version, plus the target
labels), backfills them into a throwaway Prometheus (promtool), registers the jobs as discovery would
(`{"hpc_job": id}`; `--explicit-share` of them with explicit GPU lists instead) with the simulator's
throughput query, and runs `--cycles` one-minute cycles from T0 + `--history-min` (default 10 min).
`--mode per-job` polls every job with `pipeline.poll_job`, as the fan-out before the cluster-wide cycle did
(run it on an older checkout to measure "before").

Per cycle it prints wall time, CPU split (this process = Python + the Postgres client; the Prometheus
process; the Postgres backend of this connection, when /proc shows it), Prometheus requests (DCGM signal
queries and look-ups / per-job throughput queries / per-job energy queries) and archive rows written.
Steady state is the second and later cycles. Cycle 1 reads every job's per-GPU rows (each job's first poll);
after it each cycle reads those of the fifth of the jobs whose minute it is (`ingest.per_gpu_due`): the
per-GPU column is how many jobs' rows the cycle read.
The jobs' last diagnoses are spread over the 10 minutes before cycle 1, so a tenth of them are re-diagnosed
in each cycle as in steady state (`--no-stagger-diagnosis`: all of them in cycle 1, as after a cold start).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "efficiency.settings")
os.environ.setdefault("TEST_DATABASE_NAME", "bench_poll_cycle")

import django

django.setup()

import requests  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402

T0 = 1_767_225_600.0  # jobs.simulate.DEFAULT_START: a multiple of the 2 h aggregate chunk
_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a process in seconds (None when /proc does not show it)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


class _Requests:
    """Counts HTTP requests to Prometheus by kind (wraps requests.Session.request)."""

    def __init__(self) -> None:
        self.by_kind: Counter[str] = Counter()
        original = requests.Session.request

        def request(session: requests.Session, method: str, url: str, **kwargs: Any) -> Any:
            query = str((kwargs.get("data") or {}).get("query", ""))
            if "train_tokens" in query:
                kind = "throughput"
            elif "TOTAL_ENERGY" in query and url.endswith("/api/v1/query"):
                kind = "energy"
            elif "GPU_I_ID" in query:
                kind = "mig"  # sharing's MIG instance look-ups (per job before #14's batching)
            else:
                kind = "signals"
            self.by_kind[kind] += 1
            return original(session, method, url, **kwargs)

        requests.Session.request = request  # type: ignore[method-assign]


def _simulate(jobs: int, minutes: float, seed: int) -> list[Any]:
    from jobs.metrics.signals import DEFAULT_DISABLED
    from jobs.simulate import CLUSTER_MIX, SimSpec, simulate

    names = list(CLUSTER_MIX)
    out = []
    for j in range(jobs):
        offset = 30.0 * (j % 4)  # jobs started within the first 2 minutes
        out.append(
            simulate(
                SimSpec(
                    scenario=names[j % len(names)],
                    gpus=8,
                    hosts=(f"gpu-node-{j + 1:05d}",),
                    job_id=str(60000 + j),
                    start=T0 + offset,
                    duration_s=minutes * 60.0 - offset,
                    seed=seed * 100000 + j,
                    missing_fraction=0.01,
                    disabled=DEFAULT_DISABLED - {"sm_active"},
                )
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=6)
    parser.add_argument("--mode", choices=("cycle", "per-job"), default="cycle")
    parser.add_argument("--explicit-share", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--history-min", type=int, default=10, help="job age at the first cycle (minutes)")
    parser.add_argument("--keep", help="directory to keep (and reuse) the backfilled TSDB in")
    parser.add_argument("--profile", type=int, default=0, help="cProfile this cycle (1-based), top 25")
    parser.add_argument("--profile-out", help="also write the profile's pstats to this file (pstats.Stats)")
    parser.add_argument(
        "--no-stagger-diagnosis", dest="stagger", action="store_false",
        help="every job due for its diagnosis in cycle 1 (a cold start) instead of a tenth of them per cycle",
    )  # fmt: skip
    args = parser.parse_args()

    from jobs.metrics import archive, ingest
    from jobs.metrics.prometheus import PrometheusClient
    from jobs.metrics.promserver import PrometheusProcess
    from jobs.models import Job, Team
    from jobs.pipeline import poll as pipeline
    from jobs.registry import register_job
    from jobs.simulate import backfill, registration_body, write_openmetrics

    n_jobs = max(1, args.gpus // 8)
    first = T0 + args.history_min * 60.0
    minutes = args.history_min + args.cycles + 2
    t = time.perf_counter()
    sims = _simulate(n_jobs, minutes, args.seed)
    print(f"simulated {n_jobs} jobs x 8 GPUs, {minutes} min: {time.perf_counter() - t:.1f} s", flush=True)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-poll-"))
    tsdb = work / f"tsdb-{n_jobs}-{args.seed}-{minutes}"
    if not tsdb.exists():
        t = time.perf_counter()
        om = work / "data.om"
        write_openmetrics(sims, om)
        backfill(om, tsdb, timeout_s=3600)
        om.unlink()
        print(f"backfilled: {time.perf_counter() - t:.1f} s", flush=True)

    setup_test_environment()
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    counter = _Requests()
    rows = Counter[str]()
    upsert = archive.upsert

    def counted(batch: Any) -> Any:
        rows["rows"] += len(batch)
        return upsert(batch)

    archive.upsert = counted  # type: ignore[assignment]
    diagnosed = Counter[str]()
    diagnose = pipeline.run_diagnosis

    def counted_diagnosis(job: Any) -> Any:
        diagnosed["jobs"] += 1
        return diagnose(job)

    pipeline.run_diagnosis = counted_diagnosis  # type: ignore[assignment]
    try:
        team = Team.objects.create(slug="bench", name="Bench")
        explicit = round(args.explicit_share * n_jobs)
        for i, sim in enumerate(sims):
            body = registration_body(sim, team=team, ended=False)
            if i >= explicit:
                body["gpus"], body["selector"] = [], {"hpc_job": sim.spec.job_id}
            register_job(body)
        print(f"registered {Job.objects.count()} jobs ({explicit} with explicit GPU lists)", flush=True)
        if args.stagger:
            # Steady state: a running job is re-diagnosed every DIAGNOSE_RUNNING_EVERY (10 min) from its own
            # last diagnosis, so about a tenth of the jobs are due in any one-minute cycle. Spread the last
            # diagnoses over the 10 minutes before cycle 1 (without this every job is due in cycle 1 and in
            # none of the next nine, and the steady cycles would leave the diagnosis out).
            every = pipeline.DIAGNOSE_RUNNING_EVERY.total_seconds()
            for i, pk in enumerate(Job.objects.order_by("pk").values_list("pk", flat=True)):
                last = first - every + 60.0 * (i % round(every / 60.0))
                Job.objects.filter(pk=pk).update(diagnosed_at=datetime.fromtimestamp(last, tz=UTC))
        with connection.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            pg_pid = int(cur.fetchone()[0])
        with PrometheusProcess(tsdb) as prom:
            assert prom._proc is not None
            prom_pid = prom._proc.pid
            client = PrometheusClient(prom.url, timeout_s=60, retries=0)
            print("cycle  per-GPU  wall_s  python_cpu_s  prometheus_cpu_s  postgres_cpu_s  "
                  "requests(signals/mig/throughput/energy)  rows  stale")  # fmt: skip
            for c in range(args.cycles):
                now = datetime.fromtimestamp(first + 60.0 * c, tz=UTC)
                counter.by_kind.clear()
                rows.clear()
                diagnosed.clear()
                cpu0, p0, g0 = time.process_time(), _proc_cpu_s(prom_pid), _proc_cpu_s(pg_pid)
                w0 = time.perf_counter()
                profiler = cProfile.Profile() if args.profile == c + 1 else None
                if profiler is not None:
                    profiler.enable()
                if args.mode == "cycle":
                    report = pipeline.poll_cycle(client, now=now)
                    per_gpu, stale = report["per_gpu"], report["stale"]
                else:
                    per_gpu, stale = n_jobs, 0
                    for job in ingest.running_jobs():
                        stale += bool(pipeline.poll_job(job, client, now=now).ingest_error)
                wall = time.perf_counter() - w0
                if profiler is not None:
                    profiler.disable()
                    pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
                    if args.profile_out:
                        profiler.dump_stats(args.profile_out)
                cpu = time.process_time() - cpu0
                p1, g1 = _proc_cpu_s(prom_pid), _proc_cpu_s(pg_pid)
                prom_cpu = f"{p1 - p0:.1f}" if p0 is not None and p1 is not None else "?"
                pg_cpu = f"{g1 - g0:.1f}" if g0 is not None and g1 is not None else "?"
                k = counter.by_kind
                total = sum(k.values())
                print(f"{c + 1:5d}  {int(per_gpu):7d}  {wall:6.1f}  {cpu:12.1f}  "
                      f"{prom_cpu:>16s}  {pg_cpu:>14s}  {total:6d} "
                      f"({k['signals']}/{k['mig']}/{k['throughput']}/{k['energy']}){'':10s}"
                      f"  {rows['rows']:5d}  {stale}",
                      flush=True)  # fmt: skip
                print(f"       ({diagnosed['jobs']} jobs diagnosed in this cycle)", flush=True)
        lag = Job.objects.order_by("data_until").values_list("data_until", flat=True).first()
        print(f"oldest data_until: {lag} (last cycle at {now})")
    finally:
        archive.upsert = upsert  # type: ignore[assignment]
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
