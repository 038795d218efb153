"""Uploads cannot fill the disk or tie up workers (issue #13): anonymous, unauthorised and oversized uploads
are refused from the headers before one byte of the body is read; a body that passes ARTIFACT_MAX_BYTES
while streaming is stopped at the limit; CSRF still holds for session uploads; /healthz has its own short
Prometheus timeout."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client, RequestFactory
from django.test.client import ClientHandler

from jobs.intake import artifacts
from jobs.models import Artifact
from tests.conftest import job_body

GiB = 1024**3
BOUNDARY = "BoUnDaRy"


class CountingInput:
    """A wsgi.input of `size` bytes that counts what the application reads (and never holds it)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.read_bytes = 0

    def read(self, n: int | None = -1) -> bytes:
        left = self.size - self.read_bytes
        n = left if n is None or n < 0 else min(n, left)
        n = min(n, 1024 * 1024)
        self.read_bytes += n
        return b"x" * n

    def readline(self, n: int | None = -1) -> bytes:
        return self.read(n)


def _raw_post(path: str, length: int, **headers: str) -> tuple[int, CountingInput, bytes]:
    """POST `length` bytes of multipart body through Django's full handler (middleware included)."""
    body = CountingInput(length)
    environ = RequestFactory()._base_environ(
        PATH_INFO=path,
        REQUEST_METHOD="POST",
        CONTENT_TYPE=f"multipart/form-data; boundary={BOUNDARY}",
        CONTENT_LENGTH=str(length),
        **{"wsgi.input": body},
        **headers,
    )
    response = ClientHandler(enforce_csrf_checks=True)(environ)
    return response.status_code, body, response.content


@pytest.fixture
def setup(make_team, make_user, api_client_for, media_root, celery_eager, catalog):
    llm = make_team("llm")
    vision = make_team("vision")
    alice = make_user("alice", teams=[llm])
    bob = make_user("bob", teams=[vision])
    client = api_client_for(alice)
    assert client.post("/api/v1/jobs/", job_body(), format="json").status_code == 201
    return {"alice": alice, "bob": bob, "api": client, "outsider": api_client_for(bob)}


def _token(api_client) -> str:
    return api_client._credentials["HTTP_AUTHORIZATION"]


def _nothing_stored() -> None:
    root = artifacts.storage_root()
    assert not [p for p in root.rglob("*") if p.is_file()] if root.exists() else True
    assert not (root / "tmp").exists() or not list((root / "tmp").iterdir())
    assert not Artifact.objects.exists()


def _session_cookie(client: Client) -> str:
    return (
        f"{django_settings.SESSION_COOKIE_NAME}={client.cookies[django_settings.SESSION_COOKIE_NAME].value}"
    )


@pytest.mark.django_db(transaction=True)
def test_anonymous_api_upload_is_refused_before_the_body_is_read(setup):
    for length in (int(1.5 * GiB), 100 * 1024**2):
        status, body, content = _raw_post("/api/v1/jobs/48213/artifacts/", length)
        assert status == 401 and body.read_bytes == 0
        assert "credentials" in json.loads(content)["detail"]
    _nothing_stored()


@pytest.mark.django_db(transaction=True)
def test_anonymous_page_upload_is_sent_to_the_login_page_unread(setup):
    for length in (int(1.5 * GiB), 100 * 1024**2):
        status, body, _ = _raw_post("/jobs/48213/artifacts/", length)
        assert status == 302 and body.read_bytes == 0
    client = Client()
    response = client.post("/jobs/48213/artifacts/", {"file": SimpleUploadedFile("p.txt", b"x")})
    assert response.status_code == 302 and response["Location"] == "/login/?next=/jobs/48213/"
    _nothing_stored()


@pytest.mark.django_db(transaction=True)
def test_a_bad_token_and_another_team_are_refused_unread(setup):
    status, body, _ = _raw_post("/api/v1/jobs/48213/artifacts/", 10_000, HTTP_AUTHORIZATION="Token nope")
    assert status == 401 and body.read_bytes == 0
    outsider = _token(setup["outsider"])
    status, body, _ = _raw_post("/api/v1/jobs/48213/artifacts/", 10_000, HTTP_AUTHORIZATION=outsider)
    assert status == 403 and body.read_bytes == 0
    status, body, _ = _raw_post("/api/v1/jobs/nope/artifacts/", 10_000, HTTP_AUTHORIZATION=outsider)
    assert status == 404 and body.read_bytes == 0
    web = Client()
    web.force_login(setup["bob"])
    status, body, _ = _raw_post("/jobs/48213/artifacts/", 10_000, HTTP_COOKIE=_session_cookie(web))
    assert status == 403 and body.read_bytes == 0
    _nothing_stored()


@pytest.mark.django_db(transaction=True)
def test_an_oversized_content_length_is_refused_unread_even_with_a_token(setup):
    status, body, content = _raw_post(
        "/api/v1/jobs/48213/artifacts/", 2 * GiB, HTTP_AUTHORIZATION=_token(setup["api"])
    )
    assert status == 413 and body.read_bytes == 0
    assert "ARTIFACT_MAX_BYTES" in json.loads(content)["detail"]
    web = Client()
    web.force_login(setup["alice"])
    status, body, _ = _raw_post("/jobs/48213/artifacts/", 2 * GiB, HTTP_COOKIE=_session_cookie(web))
    assert status == 413 and body.read_bytes == 0
    _nothing_stored()


@pytest.mark.django_db(transaction=True)
def test_other_urls_refuse_bodies_past_data_upload_max_memory_size_unread(setup):
    status, body, _ = _raw_post("/api/v1/jobs/", 100 * 1024**2, HTTP_AUTHORIZATION=_token(setup["api"]))
    assert status == 413 and body.read_bytes == 0
    status, body, _ = _raw_post("/login/", 100 * 1024**2)
    assert status == 413 and body.read_bytes == 0


@pytest.mark.django_db(transaction=True)
def test_a_token_upload_of_the_limit_plus_one_byte_is_a_413_and_nothing_is_stored(setup, settings, tmp_path):
    settings.ARTIFACT_MAX_BYTES = 4096
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 0  # every upload streams to a temporary file
    settings.FILE_UPLOAD_TEMP_DIR = str(tmp_path / "upload-tmp")
    Path(settings.FILE_UPLOAD_TEMP_DIR).mkdir()
    response = setup["api"].post(
        "/api/v1/jobs/48213/artifacts/",
        {"file": SimpleUploadedFile("p.txt", b"m" * 4097), "kind": "pyspy_raw"},
        format="multipart",
    )
    assert response.status_code == 413, response.content
    assert "ARTIFACT_MAX_BYTES" in json.dumps(response.json())
    _nothing_stored()
    assert not list(Path(settings.FILE_UPLOAD_TEMP_DIR).iterdir())
    # Exactly the limit is accepted.
    ok = setup["api"].post(
        "/api/v1/jobs/48213/artifacts/",
        {"file": SimpleUploadedFile("p.txt", b"main (a.py:1) 1\n" * 256), "kind": "pyspy_raw"},
        format="multipart",
    )
    assert ok.status_code == 201, ok.content


@pytest.mark.django_db(transaction=True)
def test_a_page_upload_past_the_limit_is_refused_with_a_message(setup, settings):
    settings.ARTIFACT_MAX_BYTES = 4096
    web = Client()
    web.force_login(setup["alice"])
    response = web.post(
        "/jobs/48213/artifacts/", {"file": SimpleUploadedFile("p.txt", b"m" * 5000)}, follow=False
    )
    assert response.status_code == 302
    messages = [str(m) for m in response.wsgi_request._messages]  # type: ignore[attr-defined]
    assert any("ARTIFACT_MAX_BYTES" in m for m in messages), messages
    _nothing_stored()


@pytest.mark.django_db(transaction=True)
def test_csrf_is_still_enforced_for_session_uploads(setup):
    web = Client(enforce_csrf_checks=True)
    web.force_login(setup["alice"])
    upload = {"file": SimpleUploadedFile("p.txt", b"main (a.py:1) 5\n"), "kind": "pyspy_raw"}
    assert web.post("/jobs/48213/artifacts/", upload).status_code == 403
    api = web.post("/api/v1/jobs/48213/artifacts/", upload)
    assert api.status_code == 403 and "CSRF" in api.json()["detail"]
    assert not Artifact.objects.exists()
    web.get("/jobs/48213/")  # sets the CSRF cookie
    token = web.cookies[django_settings.CSRF_COOKIE_NAME].value
    upload = {"file": SimpleUploadedFile("p.txt", b"main (a.py:1) 5\n"), "kind": "pyspy_raw"}
    response = web.post("/jobs/48213/artifacts/", {**upload, "csrfmiddlewaretoken": token})
    assert response.status_code == 302 and Artifact.objects.count() == 1


def test_the_limits_run_before_the_csrf_middleware_reads_bodies():
    order = django_settings.MIDDLEWARE
    limits = order.index("efficiency.middleware.RequestLimitsMiddleware")
    assert order.index("django.contrib.sessions.middleware.SessionMiddleware") < limits
    assert limits < order.index("django.middleware.csrf.CsrfViewMiddleware")


@pytest.fixture
def silent_prometheus() -> Iterator[str]:
    """A TCP server that accepts connections and never answers (a Prometheus stuck on a heavy query)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(2)
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.django_db
def test_healthz_answers_quickly_when_prometheus_hangs(client, settings, silent_prometheus):
    settings.PROMETHEUS_URL = silent_prometheus
    settings.PROMETHEUS_TIMEOUT_S = 30.0  # the ingestion timeout is not the one /healthz uses
    settings.HEALTHZ_PROMETHEUS_TIMEOUT_S = 0.5
    started = time.monotonic()
    response = client.get("/healthz")
    elapsed = time.monotonic() - started
    assert response.status_code == 503 and elapsed < 2.5, elapsed  # not PROMETHEUS_TIMEOUT_S
    assert response.json()["checks"]["prometheus"]["ok"] is False
