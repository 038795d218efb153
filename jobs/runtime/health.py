"""Reachability checks for /healthz: database, Redis broker, Prometheus; whether the service is polling
(jobs.runtime.service_health); and the readiness of the optional sources (node_exporter's host signals)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from django.db import connection

from jobs.metrics import engine_signals
from jobs.metrics.host_signals import source_readiness
from jobs.metrics.prometheus import PrometheusClient
from jobs.metrics.promql import validate_label_name
from jobs.runtime import service_health

log = logging.getLogger(__name__)


def _timed(check: Callable[[], None]) -> dict[str, Any]:
    started = time.monotonic()
    try:
        check()
    except Exception as exc:  # any failure of a dependency is a health result, not a crash
        log.warning("health check failed: %s: %s", check.__name__, exc)
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"ok": True, "latency_ms": round((time.monotonic() - started) * 1000, 1)}


def _database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def _redis() -> None:
    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.ping()
    finally:
        client.close()


def _prometheus() -> None:
    with PrometheusClient(
        settings.PROMETHEUS_URL, timeout_s=settings.HEALTHZ_PROMETHEUS_TIMEOUT_S, retries=0
    ) as client:
        health = client.ping()
    if not health.ok:
        raise ConnectionError(f"{settings.PROMETHEUS_URL}: {health.detail}")


def _poller() -> dict[str, Any]:
    try:
        return service_health.poller().as_json()
    except Exception as exc:  # the database is down (reported by its own check): the state is unknown
        log.warning("health check: poller state unknown: %s", exc)
        return {"status": service_health.UNKNOWN, "reason": f"not readable: {type(exc).__name__}"}


#: How far back the node_exporter readiness check looks for series (a few scrapes of the usual 15-60 s).
NODE_EXPORTER_LOOKBACK_S = 600.0


def node_exporter_source(now: float | None = None) -> dict[str, Any]:
    """node_exporter's readiness line (jobs.metrics.host_signals.source_readiness): configured or not
    (NODE_EXPORTER_HOST_LABEL), and, when configured, whether Prometheus holds node_exporter series carrying
    the join label in the last NODE_EXPORTER_LOOKBACK_S (one label-values request, the /healthz timeout).
    Never raises: an unreachable Prometheus gives a line saying it was not checked."""
    label = settings.NODE_EXPORTER_HOST_LABEL
    if not label:
        return source_readiness("", None)
    end = time.time() if now is None else now
    try:
        match = [f'{{__name__=~"node_.+", {validate_label_name(label)}=~".+"}}']
        with PrometheusClient(
            settings.PROMETHEUS_URL, timeout_s=settings.HEALTHZ_PROMETHEUS_TIMEOUT_S, retries=0
        ) as client:
            names = client.label_values("__name__", match, end - NODE_EXPORTER_LOOKBACK_S, end)
    except Exception as exc:  # a health answer, not a crash
        log.warning("node_exporter readiness: %s: %s", type(exc).__name__, exc)
        return source_readiness(label, None, f"{type(exc).__name__}: {exc}"[:300])
    return source_readiness(label, names)


#: How far back the serving engines' readiness line looks for their FLOP counters (as node_exporter's).
ENGINE_LOOKBACK_S = NODE_EXPORTER_LOOKBACK_S


def engine_source(now: float | None = None) -> dict[str, Any]:
    """The serving engines' readiness line (jobs.metrics.engine_signals.source_readiness): whether vLLM or
    SGLang FLOP counters (`--enable-mfu-metrics`) have series in Prometheus in the last ENGINE_LOOKBACK_S,
    per engine and namespace how many pods carry them, and how many join no job (one instant query, the
    /healthz timeout). Never raises: an unreachable Prometheus gives a line saying it was not checked."""
    at = time.time() if now is None else now
    try:
        with PrometheusClient(
            settings.PROMETHEUS_URL, timeout_s=settings.HEALTHZ_PROMETHEUS_TIMEOUT_S, retries=0
        ) as client:
            samples = client.instant(engine_signals.engine_groups_query(ENGINE_LOOKBACK_S), at)
    except Exception as exc:  # a readiness answer, not a crash
        log.warning("engine readiness: %s: %s", type(exc).__name__, exc)
        return engine_signals.source_readiness(None, ENGINE_LOOKBACK_S, f"{type(exc).__name__}: {exc}"[:300])
    return engine_signals.source_readiness([(s.labels, s.value) for s in samples], ENGINE_LOOKBACK_S)


def run_checks() -> dict[str, Any]:
    """All checks; `ok` is true only when every dependency answered. `status` is "down" when one did not,
    "degraded" when they all answer but the service stopped polling (`poller`, jobs.runtime.service_health:
    the
    web server still serves, so the answer stays 200), "ok" otherwise. `sources` holds the optional sources'
    readiness lines (node_exporter): auxiliary, they change neither `ok` nor `status`."""
    checks = {"database": _timed(_database), "redis": _timed(_redis), "prometheus": _timed(_prometheus)}
    ok = all(c["ok"] for c in checks.values())
    poller = _poller()
    status = "down" if not ok else "degraded" if poller["status"] == "degraded" else "ok"
    sources = {"node_exporter": node_exporter_source()}
    return {"ok": ok, "status": status, "checks": checks, "poller": poller, "sources": sources}
