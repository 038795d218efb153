"""Nothing stuck (issue #13): every parse ends done or failed with a reason, whatever the analysis holds,
whatever the storage or the database does; lost workers are counted and swept."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from efficiency.schedule import beat_schedule
from jobs.intake import artifacts
from jobs.models import Artifact, Job
from tests.conftest import job_body

SMI_INF = (
    b"timestamp, index, name, utilization.gpu [%], power.draw [W]\n"
    b"2026/11/23 09:00:00.000, 0, NVIDIA H100 80GB HBM3, 85 %, 1e309 W\n"
    b"2026/11/23 09:00:01.000, 0, NVIDIA H100 80GB HBM3, 86 %, 300 W\n"
)
PYSPY = b"main (train.py:10);step (train.py:20) 100\nmain (train.py:10);load (data.py:3) 50\n"


@pytest.fixture
def llm(make_team, make_user, api_client_for, media_root, celery_eager, catalog):
    team = make_team("llm")
    client = api_client_for(make_user("alice", teams=[team]))
    assert client.post("/api/v1/jobs/", job_body(), format="json").status_code == 201
    return client


def _upload(client, name: str, data: bytes, **extra):
    return client.post(
        "/api/v1/jobs/48213/artifacts/", {"file": SimpleUploadedFile(name, data), **extra}, format="multipart"
    )


def _stored(name: str = "p.txt", data: bytes = PYSPY, kind: str = "pyspy_raw") -> Artifact:
    job = Job.objects.get(external_id="48213")
    return artifacts.store_upload(job, SimpleUploadedFile(name, data), kind=kind, parse=False)


@pytest.mark.django_db(transaction=True)
def test_an_infinite_nvidia_smi_cell_ends_done_with_the_value_unknown(llm):
    response = _upload(llm, "gpu.csv", SMI_INF, kind="nvidia_smi_csv")
    assert response.status_code == 201, response.content
    artifact = Artifact.objects.get()
    assert artifact.status == "done", artifact.error
    power = artifact.analysis["mean_power_draw_w"]  # unknown, or the finite cells' mean (parser's choice)
    assert power is None or power == pytest.approx(300.0)
    assert "Infinity" not in json.dumps(artifact.analysis) and "NaN" not in json.dumps(artifact.analysis)
    assert artifact.parse_attempts == 1 and artifact.parse_started_at is not None


POISON = {
    "nan": float("nan"),
    "inf": [float("inf"), -float("inf"), 1.0],
    "nul": "a\x00b",
    "surrogate": "x\ud800y",
    "key\x00": {"\udfff": 1},
    "big": 10**23,
    "huge": 10**400,
    "tuple": (1, 2),
}


@pytest.mark.django_db(transaction=True)
def test_nan_inf_nul_and_lone_surrogates_are_sanitised_before_the_save(llm, monkeypatch):
    artifact = _stored()
    monkeypatch.setattr(artifacts, "analyze_file", lambda *a, **k: dict(POISON))
    artifacts.parse_artifact(artifact.pk)
    artifact.refresh_from_db()
    assert artifact.status == "done", artifact.error
    a = artifact.analysis
    assert a["nan"] is None and a["inf"] == [None, None, 1.0]
    assert a["nul"] == "ab" and a["surrogate"] == "x\ufffdy" and a["key"] == {"\ufffd": 1}
    assert a["big"] is None  # past ±2^53 no JSON reader keeps it exactly: unknown (safe_json.MAX_SAFE_INT)
    assert a["huge"] is None and a["tuple"] == [1, 2]


@pytest.mark.django_db(transaction=True)
def test_a_save_the_database_refuses_fails_the_artifact_with_the_reason(llm, monkeypatch):
    artifact = _stored()
    monkeypatch.setattr(artifacts, "analyze_file", lambda *a, **k: {"text": "a\x00b"})
    monkeypatch.setattr(artifacts, "sanitize_json", lambda value: value)  # what main did: no sanitising
    artifacts.parse_artifact(artifact.pk)
    artifact.refresh_from_db()
    assert artifact.status == "failed" and "could not be saved" in artifact.error
    assert artifact.analysis in (None, {})  # nothing half-saved


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "error,expected",
    [
        (PermissionError(13, "Permission denied"), "could not be read"),
        (OSError(5, "Input/output error"), "could not be read"),
        (FileNotFoundError(2, "No such file"), "missing"),
        (MemoryError(), "out of memory"),
        (SoftTimeLimitExceeded(), "ARTIFACT_PARSE_BUDGET_S"),
        (RecursionError(), "internal error"),
    ],
)
def test_storage_errors_and_budgets_fail_the_artifact_with_a_reason(llm, monkeypatch, error, expected):
    artifact = _stored()

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(artifacts, "analyze_file", broken)
    artifacts.parse_artifact(artifact.pk)
    artifact.refresh_from_db()
    assert artifact.status == "failed" and expected in artifact.error, artifact.error


@pytest.mark.django_db(transaction=True)
def test_redeliveries_after_lost_workers_are_capped(llm, settings, monkeypatch):
    settings.ARTIFACT_MAX_PARSE_ATTEMPTS = 3
    artifact = _stored()
    # Three starts whose worker died (the row is left "parsing" with the count), then a fourth delivery.
    Artifact.objects.filter(pk=artifact.pk).update(status="parsing", parse_attempts=3)
    called = []
    monkeypatch.setattr(artifacts, "analyze_file", lambda *a, **k: called.append(1) or {})
    artifacts.parse_artifact(artifact.pk)
    artifact.refresh_from_db()
    assert (
        artifact.status == "failed"
        and "3 times" in artifact.error
        and "ARTIFACT_MAX_PARSE_ATTEMPTS" in artifact.error
    )
    assert not called  # the file that kills its worker is not parsed a fourth time
    # A user's re-parse starts the count again.
    artifacts.requeue(artifact)
    artifact.refresh_from_db()
    assert artifact.parse_attempts == 1 and artifact.status == "done", artifact.error


@pytest.mark.django_db(transaction=True)
def test_a_message_for_a_finished_artifact_changes_nothing(llm, monkeypatch):
    artifact = _stored()
    artifacts.parse_artifact(artifact.pk)
    artifact.refresh_from_db()
    assert artifact.status == "done" and artifact.parse_attempts == 1
    monkeypatch.setattr(artifacts, "analyze_file", lambda *a, **k: pytest.fail("parsed again"))
    artifacts.parse_artifact(artifact.pk)  # a redelivery after the result was saved
    artifact.refresh_from_db()
    assert artifact.status == "done" and artifact.parse_attempts == 1


@pytest.mark.django_db(transaction=True)
def test_the_sweep_fails_parses_left_past_their_budget(llm, settings):
    from jobs.tasks import sweep_stuck_artifacts

    settings.ARTIFACT_PARSE_BUDGET_S = 900
    now = timezone.now()
    old = _stored("old.txt", PYSPY + b"x (a.py:1) 1\n")
    recent = _stored("recent.txt", PYSPY + b"y (a.py:1) 1\n")
    legacy = _stored("legacy.txt", PYSPY + b"z (a.py:1) 1\n")
    done = _stored("done.txt", PYSPY + b"w (a.py:1) 1\n")
    Artifact.objects.filter(pk=old.pk).update(
        status="parsing", parse_started_at=now - timedelta(seconds=1000)
    )
    Artifact.objects.filter(pk=recent.pk).update(
        status="parsing", parse_started_at=now - timedelta(seconds=100)
    )
    Artifact.objects.filter(pk=legacy.pk).update(
        status="parsing", parse_started_at=None, uploaded_at=now - timedelta(hours=2)
    )
    Artifact.objects.filter(pk=done.pk).update(status="done", parse_started_at=now - timedelta(hours=3))
    assert sweep_stuck_artifacts() == 2
    states = dict(Artifact.objects.values_list("original_name", "status"))
    assert states == {
        "old.txt": "failed",
        "recent.txt": "parsing",
        "legacy.txt": "failed",
        "done.txt": "done",
    }
    assert "ARTIFACT_PARSE_BUDGET_S" in Artifact.objects.get(pk=old.pk).error
    assert sweep_stuck_artifacts() == 0


def test_the_sweep_runs_from_beat_and_expires():
    entry = beat_schedule()["sweep-stuck-artifacts"]
    assert entry["task"] == "jobs.tasks.sweep_stuck_artifacts"
    assert 0 < entry["options"]["expires"] < 300  # type: ignore[index]


def test_the_parse_task_time_limits_follow_the_budget(settings):
    from jobs.tasks import parse_artifact

    assert parse_artifact.soft_time_limit == settings.ARTIFACT_PARSE_BUDGET_S
    assert parse_artifact.time_limit == settings.ARTIFACT_PARSE_BUDGET_S + artifacts.PARSE_HARD_LIMIT_GRACE_S


@pytest.mark.django_db(transaction=True)
def test_an_upload_whose_parse_cannot_be_queued_fails_instead_of_waiting_forever(llm, monkeypatch):
    from kombu.exceptions import OperationalError

    def broker_down(name, *args):
        raise OperationalError("Error 111 connecting to 127.0.0.1:56379. Connection refused.")

    monkeypatch.setattr(artifacts, "enqueue", broker_down)
    response = _upload(llm, "p.txt", PYSPY, kind="pyspy_raw")
    assert response.status_code == 201
    artifact = Artifact.objects.get()
    assert artifact.status == "failed" and "could not be queued" in artifact.error


@pytest.mark.django_db(transaction=True)
def test_a_parser_bug_fails_the_artifact_and_is_logged_as_an_error(llm, monkeypatch, caplog):
    from jobs.profiling.errors import ParserBug

    artifact = _stored()

    def broken(*args, **kwargs):
        raise ParserBug("internal error in the kineto parser (IndexError at events.py:12)")

    monkeypatch.setattr(artifacts, "analyze_file", broken)
    with caplog.at_level("ERROR", logger="jobs.intake.artifacts"):
        artifacts.parse_artifact(artifact.pk)
    artifact.refresh_from_db()
    assert artifact.status == "failed" and "IndexError at events.py:12" in artifact.error
    assert any(r.levelname == "ERROR" and "parser bug" in r.getMessage() for r in caplog.records)
