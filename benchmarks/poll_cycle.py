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

`--workers 1,2,4` (#26 item 1): the sharded cycle. Cycle 1 (every job's first poll) runs in this process;
then for each worker count W, W real Celery workers (`celery worker --pool solo`, one process each, queue
`poll`) on a private Redis database (`--redis-db`, broker and cache) run `--cycles` cycles' shards of
`--shard-jobs` jobs while this process reads Prometheus, archives and waits (jobs.pipeline.shards). Per
cycle it prints wall time, CPU of this process (the coordinator), of the workers, of Prometheus and of the
Postgres backends of the benchmark's database (sampled from /proc every 0.2 s: a backend that exits between
samples loses its last 0.2 s), per_job_s (the cycle's per-job phase: from handing out the shards to
their last done marker; in process for cycle 1), the requests Prometheus served (its own counter: the
coordinator's and the workers') and the 1-minute load average.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import _setup

_setup.setup_django("bench_poll_cycle")

import requests  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402

T0 = _setup.T0
_proc_cpu_s = _setup.proc_cpu_s


class _Requests:
    """Counts HTTP requests to Prometheus by kind (wraps requests.Session.request)."""

    def __init__(self) -> None:
        self.by_kind: Counter[str] = Counter()
        _setup.tap_requests(self._seen)

    def _seen(self, method: str, url: str, kwargs: dict[str, Any]) -> None:
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


class _PostgresSampler:
    """CPU of the Postgres backends serving one database, from /proc every `every_s` (a backend's title
    names its database: 'postgres: user db host(port) state'); the max seen per pid, so backends that
    exit (Celery closes a task's connection) still count up to their last sample."""

    def __init__(self, database: str, every_s: float = 0.2) -> None:
        self.database = database
        self.every_s = every_s
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _scan(self) -> None:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if title.startswith("postgres: ") and f" {self.database} " in title:
                cpu = _proc_cpu_s(int(entry.name))
                if cpu is not None:
                    self.seen[int(entry.name)] = max(cpu, self.seen.get(int(entry.name), 0.0))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._scan()

    def total(self) -> float:
        """CPU seconds of every backend seen so far (scanned now first)."""
        self._scan()
        return sum(self.seen.values())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _prometheus_requests(url: str) -> int:
    """API requests Prometheus has served (its prometheus_http_requests_total over /api/v1/ handlers)."""
    text = requests.get(f"{url}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


class _Workers:
    """W Celery worker processes (`--pool solo`: the task runs in the process we measure) on the poll
    queue, with the benchmark's database, the private Redis and the throwaway Prometheus."""

    def __init__(self, count: int, env: dict[str, str], log_dir: Path) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        celery = str(Path(sys.executable).with_name("celery"))
        for i in range(count):
            log = open(log_dir / f"worker-{count}-{i}.log", "wb")  # noqa: SIM115 - closed with the process
            self.procs.append(subprocess.Popen(
                [celery, "-A", "efficiency", "worker", "-Q", "poll", "--pool", "solo", "-n", f"bench{i}@%h",
                 "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "warning"],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            ))  # fmt: skip

    def wait_ready(self, app: Any, timeout_s: float = 120.0) -> None:
        """Until every worker answers a ping (each has imported the code and connected)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(app.control.ping(timeout=1.0) or []) >= len(self.procs):
                return
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError("a Celery worker exited at start (see its log)")
        raise RuntimeError(f"{len(self.procs)} workers not ready after {timeout_s:.0f} s")

    def cpu_s(self) -> float:
        return sum(_proc_cpu_s(p.pid) or 0.0 for p in self.procs)

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _cycles(
    args: argparse.Namespace, n_jobs: int, first: float, client: Any, counter: _Requests, rows: Counter[str],
    diagnosed: Counter[str], prom_pid: int, pg_pid: int,
) -> datetime:  # fmt: skip
    """The in-process cycles (no --workers): one process reads, archives and evaluates every job."""
    from jobs.metrics import ingest
    from jobs.pipeline import poll as pipeline

    now = datetime.fromtimestamp(first, tz=UTC)
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
    return now


def _sharded_cycles(
    args: argparse.Namespace, worker_counts: list[int], first: float, prom: Any, prom_pid: int, client: Any,
    redis_url: str, counter: _Requests,
) -> None:  # fmt: skip
    """Cycle 1 in this process (every job's first poll), then `args.cycles` sharded cycles per worker
    count."""
    from efficiency.celery import app as celery_app
    from jobs.pipeline import poll as pipeline

    database = str(connection.settings_dict["NAME"])
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "efficiency.settings",
        "DEBUG": "true",  # start-up without a SECRET_KEY, as the tests'
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{database}",
        "REDIS_URL": redis_url,
        "CACHE_URL": redis_url,
        "PROMETHEUS_URL": prom.url,
        "PROMETHEUS_SCRAPE_INTERVAL_S": str(settings.PROMETHEUS_SCRAPE_INTERVAL_S),
        "PROMETHEUS_INGESTION_LAG_S": str(settings.PROMETHEUS_INGESTION_LAG_S),
    }
    env["CACHE_KEY_PREFIX"] = "bench-poll-cycle"  # the coordinator's cache keys
    sampler = _PostgresSampler(database)
    print("cycle  workers  shards  wall_s  per_job_s  coordinator_cpu_s  workers_cpu_s  prometheus_cpu_s  "
          "postgres_cpu_s  requests(coordinator/prometheus-side)  load1  stale  pending")  # fmt: skip
    c = 0

    def one(workers: int, shard_jobs: int, pool: _Workers | None) -> None:
        nonlocal c
        now = datetime.fromtimestamp(first + 60.0 * c, tz=UTC)
        counter.by_kind.clear()
        cpu0, p0, g0 = time.process_time(), _proc_cpu_s(prom_pid), sampler.total()
        w_cpu0 = pool.cpu_s() if pool else 0.0
        r0 = _prometheus_requests(prom.url)
        w0 = time.perf_counter()
        report = pipeline.poll_cycle(client, now=now, shard_size=shard_jobs)
        wall = time.perf_counter() - w0
        cpu = time.process_time() - cpu0
        w_cpu = (pool.cpu_s() if pool else 0.0) - w_cpu0
        p1, g1 = _proc_cpu_s(prom_pid), sampler.total()
        prom_cpu = f"{p1 - p0:.1f}" if p0 is not None and p1 is not None else "?"
        time.sleep(0.5)  # Prometheus counts a request after answering it
        served = _prometheus_requests(prom.url) - r0  # /metrics itself is not an /api/v1/ handler
        shards = -(-report["jobs"] // shard_jobs) if shard_jobs else 0
        print(f"{c + 1:5d}  {workers:7d}  {shards:6d}  {wall:6.1f}  {report['per_job_s']:9.1f}  "
              f"{cpu:17.1f}  {w_cpu:13.1f}  {prom_cpu:>16s}  "
              f"{g1 - g0:14.1f}  {sum(counter.by_kind.values()):11d}/{served:<24d}  "
              f"{os.getloadavg()[0]:5.1f}  {report['stale']:5d}  {len(report['shards_pending'])}",
              flush=True)  # fmt: skip
        c += 1

    try:
        one(0, 0, None)  # every job's first poll, in this process
        for workers in worker_counts:
            pool = _Workers(workers, env, Path(tempfile.gettempdir()))
            try:
                pool.wait_ready(celery_app)
                for _ in range(args.cycles):
                    one(workers, args.shard_jobs, pool)
            finally:
                pool.stop()
    finally:
        sampler.stop()


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
    parser.add_argument(
        "--workers", default="", help="sharded cycles with these Celery worker counts, e.g. 1,2,4"
    )
    parser.add_argument("--shard-jobs", type=int, default=50, help="jobs per shard (--workers)")
    parser.add_argument("--redis-db", type=int, default=13, help="private Redis database (--workers)")
    args = parser.parse_args()
    worker_counts = [int(w) for w in args.workers.split(",") if w.strip()]

    n_jobs = max(1, args.gpus // 8)
    total_cycles = 1 + args.cycles * len(worker_counts) if worker_counts else args.cycles
    minutes = args.history_min + total_cycles + 2
    t = time.perf_counter()
    sims = _setup.cluster_sims(n_jobs, minutes, args.seed)
    print(f"simulated {n_jobs} jobs x 8 GPUs, {minutes} min: {time.perf_counter() - t:.1f} s", flush=True)
    with _setup.workspace(args.keep, "bench-poll-") as work:
        tsdb = work / f"tsdb-{n_jobs}-{args.seed}-{minutes}"
        made = _setup.ensure_tsdb(tsdb, lambda: [sims])
        if made is not None:
            print(f"backfilled: {made[1]:.1f} s", flush=True)
        caches = None
        private_redis = ""
        if worker_counts:
            # The shards' inputs and done markers and the broker: a Redis database of the benchmark's own.
            from efficiency.celery import app as celery_app

            base = str(settings.REDIS_URL).rsplit("/", 1)[0]
            private_redis = f"{base}/{args.redis_db}"
            redis_cache = "django.core.cache.backends.redis.RedisCache"
            caches = {"default": {"BACKEND": redis_cache, "LOCATION": private_redis,
                                  "KEY_PREFIX": "bench-poll-cycle"}}  # fmt: skip
            celery_app.conf.update(broker_url=private_redis)
            settings.POLL_SHARD_WAIT_S = 3000.0
        with _setup.throwaway_database(caches), _setup.counting_archive_rows() as rows:
            _run(args, sims, tsdb, worker_counts, total_cycles, private_redis, rows)


def _run(
    args: argparse.Namespace, sims: list[Any], tsdb: Path, worker_counts: list[int], total_cycles: int,
    private_redis: str, rows: Counter[str],
) -> None:  # fmt: skip
    """Register the jobs in the throwaway database and run the cycles against a Prometheus over `tsdb`."""
    from jobs.intake.registry import register_job
    from jobs.metrics.prometheus import PrometheusClient
    from jobs.models import Job, Team
    from jobs.pipeline import poll as pipeline
    from jobs.simulate import registration_body

    n_jobs = len(sims)
    first = T0 + args.history_min * 60.0
    counter = _Requests()
    diagnosed = Counter[str]()
    diagnose = pipeline.run_diagnosis

    def counted_diagnosis(job: Any) -> Any:
        diagnosed["jobs"] += 1
        return diagnose(job)

    pipeline.run_diagnosis = counted_diagnosis
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
    pg_pid = _setup.backend_pid()
    with _setup.prometheus(tsdb) as (prom, prom_pid):
        client = PrometheusClient(prom.url, timeout_s=60, retries=0)
        if worker_counts:
            _sharded_cycles(args, worker_counts, first, prom, prom_pid, client, private_redis, counter)
            now = datetime.fromtimestamp(first + 60.0 * (total_cycles - 1), tz=UTC)
        else:
            now = _cycles(args, n_jobs, first, client, counter, rows, diagnosed, prom_pid, pg_pid)
    lag = Job.objects.order_by("data_until").values_list("data_until", flat=True).first()
    print(f"oldest data_until: {lag} (last cycle at {now})")


if __name__ == "__main__":
    main()
