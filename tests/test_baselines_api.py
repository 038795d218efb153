"""Baselines through the API: promote finished jobs, compare a job, retire; team-scoped."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.evaluation.schema import Evaluation, encode
from jobs.intake.registry import register_job
from jobs.models import Baseline
from tests.conftest import job_body


@pytest.fixture
def setup(make_team, make_user, api_client_for, catalog):
    from jobs.api.serializers import JobRegisterSerializer

    team = make_team("llm")
    client = api_client_for(make_user("alice", teams=[team]))
    outsider = api_client_for(make_user("eve", teams=[make_team("vision")]))
    ended = (timezone.now() - timedelta(days=1)).isoformat()

    def job(external_id: str, mfu: float, *, finished: bool = True):
        body = JobRegisterSerializer(data=job_body(external_id, ended_at=ended if finished else None))
        body.is_valid(raise_exception=True)
        created = register_job(body.validated_data).job
        created.mfu, created.tokens_per_second, created.sm_active_mean = mfu, mfu * 1e6, 0.8
        if finished:
            created.status = created.Status.FINALIZED
        created.save()
        return created

    return client, outsider, job


@pytest.mark.django_db
def test_promoting_finished_jobs_builds_robust_statistics(setup):
    client, _, job = setup
    job("b1", 0.44)
    job("b2", 0.46)
    first = client.post("/api/v1/baselines/", {"job": "b1"}, format="json")
    assert first.status_code == 201, first.json()
    second = client.post("/api/v1/baselines/", {"job": "b2"}, format="json").json()
    assert second["id"] == first.json()["id"]
    assert sorted(second["runs"]) == ["b1", "b2"]
    assert second["stats"]["mfu"]["median"] == pytest.approx(0.45)
    assert client.get("/api/v1/baselines/").json()["count"] == 1


@pytest.mark.django_db
def test_a_job_below_the_band_shows_the_deviation_in_percent_and_spreads(setup):
    client, _, job = setup
    for i, mfu in enumerate((0.44, 0.45, 0.46)):
        job(f"b{i}", mfu)
        client.post("/api/v1/baselines/", {"job": f"b{i}"}, format="json")
    job("slow", 0.30)
    comparison = client.get("/api/v1/jobs/slow/").json()["baseline"]
    mfu = next(m for m in comparison["metrics"] if m["metric"] == "mfu")
    assert mfu["deviation_pct"] == pytest.approx(-33.3, abs=0.1)
    assert mfu["robust_z"] < -3
    assert mfu["verdict"] == "regression"


@pytest.mark.django_db
def test_running_jobs_and_other_teams_cannot_promote(setup):
    client, outsider, job = setup
    job("running", 0.4, finished=False)
    response = client.post("/api/v1/baselines/", {"job": "running"}, format="json")
    assert response.status_code == 400 and "finished" in response.json()["job"]
    job("done", 0.4)
    assert outsider.post("/api/v1/baselines/", {"job": "done"}, format="json").status_code == 403
    assert client.post("/api/v1/baselines/", {"job": "nope"}, format="json").status_code == 404


@pytest.mark.django_db
def test_retiring_keeps_history_and_stops_comparisons(setup):
    client, outsider, job = setup
    job("b1", 0.45)
    baseline_id = client.post("/api/v1/baselines/", {"job": "b1"}, format="json").json()["id"]
    assert outsider.post(f"/api/v1/baselines/{baseline_id}/retire/").status_code == 403
    retired = client.post(f"/api/v1/baselines/{baseline_id}/retire/")
    assert retired.status_code == 200 and retired.json()["active"] is False
    assert client.get("/api/v1/baselines/").json()["count"] == 0
    assert client.get("/api/v1/baselines/?include_retired=1").json()["count"] == 1
    assert client.get("/api/v1/jobs/b1/").json()["baseline"] is None
    assert Baseline.objects.get().retired_at is not None


@pytest.mark.django_db
def test_slower_steps_and_more_memory_count_as_regressions(setup):
    client, _, job = setup
    for i, (step_ms, mib) in enumerate(((400.0, 60000.0), (410.0, 61000.0), (405.0, 60500.0))):
        run = job(f"b{i}", 0.45)
        run.profiler_step_time_ms = step_ms
        run.evaluation = encode(Evaluation(duration_s=3600.0, gpu_hours=8.0, peak_memory_mib=mib))
        run.save()
        client.post("/api/v1/baselines/", {"job": f"b{i}"}, format="json")
    slow = job("slow", 0.45)
    slow.profiler_step_time_ms = 600.0
    slow.evaluation = encode(Evaluation(duration_s=3600.0, gpu_hours=8.0, peak_memory_mib=60200.0))
    slow.save()
    rows = {m["metric"]: m for m in client.get("/api/v1/jobs/slow/").json()["baseline"]["metrics"]}
    assert rows["step_time_ms"]["verdict"] == "regression"
    assert rows["step_time_ms"]["deviation_pct"] == pytest.approx(48.1, abs=0.1)
    assert rows["peak_memory_mib"]["verdict"] == "within"
    assert rows["comm_share_pct"]["verdict"] == "n/a"
