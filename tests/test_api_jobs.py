"""Job registration, update, end and progress through the API and the management commands."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from jobs.models import Job, ProgressSample
from tests.conftest import job_body


@pytest.fixture
def llm_client(make_team, make_user, api_client_for):
    team = make_team("llm")
    return api_client_for(make_user("alice", teams=[team]))


@pytest.mark.django_db
def test_register_creates_then_updates_idempotently(llm_client):
    first = llm_client.post("/api/v1/jobs/", job_body(), format="json")
    assert first.status_code == 201, first.json()
    data = first.json()
    assert data["gpu_model"] == "H100 SXM" and data["gpu_model_known"] is True
    assert data["gpu_count"] == 8
    assert data["config_fingerprint"]
    again = llm_client.post("/api/v1/jobs/", job_body(name="renamed"), format="json")
    assert again.status_code == 200
    assert Job.objects.count() == 1
    assert Job.objects.get().name == "renamed"
    assert again.json()["config_fingerprint"] == data["config_fingerprint"]


@pytest.mark.django_db
def test_register_with_a_label_selector_and_an_unknown_gpu_model(llm_client):
    # A member's selector carries the job's own job label exactly (hpc_job = the external id).
    selector = {"hpc_job": "pod-7b", "namespace": "llm", "pod": {"regex": "pretrain-7b-.*"}}
    body = job_body("pod-7b", selector=selector, gpu_count=16, gpu_model="NVIDIA Quantum 9000")
    body.pop("gpus")
    response = llm_client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    data = response.json()
    assert data["gpu_model"] is None and data["gpu_model_known"] is False
    assert data["gpu_model_reported"] == "NVIDIA Quantum 9000"
    assert data["selector"] == selector
    from jobs.metrics.ingest import job_selector

    query = job_selector(Job.objects.get(external_id="pod-7b")).select("DCGM_FI_DEV_GPU_UTIL")
    assert 'pod=~"pretrain-7b-.*"' in query and 'namespace="llm"' in query


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"dtype": "fp13"}, "dtype"),
        ({"selector": {"bad label": "x"}}, "selector"),
        ({"gpus": [], "selector": {"pod": {"regex": "("}}}, "selector"),
        ({"gpus": [], "selector": {"pod": ""}}, "selector"),
        ({"gpu_count": 3}, "gpu_count"),
        ({"ended_at": "2026-11-22T00:00:00Z"}, "ended_at"),
        ({"external_id": "a/b"}, "external_id"),
        ({"team": "nope"}, "team"),
        ({"model": {"n_params": 7e9}}, "model"),
        ({"kind": "pretraining"}, "kind"),
    ],
)
def test_invalid_registrations_are_rejected_with_the_field_named(llm_client, override, field):
    response = llm_client.post("/api/v1/jobs/", job_body(**override), format="json")
    assert response.status_code == 400
    assert field in json.dumps(response.json())


@pytest.mark.django_db
def test_job_kind_is_registered_defaults_to_training_and_can_be_corrected(llm_client):
    default = llm_client.post("/api/v1/jobs/", job_body(), format="json").json()
    assert default["kind"] == "training"
    serving = llm_client.post("/api/v1/jobs/", job_body("serve-1", kind="inference"), format="json")
    assert serving.status_code == 201 and serving.json()["kind"] == "inference"
    assert Job.objects.get(external_id="serve-1").kind == Job.Kind.INFERENCE
    fixed = llm_client.patch("/api/v1/jobs/48213/", {"kind": "fine_tuning"}, format="json")
    assert fixed.status_code == 200 and fixed.json()["kind"] == "fine_tuning"
    assert llm_client.patch("/api/v1/jobs/48213/", {"kind": "x"}, format="json").status_code == 400


@pytest.mark.django_db
def test_both_or_neither_gpu_mapping_is_rejected(llm_client):
    response = llm_client.post("/api/v1/jobs/", job_body(selector={"hpc_job": "1"}), format="json")
    assert response.status_code == 400
    assert "exactly one" in json.dumps(response.json())


@pytest.mark.django_db
def test_patch_ends_a_job_and_can_reopen_it(llm_client):
    llm_client.post("/api/v1/jobs/", job_body(), format="json")
    ended = llm_client.patch("/api/v1/jobs/48213/", {"ended_at": "2026-11-24T08:00:00Z"}, format="json")
    assert ended.status_code == 200
    assert ended.json()["status"] == "ended"
    bad = llm_client.patch("/api/v1/jobs/48213/", {"ended_at": "2020-01-01T00:00:00Z"}, format="json")
    assert bad.status_code == 400
    reopened = llm_client.patch("/api/v1/jobs/48213/", {"ended_at": None}, format="json")
    assert reopened.json()["status"] == "running"
    assert llm_client.patch("/api/v1/jobs/nope/", {}, format="json").status_code == 404


@pytest.mark.django_db
def test_progress_points_are_stored_once_per_timestamp(llm_client):
    llm_client.post("/api/v1/jobs/", job_body(), format="json")
    points = [
        {"timestamp": "2026-11-23T09:00:00Z", "step": 10, "tokens": 1000},
        {"timestamp": "2026-11-23T09:01:00Z", "step": 20, "tokens": 2000},
    ]
    assert llm_client.post("/api/v1/jobs/48213/progress/", points, format="json").status_code == 202
    single = {"timestamp": "2026-11-23T09:01:00Z", "step": 21, "tokens": 2100}
    assert llm_client.post("/api/v1/jobs/48213/progress/", single, format="json").status_code == 202
    assert list(ProgressSample.objects.order_by("timestamp").values_list("step", "tokens")) == [
        (10, 1000),
        (21, 2100),
    ]
    bad = llm_client.post("/api/v1/jobs/48213/progress/", {"timestamp": "x", "tokens": -1}, format="json")
    assert bad.status_code == 400


@pytest.mark.django_db
def test_list_filters_by_team_and_status(llm_client, make_team):
    llm_client.post("/api/v1/jobs/", job_body(), format="json")
    llm_client.post("/api/v1/jobs/", job_body("2", ended_at="2026-11-24T00:00:00Z"), format="json")
    assert llm_client.get("/api/v1/jobs/?team=llm").json()["count"] == 2
    assert [j["external_id"] for j in llm_client.get("/api/v1/jobs/?status=running").json()["results"]] == [
        "48213"
    ]
    assert llm_client.get("/api/v1/jobs/?limit=x").status_code == 400


@pytest.mark.django_db
def test_import_jobs_and_job_summary_commands(tmp_path, make_team, llm_client):
    make_team("llm")
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps([job_body("a1"), job_body("a2"), job_body("bad", dtype="fp13")]))
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError, match="1 job"):
        call_command("import_jobs", str(path), stdout=out, stderr=err)
    assert "created 2, updated 0, rejected 1" in out.getvalue()
    assert "bad" in err.getvalue()
    out = StringIO()
    call_command("job_summary", "a1", "--json", stdout=out)
    assert json.loads(out.getvalue()) == llm_client.get("/api/v1/jobs/a1/").json()
    with pytest.raises(CommandError, match="no job"):
        call_command("job_summary", "zzz")
