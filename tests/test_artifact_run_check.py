"""An artifact belongs to a run: GPU model, capture time and rank are checked against its job; a mismatched
artifact changes nothing until a user confirms it, and any artifact can be excluded."""

from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile

from jobs.intake import artifacts
from jobs.models import Artifact, Finding, Job
from jobs.profiling.run_check import CLOCK_SLACK_S, JobFacts, check_run
from tests.conftest import job_body

START = datetime(2026, 11, 23, 8, tzinfo=UTC).timestamp()  # job_body's started_at
H100 = JobFacts(gpu_model="H100 SXM", gpu_count=8, start_unix=START, end_unix=START + 6 * 3600)
NOW = START + 7 * 3600


def canonical(name: str) -> str | None:
    # What the catalog resolver does for these names (jobs.intake.registry.resolve_gpu_model).
    return {"NVIDIA H100 80GB HBM3": "H100 SXM", "NVIDIA A100-SXM4-80GB": "A100 SXM 80GB"}.get(name)


def check(capture, rank=None, job=H100):
    return check_run(capture, job, rank=rank, now_unix=NOW, canonical_gpu=canonical)


# --- the pure check ------------------------------------------------------------------------------------


def test_a_trace_from_the_jobs_gpu_window_and_rank_matches():
    capture = {"gpu_names": ["NVIDIA H100 80GB HBM3"], "start_unix": START + 3600, "end_unix": START + 3660,
               "ranks": [3], "world_size": 8}  # fmt: skip
    result = check(capture, rank=3)
    assert result.status == "matches" and result.mismatches == []
    assert result.checked == ["gpu", "time", "rank", "world size"]


def test_an_a100_trace_on_an_h100_job_is_a_mismatch_naming_both():
    result = check({"gpu_names": ["NVIDIA A100-SXM4-80GB"]})
    assert result.status == "mismatch"
    assert result.mismatches == ["captured on NVIDIA A100-SXM4-80GB, but the job runs on H100 SXM"]


def test_a_gpu_the_catalog_does_not_know_differs_from_a_known_job_gpu():
    # An MI250 is not in the catalog (canonical None) but the job's H100 is known: they differ.
    assert check({"gpu_names": ["AMD Instinct MI250X"]}).status == "mismatch"
    # Both unknown: nothing to compare, so nothing is judged.
    unknown_job = JobFacts(gpu_model=None, gpu_count=8, start_unix=START, end_unix=None)
    assert check({"gpu_names": ["AMD Instinct MI250X"]}, job=unknown_job).status == "unverifiable"


def test_capture_time_outside_the_window_beyond_the_clock_slack_is_a_mismatch():
    # Ends 11 minutes before the job starts: 660 s > CLOCK_SLACK_S (600 s) of tolerated skew.
    early = check({"start_unix": START - 700, "end_unix": START - 660})
    assert early.status == "mismatch" and "outside the job's window" in early.mismatches[0]
    # Ends 9 minutes before the start: within the slack, so it overlaps the job.
    assert check({"start_unix": START - 600, "end_unix": START - 540}).status == "matches"
    assert CLOCK_SLACK_S == 600
    # A running job's window reaches to now; a capture after now + slack cannot be from it.
    running = JobFacts(gpu_model="H100 SXM", gpu_count=8, start_unix=START, end_unix=None)
    assert check({"start_unix": NOW - 60, "end_unix": NOW}, job=running).status == "matches"
    assert check({"start_unix": NOW + 3600, "end_unix": NOW + 3700}, job=running).status == "mismatch"


def test_a_rank_outside_the_jobs_gpus_and_a_different_world_size_are_mismatches():
    assert check({}, rank=8).mismatches == ["rank 8 is not one of the job's 8 GPUs (ranks 0–7)"]
    assert check({"ranks": [0]}, rank=None).status == "matches"
    world = check({"world_size": 128, "ranks": [0]})
    assert world.mismatches == ["the trace is from a 128-rank run; the job has 8 GPUs"]


def test_a_file_that_states_nothing_is_unverifiable_and_junk_is_ignored():
    assert check(None).status == "unverifiable"
    assert check({}).status == "unverifiable"
    junk = {"gpu_names": "H100", "start_unix": float("nan"), "end_unix": "x", "ranks": [True, "1"],
            "world_size": -1}  # fmt: skip
    assert check(junk).status == "unverifiable"


# --- through upload, diagnosis and the page ------------------------------------------------------------

HOST_SYNC = {
    "ranks": [
        {
            "rank": 0,
            "temporal_breakdown": {"idle_pct": 30.0, "span_ms": 1000.0},
            "sync": {"cpu_sync_calls": 60, "cpu_sync_ms": 400.0},
            "step_times": {"count": 5, "median_ms": 250.0},
        }
    ]
}


@pytest.fixture
def llm(make_team, make_user, api_client_for, media_root, celery_eager, catalog):
    team = make_team("llm")
    user = make_user("alice", teams=[team])
    client = api_client_for(user)
    assert client.post("/api/v1/jobs/", job_body(), format="json").status_code == 201
    return client


def _upload_with(client, monkeypatch, capture, name="trace.json"):
    monkeypatch.setattr(artifacts, "analyze_file", lambda *a, **k: {**HOST_SYNC, "capture": capture})
    response = client.post(
        "/api/v1/jobs/48213/artifacts/",
        {"file": SimpleUploadedFile(name, b'{"traceEvents": []}'), "kind": "kineto"},
        format="multipart",
    )
    assert response.status_code == 201, response.content
    return Artifact.objects.get(pk=response.json()["id"])


def _codes() -> set[str]:
    return set(Finding.objects.filter(job__external_id="48213").values_list("code", flat=True))


@pytest.mark.django_db(transaction=True)
def test_a_mismatched_trace_changes_nothing_until_confirmed_and_can_be_excluded(llm, monkeypatch, client):
    art = _upload_with(llm, monkeypatch, {"gpu_names": ["NVIDIA A100-SXM4-80GB"], "ranks": [0]})
    assert art.status == Artifact.Status.DONE and art.run_check == Artifact.RunCheck.MISMATCH
    assert art.run_mismatches == ["captured on NVIDIA A100-SXM4-80GB, but the job runs on H100 SXM"]
    job = Job.objects.get(external_id="48213")
    # Not used: no trace finding, and the trace's 250 ms step time does not become the job's.
    assert "host_sync" not in _codes() and job.profiler_step_time_ms is None
    listed = llm.get("/api/v1/jobs/48213/artifacts/").json()[0]
    assert listed["run_check"] == "mismatch" and listed["confirmed_at"] is None
    summary = llm.get("/api/v1/jobs/48213/").json()["artifacts"][0]
    assert summary["used_in_diagnosis"] is False and summary["run_mismatches"] == art.run_mismatches

    client.force_login(get_user_model().objects.get(username="alice"))
    page = client.get("/jobs/48213/").content.decode()
    assert "Does not match this job" in page and "It belongs to this job: use it" in page

    confirmed = llm.post(f"/api/v1/artifacts/{art.pk}/review/", {"action": "confirm"}, format="json")
    assert confirmed.status_code == 200 and confirmed.json()["confirmed_at"]
    assert "host_sync" in _codes()
    assert Job.objects.get(external_id="48213").profiler_step_time_ms == 250.0

    excluded = client.post(f"/jobs/48213/artifacts/{art.pk}/review/", {"action": "exclude"})
    assert excluded.status_code == 302 and excluded["Location"].endswith(f"#artifact-{art.pk}")
    assert "host_sync" not in _codes()
    assert Job.objects.get(external_id="48213").profiler_step_time_ms is None
    assert "Excluded from the diagnosis" in client.get("/jobs/48213/").content.decode()

    client.post(f"/jobs/48213/artifacts/{art.pk}/review/", {"action": "include"})
    assert "host_sync" in _codes()


@pytest.mark.django_db(transaction=True)
def test_the_capture_window_of_a_used_trace_is_drawn_on_the_charts(llm, monkeypatch, client):
    capture = {"gpu_names": ["NVIDIA H100 80GB HBM3"], "start_unix": START + 3600, "end_unix": START + 3660}
    art = _upload_with(llm, monkeypatch, capture, name="step-trace.json")
    client.force_login(get_user_model().objects.get(username="alice"))

    def captures():
        layout = client.get("/jobs/48213/figures.json").json()["timeseries"]["layout"]
        shapes = [s for s in layout["shapes"] if s.get("name") == "capture"]
        labels = [a["text"] for a in layout["annotations"] if a.get("name") == "capture"]
        return [(s["x0"], s["x1"]) for s in shapes], labels

    # Unix ms of the captured minute, one outline and its label with the file's name.
    assert captures() == ([((START + 3600) * 1000, (START + 3660) * 1000)], ["trace: step-trace.json"])
    llm.post(f"/api/v1/artifacts/{art.pk}/review/", {"action": "exclude"}, format="json")
    assert captures() == ([], [])  # an excluded trace is not drawn


@pytest.mark.django_db(transaction=True)
def test_a_matching_trace_is_used_at_once_and_review_is_team_scoped(
    llm, monkeypatch, make_team, make_user, api_client_for
):
    art = _upload_with(llm, monkeypatch, {"gpu_names": ["NVIDIA H100 80GB HBM3"], "ranks": [2]})
    assert art.run_check == Artifact.RunCheck.MATCHES and "host_sync" in _codes()
    bad = llm.post(f"/api/v1/artifacts/{art.pk}/review/", {"action": "confirm"}, format="json")
    assert bad.status_code == 400 and "needs confirming" in bad.json()["action"]
    assert llm.post(f"/api/v1/artifacts/{art.pk}/review/", {"action": "x"}, format="json").status_code == 400
    outsider = api_client_for(make_user("mallory", teams=[make_team("other")]))
    refused = outsider.post(f"/api/v1/artifacts/{art.pk}/review/", {"action": "exclude"}, format="json")
    assert refused.status_code in (403, 404)
    assert Artifact.objects.get(pk=art.pk).excluded_at is None
