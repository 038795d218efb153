"""Every artifact is checked to belong (issue 24 item 6), through upload, parse, diagnosis and review: a
py-spy profile (no GPU, no time, no rank) is `unverifiable` and never raises the job's findings until a user
confirms it; a dstat log is matched by the host it names."""

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from jobs.intake import artifacts
from jobs.models import Artifact, Finding
from tests.conftest import job_body, sample_path

START = datetime(2026, 11, 23, 8, tzinfo=UTC).timestamp()  # job_body's started_at
#: A trace of the job's own rank 0 on its H100s in its window, whose DataLoader is 30 % of the step:
#: data_pipeline_stall from the trace (the TensorBoard-style share older analyses carry).
STALL_TRACE = {
    "capture": {
        "gpu_names": ["NVIDIA H100 80GB HBM3"],
        "start_unix": START + 600,
        "end_unix": START + 660,
        "ranks": [0],
        "world_size": 8,
    },
    "ranks": [
        {
            "rank": 0,
            "temporal_breakdown": {"idle_pct": 35.0, "span_ms": 1000.0},
            "step_breakdown": {"steps": 4, "dataloader_pct": 30.0},
            "step_times": {"count": 4, "median_ms": 250.0},
        }
    ],
}


@pytest.fixture
def llm(
    make_team: Any, make_user: Any, api_client_for: Any, media_root: Any, celery_eager: Any, catalog: Any
) -> Any:
    team = make_team("llm")
    user = make_user("alice", teams=[team])
    client = api_client_for(user)
    assert client.post("/api/v1/jobs/", job_body(), format="json").status_code == 201
    return client


def _upload(client: Any, name: str, data: bytes, kind: str) -> Artifact:
    response = client.post(
        "/api/v1/jobs/48213/artifacts/",
        {"file": SimpleUploadedFile(name, data), "kind": kind},
        format="multipart",
    )
    assert response.status_code == 201, response.content
    return Artifact.objects.get(pk=response.json()["id"])


def _stall() -> Finding:
    return Finding.objects.get(job__external_id="48213", code="data_pipeline_stall")


@pytest.mark.django_db(transaction=True)
def test_an_unrelated_pyspy_profile_does_not_raise_the_jobs_confidence_until_confirmed(
    llm: Any, monkeypatch: Any
) -> None:
    real = artifacts.analyze_file
    # The trace's analysis is given; the py-spy profile goes through the real parser.
    monkeypatch.setattr(
        artifacts,
        "analyze_file",
        lambda path, kind, **k: STALL_TRACE if kind == "kineto" else real(path, kind, **k),
    )
    trace = _upload(llm, "rank0.json", b'{"traceEvents": []}', "kineto")
    assert trace.run_check == Artifact.RunCheck.MATCHES
    before = _stall()
    # The real py-spy profile of a BPE tokenizer (a CPU program): 37 % of samples in tokenization.
    path = sample_path("pyspy/pyspy_bpe_tokenizer.speedscope.json")
    spy = _upload(llm, path.name, path.read_bytes(), "pyspy_speedscope")
    assert spy.status == Artifact.Status.DONE and spy.run_check == Artifact.RunCheck.UNVERIFIABLE
    after = _stall()
    assert (after.confidence, after.severity) == (before.confidence, before.severity)
    labels = [e["label"] for e in after.evidence]
    assert (
        "unverified" in labels and f"unverified: {path.name}: Python samples in the input pipeline" in labels
    )

    # The job page says so and offers the confirmation to the team.
    from django.contrib.auth import get_user_model
    from django.test import Client

    page_client = Client()
    page_client.force_login(get_user_model().objects.get(username="alice"))
    page = page_client.get("/jobs/48213/").content.decode()
    form = page[page.index(f'action="/jobs/48213/artifacts/{spy.pk}/review/"') :]
    card = page[: page.index(f'action="/jobs/48213/artifacts/{spy.pk}/review/"')]
    card = card[card.rindex('data-run-check="') :]
    assert card.startswith('data-run-check="unverifiable"')
    assert "raises no finding's confidence or dollars until someone confirms it belongs here" in card
    assert 'value="confirm"' in form[: form.index("</form>")]

    # A user who knows it is the job's own profile confirms it: now it counts (+0.15, the rule's own rule).
    confirmed = llm.post(f"/api/v1/artifacts/{spy.pk}/review/", {"action": "confirm"}, format="json")
    assert confirmed.status_code == 200, confirmed.content
    assert _stall().confidence == pytest.approx(before.confidence + 0.15)
    assert "unverified" not in [e["label"] for e in _stall().evidence]


@pytest.mark.django_db(transaction=True)
def test_a_dstat_log_from_another_host_is_a_mismatch(llm: Any) -> None:
    data = (Path(__file__).parent / "unit" / "data" / "dstat_0.7.3.csv").read_bytes()
    art = _upload(llm, "dstat.csv", data, "dstat_csv")
    host = art.analysis["host"]
    # job_body's GPUs are on gpu-node-017; the log says it was written on another host.
    assert host and host.split(".")[0].lower() != "gpu-node-017"
    assert art.run_check == Artifact.RunCheck.MISMATCH
    assert any(f"captured on host {host.split('.')[0].lower()}" in m for m in art.run_mismatches)
