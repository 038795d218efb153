"""Issue 23 item 5 through the pages, the API and real deliveries: webhook URLs are checked when saved
(clear 400s, never a 500) and at send time (internal addresses refused unless ALERT_ALLOWED_HOSTS lists
them), and no receiver's reply body ever reaches a page or the API (only its status code)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from jobs.alerts import incidents
from jobs.models import AlertDelivery, AlertSubscription, Job

PROM_REPLY = (
    b'{"status":"error","errorType":"bad_data","error":"SECRET-PROMETHEUS-REPLY up{instance=\\"db\\"}"}'
)


@dataclass
class FakePrometheus:
    """Answers every POST as Prometheus' /api/v1/query answers a webhook's JSON body: 400 and a JSON reply
    that must never be shown to the subscriber."""

    port: int = 0
    hits: list[str] = field(default_factory=list)


@pytest.fixture
def prom() -> Iterator[FakePrometheus]:
    state = FakePrometheus()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.hits.append(self.path)
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(PROM_REPLY)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def _alert_settings(settings):
    settings.SITE_URL = "https://eff.example.com"
    settings.ALERT_STALE_MINUTES = 10
    settings.ALERT_RETRY_BACKOFF_S = 0
    settings.ALERT_ALLOWED_HOSTS = []


@pytest.fixture
def member(make_team, make_user, client):
    team = make_team("llm")
    user = make_user("mallory", teams=[team])
    client.force_login(user)
    return team, user


def _stale_job(team) -> Job:
    now = timezone.now()
    return Job.objects.create(
        external_id="77001",
        name="pretrain-7b",
        team=team,
        owner="mallory",
        gpu_count=8,
        gpus=[{"hostname": "node-a", "gpu": str(i)} for i in range(8)],
        started_at=now - timedelta(hours=2),
        data_until=now - timedelta(minutes=30),
    )


def _add(client, team, url: str, channel: str = "webhook"):
    return client.post(f"/teams/{team.slug}/alerts/subscriptions/", {"channel": channel, "url": url})


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://[::1", "malformed"),
        ("http://a:99999/", "malformed"),
        ("http://" + "a" * 320 + ".example.com/", "not a valid host name"),
        ("http://" + ".".join(["abcdefghij"] * 30) + "/hook", "1-253 characters"),
        ("ftp://example.com/hook", "only http"),
        ("http://127.0.0.1:9090/api/v1/query", "internal addresses (127.0.0.1 is a loopback address)"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[::ffff:10.0.0.1]/", "private (IPv4 inside IPv6)"),
    ],
)
def test_bad_webhook_urls_get_a_400_with_the_reason_on_both_pages(member, client, url, says):
    team, _ = member
    response = _add(client, team, url)
    assert response.status_code == 400
    assert says in response.content.decode()
    mine = client.post("/alerts/mine/", {"channel": "slack", "url": url})
    assert mine.status_code == 400 and says in mine.content.decode()
    assert not AlertSubscription.objects.exists()


@pytest.mark.django_db
def test_a_long_url_with_a_valid_host_is_stored_with_a_short_hint(member, client):
    team, _ = member
    response = _add(client, team, "https://hooks.example.com/" + "p" * 400)
    assert response.status_code == 302
    sub = AlertSubscription.objects.get()
    assert sub.url_hint == "https://hooks.example.com/…"


@pytest.mark.django_db
def test_an_allowed_internal_host_can_be_subscribed(member, client, settings):
    team, _ = member
    settings.ALERT_ALLOWED_HOSTS = ["10.0.0.0/8"]
    assert _add(client, team, "http://10.1.2.3:9093/api/v2/alerts", channel="alertmanager").status_code == 302
    assert AlertSubscription.objects.get().url_hint == "http://10.1.2.3:9093/…"


def _deliver(team, django_capture_on_commit_callbacks) -> AlertDelivery:
    job = _stale_job(team)
    with django_capture_on_commit_callbacks(execute=True):
        incidents.evaluate_job(job, timezone.now())
    return AlertDelivery.objects.get()


def _shown(client, team) -> str:
    page = client.get(f"/teams/{team.slug}/alerts/").content.decode()
    api = client.get("/api/v1/alerts/", {"team": team.slug, "state": "all"}).content.decode()
    return page + api


@pytest.mark.django_db
def test_the_prometheus_ssrf_is_refused_at_send_time_and_nothing_is_shown(
    member, client, prom, celery_eager, django_capture_on_commit_callbacks
):
    """The attack of issue 23: a member subscribes the team to Prometheus' query API on loopback. The IP
    literal is refused by the form; a name for the same address is accepted (no DNS at save time) and
    refused at send time: Prometheus gets no request, the page and the API show no reply."""
    team, _ = member
    assert _add(client, team, f"http://127.0.0.1:{prom.port}/api/v1/query").status_code == 400
    assert _add(client, team, f"http://localhost:{prom.port}/api/v1/query").status_code == 302
    delivery = _deliver(team, django_capture_on_commit_callbacks)
    assert delivery.status == "gave_up" and delivery.attempts == 1
    assert "refused: localhost resolves to a loopback address" in delivery.error
    assert prom.hits == []
    shown = _shown(client, team)
    assert "resolves to a loopback address" in shown and "SECRET-PROMETHEUS-REPLY" not in shown


@pytest.mark.django_db
def test_an_allowed_receiver_is_reached_and_only_its_status_code_is_kept(
    member, client, prom, settings, celery_eager, django_capture_on_commit_callbacks
):
    team, _ = member
    settings.ALERT_ALLOWED_HOSTS = ["localhost", "127.0.0.1"]
    assert _add(client, team, f"http://localhost:{prom.port}/api/v1/query").status_code == 302
    delivery = _deliver(team, django_capture_on_commit_callbacks)
    assert prom.hits == ["/api/v1/query"]
    assert delivery.status == "gave_up" and delivery.response_status == 400 and delivery.error == "HTTP 400"
    shown = _shown(client, team)
    assert "HTTP 400" in shown and "SECRET-PROMETHEUS-REPLY" not in shown and "bad_data" not in shown


@pytest.mark.django_db
def test_a_subscription_stored_before_the_checks_is_refused_when_sent(
    member, client, prom, celery_eager, django_capture_on_commit_callbacks
):
    """Rows saved by an older version (no save-time check) still go through the send-time check."""
    from jobs.alerts import secrets

    team, _ = member
    AlertSubscription.objects.create(
        team=team,
        channel="webhook",
        url_encrypted=secrets.seal(f"http://127.0.0.1:{prom.port}/-/quit"),
        url_hint="http://127.0.0.1/…",
    )
    delivery = _deliver(team, django_capture_on_commit_callbacks)
    assert delivery.status == "gave_up" and "loopback" in delivery.error
    assert prom.hits == []


@pytest.mark.django_db
def test_the_migration_drops_stored_reply_bodies_and_quoted_urls(member, client):
    """Rows written before the fix: 'HTTP 400: <Prometheus' reply>' keeps 'HTTP 400'; a requests error
    quoting the webhook path loses it; other errors stay."""
    import importlib

    from django.apps import apps

    from jobs.models import AlertIncident

    team, _ = member
    job = _stale_job(team)
    now = timezone.now()
    incident = AlertIncident.objects.create(
        rule="ingestion_stale", job=job, team=team, started_at=now, opened_at=now, last_seen_at=now, title="t"
    )
    subs = [
        AlertSubscription.objects.create(team=team, channel="webhook", url_hint="http://h/…") for _ in "ab"
    ]
    errors = [
        "HTTP 400: " + PROM_REPLY.decode(),
        "ConnectionError: HTTPSConnectionPool(host='hooks.slack.com', port=443): Max retries exceeded with "
        "url: /services/T0/B0/SECRET-TOKEN",
        "HTTP 404",
        "SMTP 451: b'try later'",
    ]
    slots = [(s, e) for s in subs for e in ("opened", "resolved")]
    for (sub, event), error in zip(slots, errors, strict=True):
        AlertDelivery.objects.create(
            incident=incident, subscription=sub, event=event, channel="webhook", error=error, status="gave_up"
        )
    migration = importlib.import_module("jobs.migrations.0014_service_health")
    migration._drop_reply_bodies(apps, None)
    stored = set(AlertDelivery.objects.values_list("error", flat=True))
    assert stored == {
        "HTTP 400",
        "connection failed (the recorded message named the webhook URL and was dropped)",
        "HTTP 404",
        "SMTP 451: b'try later'",
    }
