"""First polls of many new jobs with hours of history (#26 item 3): the cluster-wide read of N jobs whose
windows start at N different times, batched (jobs.metrics.cluster: the jobs behind read together, one
round per catch-up bucket) against one round per job (`catch_up_s=0`, what the cycle did before: a round
per 15 minutes of spread), against a real Prometheus.

Usage (from the repository root, services not needed: no database):

    .venv/bin/python benchmarks/first_polls.py --jobs 143 --hours 8 [--gpus-per-job 1]

Job i of N starts (hours x i / N) into the history and runs to its end, where the cycle polls all of them
for the first time (every job's whole window, per-GPU rows included). Prints, for each way, wall time,
this process's CPU, Prometheus' CPU, requests, and the load average; then checks both read the same series.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import _setup

_setup.setup_django("bench_first_polls")  # no database is created: the settings only

from jobs.metrics import cluster  # noqa: E402
from jobs.metrics.prometheus import PrometheusClient  # noqa: E402
from jobs.metrics.signals import DEFAULT_DISABLED  # noqa: E402
from jobs.simulate import DEFAULT_START, SimSpec, simulate  # noqa: E402

STEP, GPU_STEP = 30.0, 300.0


def _proc_cpu_s(pid: int) -> float:
    cpu = _setup.proc_cpu_s(pid)
    if cpu is None:
        raise RuntimeError(f"/proc does not show process {pid}")
    return cpu


def _floor(ts: float, step: float) -> float:
    return math.floor(ts / step) * step


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=143)
    parser.add_argument("--hours", type=float, default=8.0)
    parser.add_argument("--gpus-per-job", type=int, default=1)
    parser.add_argument("--keep", help="directory to keep (and reuse) the backfilled TSDB in")
    args = parser.parse_args()
    if args.jobs < 1 or args.hours <= 0 or args.gpus_per_job < 1:
        parser.error("--jobs, --hours and --gpus-per-job must be positive")

    total_s = args.hours * 3600.0
    end = DEFAULT_START + total_s
    specs = []
    for i in range(args.jobs):
        offset = math.floor(total_s * i / args.jobs / STEP) * STEP  # each job's own start, on the grid
        specs.append(SimSpec(scenario="healthy", gpus=args.gpus_per_job, hosts=(f"node-{i:04d}",),
                             job_id=str(90000 + i), start=DEFAULT_START + offset, duration_s=total_s - offset,
                             seed=i, disabled=DEFAULT_DISABLED - {"sm_active"}))  # fmt: skip
    with _setup.workspace(args.keep, "bench-first-polls-") as work:
        tsdb = work / f"tsdb-{args.jobs}-{args.hours}-{args.gpus_per_job}"
        made = _setup.ensure_tsdb(tsdb, lambda: [[simulate(s) for s in specs]])
        if made is not None:
            print(f"backfilled {args.jobs} jobs x {args.gpus_per_job} GPUs x {args.hours} h: "
                  f"{made[1]:.1f} s", flush=True)  # fmt: skip
        _compare(specs, end, tsdb)


def _compare(specs: list[SimSpec], end: float, tsdb: Path) -> None:
    """Read every job's first poll both ways against a Prometheus over `tsdb`, print, check they agree."""
    targets = [
        cluster.Target(
            i, s.start, end, math.floor(s.start / GPU_STEP) * GPU_STEP, labels={"hpc_job": s.job_id}
        )
        for i, s in enumerate(specs)
    ]
    with _setup.prometheus(tsdb) as (prom, prom_pid):
        results = {}
        print(
            "way                        wall_s  python_cpu_s  prometheus_cpu_s  requests  load1", flush=True
        )
        for name, catch_up in (("batched (catch-up rounds)", None), ("one round per job (before)", 0.0)):
            with PrometheusClient(prom.url, timeout_s=120, retries=0) as client:
                p0, c0, w0 = _proc_cpu_s(prom_pid), time.process_time(), time.perf_counter()
                result = cluster.read_cycle(client, targets, step=STEP, per_gpu_step=GPU_STEP,
                                            scrape_interval_s=30.0, catch_up_s=catch_up,
                                            workers=cluster.CYCLE_QUERY_WORKERS)  # fmt: skip
                wall = time.perf_counter() - w0
                cpu, prom_cpu = time.process_time() - c0, _proc_cpu_s(prom_pid) - p0
                print(f"{name:26s} {wall:7.1f}  {cpu:12.1f}  {prom_cpu:16.1f}  {client.requests:8d}  "
                      f"{_setup.load1():5.1f}", flush=True)  # fmt: skip
                assert not result.errors and not result.fallback, (result.errors, result.fallback)
                results[name] = result
        batched, alone = results.values()
        for key, sigs in alone.signals.items():
            mine = batched.signals[key]
            assert set(mine.signals) == set(sigs.signals) and mine.missing == sigs.missing, key
            for sig, series in sigs.signals.items():
                for stat, values in series.stats.items():
                    np.testing.assert_allclose(mine.signals[sig].stats[stat], values, rtol=1e-9, atol=1e-12,
                                               equal_nan=True, err_msg=f"{key} {sig} {stat}")  # fmt: skip
                rows, theirs = mine.signals[sig].per_gpu, series.per_gpu
                assert (rows is None) == (theirs is None), (key, sig)
                if rows is not None and theirs is not None:
                    np.testing.assert_allclose(rows, theirs, rtol=1e-9, equal_nan=True)
        print(f"same series for all {len(alone.signals)} jobs both ways", flush=True)


if __name__ == "__main__":
    main()
