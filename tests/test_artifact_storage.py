"""Artifact blobs on any Django storage backend: the local filesystem and an S3-compatible object store
(moto's server mode on a free port, reached over HTTP like any S3 endpoint), through upload, parse, re-parse
and delete (issue #14, workers that scale out)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from django.core.files.storage import storages
from django.core.files.uploadedfile import SimpleUploadedFile

from jobs.intake import artifacts
from jobs.models import Artifact, Job
from tests.conftest import REPO_ROOT, job_body


@pytest.fixture(scope="session")
def s3_endpoint():
    """A moto S3 server in a thread of the test process, on a free loopback port; its URL."""
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def _s3_options(endpoint: str, bucket: str) -> dict:
    # What efficiency/settings.py builds from ARTIFACT_S3_* with ARTIFACT_STORAGE=s3.
    return {
        "bucket_name": bucket,
        "endpoint_url": endpoint,
        "access_key": "test-key",
        "secret_key": "test-secret",
        "region_name": "us-east-1",
        "location": "",
        "file_overwrite": True,
        "max_memory_size": 16 * 1024 * 1024,
    }


@pytest.fixture(params=["local", "s3"])
def backend(request, settings, media_root, tmp_path):
    """The artifact storage under test: the default FileSystemStorage under MEDIA_ROOT, or S3Storage on a
    fresh bucket of the moto server. Parse downloads go to a private temporary directory."""
    settings.FILE_UPLOAD_TEMP_DIR = str(tmp_path / "parse-tmp")
    os.makedirs(settings.FILE_UPLOAD_TEMP_DIR)
    if request.param == "s3":
        _configure_bucket(settings, request.getfixturevalue("s3_endpoint"))
    return request.param


def _configure_bucket(settings, endpoint: str) -> None:
    """A fresh bucket on the moto server as STORAGES["artifacts"]."""
    import boto3

    options = _s3_options(endpoint, f"artifacts-{uuid.uuid4().hex[:12]}")
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=options["access_key"],
        aws_secret_access_key=options["secret_key"],
        region_name=options["region_name"],
    ).create_bucket(Bucket=options["bucket_name"])
    settings.STORAGES = {
        **settings.STORAGES,
        "artifacts": {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": options},
    }


@pytest.fixture
def llm(backend, make_team, make_user, api_client_for, celery_eager, catalog):
    team = make_team("llm")
    client = api_client_for(make_user("alice", teams=[team]))
    for external_id in ("48213", "48214"):
        assert client.post("/api/v1/jobs/", job_body(external_id), format="json").status_code == 201
    return client


def _kineto(kernels: int = 2) -> bytes:
    events = [
        {"ph": "X", "cat": "kernel", "name": "ampere_sgemm", "pid": 0, "tid": 7, "ts": 100.0 * (i + 1),
         "dur": 50.0, "args": {"correlation": i + 1, "stream": 7, "device": 0}}
        for i in range(kernels)
    ]  # fmt: skip
    return json.dumps({"schemaVersion": 1, "traceEvents": events}).encode()


def _upload(client, external_id: str, data: bytes, name: str = "trace.json"):
    return client.post(
        f"/api/v1/jobs/{external_id}/artifacts/", {"file": SimpleUploadedFile(name, data)}, format="multipart"
    )


def _stored(sha256: str) -> bool:
    return storages["artifacts"].exists(artifacts.blob_name(sha256))


def _local_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


@pytest.mark.django_db(transaction=True)
def test_an_upload_is_stored_in_the_artifact_storage_and_parsed_from_it(llm, backend, settings):
    data = _kineto()
    response = _upload(llm, "48213", data)
    assert response.status_code == 201, response.json()
    artifact = Artifact.objects.get()
    assert artifact.status == "done", artifact.error
    assert artifact.analysis["ranks"][0]["temporal_breakdown"]["idle_pct"] == pytest.approx(100 / 3, abs=0.5)
    assert artifact.sha256 == hashlib.sha256(data).hexdigest() and _stored(artifact.sha256)
    with storages["artifacts"].open(artifacts.blob_name(artifact.sha256), "rb") as blob:
        assert blob.read() == data
    if backend == "s3":  # nothing stays on the web/worker machine: not the spool, not the parse's copy
        assert _local_files(artifacts.storage_root()) == []
        assert not storages["artifacts"].exists("tmp")
    assert _local_files(Path(settings.FILE_UPLOAD_TEMP_DIR)) == []


@pytest.mark.django_db(transaction=True)
def test_a_reparse_reads_the_stored_blob_again(llm, backend):
    _upload(llm, "48213", _kineto())
    artifact = Artifact.objects.get()
    Artifact.objects.filter(pk=artifact.pk).update(analysis={})
    assert llm.post(f"/api/v1/artifacts/{artifact.pk}/reparse/").status_code == 202
    artifact.refresh_from_db()
    assert artifact.status == "done" and artifact.analysis["ranks"], artifact.error


@pytest.mark.django_db(transaction=True)
def test_a_blob_is_deleted_with_the_last_artifact_that_references_it(llm, backend):
    data = _kineto()
    _upload(llm, "48213", data)
    _upload(llm, "48214", data)  # the same bytes for another job: one blob, two artifacts
    other = _kineto(kernels=3)
    _upload(llm, "48214", other, name="other.json")
    sha, other_sha = hashlib.sha256(data).hexdigest(), hashlib.sha256(other).hexdigest()
    assert Artifact.objects.filter(sha256=sha).count() == 2

    Artifact.objects.get(job__external_id="48213").delete()
    assert _stored(sha)  # job 48214 still uses it
    Job.objects.get(external_id="48214").delete()  # cascades to both of its artifacts
    assert not Artifact.objects.exists()
    assert not _stored(sha) and not _stored(other_sha)


@pytest.mark.django_db(transaction=True)
def test_an_upload_after_the_last_delete_stores_the_blob_again(llm, backend):
    data = _kineto()
    _upload(llm, "48213", data)
    Artifact.objects.get().delete()
    assert not _stored(hashlib.sha256(data).hexdigest())
    assert _upload(llm, "48213", data).status_code == 201
    assert Artifact.objects.get().status == "done" and _stored(hashlib.sha256(data).hexdigest())


@pytest.mark.django_db(transaction=True)
def test_a_missing_blob_fails_the_parse_with_a_reason(llm, backend):
    _upload(llm, "48213", _kineto())
    artifact = Artifact.objects.get()
    storages["artifacts"].delete(artifacts.blob_name(artifact.sha256))
    assert llm.post(f"/api/v1/artifacts/{artifact.pk}/reparse/").status_code == 202
    artifact.refresh_from_db()
    assert artifact.status == "failed" and "missing" in artifact.error


@pytest.mark.django_db(transaction=True)
def test_a_blob_larger_than_one_multipart_part_round_trips(backend, settings, make_team, catalog):
    # 9 MiB: past boto3's 8 MiB multipart threshold, so the S3 upload and download go in parts.
    data = os.urandom(9 * 1024 * 1024)
    sha = hashlib.sha256(data).hexdigest()
    spool = Path(settings.MEDIA_ROOT) / "spool"
    spool.parent.mkdir(parents=True, exist_ok=True)
    spool.write_bytes(data)
    artifacts._put_blob(spool, sha)
    with artifacts.local_copy(sha) as path:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha
    if backend == "s3":
        assert not path.exists()  # the parse's temporary copy is gone
    assert artifacts.delete_blob_if_unreferenced(sha) and not _stored(sha)


def _settings_in_subprocess(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = "import json, efficiency.settings as s; print(json.dumps(s.STORAGES['artifacts']))"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ARTIFACT_", "DJANGO_", "PYTEST"))}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env={**clean, **env}, capture_output=True, text=True
    )


def test_the_artifact_storage_is_configured_from_the_environment():
    local = _settings_in_subprocess({})
    assert json.loads(local.stdout) == {"BACKEND": "django.core.files.storage.FileSystemStorage"}
    s3 = _settings_in_subprocess(
        {
            "ARTIFACT_STORAGE": "s3",
            "ARTIFACT_S3_BUCKET": "traces",
            "ARTIFACT_S3_ENDPOINT_URL": "https://minio.example.com:9000",
            "ARTIFACT_S3_REGION": "eu-west-1",
        }
    )
    stored = json.loads(s3.stdout)
    assert stored["BACKEND"] == "storages.backends.s3.S3Storage"
    assert stored["OPTIONS"]["bucket_name"] == "traces" and stored["OPTIONS"]["region_name"] == "eu-west-1"
    assert stored["OPTIONS"]["endpoint_url"] == "https://minio.example.com:9000"
    assert stored["OPTIONS"]["access_key"] is None  # boto3's own credential chain


def test_s3_storage_without_a_bucket_stops_start_up_naming_the_variable():
    result = _settings_in_subprocess({"ARTIFACT_STORAGE": "s3"})
    assert result.returncode != 0 and "ARTIFACT_S3_BUCKET" in result.stderr


@pytest.mark.django_db(transaction=True)
def test_a_delete_waits_for_an_upload_of_the_same_bytes_in_flight_and_keeps_its_blob(llm, backend):
    # The upload holds the blob's advisory lock from finding the blob stored until its artifact commits; a
    # delete of the last other reference arriving meanwhile waits, then sees the new artifact.
    from django.db import connection, transaction

    data = _kineto()
    sha = hashlib.sha256(data).hexdigest()
    _upload(llm, "48213", data)
    first = Artifact.objects.get()
    outcome: list[bool] = []
    with transaction.atomic():
        artifacts._lock_blob(sha)  # as store_upload does before referencing the blob
        Artifact.objects.filter(pk=first.pk).delete()  # (its on_commit delete runs after this block)
        Artifact.objects.create(
            job=first.job, sha256=sha, kind=first.kind, original_name="again.json", size_bytes=len(data)
        )

        def concurrent_delete() -> None:
            try:
                outcome.append(artifacts.delete_blob_if_unreferenced(sha))
            finally:
                connection.close()

        worker = threading.Thread(target=concurrent_delete)
        worker.start()
        worker.join(timeout=1.5)
        assert worker.is_alive() and outcome == []  # blocked on the lock
    worker.join(timeout=10)
    assert outcome == [False] and _stored(sha)


@pytest.mark.django_db(transaction=True)
def test_copy_artifact_blobs_moves_a_local_store_into_the_bucket(
    make_team, make_user, api_client_for, celery_eager, catalog, media_root, settings, s3_endpoint
):
    from django.core.management import call_command

    client = api_client_for(make_user("alice", teams=[make_team("llm")]))
    assert client.post("/api/v1/jobs/", job_body("48213"), format="json").status_code == 201
    _upload(client, "48213", _kineto())  # stored locally under MEDIA_ROOT
    sha = Artifact.objects.get().sha256
    _configure_bucket(settings, s3_endpoint)
    assert not _stored(sha)
    out = io.StringIO()
    call_command("copy_artifact_blobs", "--from", str(media_root), stdout=out)
    assert _stored(sha) and "copied 1, already stored 0, missing 0" in out.getvalue()
    call_command("copy_artifact_blobs", "--from", str(media_root), stdout=out)  # a rerun copies nothing
    assert "copied 0, already stored 1, missing 0" in out.getvalue()
    assert client.post(f"/api/v1/artifacts/{Artifact.objects.get().pk}/reparse/").status_code == 202
    assert Artifact.objects.get().status == "done"  # parsed from the bucket
