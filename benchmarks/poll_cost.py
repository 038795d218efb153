"""Our CPU per poll cycle beside the Prometheus floor (#26 item 2), measured in one run.

Usage (from the repository root, services started):

    .venv/bin/python benchmarks/poll_cost.py --gpus 400 [--cycles 3] [--profile] [--keep DIR]

Builds N/8 running jobs x 8 GPUs (one node each, `hpc_job` labels, a default dcgm-exporter's counters
plus SM_ACTIVE, 30 s samples), backfills them into a throwaway Prometheus (promtool) and registers them
in a throwaway database, as benchmarks/poll_cycle.py does. Then it runs `--cycles` one-minute cycles
(`jobs.pipeline.poll.poll_cycle`, the cycle's per-job path included: archive, evaluation, derived series,
diagnosis when due, alert rules) and records every HTTP request the last cycle sent to Prometheus. Last,
it replays those requests alone, with the cycle's query concurrency (`cluster.CYCLE_QUERY_WORKERS`), and
measures Prometheus' CPU for them: the floor, what any client of the same reads must pay.

It prints, for the last (steady) cycle: our CPU (this process: Python, numpy, the HTTP and Postgres
clients; plus this connection's Postgres backend, from /proc), Prometheus' CPU during the cycle and during
the replay, the ratio ours / replay, and the load average before and after (a busy machine inflates
every figure, ours and Prometheus' alike, but the ratio less). `--profile` runs one more cycle under
cProfile (which inflates CPU, so it is not the measured one) and prints its top (cumulative).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import _setup

# The development settings (no SECRET_KEY needed); DEBUG off again in the throwaway database, so queries
# are not logged.
_setup.setup_django("bench_poll_cost")

import requests  # noqa: E402
from django.db import connection  # noqa: E402

T0 = _setup.T0
_proc_cpu_s = _setup.proc_cpu_s


class _Recorder:
    """Records every HTTP request sent through requests.Session.request while `on` is set."""

    def __init__(self) -> None:
        self.on = False
        self.sent: list[tuple[str, str, Any, Any, Any]] = []
        self._original = _setup.tap_requests(self._seen)

    def _seen(self, method: str, url: str, kwargs: dict[str, Any]) -> None:
        if self.on:
            # The headers too: the client asks for uncompressed answers unless PROMETHEUS_COMPRESSION is
            # on, and a replay asking for gzip (requests' default) would bill Prometheus for compressing.
            self.sent.append((method, url, kwargs.get("data"), kwargs.get("params"), kwargs.get("headers")))

    def replay(self, workers: int, timeout_s: float) -> float:
        """Send the recorded requests again (`workers` at a time); returns the wall seconds."""
        session = requests.Session()
        original = self._original

        def send(item: tuple[str, str, Any, Any, Any]) -> None:
            method, url, data, params, headers = item
            resp = original(
                session, method, url, data=data, params=params, headers=headers, timeout=timeout_s
            )
            resp.raise_for_status()
            _ = resp.content  # the whole body, as the client reads it

        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(send, self.sent))
        session.close()
        return time.perf_counter() - t


class _Statements:
    """Counts SQL statements by shape (their first 70 characters, parameters aside)."""

    def __init__(self) -> None:
        self.by_shape: Counter[str] = Counter()

    def count(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.by_shape[" ".join(sql.split())[:70]] += 1
        return execute(sql, params, many, context)

    def skip(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        return execute(sql, params, many, context)


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def main() -> None:
    """Run the benchmark (see the module docstring)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=400)
    parser.add_argument("--cycles", type=int, default=3, help="cycles to run; the last one is measured")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--history-min", type=int, default=10, help="job age at the first cycle (minutes)")
    parser.add_argument("--keep", help="directory to keep (and reuse) the backfilled TSDB in")
    parser.add_argument("--profile", action="store_true", help="cProfile the measured cycle, top 40")
    parser.add_argument("--profile-out", help="also write the profile's pstats to this file")
    parser.add_argument(
        "--queries", type=int, default=0, help="print the measured cycle's N commonest SQL shapes"
    )
    args = parser.parse_args()
    if args.cycles < 1:
        parser.error("--cycles must be at least 1")

    n_jobs = max(1, args.gpus // 8)
    minutes = args.history_min + args.cycles + 3
    sims = _setup.cluster_sims(n_jobs, minutes, args.seed)
    with _setup.workspace(args.keep, "bench-poll-cost-") as work:
        tsdb = work / f"tsdb-{n_jobs}-{args.seed}-{minutes}"
        _setup.ensure_tsdb(tsdb, lambda: [sims])
        # DEBUG off as in a deployment: with it on, Django keeps every query's SQL (CPU that is not the
        # cycle's).
        with _setup.throwaway_database():
            _measure(args, sims, tsdb)


def _measure(args: argparse.Namespace, sims: list[Any], tsdb: Path) -> None:
    """Register the jobs, run the cycles against a Prometheus over `tsdb`, replay, print."""
    from jobs.intake.registry import register_job
    from jobs.metrics import cluster
    from jobs.metrics.prometheus import PrometheusClient
    from jobs.models import Job, Team
    from jobs.pipeline import poll as pipeline
    from jobs.simulate import registration_body

    n_jobs = len(sims)
    first = T0 + args.history_min * 60.0
    recorder = _Recorder()
    statements = _Statements()
    team = Team.objects.create(slug="bench", name="Bench")
    for sim in sims:
        body = registration_body(sim, team=team, ended=False)
        body["gpus"], body["selector"] = [], {"hpc_job": sim.spec.job_id}
        register_job(body)
    # Steady state: a tenth of the jobs due for their diagnosis in each one-minute cycle.
    every = pipeline.DIAGNOSE_RUNNING_EVERY.total_seconds()
    for i, pk in enumerate(Job.objects.order_by("pk").values_list("pk", flat=True)):
        last = first - every + 60.0 * (i % round(every / 60.0))
        Job.objects.filter(pk=pk).update(diagnosed_at=datetime.fromtimestamp(last, tz=UTC))
    pg_pid = _setup.backend_pid()
    with _setup.prometheus(tsdb) as (prom, prom_pid):
        client = PrometheusClient(prom.url, timeout_s=60, retries=0)
        profiler: cProfile.Profile | None = None
        measured: dict[str, float] = {}
        for c in range(args.cycles + (1 if args.profile else 0)):
            now = datetime.fromtimestamp(first + 60.0 * c, tz=UTC)
            if c == args.cycles:  # one more cycle under the profiler (which inflates CPU): not measured
                # CPU time, not wall: on a shared machine, waits for Postgres and Prometheus dominate.
                profiler = cProfile.Profile(time.process_time)
                profiler.enable()
                pipeline.poll_cycle(client, now=now)
                profiler.disable()
                break
            recorder.on = c == args.cycles - 1
            load0 = _load()
            cpu0, p0, g0 = time.process_time(), _proc_cpu_s(prom_pid), _proc_cpu_s(pg_pid)
            w0 = time.perf_counter()
            with connection.execute_wrapper(statements.count if c == args.cycles - 1 else statements.skip):
                report = pipeline.poll_cycle(client, now=now)
            wall = time.perf_counter() - w0
            cpu = time.process_time() - cpu0
            p1, g1 = _proc_cpu_s(prom_pid), _proc_cpu_s(pg_pid)
            recorder.on = False
            assert p0 is not None and p1 is not None and g0 is not None and g1 is not None
            measured = {"wall": wall, "python": cpu, "prometheus": p1 - p0, "postgres": g1 - g0}
            print(f"cycle {c + 1}: {report['jobs']} jobs, {report['stale']} stale, wall {wall:.1f} s, "
                  f"python {cpu:.2f} CPU-s, postgres {g1 - g0:.2f} CPU-s, load {load0}",
                  flush=True)  # fmt: skip
        wall, cpu = measured["wall"], measured["python"]
        prom_cycle, postgres = measured["prometheus"], measured["postgres"]
        time.sleep(1.0)
        r0 = _proc_cpu_s(prom_pid)
        replay_wall = recorder.replay(cluster.CYCLE_QUERY_WORKERS, 60.0)
        r1 = _proc_cpu_s(prom_pid)
        assert r0 is not None and r1 is not None
        prom_replay = r1 - r0
        ours = cpu + postgres
        print(f"\nmeasured cycle ({n_jobs} jobs x 8 GPUs, {len(recorder.sent)} Prometheus requests):")
        print(f"  ours:        {ours:6.2f} CPU-s  (python {cpu:.2f} + postgres backend {postgres:.2f}); "
              f"{1000 * ours / n_jobs:.1f} ms per job; cycle wall {wall:.1f} s")  # fmt: skip
        print(f"  prometheus:  {prom_cycle:6.2f} CPU-s during the cycle")
        print(f"  replay:      {prom_replay:6.2f} CPU-s of Prometheus for the same requests alone "
              f"(wall {replay_wall:.1f} s)")  # fmt: skip
        ratio = ours / prom_replay if prom_replay > 0 else float("inf")
        print(f"  ratio ours / Prometheus floor: {ratio:.2f} (target <= 1.5); load average {_load()}")
        total = sum(statements.by_shape.values())
        print(f"  SQL statements: {total} ({total / n_jobs:.1f} per job)")
        for shape, n in statements.by_shape.most_common(args.queries):
            print(f"    {n:6d}  {shape}")
        if profiler is not None:
            print(f"\nprofile of cycle {args.cycles + 1} (not the measured one):")
            stats = pstats.Stats(profiler)
            stats.sort_stats("cumulative").print_stats(40)
            if args.profile_out:
                stats.dump_stats(args.profile_out)


if __name__ == "__main__":
    main()
