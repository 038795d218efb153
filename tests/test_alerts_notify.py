"""Alert notifications: exactly once per incident and event over a real SMTP server (aiosmtpd) and a local
webhook receiver (http.server thread), under repeated polls, a failing receiver and a killed worker; the
payload formats (JSON with HMAC signature, Slack, Alertmanager v4); secrets never rendered back."""

from __future__ import annotations

import email
import email.policy
import hashlib
import hmac
import json
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from jobs.alerts import incidents, notify, secrets
from jobs.alerts.forms import SubscriptionForm
from jobs.models import AlertDelivery, AlertIncident, AlertSubscription, Job, Membership
from tests.test_reports import SmtpHandler, _free_port

SITE = "https://eff.example.com"


@dataclass
class Receiver:
    """A local webhook endpoint: keeps what it accepted; answers `fail_next` requests with `fail_status`."""

    url: str = ""
    received: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    attempts: int = 0
    fail_next: int = 0
    fail_status: int = 503


@pytest.fixture
def receiver():
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.attempts += 1
            if state.fail_next > 0:
                state.fail_next -= 1
                self.send_response(state.fail_status)
                self.end_headers()
                self.wfile.write(b"try later")
                return
            state.received.append((self.path, dict(self.headers.items()), body))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def smtp(settings):
    """A real SMTP server (aiosmtpd) on a free loopback port, Django's SMTP backend pointed at it."""
    import logging

    from aiosmtpd.controller import Controller

    mail_log = logging.getLogger("mail.log")
    level = mail_log.level
    mail_log.setLevel(logging.WARNING)
    handler = SmtpHandler()
    controller = Controller(handler, hostname="127.0.0.1", port=_free_port())
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", controller.port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    settings.EMAIL_TIMEOUT = 10
    try:
        yield handler
    finally:
        controller.stop()
        mail_log.setLevel(level)


@pytest.fixture
def eager_retrying():
    """Tasks run inline, and a task's retry runs inline too (as a worker would, without the countdown)."""
    from efficiency.celery import app

    old = (app.conf.task_always_eager, app.conf.task_eager_propagates)
    app.conf.task_always_eager, app.conf.task_eager_propagates = True, False
    yield app
    app.conf.task_always_eager, app.conf.task_eager_propagates = old


@pytest.fixture(autouse=True)
def _alert_settings(settings):
    settings.SITE_URL = SITE
    settings.ALERT_STALE_MINUTES = 10
    settings.ALERT_RETRY_BACKOFF_S = 0
    settings.ALERT_STALE_CLAIM_S = 600
    # The receivers below listen on loopback, which outbound requests refuse unless allowed (issue 23).
    settings.ALERT_ALLOWED_HOSTS = ["127.0.0.1"]


def _subscribe(team=None, user=None, channel="webhook", url="", secret="", email_addr="", rules=()):
    form = SubscriptionForm(
        {"channel": channel, "url": url, "secret": secret, "email": email_addr, "rules": list(rules)}
    )
    assert form.is_valid(), form.errors
    return form.save(team=team, user=user)


def _running_job(team, owner="alice") -> Job:
    now = timezone.now()
    return Job.objects.create(
        external_id="77001",
        name="pretrain-7b",
        team=team,
        owner=owner,
        gpu_count=8,
        gpus=[{"hostname": "node-a", "gpu": str(i)} for i in range(8)],
        started_at=now - timedelta(hours=2),
        data_until=now - timedelta(minutes=30),
    )


def _poll(job: Job, django_capture_on_commit_callbacks, now=None) -> None:
    """What a poll's hook does: evaluate the rules, then (after commit) the queued deliveries run."""
    job.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        incidents.evaluate_job(job, now or timezone.now())


@pytest.fixture
def owner(make_team, make_user):
    team = make_team("llm")
    user = make_user("alice", teams=[team])
    user.email = "alice@example.com"
    user.save()
    return team, user


@pytest.mark.django_db
def test_one_message_per_channel_on_open_and_on_resolve_under_repeated_polls(
    owner, smtp, receiver, celery_eager, django_capture_on_commit_callbacks
):
    team, user = owner
    _subscribe(team=team, channel="email", email_addr="oncall@example.com")
    _subscribe(team=team, channel="webhook", url=f"{receiver.url}/json", secret="s3cret")
    _subscribe(team=team, channel="slack", url=f"{receiver.url}/slack/T000/B000/XXXX")
    _subscribe(team=team, channel="alertmanager", url=f"{receiver.url}/am", secret="bearer-token")
    _subscribe(user=user, channel="email")  # personal: the owner's own address
    _subscribe(team=team, channel="webhook", url=f"{receiver.url}/idle-only", rules=["gpus_idle"])
    job = _running_job(team)
    for _ in range(3):
        _poll(job, django_capture_on_commit_callbacks)
    [incident] = AlertIncident.objects.filter(job=job)
    assert incident.rule == "ingestion_stale" and incident.is_open
    assert AlertDelivery.objects.filter(incident=incident).count() == 5  # the idle-only one is not for it
    assert sorted(to for _, (to,), _ in [(m[0], m[1], m[2]) for m in smtp.messages]) == [
        "alice@example.com",
        "oncall@example.com",
    ]
    by_path = {path.split("/")[1]: (headers, json.loads(body)) for path, headers, body in receiver.received}
    assert len(receiver.received) == 3 and set(by_path) == {"json", "slack", "am"}

    headers, body = by_path["json"]
    raw = next(b for p, _, b in receiver.received if p == "/json")
    expected = "sha256=" + hmac.new(b"s3cret", raw, hashlib.sha256).hexdigest()
    assert headers["X-Efficiency-Signature"] == expected
    assert body["event"] == "opened" and body["incident"]["rule"] == "ingestion_stale"
    assert body["job"]["url"] == f"{SITE}/jobs/77001/"
    headers, body = by_path["am"]
    assert headers["Authorization"] == "Bearer bearer-token"
    assert body["version"] == "4" and body["status"] == "firing"
    assert body["alerts"][0]["labels"]["alertname"] == "efficiency_ingestion_stale"
    assert body["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"
    _, body = by_path["slack"]
    assert "OPEN" in body["text"] and "77001" in body["text"]
    message = email.message_from_bytes(smtp.messages[0][2], policy=email.policy.default)
    assert "OPEN" in message["Subject"] and message.get_body(("html",)) is not None

    # The condition clears: one "resolved" message per subscription, however many polls follow.
    Job.objects.filter(pk=job.pk).update(data_until=timezone.now())
    for _ in range(3):
        _poll(job, django_capture_on_commit_callbacks)
    incident.refresh_from_db()
    assert incident.resolved_at is not None
    assert len(smtp.messages) == 4 and len(receiver.received) == 6
    resolved = [json.loads(b) for p, _, b in receiver.received[3:] if p == "/am"]
    assert (
        resolved[0]["status"] == "resolved" and resolved[0]["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"
    )
    assert set(AlertDelivery.objects.values_list("status", flat=True)) == {"sent"}
    assert AlertDelivery.objects.filter(event="resolved").count() == 5


@pytest.mark.django_db
def test_a_failing_receiver_is_retried_with_backoff_and_gets_the_message_once(
    owner, receiver, eager_retrying, django_capture_on_commit_callbacks
):
    team, _ = owner
    _subscribe(team=team, channel="webhook", url=f"{receiver.url}/json")
    receiver.fail_next = 2  # two 503s, then 200
    job = _running_job(team)
    _poll(job, django_capture_on_commit_callbacks)
    [delivery] = AlertDelivery.objects.all()
    assert delivery.status == "sent" and delivery.attempts == 3
    assert receiver.attempts == 3 and len(receiver.received) == 1
    _poll(job, django_capture_on_commit_callbacks)
    assert receiver.attempts == 3


@pytest.mark.django_db
def test_a_permanent_error_gives_up_at_once_with_the_reason(owner, receiver, celery_eager,
                                                           django_capture_on_commit_callbacks):  # fmt: skip
    team, _ = owner
    _subscribe(team=team, channel="webhook", url=f"{receiver.url}/gone")
    receiver.fail_next, receiver.fail_status = 1, 404
    _poll(_running_job(team), django_capture_on_commit_callbacks)
    [delivery] = AlertDelivery.objects.all()
    assert delivery.status == "gave_up" and delivery.attempts == 1 and delivery.response_status == 404
    assert "HTTP 404" in delivery.error
    assert notify.due_deliveries() == []


@pytest.mark.django_db
def test_backoff_doubles_per_attempt(settings):
    settings.ALERT_RETRY_BACKOFF_S = 30
    assert [notify.backoff_s(n) for n in (1, 2, 3, 4)] == [30, 60, 120, 240]
    assert notify.backoff_s(20) == 3600


@pytest.mark.django_db
def test_smtp_temporary_failure_is_retried_and_sent_once(owner, smtp, eager_retrying,
                                                         django_capture_on_commit_callbacks):  # fmt: skip
    team, _ = owner
    _subscribe(team=team, channel="email", email_addr="oncall@example.com")
    smtp.fail_next = 1  # 451 once
    _poll(_running_job(team), django_capture_on_commit_callbacks)
    [delivery] = AlertDelivery.objects.all()
    assert delivery.status == "sent" and delivery.attempts == 2
    assert len(smtp.messages) == 1


@pytest.mark.django_db
def test_a_worker_killed_after_claiming_is_resent_once_after_the_claim_goes_stale(owner, receiver, settings):
    team, _ = owner
    _subscribe(team=team, channel="webhook", url=f"{receiver.url}/json")
    job = _running_job(team)
    incidents.evaluate_job(job, timezone.now())  # not committed: no task ran, the row waits
    [delivery] = AlertDelivery.objects.all()
    now = timezone.now()
    assert notify._claim(delivery.pk, now) is not None  # the worker claims, then dies before sending
    assert notify.send_delivery(delivery.pk, now + timedelta(seconds=5)) is notify.Outcome.IN_PROGRESS
    assert receiver.received == []
    later = now + timedelta(seconds=settings.ALERT_STALE_CLAIM_S + 1)
    assert delivery.pk in notify.due_deliveries(later)  # the beat sweep re-queues it
    assert notify.send_delivery(delivery.pk, later) is notify.Outcome.SENT
    assert notify.send_delivery(delivery.pk, later) is notify.Outcome.ALREADY_SENT
    assert len(receiver.received) == 1
    delivery.refresh_from_db()
    assert delivery.attempts == 2 and delivery.status == "sent"


@pytest.mark.django_db
def test_two_racing_senders_send_once(owner, receiver):
    team, _ = owner
    _subscribe(team=team, channel="webhook", url=f"{receiver.url}/json")
    incidents.evaluate_job(_running_job(team), timezone.now())
    [delivery] = AlertDelivery.objects.all()
    outcomes = {notify.send_delivery(delivery.pk), notify.send_delivery(delivery.pk)}
    assert outcomes == {notify.Outcome.SENT, notify.Outcome.ALREADY_SENT}
    assert len(receiver.received) == 1


@pytest.mark.django_db
def test_webhook_urls_and_secrets_are_stored_sealed_and_never_rendered(owner, client, receiver):
    team, user = owner
    secret_url = f"{receiver.url}/services/T000/B000/very-secret-path"
    sub = _subscribe(team=team, channel="slack", url=secret_url, secret="signing-key")
    raw = AlertSubscription.objects.values("url_encrypted", "secret_encrypted").get(pk=sub.pk)
    assert "very-secret-path" not in raw["url_encrypted"] and "signing-key" not in raw["secret_encrypted"]
    assert secrets.reveal(raw["url_encrypted"]) == secret_url
    assert secrets.reveal(raw["url_encrypted"][:-4] + "AAAA") == ""  # tampered: refused
    client.force_login(user)
    page = client.get(f"/teams/{team.slug}/alerts/").content.decode()
    assert "very-secret-path" not in page and "signing-key" not in page
    assert "127.0.0.1" in page and ">set<" in page
    assert 'type="password"' in page and 'value="' not in page.split('name="secret"')[1].split(">")[0]


@pytest.mark.django_db
def test_only_team_members_change_team_subscriptions(client, make_team, make_user):
    team = make_team("llm")
    outsider = make_user("mallory")
    client.force_login(outsider)
    response = client.post(
        f"/teams/{team.slug}/alerts/subscriptions/", {"channel": "email", "email": "oncall@example.com"}
    )
    assert response.status_code == 403
    assert not AlertSubscription.objects.exists()
    member = make_user("bob", teams=[team])
    client.force_login(member)
    client.post(
        f"/teams/{team.slug}/alerts/subscriptions/", {"channel": "email", "email": "oncall@example.com"}
    )
    assert AlertSubscription.objects.filter(team=team).count() == 1
    assert Membership.objects.filter(team=team, user=member).exists()
    assert get_user_model().objects.count() == 2
