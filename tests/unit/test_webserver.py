"""efficiency.webserver.DeadlineSocket: a request body read waits at most the idle timeout for data and
fails after the request's deadline; the caller's own timeout is kept for everything else."""

from __future__ import annotations

import socket
import time

import pytest

from efficiency.webserver import BodyTimeout, DeadlineSocket


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_a_read_returns_what_arrived(pair):
    server, client = pair
    sock = DeadlineSocket(server, idle=1.0)
    sock.start(5.0)
    client.sendall(b"hello")
    assert sock.recv(100) == b"hello"


def test_a_stalled_body_fails_after_the_idle_timeout(pair):
    server, _client = pair
    sock = DeadlineSocket(server, idle=0.2)
    sock.start(10.0)
    t0 = time.monotonic()
    with pytest.raises(BodyTimeout):
        sock.recv(100)
    assert 0.15 < time.monotonic() - t0 < 1.0


def test_a_trickling_body_fails_at_the_deadline_though_no_read_waits_long(pair):
    server, client = pair
    sock = DeadlineSocket(server, idle=1.0)
    sock.start(0.5)
    t0 = time.monotonic()
    with pytest.raises(BodyTimeout):
        while True:
            client.sendall(b"x")
            assert sock.recv(1) == b"x"
            time.sleep(0.05)
    assert 0.4 < time.monotonic() - t0 < 1.5


def test_the_callers_timeout_is_restored_after_each_read_and_bounds_it_too(pair):
    server, client = pair
    sock = DeadlineSocket(server, idle=5.0)
    sock.start(10.0)
    assert sock.gettimeout() is None
    client.sendall(b"a")
    sock.recv(1)
    assert server.gettimeout() is None  # writes on the same socket are not bounded by the idle timeout
    sock.settimeout(0.1)  # gunicorn's body drain sets its own deadline
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        sock.recv(1)
    assert time.monotonic() - t0 < 1.0
    assert server.gettimeout() == pytest.approx(0.1)


def test_a_body_timeout_is_an_oserror_as_django_expects_of_a_broken_body():
    # Django's HttpRequest.read turns an OSError into UnreadablePostError (answered 408 here).
    assert issubclass(BodyTimeout, OSError) and issubclass(BodyTimeout, TimeoutError)
