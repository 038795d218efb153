"""Finalizing one big ended job against a real Prometheus, in a throwaway database.

Usage (from the repository root, services started with `.ci/services start`):

    .venv/bin/python benchmarks/finalize.py [--gpus 256] [--days 3] [--step-s 30] [--keep DIR]

Simulates one ended job (`jobs.simulate`, healthy scenario, `--gpus` GPUs on 8-GPU nodes with
dcgm-exporter's labels, a default exporter's counters plus SM_ACTIVE, one sample per `--step-s` over
`--days`), backfills it into a throwaway Prometheus (promtool, `--chunk-h` hours at a time; `--keep
DIR` keeps the TSDB there and reuses it on the next run), registers it as a scheduler would (explicit GPU
list, the simulator's throughput query) and runs `jobs.pipeline.finalize_job` once, as the
finalize task does.

Prints the time of that one try (wall; the read from Prometheus apart from the rest), our CPU (this
process, all threads, and this connection's Postgres backend) beside Prometheus' CPU, the requests it
sent to Prometheus by endpoint, the archive rows it wrote, whether it succeeded (status, ingest error), and
the 1-minute load average beside each figure (issue 26 item 6: a 256-GPU x 3-day job in < 60 s).
Then how parallel the read was: the most HTTP requests in flight at once and their mean over the read
(from each request's start and end), the cores Prometheus used over the read (its CPU / the read's wall),
the CPUs it may run on and its query concurrency limit (a Prometheus that gets one core shows ~1.0 there
whatever the requests in flight: the machine's other load, not the client, is then the limit).
`--concurrency N` sets FINALIZE_QUERY_CONCURRENCY (range queries in flight; 1 = one after another);
`--server-stats` reads the cross-GPU stats as the poll does (ingest.FINALIZE_STATS_HERE off: Prometheus
evaluates each signal's per-GPU expression once per stat) instead of from one per-series read;
PROMETHEUS_COMPRESSION (environment) as the service reads it.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import _setup

_setup.setup_django("bench_finalize")

from django.conf import settings  # noqa: E402

DAY = 86400.0


def _load() -> str:
    return f"load {_setup.load1():4.1f}"


class _Requests:
    """Counts HTTP requests to Prometheus by endpoint (wraps requests.Session.request; the finalize's pool
    threads send them too, hence the lock)."""

    def __init__(self) -> None:
        self.by_endpoint: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._original = _setup.tap_requests(self._seen)

    def _seen(self, method: str, url: str, kwargs: dict[str, Any]) -> None:
        with self._lock:
            self.by_endpoint[url.rsplit("/api/v1/", 1)[-1]] += 1

    def restore(self) -> None:
        _setup.untap_requests(self._original)


class _InFlight:
    """Each HTTP request's start and end (wraps PrometheusClient._send, which returns once the whole answer
    is read; the finalize's pool threads' copies of the client included), for how many were in flight."""

    def __init__(self) -> None:
        from jobs.metrics.prometheus import PrometheusClient

        self.spans: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._cls = PrometheusClient
        self._original = PrometheusClient._send
        original = self._original

        def send(client: Any, method: str, path: str, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return original(client, method, path, **kwargs)
            finally:
                with self._lock:
                    self.spans.append((t, time.perf_counter()))

        PrometheusClient._send = send  # type: ignore[method-assign,assignment]

    def restore(self) -> None:
        self._cls._send = self._original  # type: ignore[method-assign]

    def most_and_mean(self, wall: float) -> tuple[int, float]:
        """The most requests in flight at once, and the mean number in flight over `wall` seconds."""
        edges = sorted([(a, 1) for a, _ in self.spans] + [(b, -1) for _, b in self.spans])
        now = most = 0
        for _, d in edges:
            now += d
            most = max(most, now)
        busy = sum(b - a for a, b in self.spans)
        return most, busy / wall if wall > 0 else 0.0


def _prometheus_cpus(pid: int, url: str) -> str:
    """The CPUs Prometheus may run on (Go's default GOMAXPROCS is their number) and its query limit."""
    import os

    import requests

    allowed = "?"
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                allowed = line.split(":", 1)[1].strip()
    env = "?"
    with contextlib.suppress(OSError):
        env = next(
            (v.split(b"=", 1)[1].decode() for v in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
             if v.startswith(b"GOMAXPROCS=")), "unset",
        )  # fmt: skip
    limit = "?"
    with contextlib.suppress(Exception):
        limit = requests.get(f"{url}/api/v1/status/flags", timeout=5).json()["data"]["query.max-concurrency"]
    return f"CPUs allowed {allowed} of {os.cpu_count()}, GOMAXPROCS {env}, query.max-concurrency {limit}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--days", type=float, default=3.0)
    parser.add_argument("--step-s", type=float, default=30.0, help="simulated scrape interval")
    parser.add_argument("--keep", help="directory to keep (and reuse) the backfilled TSDB in")
    parser.add_argument("--chunk-h", type=float, default=3.0, help="hours of data per promtool run")
    parser.add_argument(
        "--concurrency", type=int, default=0,
        help="FINALIZE_QUERY_CONCURRENCY for this run (default: the setting, 4 unless set)",
    )  # fmt: skip
    parser.add_argument(
        "--server-stats", action="store_true",
        help="cross-GPU stats from Prometheus (one query per signal, as a poll reads them)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.gpus < 1 or args.days <= 0 or args.step_s <= 0 or args.concurrency < 0:
        parser.error("--gpus, --days and --step-s must be positive, --concurrency at least 0")
    if args.concurrency:
        settings.FINALIZE_QUERY_CONCURRENCY = args.concurrency
    if args.server_stats:
        from jobs.metrics import ingest

        ingest.FINALIZE_STATS_HERE = False

    from jobs.metrics.signals import DEFAULT_DISABLED
    from jobs.simulate import SimSpec, simulate
    from jobs.simulate.core import DEFAULT_START

    hosts = tuple(f"gpu-node-{i + 1:03d}" for i in range((args.gpus + 7) // 8))
    spec = SimSpec(
        scenario="healthy", gpus=args.gpus, hosts=hosts, job_id="70001", start=DEFAULT_START,
        duration_s=args.days * DAY, step_s=args.step_s, seed=1, missing_fraction=0.01,
        disabled=DEFAULT_DISABLED - {"sm_active"},
    )  # fmt: skip
    t = time.perf_counter()
    sim = simulate(spec)
    print(f"simulated {args.gpus} GPUs x {args.days:g} days at {args.step_s:g} s: "
          f"{time.perf_counter() - t:.1f} s  [{_load()}]", flush=True)  # fmt: skip
    with _setup.workspace(args.keep, "bench-finalize-") as work:
        tsdb = work / f"tsdb-{args.gpus}-{args.days:g}d-{args.step_s:g}s"
        # In time slices of --chunk-h, each one block: promtool holds a block's samples in memory (the
        # whole 3-day file at once grew it past 11 GB) and re-reads the file once per block.
        made = _setup.ensure_tsdb(
            tsdb, lambda: ([part] for part in _slices(sim, args.chunk_h * 3600.0)), max_block_duration="24h"
        )
        if made is not None:
            print(f"backfilled {made[0]:,.0f} MiB of OpenMetrics: {made[1]:.1f} s  [{_load()}]", flush=True)
        _finalize(sim, tsdb)


def _slices(sim: Any, seconds: float) -> list[Any]:
    """The simulated job cut into consecutive time slices of `seconds` (the same series, labels and
    scrape offsets; each slice's samples only), so each is backfilled on its own."""
    from jobs.simulate.core import SimResult

    ts = sim.timestamps
    index = np.floor((ts - ts[0]) / seconds).astype(np.int64)
    out = []
    for i in np.unique(index):
        sl = index == i
        out.append(SimResult(
            spec=sim.spec, model=sim.model, timestamps=ts[sl], gpus=sim.gpus,
            fields={k: v[:, sl] for k, v in sim.fields.items()},
            throughput=replace(sim.throughput, tokens_per_s=sim.throughput.tokens_per_s[sl],
                               tokens_total=sim.throughput.tokens_total[sl]),
            truth=sim.truth, sample_offsets=sim.sample_offsets,
        ))  # fmt: skip
    return out


def _finalize(sim: Any, tsdb: Path) -> None:
    """Register the simulated job in a throwaway database and finalize it once against Prometheus."""
    from jobs.intake.registry import register_job
    from jobs.metrics import ingest
    from jobs.metrics.prometheus import PrometheusClient
    from jobs.models import Job, Team
    from jobs.pipeline import poll as pipeline
    from jobs.simulate import registration_body

    counter: _Requests | None = None
    flight: _InFlight | None = None
    read_s: list[float] = []
    read_finalize = pipeline.read_finalize

    def timed_read(job: Any, client: Any) -> Any:
        t = time.perf_counter()
        try:
            return read_finalize(job, client)
        finally:
            read_s.append(time.perf_counter() - t)

    pipeline.read_finalize = timed_read
    try:
        with _setup.throwaway_database(), _setup.counting_archive_rows() as rows:
            team = Team.objects.create(slug="bench", name="Bench")
            register_job(registration_body(sim, team=team, ended=True))
            job = Job.objects.get(external_id=sim.spec.job_id)
            pg_pid = _setup.backend_pid()
            with _setup.prometheus(tsdb) as (prom, prom_pid):
                prom_cpus = _prometheus_cpus(prom_pid, prom.url)  # before the tap: not one of the finalize's
                client = PrometheusClient(
                    prom.url, timeout_s=120, retries=0, compress=settings.PROMETHEUS_COMPRESSION
                )
                counter, flight = _Requests(), _InFlight()
                assert job.ended_at is not None
                now = job.ended_at + timedelta(minutes=5)
                p0, g0 = _setup.proc_cpu_s(prom_pid), _setup.proc_cpu_s(pg_pid)
                w0, c0 = time.perf_counter(), time.process_time()
                job = pipeline.finalize_job(job, client, now=now)
                wall, cpu = time.perf_counter() - w0, time.process_time() - c0
                p1, g1 = _setup.proc_cpu_s(prom_pid), _setup.proc_cpu_s(pg_pid)
            prom_cpu = f"{p1 - p0:.1f}" if p0 is not None and p1 is not None else "?"
            pg_cpu = f"{g1 - g0:.1f}" if g0 is not None and g1 is not None else "?"
            by = counter.by_endpoint
            requests_by = ", ".join(f"{n} {endpoint}" for endpoint, n in sorted(by.items()))
            verdict = "ok" if wall < 60 and not job.ingest_error else "OVER 60 s or failed"
            assert job.ended_at is not None
            days = (job.ended_at - job.started_at) / timedelta(days=1)
            print(f"finalize_job, {job.gpu_count} GPUs x {days:g} days, "
                  f"{settings.FINALIZE_QUERY_CONCURRENCY} range queries in flight: wall {wall:.1f} s "
                  f"(read {sum(read_s):.1f} s); CPU ours {cpu:.1f} s (this process) + {pg_cpu} s (Postgres "
                  f"backend), Prometheus {prom_cpu} s; {sum(by.values())} requests ({requests_by}); "
                  f"{rows['rows']:,} archive lines; status {job.status}, ingest error "
                  f"{job.ingest_error or 'none'}  {verdict}  [{_load()}]", flush=True)  # fmt: skip
            print(f"  data_until {job.data_until:%Y-%m-%d %H:%M}Z (ended {job.ended_at:%Y-%m-%d %H:%M}Z), "
                  f"MFU {job.mfu}, GPU util mean {job.gpu_util_mean}")  # fmt: skip
            assert flight is not None
            read = sum(read_s)
            most, mean = flight.most_and_mean(read)
            cores = f"{(p1 - p0) / read:.2f}" if p0 is not None and p1 is not None and read > 0 else "?"
            stats_where = "here, one per-series read a signal" if ingest.FINALIZE_STATS_HERE else "Prometheus"
            print(f"  read: requests in flight at most {most}, mean {mean:.2f}; Prometheus used {cores} "
                  f"cores over the read ({prom_cpus}); cross-GPU stats from {stats_where}; compression "
                  f"{'on' if settings.PROMETHEUS_COMPRESSION else 'off'}  [{_load()}]")  # fmt: skip
    finally:
        if flight is not None:
            flight.restore()
        if counter is not None:
            counter.restore()
        pipeline.read_finalize = read_finalize


if __name__ == "__main__":
    main()
