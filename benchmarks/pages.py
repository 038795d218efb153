"""Server-side speed and payload of the pages on big data, in a throwaway database.

Usage (from the repository root, services started with `.ci/services start`):

    .venv/bin/python benchmarks/pages.py [--runs 30] [--jobs 100000] [--skip-running]

Creates a private database (TEST_DATABASE_NAME, default `bench_pages`), fills it, measures, and drops it:

* a finalized 256-GPU, 7-day job archived as `jobs.metrics.pipeline.finalize_job` writes it (aggregate series
  at a 300 s step, per-GPU rows at 1800 s, for every signal), with five findings;
* the same job still running, archived as polling writes it (30 s aggregates, per-GPU rows at 300 s;
  only the charted signals, and per GPU only SM_ACTIVE and GPU_UTIL, to keep the fill time reasonable:
  other rows sit behind the (job, signal, stat, start) index and are not read);
* 100,000 finished and running jobs over a year in 20 teams for the leaderboard and the job list.

For each page it prints p50/p95/max server-side time (Django test client: middleware, views, templates,
no network) and the payload: HTML size and the size of the figure data (the json_script element). Targets
(issue 7): job page < 300 ms and < 1.5 MB of figure data; leaderboard < 200 ms. After the warm-up view a job
page is answered from its kept body (jobs.views.job_page_cache); the "body rendered" rows forget it before
each view, as the first view after a poll renders it in each web process.

`--concurrency 10` then serves the filled database with gunicorn as `make demo` starts it (`--config
gunicorn.conf.py`: threaded workers, `--workers`, default 2 as in the Makefile, DEBUG=false, static files
collected into a temporary STATIC_ROOT) and measures the job pages and figures JSON over HTTP with that many
clients at once, each sending `--runs` requests back to back (issue 26: p95 < 300 ms at 10 clients for the
256-GPU x 7-day job); `--concurrency 1,10` runs one client, then ten, against the same server.
`--only-running` skips the finalized job and the list pages (a quicker fill); `--job-pages-only` fills
both 256-GPU jobs but not the 100,000 (two minutes of the fill) and times only their pages and figures
JSON; `--lists-only` fills the 100,000 jobs (on GPU models priced in the default tier, at their latest
price) and times only the pages that list them (leaderboard, job list, team and readiness pages).

The benchmark user is an ordinary (not staff) member of every team: the pages run their team-scoped
queries (`jobs.access.permissions.scope_to_teams`) as a user's would, and the team page of any team answers
200.
Every figure is printed with the 1-minute load average beside it (`load`): on a shared machine wall times
move with it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "efficiency.settings")
os.environ.setdefault("TEST_DATABASE_NAME", "bench_pages")
# The in-process (test client) rows run with the development settings: without DEBUG the settings demand
# HTTPS (every page answered 301) and the static manifest of a collectstatic. The gunicorn of --concurrency
# runs with DEBUG=false, as deployed (_concurrent).
os.environ.setdefault("DEBUG", "true")
# One key for this process and the gunicorn of --concurrency: the session cookie made here must log in there.
os.environ.setdefault("SECRET_KEY", "bench-pages-" + "x" * 50)

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402

if TYPE_CHECKING:
    from jobs.metrics.signals import JobSignals
    from jobs.models import GpuModel, Job, Team

DAY = 86400.0
GPUS = 256
START = datetime(2026, 11, 2, tzinfo=UTC)  # a Monday, so the job fills one ISO week


def _synthetic_signals(
    step: int, gpu_step: int, keys: list[str], gpu_keys: list[str]
) -> tuple[JobSignals, dict[str, np.ndarray]]:
    """A 7-day JobSignals with realistic shapes: utilisation with a straggler and periodic stalls, spikes."""
    from jobs.metrics.signals import SIGNALS, GpuKey, JobSignals, SignalSeries, grid

    start = START.timestamp()
    end = start + 7 * DAY
    ts = grid(start, end, step)
    gts = grid(start, end, gpu_step)
    rng = np.random.default_rng(7)
    gpus = tuple(GpuKey(f"gpu-node-{i // 8 + 1:03d}", str(i % 8)) for i in range(GPUS))
    sigs = JobSignals(start, end, step, ts)
    base = {"gpu_util": 0.98, "sm_active": 0.55, "tensor_active": 0.3, "dram_active": 0.4,
            "power_usage": 520.0, "gpu_temp": 64.0, "memory_temp": 70.0, "sm_clock": 1830.0,
            "pcie_rx_bytes": 2e9, "pcie_tx_bytes": 5e8, "nvlink_rx_bytes": 4e10, "nvlink_tx_bytes": 4e10,
            "fb_used": 61000.0, "fb_free": 20000.0}  # fmt: skip
    for key in keys:
        level = base.get(key, 0.5 if SIGNALS[key].unit == "ratio" else 100.0)
        stall = (np.arange(ts.size) % 40 == 0) * 0.6  # a periodic input stall
        mean = level * (1 + 0.03 * rng.standard_normal(ts.size)) * (1 - stall)
        mean[rng.integers(0, ts.size, 5)] *= 0.2  # single-sample dips the envelope must keep
        stats = {"mean": mean, "min": mean * 0.8, "max": mean * 1.1, "count": np.full(ts.size, float(GPUS))}
        series = SignalSeries(key, SIGNALS[key].unit, ts, stats)
        if key in gpu_keys:
            matrix = level * (1 + 0.05 * rng.standard_normal((GPUS, gts.size)))
            matrix[37] *= 0.7  # a straggler
            series.gpus, series.gpu_timestamps, series.per_gpu = gpus, gts, matrix
        sigs.signals[key] = series
    derived = {"tokens_per_second": 2.4e6 * (1 + 0.02 * rng.standard_normal(ts.size)),
               "mfu": 0.38 * (1 + 0.02 * rng.standard_normal(ts.size))}  # fmt: skip
    return sigs, derived


def _make_job(team: Team, gpu: GpuModel, external_id: str, running: bool) -> Job:
    from jobs.evaluation.schema import Evaluation, encode
    from jobs.models import Finding, Job

    job = Job.objects.create(
        external_id=external_id, name=f"llama-70b {'running' if running else 'finished'} 256 GPUs", team=team,
        model_name="llama-70b", model_config={"n_params": 70e9, "seq_len": 8192}, gpu_model=gpu,
        gpu_model_name=gpu.name, gpu_count=GPUS, started_at=START,
        ended_at=None if running else START + timedelta(days=7),
        status=Job.Status.RUNNING if running else Job.Status.FINALIZED, config_fingerprint="bench",
        mfu=0.38, hfu=0.41, tokens_per_second=2.4e6, gpu_util_mean=0.98, sm_active_mean=0.55,
        tensor_active_mean=0.3, gpu_hours=GPUS * 168, cost_usd=GPUS * 168 * 6.88,
        cost_per_day_usd=GPUS * 24 * 6.88, waste_per_day_usd=GPUS * 24 * 6.88 * 0.15,
        last_polled_at=START + timedelta(days=7), data_until=START + timedelta(days=7),
        evaluation=encode(Evaluation(
            duration_s=7 * DAY, gpu_hours=GPUS * 168.0, mfu=0.38,
            variants={"mfu": "MFU, 6N + 12LHQT (PaLM)"}, price_note="256 GPUs × $6.88/GPU-h",
        )),
    )  # fmt: skip
    t0 = START.timestamp()
    for i, code in enumerate(
        ("straggler", "data_pipeline_stall", "communication_wait", "throttling", "idle_gpus")
    ):
        windows = [[t0 + d * DAY + i * 3600, t0 + d * DAY + i * 3600 + 1800] for d in range(7)]
        if code == "data_pipeline_stall":  # a finding with thousands of short windows
            windows = [[t0 + k * 1200.0, t0 + k * 1200.0 + 60] for k in range(500)]
        Finding.objects.create(
            job=job, code=code, severity="warning", confidence=0.7, title=f"{code} finding", windows=windows,
            evidence=[{"label": "x", "value": 1.0, "unit": "%"}], recommendation="fix it",
            waste_per_day_usd=1000.0 - 100 * i,
        )  # fmt: skip
    return job


def _fill_series(job: Job, step: int, gpu_step: int, keys: list[str], gpu_keys: list[str]) -> int:
    # jobs.metrics.archive's own row builder, so the archive has exactly the production layout.
    from jobs.metrics.archive import rows_for, upsert

    sigs, derived = _synthetic_signals(step, gpu_step, keys, gpu_keys)
    rows = rows_for(job, sigs, derived)
    for i in range(0, len(rows), 2000):
        upsert(rows[i : i + 2000])
    return len(rows)


def _archive_size() -> None:
    """Bytes of the archive per GPU-hour of each job, by level (pg_column_size of the stored rows)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT j.external_id, s.stat = 'gpu', s.step_seconds, count(*), sum(pg_column_size(s.*)), "
            "j.gpu_count * extract(epoch from coalesce(j.ended_at, j.data_until) - j.started_at) / 3600 "
            "FROM jobs_jobseries s JOIN jobs_job j ON j.id = s.job_id GROUP BY 1, 2, 3, j.gpu_count, "
            "j.ended_at, j.data_until, j.started_at ORDER BY 1, 2, 3"
        )
        for job, per_gpu, step, rows, size, gpu_hours in cur.fetchall():
            kind = "per GPU" if per_gpu else "cross-GPU stats"
            print(f"  {job:<13} {kind:<16} step {step:>6} s: {rows:>7,} rows {size / 2**20:8.1f} MiB  "
                  f"{size / float(gpu_hours):8.0f} B per GPU-hour")  # fmt: skip
        # The layout before migration 0010, measured on equivalent rows: every value with a float8 Unix time
        # next to it (timestamps float8[] + values float8[]), the polled levels only (no tiers).
        cur.execute(
            "SELECT j.external_id, sum(pg_column_size(ROW(s.id, s.job_id, s.signal, s.stat, s.gpu_key, "
            's.step_seconds, s.start, s."end", array_fill(0::float8, ARRAY[length(s."values") / 4]), '
            'array_fill(0::float8, ARRAY[length(s."values") / 4])))), sum(pg_column_size(s.*)), '
            "j.gpu_count * extract(epoch from coalesce(j.ended_at, j.data_until) - j.started_at) / 3600 "
            "FROM jobs_jobseries s JOIN jobs_job j ON j.id = s.job_id "
            "WHERE s.stat NOT IN ('mean_low', 'mean_high') AND s.step_seconds NOT IN (3600, 21600) "
            "AND NOT (s.stat <> 'gpu' AND s.step_seconds = 300 AND j.status = 'running') "
            "AND NOT (s.stat = 'gpu' AND s.step_seconds = 1800 AND j.status = 'running') "
            "GROUP BY 1, j.gpu_count, j.ended_at, j.data_until, j.started_at ORDER BY 1"
        )
        for job, old, new, gpu_hours in cur.fetchall():
            old_b, new_b = old / float(gpu_hours), new / float(gpu_hours)
            print(f"  {job:<13} polled levels only: old layout (float8[] times + values) {old_b:6.0f} B "
                  f"per GPU-hour, compact {new_b:6.0f} B per GPU-hour")  # fmt: skip
        cur.execute("SELECT pg_total_relation_size('jobs_jobseries')")
        print(f"  jobs_jobseries total (pg_total_relation_size): {cur.fetchone()[0] / 2**20:,.1f} MiB")


def _evaluation_reads(job: Job) -> None:
    """What the poll's summary and the running re-diagnosis read: every archived value (before) against
    archive.load_for_evaluation (the tiers within the evaluation's point budget); wall time, peak memory."""
    import tracemalloc

    from jobs.metrics import archive

    reads = [
        ("every archived value (load_job_signals)", lambda: archive.load_job_signals(job)),
        ("evaluation budget (load_for_evaluation)", lambda: archive.load_for_evaluation(job)),
    ]
    for name, read in reads:
        read()  # warm
        tracemalloc.start()
        t0 = time.perf_counter()
        sigs = read()
        wall = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert sigs is not None
        cols = sigs.signals["gpu_util"].gpu_timestamps
        print(f"  re-diagnosis read, {name:<40} {wall * 1000:7.0f} ms, peak {peak / 2**20:6.0f} MiB, "
              f"step {sigs.step:.0f} s, per-GPU columns {0 if cols is None else cols.size}")  # fmt: skip


def _poll_write(job: Job) -> None:
    """One poll that writes only its new window (2 x 30 s cross-GPU points, one 300 s point per GPU row)
    into the week-old archive: archive.upsert's merge, tiers included, wall time and rows written."""
    from jobs.metrics import archive
    from jobs.models import JobSeries

    end = START.timestamp() + 7 * DAY
    lines = set(
        JobSeries.objects.filter(job=job, step_seconds__in=(30, 300))
        .exclude(stat__in=archive.EXTREMES)
        .exclude(step_seconds=300, stat__in=("mean", "min", "max", "count", "sampled"))
        .values_list("signal", "stat", "gpu_key", "step_seconds")
    )
    rows = []
    for signal, stat, gpu_key, step in lines:
        times = end + step * np.arange(1, 3 if step == 30 else 2, dtype=np.float64)
        rows.append(archive.Points(job.pk, signal, stat, gpu_key, step, times, np.full(times.size, 0.5)))
    t0 = time.perf_counter()
    written = archive.upsert(rows)
    wall = time.perf_counter() - t0
    print(f"  poll write of the new window only: {len(rows):,} lines -> {written:,} chunk rows (with tiers) "
          f"in {wall * 1000:.0f} ms")  # fmt: skip


def _fill_jobs(n: int) -> None:
    from jobs.models import GpuModel, Job, PriceEntry, Team

    rng = np.random.default_rng(3)
    teams = [Team.objects.create(slug=f"team-{i:02d}", name=f"Team {i:02d}") for i in range(20)]
    # GPU models with a price in the default tier, at their latest price: a period's cost follows the dated
    # book (jobs.evaluation.totals), so jobs on models the seed does not price would all read "no price".
    priced = (
        PriceEntry.objects.filter(tier=settings.DEFAULT_PRICE_TIER)
        .order_by("gpu_model_id", "-effective_from")
        .values_list("gpu_model_id", "usd_per_gpu_hour")
    )
    latest: dict[int, float] = {}
    for model_id, usd in priced:
        latest.setdefault(model_id, float(usd))
    gpus = list(GpuModel.objects.filter(pk__in=latest).order_by("pk")[:5])
    if not gpus:
        raise SystemExit(f"no GPU model has a {settings.DEFAULT_PRICE_TIER} price: seed the catalog first")
    now = datetime.now(UTC)
    batch = []
    for i in range(n):
        start = now - timedelta(days=float(rng.uniform(0, 365)))
        hours = float(rng.uniform(0.5, 96))
        end = start + timedelta(hours=hours)
        running = end > now
        mfu = float(rng.uniform(0.05, 0.6)) if rng.random() > 0.05 else None
        gpu, count = gpus[i % len(gpus)], int(rng.choice([8, 16, 64, 256]))
        cost = count * 24 * latest[gpu.pk]
        batch.append(Job(
            external_id=f"bulk-{i}", name=f"job {i}", team=teams[i % 20], model_name=f"model-{i % 12}",
            gpu_model=gpu, gpu_count=count, started_at=start,
            ended_at=None if running else end, status=Job.Status.RUNNING if running else Job.Status.FINALIZED,
            mfu=mfu, sm_active_mean=float(rng.uniform(0.2, 0.8)), cost_per_day_usd=cost,
            waste_per_day_usd=cost * (1 - (mfu or 0.2) / 0.45) if mfu and mfu < 0.45 else 0.0,
        ))  # fmt: skip
        if len(batch) == 5000:
            Job.objects.bulk_create(batch)
            batch = []
    if batch:
        Job.objects.bulk_create(batch)
    with connection.cursor() as cur:
        cur.execute("ANALYZE")


def _measure(
    client: Client, url: str, runs: int, before: Callable[[], None] | None = None
) -> tuple[list[float], bytes]:
    """`runs` views of `url` after one to warm up; `before` runs ahead of each (untimed)."""
    client.get(url)  # warm-up: template compilation, connection
    times, body = [], b""
    for _ in range(runs):
        if before is not None:
            before()
        t0 = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - t0) * 1000)
        assert response.status_code == 200, (url, response.status_code)
        body = response.content
    return times, body


def _load() -> str:
    """The 1-minute load average, printed beside every figure (on a shared machine wall times follow it)."""
    return f"load {os.getloadavg()[0]:4.1f}"


def _report(name: str, times: list[float], body: bytes, target_ms: float | None) -> None:
    p50 = statistics.median(times)
    p95 = sorted(times)[max(0, round(0.95 * len(times)) - 1)]
    figure = re.search(rb'<script id="job-data" type="application/json">(.*?)</script>', body, re.S)
    payload = f"html {len(body) / 1024:,.0f} KiB"
    if figure:
        payload += f", figure data {len(figure.group(1)) / 1024:,.0f} KiB"
    elif body.startswith(b"{"):
        payload = f"json {len(body) / 1024:,.0f} KiB"
    verdict = "" if target_ms is None else ("  ok" if p95 < target_ms else f"  OVER {target_ms:.0f} ms")
    print(f"{name:<46} p50 {p50:7.1f} ms  p95 {p95:7.1f} ms  max {max(times):7.1f} ms  {payload}{verdict}"
          f"  [{_load()}]", flush=True)  # fmt: skip


def _tree_cpu_s(pid: int) -> float:
    """utime + stime (s) of a process and its children (gunicorn's arbiter and its workers), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat.parent.name == str(pid) or fields[1] == str(pid):
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _client(
    opener: urllib.request.OpenerDirector, url: str, runs: int, times: list[float], lock: threading.Lock
) -> None:
    """One client: `runs` requests back to back, each one's latency appended to `times`."""
    for _ in range(runs):
        t0 = time.perf_counter()
        with opener.open(url, timeout=120) as response:
            response.read()
            # Redirects are followed: a lost session would time the login page instead.
            assert response.status == 200 and response.geturl() == url, (url, response.geturl())
        with lock:
            times.append((time.perf_counter() - t0) * 1000)


def _concurrent(session: str, paths: list[tuple[str, str]], clients: int, runs: int, workers: int) -> None:
    """Serve the benchmark database with gunicorn and time each path with `clients` clients at once."""
    db = settings.DATABASES["default"]
    port = _free_port()
    env = dict(os.environ)
    static_root = tempfile.mkdtemp(prefix="bench-static-")
    # As deployed: DEBUG=false (WhiteNoise's compressed manifest, no autorefresh scan per request).
    env |= {
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "DEBUG": "false", "ALLOWED_HOSTS": "127.0.0.1,localhost", "STATIC_ROOT": static_root,
        "SECRET_KEY": settings.SECRET_KEY, "SECURE_SSL_REDIRECT": "false",
        "SESSION_COOKIE_SECURE": "false", "CSRF_COOKIE_SECURE": "false", "SECURE_HSTS_SECONDS": "0",
    }  # fmt: skip
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=REPO, env=env,
                   check=True)  # fmt: skip
    # As `make demo` starts it: gunicorn.conf.py's threaded worker class and threads, the Makefile's workers.
    server = subprocess.Popen(
        [str(REPO / ".venv/bin/gunicorn"), "--config", str(REPO / "gunicorn.conf.py"),
         "--workers", str(workers), "--bind", f"127.0.0.1:{port}", "--log-level", "warning"],
        cwd=REPO, env=env,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                urllib.request.urlopen(base + "/healthz", timeout=2)
                break
            except OSError:
                time.sleep(0.2)
        for name, path in paths:
            opener = urllib.request.build_opener()
            opener.addheaders = [("Cookie", f"{settings.SESSION_COOKIE_NAME}={session}")]
            # Warm-up: imports, template compilation, connections, kept bodies. Concurrent, so every worker
            # gets some (one client after another may all land on the same one, and the other's first
            # view, a second of imports and rendering, fell into the timed 1-client row).
            warm_times: list[float] = []
            lock = threading.Lock()
            warm = [threading.Thread(target=_client, args=(opener, base + path, 3, warm_times, lock))
                    for _ in range(4 * workers)]  # fmt: skip
            for t in warm:
                t.start()
            for t in warm:
                t.join()
            times: list[float] = []

            threads = [threading.Thread(target=_client, args=(opener, base + path, runs, times, lock))
                       for _ in range(clients)]  # fmt: skip
            t0, cpu0 = time.perf_counter(), _tree_cpu_s(server.pid)
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            # The web processes' own CPU per request: steadier than latency on a shared machine, and what
            # sizes the web tier (Postgres' and this client's CPU are not in it).
            server_ms = (_tree_cpu_s(server.pid) - cpu0) * 1000 / len(times)
            p50 = statistics.median(times)
            p95 = sorted(times)[max(0, round(0.95 * len(times)) - 1)]
            verdict = "  ok" if p95 < 300 else "  OVER 300 ms"
            print(f"{name:<40} {clients} clients, gunicorn -w {workers}: p50 {p50:7.1f} ms  p95 {p95:7.1f} ms"
                  f"  max {max(times):7.1f} ms  {len(times) / wall:5.1f} req/s, gunicorn CPU"
                  f" {server_ms:5.1f} ms a request{verdict}  [{_load()}]",
                  flush=True)  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(static_root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument(
        "--skip-running", action="store_true", help="skip the running-job archive (slow fill)"
    )
    parser.add_argument(
        "--concurrency", default="0",
        help="clients at once over HTTP (0: off); several, comma-separated (1,10), run one after another",
    )  # fmt: skip
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers for --concurrency")
    parser.add_argument("--only-running", action="store_true", help="only the running job's pages")
    parser.add_argument(
        "--job-pages-only", action="store_true", help="both 256-GPU jobs' pages, no 100k jobs or list pages"
    )
    parser.add_argument(
        "--lists-only", action="store_true", help="the 100k jobs' list pages (leaderboard...), no 256-GPU job"
    )
    args = parser.parse_args()
    lists = not (args.only_running or args.job_pages_only)  # the 100k jobs and the pages that list them
    finalized_job = not (args.only_running or args.lists_only)
    if args.lists_only:
        args.skip_running = True
    try:
        counts = [int(n) for n in args.concurrency.split(",") if int(n) > 0]
    except ValueError:
        parser.error(f"--concurrency takes client counts, comma-separated (1,10), not {args.concurrency!r}")

    setup_test_environment()
    settings.DEBUG = False
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        from django.contrib.auth import get_user_model

        from jobs.charts import CHART_SIGNALS
        from jobs.metrics.signals import SIGNALS
        from jobs.models import GpuModel, Membership, Team

        team = Team.objects.create(slug="llm", name="LLM")
        # An ordinary user, not staff: the pages then take their team-scoped paths (memberships of the
        # 20 bulk teams are added after _fill_jobs creates them).
        user = get_user_model().objects.create_user("bench", password="x")
        Membership.objects.create(team=team, user=user)
        gpu = GpuModel.objects.get(name="H100 SXM")
        if finalized_job:
            t0 = time.perf_counter()
            finished = _make_job(team, gpu, "big-finished", running=False)
            n = _fill_series(finished, 300, 1800, list(SIGNALS), list(SIGNALS))
            print(
                f"filled finalized 256-GPU 7-day job: {n:,} archive rows in {time.perf_counter() - t0:.0f} s"
            )
        running = None
        if not args.skip_running:
            t0 = time.perf_counter()
            running = _make_job(team, gpu, "big-running", running=True)
            keys = [k for k in CHART_SIGNALS if k in SIGNALS]
            n = _fill_series(running, 30, 300, keys, ["sm_active", "gpu_util"])
            print(
                f"filled running 256-GPU 7-day job: {n:,} archived lines in {time.perf_counter() - t0:.0f} s"
            )
        if lists:
            t0 = time.perf_counter()
            _fill_jobs(args.jobs)
            Membership.objects.bulk_create(
                [Membership(team=t, user=user) for t in Team.objects.exclude(pk=team.pk)]
            )
            # Statistics for the memberships too: un-analysed, the planner took the user's 21 teams for one
            # and ran the leaderboard's worst-jobs query team by team (84 ms instead of 11 ms at load ~8).
            with connection.cursor() as cur:
                cur.execute("ANALYZE")
            print(f"filled {args.jobs:,} jobs in {time.perf_counter() - t0:.0f} s\n")
        _archive_size()

        client = Client()
        client.force_login(user)
        today = datetime.now(UTC).date()
        week = f"{today.isocalendar()[0]}-W{today.isocalendar()[1]:02d}"
        cases: list[tuple[str, str, float | None]] = [] if not finalized_job else [
            ("job page, finalized 256 GPUs x 7 days", "/jobs/big-finished/", 300.0),
            ("figures JSON (refresh), finalized", "/jobs/big-finished/figures.json?points=1200", 300.0),
        ]  # fmt: skip
        if running is not None:
            cases += [
                ("job page, running 256 GPUs x 7 days", "/jobs/big-running/", 300.0),
                ("figures JSON (refresh), running", "/jobs/big-running/figures.json?points=1200", 300.0),
                ("figures JSON, zoom to 1 h, running",
                 f"/jobs/big-running/figures.json?start={START.timestamp() + 3 * DAY}"
                 f"&end={START.timestamp() + 3 * DAY + 3600}", 300.0),
            ]  # fmt: skip
        cases += (
            []
            if not lists
            else [
                (f"leaderboard, this week, {args.jobs:,} jobs", f"/leaderboard/?week={week}", 200.0),
                (f"leaderboard, this month, {args.jobs:,} jobs", "/leaderboard/?by=month", 200.0),
                (f"job list, sorted by waste, {args.jobs:,} jobs", "/?sort=-waste", None),
                ("job list, sorted by MFU, team filter", "/?sort=-mfu&team=team-03", None),
                ("team page", "/teams/team-03/", None),
                ("readiness page", "/readiness/", None),
            ]
        )
        for name, url, target in cases:
            times, body = _measure(client, url, args.runs)
            _report(name, times, body, target)
        # What the first view of a job page after a poll pays in each web process: its body rendered (the
        # rows above are answered from the kept body, jobs.views.job_page_cache; the figures stay cached).
        from jobs.views import job_page_cache

        for name, url in (("job page, finalized, body rendered", "/jobs/big-finished/"),
                          ("job page, running, body rendered", "/jobs/big-running/")):  # fmt: skip
            if url in [c[1] for c in cases]:
                times, body = _measure(client, url, args.runs, before=job_page_cache.bodies().clear)
                _report(name, times, body, None)
        if running is not None:
            _evaluation_reads(running)
            _poll_write(running)
        if counts:
            session = client.cookies[settings.SESSION_COOKIE_NAME].value
            paths = []
            if finalized_job:
                paths += [
                    ("job page, finalized 256 GPUs x 7 days", "/jobs/big-finished/"),
                    ("figures JSON (refresh), finalized", "/jobs/big-finished/figures.json?points=1200"),
                ]
            if running is not None:
                paths += [
                    ("job page, running 256 GPUs x 7 days", "/jobs/big-running/"),
                    ("figures JSON (refresh), running", "/jobs/big-running/figures.json?points=1200"),
                ]
            print()
            for clients in counts:
                _concurrent(session, paths, clients, args.runs, args.workers)
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
