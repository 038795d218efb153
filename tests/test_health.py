"""/healthz reports database, Redis and Prometheus reachability."""

import socket

import pytest


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.django_db
def test_healthz_is_200_when_every_dependency_answers(client, settings, prometheus_server):
    settings.PROMETHEUS_URL = prometheus_server.url
    response = client.get("/healthz")
    body = response.json()
    assert response.status_code == 200, body
    assert body["ok"] is True
    assert set(body["checks"]) == {"database", "redis", "prometheus"}
    assert all(check["ok"] for check in body["checks"].values())


@pytest.mark.django_db
def test_healthz_is_503_and_names_prometheus_when_it_is_down(client, settings):
    settings.PROMETHEUS_URL = f"http://127.0.0.1:{_closed_port()}"
    response = client.get("/healthz")
    body = response.json()
    assert response.status_code == 503
    assert body["ok"] is False
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["prometheus"]["ok"] is False
    assert body["checks"]["prometheus"]["error"]


@pytest.mark.django_db
def test_healthz_is_503_when_redis_is_down(client, settings, prometheus_server):
    settings.PROMETHEUS_URL = prometheus_server.url
    settings.REDIS_URL = f"redis://127.0.0.1:{_closed_port()}/0"
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["checks"]["redis"]["ok"] is False


def test_healthz_needs_no_login(client, settings):
    settings.PROMETHEUS_URL = f"http://127.0.0.1:{_closed_port()}"
    assert client.get("/healthz").status_code in (200, 503)
