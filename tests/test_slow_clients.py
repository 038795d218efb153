"""The web server as `make demo` starts it stays responsive with slow and huge clients (issue #23 item 6).

gunicorn is started from the Makefile's own demo command line (its flags and DEMO_ENV, read from the
Makefile, so this measures what `make demo` runs, with gunicorn.conf.py) on a free loopback port against
the test database. While 8 sockets send one header line per second and 2 members stream 500 MiB uploads,
`/healthz` and `/login/` answer in under a second each; the slow-header sockets are closed with 408 after
the header timeout; a stalled or trickling upload body is cut off by the body timeouts.
"""

from __future__ import annotations

import os
import re
import secrets
import select
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

MiB = 1024 * 1024
BOUNDARY = "SlowClientBoundary"
#: gunicorn's header timeout when GUNICORN_HEADER_TIMEOUT is unset (efficiency/webserver.py).
DEFAULT_HEADER_TIMEOUT_S = 10.0


# -- the demo's command line, from the Makefile -------------------------------------------------------


def _logical_lines(makefile: str) -> list[str]:
    """Makefile lines with backslash continuations joined."""
    return re.sub(r"\\\n\s*", " ", makefile).splitlines()


def demo_environment(makefile: str) -> dict[str, str]:
    """The DEMO_ENV assignments of the Makefile (the secret key, read from a file there, replaced)."""
    line = next(raw for raw in _logical_lines(makefile) if raw.startswith("DEMO_ENV ="))
    env: dict[str, str] = {}
    for token in shlex.split(line.split("=", 1)[1]):
        key, _, value = token.partition("=")
        env[key] = value
    assert env.get("DEBUG") == "false", "the demo runs like a deployment (DEBUG=false)"
    env["SECRET_KEY"] = secrets.token_urlsafe(50)
    return env


def demo_gunicorn_args(makefile: str, bind: str, error_log: Path) -> list[str]:
    """gunicorn's arguments in `make demo`, in the foreground on `bind`, logging errors to `error_log`."""
    line = next(raw for raw in _logical_lines(makefile) if "$(VENV)/bin/gunicorn" in raw)
    tokens = shlex.split(line)
    args = tokens[tokens.index("$(VENV)/bin/gunicorn") + 1 :]
    out: list[str] = []
    skip_value = {"--pid", "--access-logfile", "--error-logfile", "--log-file"}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--daemon":
            i += 1
        elif arg in skip_value:
            i += 2
        else:
            out.append(bind if arg == "$(WEB_ADDR)" else arg)
            i += 1
    assert not [a for a in out if "$(" in a], f"unexpected make variables in the demo's gunicorn line: {out}"
    return [*out, "--error-logfile", str(error_log)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A running gunicorn: its port and error log."""

    port: int
    log: Path
    process: subprocess.Popen[bytes] = field(repr=False)

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


def _database_url() -> str:
    from django.db import connection

    s = connection.settings_dict
    return f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


@pytest.fixture(scope="module")
def static_root(tmp_path_factory) -> Path:
    """collectstatic as `make demo` runs it (DEBUG=false: the manifest storage), into a private folder."""
    root = tmp_path_factory.mktemp("static")
    env = {**os.environ, **demo_environment((REPO_ROOT / "Makefile").read_text()), "STATIC_ROOT": str(root)}
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"],
        cwd=REPO_ROOT,
        env=env,
        check=True,
        timeout=300,
    )
    return root


@pytest.fixture
def start_server(static_root, prometheus_server, tmp_path) -> Iterator:
    """Factory: gunicorn as `make demo` starts it (extra environment optional), stopped after the test."""
    servers: list[Server] = []
    makefile = (REPO_ROOT / "Makefile").read_text()

    def start(**extra_env: str) -> Server:
        port = _free_port()
        log = tmp_path / f"gunicorn-{port}.log"
        env = {
            **os.environ,
            **demo_environment(makefile),
            "DATABASE_URL": _database_url(),
            "PROMETHEUS_URL": prometheus_server.url,
            "STATIC_ROOT": str(static_root),
            "MEDIA_ROOT": str(tmp_path / "media"),
            "FILE_UPLOAD_TEMP_DIR": str(tmp_path),
            **extra_env,
        }
        gunicorn = str(Path(sys.executable).with_name("gunicorn"))
        args = demo_gunicorn_args(makefile, f"127.0.0.1:{port}", log)
        process = subprocess.Popen([gunicorn, *args], cwd=REPO_ROOT, env=env)
        server = Server(port, log, process)
        servers.append(server)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.poll() is None, f"gunicorn exited: {server.log_text()}"
            try:
                if _get(port, "/healthz", timeout=5)[0] == 200:
                    return server
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"gunicorn did not answer /healthz in 60 s: {server.log_text()}")

    yield start
    for server in servers:
        server.process.terminate()
        try:
            server.process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


# -- clients ------------------------------------------------------------------------------------------


def _get(port: int, path: str, timeout: float = 10) -> tuple[int, float]:
    """One GET on a new connection: (status, seconds to the whole response)."""
    import http.client

    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status, time.monotonic() - t0
    finally:
        conn.close()


@dataclass
class SlowHeaders:
    """A client that sends a request line, then one header line per second, until cut off."""

    port: int
    cut_after_s: float | None = None
    answer: bytes = b""

    def run(self, stop: threading.Event) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port))
        t0 = time.monotonic()
        try:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            n = 0
            while not stop.is_set():
                readable, _, _ = select.select([sock], [], [], 1.0)
                if readable:  # the server answered (408) or closed
                    self.answer = sock.recv(4096)
                    break
                sock.sendall(f"X-Slow-{n}: {n}\r\n".encode())
                n += 1
            else:
                return
            self.cut_after_s = time.monotonic() - t0
        except OSError:
            self.cut_after_s = time.monotonic() - t0
        finally:
            sock.close()


def _upload_head(path: str, token: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Token {token}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def _part_head() -> bytes:
    return (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="kind"\r\n\r\npyspy_raw\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="big.txt"\r\n'
        "Content-Type: text/plain\r\n\r\n"
    ).encode()


@dataclass
class SlowUpload:
    """A member's 500 MiB upload sent at `rate` bytes/s: it is still streaming while others are served."""

    port: int
    path: str
    token: str
    rate: int = 4 * MiB
    sent: int = 0
    early_answer: bytes = b""

    def run(self, stop: threading.Event) -> None:
        length = 500 * MiB
        chunk = b"main (a.py:1) 5\n" * (MiB // 16)
        with socket.create_connection(("127.0.0.1", self.port)) as sock:
            sock.sendall(_upload_head(self.path, self.token, length) + _part_head())
            while not stop.is_set() and self.sent + len(chunk) < length:
                readable, _, _ = select.select([sock], [], [], 0)
                if readable:  # refused from the headers, or cut off: that is not what this client measures
                    self.early_answer = sock.recv(4096) or b"<closed>"
                    return
                sock.sendall(chunk)
                self.sent += len(chunk)
                time.sleep(len(chunk) / self.rate)


@pytest.fixture
def member_upload(django_db_blocker):
    """A job of team llm and an API token of its member alice (committed: the server is another process)."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from jobs.models import ApiToken, Job, Membership, Team

    with django_db_blocker.unblock():
        team = Team.objects.create(slug="llm", name="LLM")
        alice = get_user_model().objects.create_user("alice", "alice@example.com", "pw-correct-horse")
        Membership.objects.create(team=team, user=alice)
        Job.objects.create(
            team=team,
            external_id="48213",
            name="pretrain",
            gpu_count=8,
            gpus=[{"hostname": "node-a", "gpu": str(i)} for i in range(8)],
            started_at=timezone.now() - timedelta(hours=1),
        )
        _, key = ApiToken.issue(alice, "slow-upload")
    return {"path": "/api/v1/jobs/48213/artifacts/", "token": key}


# -- the checks ---------------------------------------------------------------------------------------


def test_the_demo_starts_gunicorn_with_the_config_file_and_threaded_workers():
    makefile = (REPO_ROOT / "Makefile").read_text()
    args = demo_gunicorn_args(makefile, "127.0.0.1:1", Path("/dev/null"))
    assert args[args.index("--config") + 1] == "gunicorn.conf.py"
    namespace: dict[str, object] = {}
    exec((REPO_ROOT / "gunicorn.conf.py").read_text(), namespace)
    assert namespace["worker_class"] == "efficiency.webserver.HeadTimeoutThreadWorker"
    assert isinstance(namespace["threads"], int) and namespace["threads"] >= 4


@pytest.mark.django_db(transaction=True)
def test_healthz_and_login_answer_within_a_second_while_slow_and_huge_clients_are_connected(
    start_server, member_upload
):
    server = start_server()
    stop = threading.Event()
    slow = [SlowHeaders(server.port) for _ in range(8)]
    uploads = [SlowUpload(server.port, member_upload["path"], member_upload["token"]) for _ in range(2)]
    threads = [threading.Thread(target=c.run, args=(stop,), daemon=True) for c in [*slow, *uploads]]
    for t in threads:
        t.start()
    try:
        time.sleep(2.0)  # every slow client is connected and has sent part of its request
        timings: list[tuple[str, int, float]] = []
        while len(timings) < 12:
            for path in ("/healthz", "/login/"):
                status, seconds = _get(server.port, path)
                timings.append((path, status, seconds))
            time.sleep(0.5)
        worst = max(seconds for _, _, seconds in timings)
        print(f"\n8 slow-header sockets + 2 uploads open: {len(timings)} requests, slowest {worst:.3f} s")
        for path, status, seconds in timings:
            print(f"  {path:10s} {status} {seconds:.3f} s")
        assert all(status == 200 for _, status, _ in timings), timings
        assert worst < 1.0, timings
        assert all(u.early_answer == b"" for u in uploads), [u.early_answer[:200] for u in uploads]
        assert all(u.sent >= 8 * MiB for u in uploads), [u.sent for u in uploads]  # they really streamed
        print(f"  uploads streamed meanwhile: {[round(u.sent / MiB) for u in uploads]} MiB")
        # All of that while every slow-header socket was still open (none cut off yet).
        assert [s.cut_after_s for s in slow] == [None] * len(slow)

        # The slow-header clients are cut off (408) once the header timeout has passed, not served.
        for t in threads[: len(slow)]:
            t.join(timeout=DEFAULT_HEADER_TIMEOUT_S + 10)
        cut = [s.cut_after_s for s in slow]
        print(f"  slow-header sockets closed after: {[round(c, 1) if c else c for c in cut]} s")
        assert all(
            c is not None and DEFAULT_HEADER_TIMEOUT_S - 1 <= c <= DEFAULT_HEADER_TIMEOUT_S + 3 for c in cut
        )
        assert all(s.answer.startswith(b"HTTP/1.1 408 ") or s.answer == b"" for s in slow), [
            s.answer for s in slow
        ]
        assert any(s.answer.startswith(b"HTTP/1.1 408 ") for s in slow)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=15)
    status, seconds = _get(server.port, "/healthz")
    assert status == 200 and seconds < 1.0


def _stalled_upload(port: int, path: str, token: str, trickle: bool) -> tuple[float, bytes]:
    """Sends an upload's head and 64 KiB of its body, then nothing (or 100 bytes every 0.5 s when
    `trickle`): seconds until the server answers or closes, and its answer."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(_upload_head(path, token, 10 * MiB) + _part_head() + b"x" * 65536)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            readable, _, _ = select.select([sock], [], [], 0.5)
            if readable:
                return time.monotonic() - t0, sock.recv(4096)
            if trickle:
                try:
                    sock.sendall(b"y" * 100)
                except OSError:
                    return time.monotonic() - t0, b""
        return time.monotonic() - t0, b"<still open after 30 s>"


@pytest.mark.django_db(transaction=True)
def test_a_stalled_or_trickling_upload_body_is_cut_off_with_408(start_server, member_upload):
    # The same demo command line with short body timeouts, so the test need not wait the defaults (30/120 s).
    server = start_server(GUNICORN_BODY_IDLE_TIMEOUT="1", GUNICORN_BODY_TIMEOUT="3")
    stalled_s, stalled = _stalled_upload(server.port, member_upload["path"], member_upload["token"], False)
    trickled_s, trickled = _stalled_upload(server.port, member_upload["path"], member_upload["token"], True)
    print(f"\nstalled upload cut after {stalled_s:.1f} s: {stalled[:60]!r}")
    print(f"trickling upload cut after {trickled_s:.1f} s: {trickled[:60]!r}")
    assert stalled.startswith(b"HTTP/1.1 408 ") and stalled_s < 3, stalled
    # The trickle never pauses for the idle timeout; the 3 s deadline for the whole body ends it.
    assert trickled.startswith(b"HTTP/1.1 408 ") and 2 < trickled_s < 6, trickled
    status, seconds = _get(server.port, "/healthz")
    assert status == 200 and seconds < 1.0


# -- compose, the image and nginx (no Docker engine here: their files are parsed) ---------------------


def _nginx_directives(text: str) -> dict[str, list[str]]:
    """`directive value` pairs of an nginx config (comments dropped), each directive's values in order."""
    found: dict[str, list[str]] = {}
    for statement in re.sub(r"#[^\n]*", "", text).replace("{", ";").replace("}", ";").split(";"):
        words = statement.split()
        if words:
            found.setdefault(words[0], []).append(" ".join(words[1:]))
    return found


def _nginx_size(value: str) -> int:
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    return int(value[:-1]) * units[value[-1].lower()] if value[-1].lower() in units else int(value)


def test_compose_puts_nginx_in_front_and_no_longer_publishes_gunicorn():
    import yaml

    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    web, proxy = services["web"], services["proxy"]
    assert "ports" not in web, "gunicorn must be reached through the proxy only"
    assert web["command"] == ["gunicorn", "--config", "gunicorn.conf.py"]
    assert proxy["image"].startswith("nginx:")
    assert proxy["ports"] == ["8000:8080"]
    assert "./efficiency/deploy/nginx.conf:/etc/nginx/nginx.conf:ro" in proxy["volumes"]
    assert proxy["depends_on"]["web"]["condition"] == "service_healthy"
    # No other service publishes a port either (Postgres, Redis, Prometheus stay on the compose network).
    assert [name for name, s in services.items() if "ports" in s] == ["proxy"]


def test_nginx_bounds_slow_and_large_clients_and_proxies_to_web():
    directives = _nginx_directives((REPO_ROOT / "efficiency" / "deploy" / "nginx.conf").read_text())

    def seconds(name: str) -> int:
        (value,) = directives[name]
        assert value.endswith("s"), value
        return int(value[:-1])

    assert seconds("client_header_timeout") <= 15
    assert seconds("client_body_timeout") <= 60
    assert seconds("send_timeout") <= 60
    (body_limit,) = directives["client_max_body_size"]
    from django.conf import settings

    # Room for the largest artifact plus the multipart envelope, and not much more.
    assert settings.ARTIFACT_MAX_BYTES < _nginx_size(body_limit) <= settings.ARTIFACT_MAX_BYTES + 16 * MiB
    assert directives["proxy_request_buffering"] == ["on"]
    assert directives["proxy_buffering"] == ["on"]
    assert "web:8000" in directives["server"]  # the upstream's member (the other entry: `server {`)
    assert directives["proxy_pass"] == ["http://efficiency_web"]
    # The client's own address, never one it sent (login throttling reads the first entry).
    assert "X-Forwarded-For $remote_addr" in directives["proxy_set_header"]
    assert directives["listen"] == ["8080"]


def test_the_image_starts_gunicorn_with_the_config_file():
    cmd = next(
        line for line in (REPO_ROOT / "Dockerfile").read_text().splitlines() if line.startswith("CMD ")
    )
    assert json_list(cmd.removeprefix("CMD ")) == ["gunicorn", "--config", "gunicorn.conf.py"]


def json_list(text: str) -> list[str]:
    """A Dockerfile exec-form list."""
    import json

    value = json.loads(text)
    assert isinstance(value, list)
    return [str(v) for v in value]


def _read_responses(sock: socket.socket, count: int, timeout: float = 10) -> list[bytes]:
    """`count` HTTP/1.1 responses (with Content-Length) read from `sock`: their status lines."""
    sock.settimeout(timeout)
    data = b""
    statuses: list[bytes] = []
    while len(statuses) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end].decode("latin-1")
            length = int(re.search(r"(?im)^content-length:\s*(\d+)", head).group(1))  # type: ignore[union-attr]
            if len(data) >= head_end + 4 + length:
                statuses.append(head.split("\r\n", 1)[0].encode())
                data = data[head_end + 4 + length :]
                continue
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return statuses


@pytest.mark.django_db(transaction=True)
def test_kept_alive_and_pipelined_requests_are_answered_in_order(start_server, member_upload):
    server = start_server()
    get = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(get)
        assert _read_responses(sock, 1) == [b"HTTP/1.1 200 OK"]
        sock.sendall(get)  # the same connection, kept alive: its head is read by the event loop again
        assert _read_responses(sock, 1) == [b"HTTP/1.1 200 OK"]
        # Two requests in one packet, the first with a body: the second is answered after the first.
        body = b'{"name": "x"}'
        post = (
            f"PATCH /api/v1/jobs/48213/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Token {member_upload['token']}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        sock.sendall(post + body + get)
        assert _read_responses(sock, 2) == [b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK"]
