"""Real archived series for page tests: simulated dcgm-exporter data backfilled into a real Prometheus,
then pulled through jobs.pipeline.poll (finalize for an ended job, poll for a running one), exactly as in
production. Shared by tests/test_pages.py and the browser tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from jobs.simulate import (
    DEFAULT_START,
    SimResult,
    SimSpec,
    backfill,
    registration_body,
    simulate,
    write_openmetrics,
)

HOUR = 3600.0
START = datetime.fromtimestamp(DEFAULT_START, tz=UTC)
# A straggler among 16 GPUs with the default exporter set plus SM_ACTIVE; and a job that shows only
# nvidia-smi util (SM_ACTIVE off, the dcgm-exporter default), which must say "missing", never 0.
SPECS = {
    "7001": SimSpec(scenario="straggler", gpus=16, job_id="7001", duration_s=3 * HOUR, seed=11,
                    hosts=("node-a", "node-b")),
    "7002": SimSpec(scenario="false_saturation", gpus=4, job_id="7002", duration_s=3 * HOUR, seed=12,
                    hosts=("node-c",), disabled=frozenset({"sm_active"})),
}  # fmt: skip


def simulate_all() -> dict[str, SimResult]:
    """The simulated jobs, keyed by job id."""
    return {job_id: simulate(spec) for job_id, spec in SPECS.items()}


@contextmanager
def prometheus_with(sims: dict[str, SimResult], workdir: Path) -> Iterator[Any]:
    """A real Prometheus serving the simulated jobs' exporter data (skips when not installed)."""
    import pytest

    from tests.prom_server import PrometheusProcess, prometheus_binary

    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (Debian package 'prometheus')")
    om = workdir / "data.om"
    write_openmetrics(list(sims.values()), om)
    backfill(om, workdir / "tsdb")
    with PrometheusProcess(workdir / "tsdb") as server:
        yield server


def register(sim: SimResult, team: Any, *, ended: bool, **extra: Any):
    """Register a simulated job as the scheduler would (model config, GPUs, throughput query)."""
    from jobs.intake.registry import register_job

    n = len(sim.gpus)
    data = registration_body(
        sim, team=team, name=f"pretrain-{sim.spec.job_id}", model="llama-7b", ended=ended, owner="alice",
        parallelism={"tp": 1, "pp": 1, "dp": n, "ep": 1}, micro_batch=4, global_batch=4 * n,
    )  # fmt: skip
    data["model"]["seq_len"] = 4096
    data.update(extra)
    return register_job(data).job


def ingest(job: Any, prom_url: str, *, ended: bool, hours: float = 2.0) -> Any:
    """Pull the job's series from Prometheus into the archive (finalize when ended, else one poll
    `hours` after the simulated start)."""
    from jobs.metrics.prometheus import PrometheusClient
    from jobs.pipeline import poll as ingestion

    client = PrometheusClient(prom_url, timeout_s=20, retries=0)
    if ended:
        return ingestion.finalize_job(job, client, now=START + timedelta(hours=4))
    return ingestion.poll_job(job, client, now=START + timedelta(hours=hours))


def add_findings(job: Any) -> list[Any]:
    """Two findings with short windows inside the job, besides what the diagnosis found (job 7001: the
    planted straggler, whole job): one worth more $/day than it, one worth less. Written as the rules
    write them; update_or_create in case a rule reports the same code."""
    from jobs.models import Finding

    t0 = START.timestamp()
    specs = {
        "throttling": dict(
            severity="warning", confidence=0.8, title="Clocks throttled on node-a",
            windows=[[t0 + 3600, t0 + 5400]], window_start=START + timedelta(hours=1),
            window_end=START + timedelta(hours=1, minutes=30),
            evidence=[{"label": "SM clock of node-a/3", "value": 1410.0, "unit": "MHz"},
                      {"label": "boost clock", "value": 1830.0, "unit": "MHz"}],
            recommendation="Check cooling of node-a <b>now</b>.", waste_per_day_usd=812.5,
        ),
        "communication_wait": dict(
            severity="info", confidence=0.6, title="Collectives wait",
            windows=[[t0 + 600, t0 + 900], [t0 + 7200, t0 + 7500]],
            evidence=[{"label": "NCCL share of step", "value": 31.0, "unit": "%"}],
            recommendation="Overlap gradient buckets with backward.", waste_per_day_usd=120.0,
        ),
    }  # fmt: skip
    return [Finding.objects.update_or_create(job=job, code=code, defaults=d)[0] for code, d in specs.items()]
