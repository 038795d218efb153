"""The set-up the Prometheus-backed benchmarks share (poll_cycle.py, poll_cost.py, finalize.py,
first_polls.py): Django configured for a throwaway database, simulated jobs backfilled into a TSDB (kept in
`--keep DIR` and reused, or thrown away), a throwaway Prometheus over it, a throwaway Postgres database,
and the CPU and load figures they print beside their timings.

A benchmark calls `setup_django` before importing anything of the apps (it runs `django.setup()`):

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import _setup

    _setup.setup_django("bench_poll_cost")

Nothing here is timed: the benchmarks measure only what happens inside these context managers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobs.metrics.promserver import PrometheusProcess
    from jobs.simulate.core import SimResult

REPO = Path(__file__).resolve().parents[1]
T0 = 1_767_225_600.0  # jobs.simulate.DEFAULT_START: a multiple of the 2 h aggregate chunk
_TICK = os.sysconf("SC_CLK_TCK")


def setup_django(test_database: str) -> None:
    """Settings for a benchmark process, then `django.setup()`: the repository on sys.path, the
    development settings (`DEBUG=true` unless set: no SECRET_KEY needed; `throwaway_database` turns DEBUG
    off again, as in a deployment) and `test_database` as the throwaway database's name unless
    TEST_DATABASE_NAME is set (so two benchmarks, or a benchmark and the tests, never share one)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "efficiency.settings")
    os.environ.setdefault("TEST_DATABASE_NAME", test_database)
    os.environ.setdefault("DEBUG", "true")
    import django

    django.setup()


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a process in seconds (None when /proc does not show it)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


RequestSeen = Callable[[str, str, dict[str, Any]], None]


def tap_requests(seen: RequestSeen) -> Callable[..., Any]:
    """Call `seen(method, url, kwargs)` for every HTTP request sent through `requests.Session.request` (the
    benchmarks count or record what the service sends to Prometheus), then send it; returns the original
    method, for `untap_requests` and for sending without being seen."""
    import requests

    original = requests.Session.request

    def request(session: requests.Session, method: str, url: str, **kwargs: Any) -> Any:
        seen(method, url, kwargs)
        return original(session, method, url, **kwargs)

    requests.Session.request = request  # type: ignore[method-assign,assignment]
    return original


def untap_requests(original: Callable[..., Any]) -> None:
    """Put back what `tap_requests` replaced."""
    import requests

    requests.Session.request = original  # type: ignore[method-assign]


def load1() -> float:
    """The 1-minute load average (printed beside every figure: on a shared machine it explains the swing)."""
    return os.getloadavg()[0]


@contextlib.contextmanager
def workspace(keep: str | None, prefix: str) -> Iterator[Path]:
    """`keep` (created if needed, left in place: its TSDB is reused by the next run) or a temporary
    directory removed on exit."""
    if keep:
        path = Path(keep)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def ensure_tsdb(
    tsdb: Path,
    parts: Callable[[], Iterable[Sequence[SimResult]]],
    *,
    max_block_duration: str | None = None,
    timeout_s: float = 3600.0,
) -> tuple[float, float] | None:
    """Backfill `tsdb` with promtool unless it exists: each element of `parts()` (a list of simulated jobs)
    is written as OpenMetrics next to it and backfilled on its own (promtool holds a block's samples in
    memory: a big job goes in time slices), into `<tsdb>.partial`, renamed when complete so an interrupted
    backfill is never reused. Returns (MiB of OpenMetrics, seconds), or None when `tsdb` was there."""
    from jobs.simulate import backfill, write_openmetrics

    if tsdb.exists():
        return None
    t = time.perf_counter()
    partial = tsdb.with_name(tsdb.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    om = tsdb.with_name(tsdb.name + ".om")
    size = 0
    try:
        for sims in parts():
            write_openmetrics(list(sims), om)
            size += om.stat().st_size
            backfill(om, partial, timeout_s=timeout_s, max_block_duration=max_block_duration)
    finally:
        om.unlink(missing_ok=True)
    partial.rename(tsdb)
    return size / 2**20, time.perf_counter() - t


def cluster_sims(jobs: int, minutes: float, seed: int) -> list[SimResult]:
    """`jobs` running jobs x 8 GPUs, one node each (`gpu-node-00001`, ...), the cluster's scenario mix, a
    default exporter's counters plus SM_ACTIVE, 30 s samples, 1 % missing, started within the first 2
    minutes after T0 and running `minutes` from T0 (the poll-cycle benchmarks' cluster)."""
    from jobs.metrics.signals import DEFAULT_DISABLED
    from jobs.simulate import CLUSTER_MIX, SimSpec, simulate

    names = list(CLUSTER_MIX)
    out = []
    for j in range(jobs):
        offset = 30.0 * (j % 4)  # jobs started within the first 2 minutes
        spec = SimSpec(
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
        out.append(simulate(spec))
    return out


@contextlib.contextmanager
def prometheus(tsdb: Path) -> Iterator[tuple[PrometheusProcess, int]]:
    """A throwaway Prometheus over `tsdb` (jobs.metrics.promserver) and its pid, for its CPU."""
    from jobs.metrics.promserver import PrometheusProcess

    with PrometheusProcess(tsdb) as prom:
        assert prom._proc is not None
        yield prom, prom._proc.pid


@contextlib.contextmanager
def throwaway_database(caches: dict[str, Any] | None = None) -> Iterator[str]:
    """A migrated test database (TEST_DATABASE_NAME), destroyed on exit; yields its name. DEBUG off as in
    a deployment (with it on, Django keeps every query's SQL: CPU that is not the benchmark's), and the
    cache `caches` (default: this process' memory, so no Redis state is shared with anything else)."""
    from django.conf import settings
    from django.db import connection
    from django.test.utils import setup_test_environment

    setup_test_environment(debug=False)
    settings.CACHES = caches or {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        yield str(connection.settings_dict["NAME"])
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


def backend_pid() -> int:
    """The pid of this connection's Postgres backend (its CPU is ours too)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        return int(cur.fetchone()[0])


@contextlib.contextmanager
def counting_archive_rows() -> Iterator[Counter[str]]:
    """Counts the rows `jobs.metrics.archive.upsert` writes (`["rows"]`) while inside."""
    from jobs.metrics import archive

    rows = Counter[str]()
    upsert = archive.upsert

    def counted(batch: Any, **options: Any) -> Any:
        rows["rows"] += len(batch)
        return upsert(batch, **options)

    archive.upsert = counted  # type: ignore[assignment]
    try:
        yield rows
    finally:
        archive.upsert = upsert
