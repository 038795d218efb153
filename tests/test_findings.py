"""run_diagnosis on simulated jobs read back from a real Prometheus, and a small evaluate_diagnosis run."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command

from benchmarks.diagnosis_inputs import input_from_sim
from jobs.diagnosis import diagnose
from jobs.intake.registry import register_job
from jobs.metrics.prometheus import PrometheusClient
from jobs.models import Artifact, Baseline, Finding, Job
from jobs.pipeline import poll as pipeline
from jobs.pipeline.findings import build_input, run_diagnosis
from jobs.simulate import DEFAULT_START, SimSpec, backfill, registration_body, simulate, write_openmetrics
from tests.prom_server import PrometheusProcess, prometheus_binary

pytestmark = [pytest.mark.prometheus]
HOUR = 3600.0
START = datetime.fromtimestamp(DEFAULT_START, tz=UTC)


@pytest.fixture(scope="module")
def sims():
    """Three simulated jobs on their own nodes: launch overhead, an input stall, a healthy one."""
    specs = {
        "2001": SimSpec(scenario="launch_overhead", gpus=8, job_id="2001", seed=5, hosts=("diag-a",)),
        "2002": SimSpec(
            scenario="data_pipeline_stall",
            gpus=8,
            job_id="2002",
            seed=6,
            hosts=("diag-b",),
            noise=0.08,
            missing_fraction=0.2,
        ),
        "2003": SimSpec(scenario="healthy", gpus=4, job_id="2003", seed=7, hosts=("diag-c",)),
    }
    return {k: simulate(v) for k, v in specs.items()}


@pytest.fixture(scope="module")
def prom(sims, tmp_path_factory):
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (Debian package 'prometheus')")
    work = tmp_path_factory.mktemp("findings-prom")
    write_openmetrics(list(sims.values()), work / "data.om")
    backfill(work / "data.om", work / "tsdb")
    with PrometheusProcess(work / "tsdb") as server:
        yield server


def _finalized(sim, team, prom, model: str = "sim-7b") -> Job:
    job = register_job(registration_body(sim, team=team, model=model)).job
    client = PrometheusClient(prom.url, timeout_s=10, retries=0)
    return pipeline.finalize_job(job, client, now=START + timedelta(hours=3))


def _rows(job: Job) -> dict[str, tuple]:
    return {
        f.code: (f.pk, f.severity, round(f.confidence, 6), f.title, f.waste_per_day_usd)
        for f in Finding.objects.filter(job=job)
    }


@pytest.mark.django_db
def test_findings_are_stored_once_and_updated_in_place(prom, sims, make_team):
    job = _finalized(sims["2001"], make_team("llm"), prom)
    stored = run_diagnosis(job)
    codes = [f.code for f in stored]
    assert "launch_overhead" in codes and len(codes) == len(set(codes))
    first = _rows(job)
    assert first["launch_overhead"][1] in ("warning", "critical")
    run_diagnosis(job)
    run_diagnosis(job)
    assert _rows(job) == first  # same rows (same primary keys), no duplicates
    top = Finding.objects.filter(job=job).first()
    assert top.code == "launch_overhead" and top.window_start is not None and top.evidence
    assert all({"label", "value", "unit"} <= set(e) for e in top.evidence)
    job.refresh_from_db()
    total = sum(f.waste_per_day_usd for f in Finding.objects.filter(job=job))
    assert 0 < total <= job.waste_per_day_usd


@pytest.mark.django_db
def test_a_code_no_longer_found_is_deleted_and_artifacts_count_only_when_parsed(prom, sims, make_team):
    job = _finalized(sims["2003"], make_team("llm"), prom)
    assert run_diagnosis(job) == []
    analysis = {
        "ranks": [
            {
                "rank": 0,
                "temporal_breakdown": {"idle_pct": 30.0, "span_ms": 1000.0},
                "sync": {"cpu_sync_calls": 60, "cpu_sync_ms": 400.0},
                "step_times": {"count": 5},
            }
        ]
    }
    art = Artifact.objects.create(
        job=job,
        kind="kineto",
        original_name="t.json.gz",
        sha256="a" * 64,
        size_bytes=10,
        status=Artifact.Status.PARSING,
        analysis=analysis,
    )
    assert run_diagnosis(job) == []
    art.status = Artifact.Status.DONE
    art.save()
    assert [f.code for f in run_diagnosis(job)] == ["host_sync"]
    pk = Finding.objects.get(job=job, code="host_sync").pk
    assert [f.pk for f in run_diagnosis(job)] == [pk]
    art.delete()
    assert run_diagnosis(job) == []
    assert not Finding.objects.filter(job=job).exists()


@pytest.mark.django_db
def test_prometheus_path_agrees_with_the_pure_emulation(prom, sims, make_team):
    team = make_team("llm")
    for key in ("2001", "2002"):
        job = _finalized(sims[key], team, prom)
        via_prom = {f.code for f in diagnose(build_input(job)) if f.severity.rank >= 1}
        emulated = {f.code for f in diagnose(input_from_sim(sims[key])) if f.severity.rank >= 1}
        assert via_prom == emulated == {sims[key].truth["code"]}


@pytest.mark.django_db
def test_the_active_baseline_is_compared(prom, sims, make_team):
    team = make_team("llm")
    job = _finalized(sims["2003"], team, prom, model="sim-7b-baselined")
    Baseline.objects.create(
        fingerprint=job.config_fingerprint,
        model_name=job.model_name,
        team=team,
        stats={"mfu": {"median": 0.62, "mad": 0.01, "n": 3}},
    )
    job = _finalized(sims["2003"], team, prom, model="sim-7b-baselined")  # reference MFU now the baseline's
    found = {f.code: f for f in run_diagnosis(job)}
    assert found["baseline_regression"].severity in ("warning", "critical")
    assert found["baseline_regression"].waste_per_day_usd <= job.waste_per_day_usd


@pytest.mark.django_db
def test_evaluate_diagnosis_small_run_completes_and_writes_nothing(make_team):
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (Debian package 'prometheus')")
    before = Job.objects.count()
    out = io.StringIO()
    call_command(
        "evaluate_diagnosis", "--per-scenario", "1", "--seed", "3", "--json", stdout=out, stderr=io.StringIO()
    )
    report = json.loads(out.getvalue())
    assert report["jobs"] == 14 and report["findings_dollars_within_waste"] is True
    assert report["healthy_false_warning_rate"] == 0.0
    assert set(report["per_code"]) >= {"false_saturation", "idle_gpus", "baseline_regression"}
    assert all(m["recall"] == 1.0 for m in report["per_code"].values())
    assert Job.objects.count() == before
