"""Artifact upload, content-addressed storage, parsing status, and the analyze_artifact command."""

import gzip
import io
import json
import threading
from io import StringIO
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command

from jobs.intake import artifacts
from jobs.intake.client import main as client_main
from jobs.models import Artifact, Job
from tests.conftest import job_body, sample_path


@pytest.fixture
def llm(make_team, make_user, api_client_for, media_root, celery_eager, catalog):
    team = make_team("llm")
    user = make_user("alice", teams=[team])
    client = api_client_for(user)
    assert client.post("/api/v1/jobs/", job_body(), format="json").status_code == 201
    return client


def _kineto_bytes() -> bytes:
    trace = {
        "schemaVersion": 1,
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "ampere_sgemm", "pid": 0, "tid": 7, "ts": 100.0, "dur": 50.0,
             "args": {"correlation": 1, "stream": 7, "device": 0}},
            {"ph": "X", "cat": "kernel", "name": "ampere_sgemm", "pid": 0, "tid": 7, "ts": 200.0, "dur": 50.0,
             "args": {"correlation": 2, "stream": 7, "device": 0}},
        ],
    }  # fmt: skip
    return json.dumps(trace).encode()


def _upload(client, name: str, data: bytes, **extra):
    return client.post(
        "/api/v1/jobs/48213/artifacts/", {"file": SimpleUploadedFile(name, data), **extra}, format="multipart"
    )


@pytest.mark.django_db(transaction=True)
def test_upload_parses_a_trace_and_reports_its_analysis(llm):
    response = _upload(llm, "trace.json", _kineto_bytes())
    assert response.status_code == 201, response.json()
    artifact = Artifact.objects.get()
    assert artifact.kind == "kineto" and artifact.status == "done", artifact.error
    ranks = artifact.analysis["ranks"]
    assert ranks[0]["temporal_breakdown"]["idle_pct"] == pytest.approx(100 / 3, abs=0.5)
    status = llm.get(f"/api/v1/artifacts/{artifact.pk}/").json()
    assert status["status"] == "done" and status["analysis"]["ranks"]
    assert artifacts.blob_path(artifact.sha256).read_bytes() == _kineto_bytes()


@pytest.mark.django_db(transaction=True)
def test_the_same_bytes_are_stored_once(llm):
    _upload(llm, "a.json", _kineto_bytes())
    second = _upload(llm, "b.json", _kineto_bytes())
    assert second.status_code == 201
    assert Artifact.objects.count() == 1
    assert len([p for p in artifacts.storage_root().rglob("*") if p.is_file()]) == 1


@pytest.mark.django_db(transaction=True)
def test_a_malformed_trace_fails_with_a_clear_reason_and_nothing_else_is_lost(llm):
    _upload(llm, "good.json", _kineto_bytes())
    truncated = gzip.compress(_kineto_bytes())[:40]
    response = _upload(llm, "broken.json.gz", truncated, kind="kineto")
    assert response.status_code == 201
    broken = Artifact.objects.get(original_name="broken.json.gz")
    assert broken.status == "failed"
    assert broken.error and "Traceback" not in broken.error
    assert Artifact.objects.get(original_name="good.json").status == "done"
    assert Job.objects.filter(external_id="48213").exists()


@pytest.mark.django_db(transaction=True)
def test_svg_and_html_are_refused(llm, samples_dir):
    svg = (samples_dir / "pyspy" / "pyspy_readme_flamegraph.svg").read_bytes()
    response = _upload(llm, "flame.svg", svg)
    assert response.status_code == 400
    assert "SVG" in json.dumps(response.json())
    response = _upload(llm, "report.html", b"<!doctype html><html><script>alert(1)</script></html>")
    assert response.status_code == 400
    assert not Artifact.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_uploads_over_the_size_limit_are_refused_without_leftovers(llm, settings):
    settings.ARTIFACT_MAX_BYTES = 2048
    response = _upload(llm, "big.json", b"{" + b" " * 4096 + b"}")
    assert response.status_code == 413  # the streaming upload handler stops at the limit
    assert "limit" in json.dumps(response.json())
    assert not [p for p in artifacts.storage_root().rglob("*") if p.is_file()]


@pytest.mark.django_db(transaction=True)
def test_unknown_kind_and_undetectable_files_are_refused(llm):
    assert _upload(llm, "x.bin", b"\x00\x01garbage", kind="word").status_code == 400
    response = _upload(llm, "x.bin", b"\x00\x01garbage")
    assert response.status_code == 400


@pytest.mark.django_db(transaction=True)
def test_another_team_cannot_upload_or_reparse(llm, make_team, make_user, api_client_for):
    outsider = api_client_for(make_user("eve", teams=[make_team("vision")]))
    assert _upload(outsider, "t.json", _kineto_bytes()).status_code == 403
    _upload(llm, "t.json", _kineto_bytes())
    artifact = Artifact.objects.get()
    assert outsider.post(f"/api/v1/artifacts/{artifact.pk}/reparse/").status_code == 403
    assert llm.post(f"/api/v1/artifacts/{artifact.pk}/reparse/").status_code == 202


@pytest.mark.django_db(transaction=True)
def test_real_samples_of_every_format_parse(llm, samples_dir):
    files = {
        "kineto/hta_alexnet_a100.json.gz": "kineto",
        "nsys/nsysai_minimal_rtx3080.sqlite": "nsys_sqlite",
        "pyspy/pyspy_bpe_tokenizer.speedscope.json": "pyspy_speedscope",
        "nvidia-smi/nanogpt_8gpu_util_power.csv": "nvidia_smi_csv",
    }
    for rel, kind in files.items():
        path = samples_dir / rel
        response = _upload(llm, path.name, path.read_bytes())
        assert response.status_code == 201, (rel, response.json())
        artifact = Artifact.objects.get(pk=response.json()["id"])
        assert artifact.kind == kind
        assert artifact.status == "done", (rel, artifact.error)


def test_analyze_artifact_json_has_the_hta_breakdowns():
    path = sample_path("kineto/hta_a100_nccl_allreduce_rank0.json.gz")
    out = StringIO()
    call_command("analyze_artifact", str(path), "--json", stdout=out)
    data = json.loads(out.getvalue())
    rank = data["ranks"][0]
    assert {"idle_pct", "compute_pct", "non_compute_pct"} <= set(rank["temporal_breakdown"])
    assert {"host_wait_pct", "kernel_wait_pct", "other_pct"} <= set(rank["idle_breakdown"])
    assert rank["rank"] == 0


def test_analyze_artifact_refuses_svg_and_missing_files(tmp_path):
    with pytest.raises(CommandError, match="no such file"):
        call_command("analyze_artifact", str(tmp_path / "nope.json"))
    svg = sample_path("pyspy/pyspy_readme_flamegraph.svg")
    with pytest.raises(CommandError, match="SVG"):
        call_command("analyze_artifact", str(svg))


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass


@pytest.mark.django_db(transaction=True)
def test_command_line_client_uploads_and_waits_for_the_analysis(llm, make_user, capsys):
    from django.core.wsgi import get_wsgi_application

    from jobs.models import ApiToken

    _, key = ApiToken.issue(make_user("bot", teams=[Job.objects.get().team]), "node")
    server = make_server("127.0.0.1", 0, get_wsgi_application(), handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {"EFFICIENCY_URL": f"http://127.0.0.1:{server.server_port}", "EFFICIENCY_TOKEN": key}
        trace = io.BytesIO(_kineto_bytes())
        path = artifacts.storage_root().parent / "node-trace.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(trace.getvalue())
        assert client_main(["upload", "48213", str(path), "--wait"], env=env) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed["status"] == "done" and printed["analysis"]["ranks"]
        assert client_main(["progress", "48213", "--tokens", "1000", "--step", "1"], env=env) == 0
        assert client_main(["status", "nope"], env=env) == 1
        assert "HTTP 404" in capsys.readouterr().err
        assert client_main(["status", "48213"], env={}) == 2
    finally:
        server.shutdown()


@pytest.mark.django_db(transaction=True)
def test_the_job_page_reparses_an_artifact_for_team_members_only(llm, client, make_user, make_team):
    _upload(llm, "t.json", _kineto_bytes())
    artifact = Artifact.objects.get()
    Artifact.objects.filter(pk=artifact.pk).update(status="failed", error="old parser bug")
    url = f"/jobs/48213/artifacts/{artifact.pk}/reparse/"
    client.force_login(make_user("eve", teams=[make_team("vision")]))
    assert client.post(url).status_code == 403
    client.force_login(Job.objects.get().team.memberships.first().user)
    page = client.get("/jobs/48213/")
    assert url.encode() in page.content
    response = client.post(url)
    assert response.status_code == 302
    artifact.refresh_from_db()
    assert artifact.status == "done" and artifact.error == ""
