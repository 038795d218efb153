"""Shared test fixtures: where ../shared lives, and skipping cleanly when it is absent."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"
SAMPLES = SHARED / "samples"


@pytest.fixture
def samples_dir() -> Path:
    """The real profiling artifacts in ../shared/samples (skips the test when absent)."""
    if not SAMPLES.is_dir():
        pytest.skip(f"{SAMPLES} is absent: real sample artifacts are not available on this machine")
    return SAMPLES


def sample_path(relative: str) -> Path:
    """Path of one sample file; skips the calling test when ../shared/samples is absent."""
    path = SAMPLES / relative
    if not path.exists():
        pytest.skip(f"{path} is absent: real sample artifacts are not available on this machine")
    return path


# Database fixtures. Imports stay inside the fixtures so that pure unit tests can run without Django.


@pytest.fixture
def make_team(db):
    """Factory: a team with the given slug (created on first use)."""
    from jobs.models import Team

    def make(slug: str = "llm", name: str | None = None):
        team, _ = Team.objects.get_or_create(slug=slug, defaults={"name": name or slug.upper()})
        return team

    return make


@pytest.fixture
def make_user(db):
    """Factory: a user, optionally a member of teams, optionally staff."""
    from django.contrib.auth import get_user_model

    from jobs.models import Membership

    def make(username: str = "alice", teams=(), staff: bool = False, password: str = "pw-correct-horse"):
        user = get_user_model().objects.create_user(
            username=username, password=password, email=f"{username}@example.com", is_staff=staff
        )
        for team in teams:
            Membership.objects.create(team=team, user=user)
        return user

    return make


@pytest.fixture
def api_client_for(db):
    """Factory: a DRF APIClient authenticated with a fresh API token of `user`."""
    from rest_framework.test import APIClient

    from jobs.models import ApiToken

    def make(user):
        _, key = ApiToken.issue(user, "test")
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        return client

    return make


def job_body(external_id: str = "48213", team: str = "llm", **overrides):
    """A valid POST /api/v1/jobs/ body (Llama-like 7B on 8 H100s)."""
    body = {
        "external_id": external_id,
        "name": "pretrain-7b",
        "team": team,
        "owner": "alice",
        "model": {
            "name": "llama-7b",
            "n_params": 6.7e9,
            "n_layers": 32,
            "n_heads": 32,
            "head_dim": 128,
            "hidden": 4096,
            "seq_len": 4096,
            "vocab": 32000,
        },
        "dtype": "bf16",
        "parallelism": {"tp": 1, "pp": 1, "dp": 8, "ep": 1},
        "micro_batch": 4,
        "global_batch": 256,
        "recompute": "none",
        "gpu_model": "NVIDIA H100 80GB HBM3",
        "tokens_per_step": 256 * 4096,
        "started_at": "2026-11-23T08:00:00Z",
        "gpus": [{"hostname": "gpu-node-017", "gpu": str(i)} for i in range(8)],
    }
    body.update(overrides)
    return body


@pytest.fixture(scope="session")
def prometheus_server(tmp_path_factory):
    """A real, empty Prometheus on a free loopback port for the whole session (skips when not installed)."""
    from tests.prom_server import PrometheusProcess, prometheus_binary

    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (Debian package 'prometheus')")
    with PrometheusProcess(tmp_path_factory.mktemp("prom-empty")) as prom:
        yield prom


#: The tests' fixed dates (job_body starts 2026-11-23) are this many days after this day.
FIXED_DATES_FROM = date(2026, 11, 1)


@pytest.fixture(autouse=True)
def job_window_for_fixed_dates(settings):
    """MAX_JOB_WINDOW_DAYS grows with the days since the tests' fixed dates, so a running test job of
    2026-11-23 stays registrable as the calendar moves on, while a start a year before those dates (the
    edge-validation case) stays refused: both ages grow by the same day count."""
    settings.MAX_JOB_WINDOW_DAYS = 90 + max((date.today() - FIXED_DATES_FROM).days, 0)


@pytest.fixture(autouse=True, scope="session")
def celery_in_memory():
    """Tasks queued by a test (a price entry's re-evaluation, an upload's parse) go to an in-memory broker,
    never to the Redis a developer's demo worker reads: tests that need them run use `celery_eager`."""
    from efficiency.celery import app

    old = app.conf.broker_url
    app.conf.broker_url = "memory://"
    yield app
    app.conf.broker_url = old


@pytest.fixture(autouse=True)
def read_scope_all(settings):
    """Tests of pages, exports and the API that predate the read policy log in as users outside the job's
    team: they run with READ_SCOPE=all. Tests of the policy itself (tests/test_read_scope.py and others
    that need it) set READ_SCOPE="team", the deployed default (test_read_scope checks the default)."""
    settings.READ_SCOPE = "all"


@pytest.fixture(autouse=True, scope="session")
def private_cache_prefix():
    """The cache is the Redis a developer's demo and other test runs share: this run's keys get their own
    prefix, so a test never reads or clears another process's entries."""
    import os
    import uuid

    from django.conf import settings
    from django.test import override_settings

    default = {**settings.CACHES["default"], "KEY_PREFIX": f"test-{os.getpid()}-{uuid.uuid4().hex[:8]}"}
    with override_settings(CACHES={**settings.CACHES, "default": default}):
        yield


def clear_private_cache() -> int:
    """Delete this test run's cache entries only (those under its private KEY_PREFIX) and say how many.

    Never `cache.clear()` on the Redis cache: it is FLUSHDB on the database the Celery broker, redbeat and a
    developer's demo share, so it empties their queues and schedule too."""
    from django.core.cache import cache

    backend = cache._cache  # type: ignore[attr-defined]  # django's RedisCache: its client wrapper
    client = backend.get_client(None, write=True)
    deleted = 0
    for key in client.scan_iter(match=f"{cache.key_prefix}:*", count=500):
        deleted += int(client.delete(key))
    return deleted


@pytest.fixture
def celery_eager():
    """Run Celery tasks inline, propagating their exceptions."""
    from efficiency.celery import app

    old = (app.conf.task_always_eager, app.conf.task_eager_propagates)
    app.conf.task_always_eager = app.conf.task_eager_propagates = True
    yield app
    app.conf.task_always_eager, app.conf.task_eager_propagates = old


@pytest.fixture
def media_root(settings, tmp_path):
    """A private MEDIA_ROOT for tests that store artifacts."""
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


@pytest.fixture
def catalog(db):
    """The seeded GPU catalog and price book (transactional tests flush the migration's rows)."""
    from jobs.demo.seed import seed_catalog
    from jobs.models import GpuModel, PriceEntry

    seed_catalog(GpuModel, PriceEntry)
    return GpuModel.objects.all()
