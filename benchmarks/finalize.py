"""Finalizing one big ended job against a real Prometheus, in a throwaway database.

Usage (from the repository root, services started with `.ci/services start`):

    .venv/bin/python benchmarks/finalize.py [--gpus 256] [--days 3] [--step-s 30] [--keep DIR]

Simulates one ended job (`jobs.simulate`, healthy scenario, `--gpus` GPUs on 8-GPU nodes with
dcgm-exporter's labels, a default exporter's counters plus SM_ACTIVE, one sample per `--step-s` over
`--days`), backfills it into a throwaway Prometheus (promtool, `--chunk-h` hours at a time; `--keep
DIR` keeps the TSDB there and reuses it on the next run), registers it as a scheduler would (explicit GPU
list, the simulator's throughput query) and runs `jobs.pipeline.finalize_job` once, as the
finalize task does.

Prints the time of that one try (wall, this process' CPU, Prometheus' CPU), the requests it sent to
Prometheus by endpoint, the archive rows it wrote, whether it succeeded (status, ingest error), and the
1-minute load average beside each figure (issue 26 item 6: a 256-GPU x 3-day job in < 60 s).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "efficiency.settings")
os.environ.setdefault("TEST_DATABASE_NAME", "bench_finalize")

import django

django.setup()

import requests  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402

DAY = 86400.0
_TICK = os.sysconf("SC_CLK_TCK")


def _load() -> str:
    return f"load {os.getloadavg()[0]:4.1f}"


def _proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a process in seconds (None when /proc does not show it)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


class _Requests:
    """Counts HTTP requests to Prometheus by endpoint (wraps requests.Session.request)."""

    def __init__(self) -> None:
        self.by_endpoint: Counter[str] = Counter()
        self._original = requests.Session.request
        original = self._original

        def request(session: requests.Session, method: str, url: str, **kwargs: Any) -> Any:
            self.by_endpoint[url.rsplit("/api/v1/", 1)[-1]] += 1
            return original(session, method, url, **kwargs)

        requests.Session.request = request  # type: ignore[method-assign,assignment]

    def restore(self) -> None:
        requests.Session.request = self._original  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--days", type=float, default=3.0)
    parser.add_argument("--step-s", type=float, default=30.0, help="simulated scrape interval")
    parser.add_argument("--keep", help="directory to keep (and reuse) the backfilled TSDB in")
    parser.add_argument("--chunk-h", type=float, default=3.0, help="hours of data per promtool run")
    args = parser.parse_args()
    if args.gpus < 1 or args.days <= 0 or args.step_s <= 0:
        parser.error("--gpus, --days and --step-s must be positive")

    from jobs.metrics.signals import DEFAULT_DISABLED
    from jobs.simulate import SimSpec, backfill, simulate, write_openmetrics
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
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-finalize-"))
    work.mkdir(parents=True, exist_ok=True)
    tsdb = work / f"tsdb-{args.gpus}-{args.days:g}d-{args.step_s:g}s"
    try:
        if not tsdb.exists():
            t = time.perf_counter()
            size = 0
            partial = tsdb.with_name(tsdb.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            # In time slices of --chunk-h, each one block: promtool holds a block's samples in memory
            # (the whole 3-day file at once grew it past 11 GB) and re-reads the file once per block.
            for part in _slices(sim, args.chunk_h * 3600.0):
                om = work / "data.om"
                write_openmetrics([part], om)
                size += om.stat().st_size
                backfill(om, partial, timeout_s=3600, max_block_duration="24h")
                om.unlink()
            partial.rename(tsdb)
            print(f"backfilled {size / 2**20:,.0f} MiB of OpenMetrics: {time.perf_counter() - t:.1f} s  "
                  f"[{_load()}]", flush=True)  # fmt: skip
        _finalize(sim, tsdb)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


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
    from jobs.metrics import archive
    from jobs.metrics.prometheus import PrometheusClient
    from jobs.metrics.promserver import PrometheusProcess
    from jobs.models import Job, Team
    from jobs.pipeline import poll as pipeline
    from jobs.simulate import registration_body

    setup_test_environment()
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    rows = Counter[str]()
    upsert = archive.upsert

    def counted(batch: Any) -> Any:
        rows["rows"] += len(batch)
        return upsert(batch)

    archive.upsert = counted  # type: ignore[assignment]
    counter: _Requests | None = None
    try:
        team = Team.objects.create(slug="bench", name="Bench")
        register_job(registration_body(sim, team=team, ended=True))
        job = Job.objects.get(external_id=sim.spec.job_id)
        with PrometheusProcess(tsdb) as prom:
            assert prom._proc is not None
            client = PrometheusClient(prom.url, timeout_s=120, retries=0)
            counter = _Requests()
            assert job.ended_at is not None
            now = job.ended_at + timedelta(minutes=5)
            p0, w0, c0 = _proc_cpu_s(prom._proc.pid), time.perf_counter(), time.process_time()
            job = pipeline.finalize_job(job, client, now=now)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            p1 = _proc_cpu_s(prom._proc.pid)
        prom_cpu = f"{p1 - p0:.1f}" if p0 is not None and p1 is not None else "?"
        requests_by = ", ".join(f"{n} {endpoint}" for endpoint, n in sorted(counter.by_endpoint.items()))
        verdict = "ok" if wall < 60 and not job.ingest_error else "OVER 60 s or failed"
        assert job.ended_at is not None
        days = (job.ended_at - job.started_at) / timedelta(days=1)
        print(f"finalize_job, {job.gpu_count} GPUs x {days:g} days: wall {wall:.1f} s, CPU this process "
              f"{cpu:.1f} s, Prometheus {prom_cpu} s; {sum(counter.by_endpoint.values())} requests "
              f"({requests_by}); {rows['rows']:,} archive lines; status {job.status}, ingest error "
              f"{job.ingest_error or 'none'}  {verdict}  [{_load()}]", flush=True)  # fmt: skip
        print(f"  data_until {job.data_until:%Y-%m-%d %H:%M}Z (ended {job.ended_at:%Y-%m-%d %H:%M}Z), "
              f"MFU {job.mfu}, GPU util mean {job.gpu_util_mean}")  # fmt: skip
    finally:
        if counter is not None:
            counter.restore()
        archive.upsert = upsert
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
