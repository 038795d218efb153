"""Alert state on the job page and job list, the team alerts page, one's own subscriptions, and
GET /api/v1/alerts/ (in the OpenAPI schema)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import AlertDelivery, AlertIncident, AlertSubscription, Finding, Job


@pytest.fixture
def scene(make_team, make_user):
    team = make_team("llm")
    other = make_team("vision")
    user = make_user("alice", teams=[team])
    now = timezone.now()
    job = Job.objects.create(
        external_id="88001", name="pretrain <b>7b</b>", team=team, owner="alice", gpu_count=8,
        gpus=[{"hostname": "node-a", "gpu": str(i)} for i in range(8)], started_at=now - timedelta(hours=3),
    )  # fmt: skip
    finding = Finding.objects.create(
        job=job, code="idle_gpus", severity="warning", confidence=0.9, title="2 of 8 GPUs idle",
        recommendation="release them", waste_per_day_usd=412.0,
    )  # fmt: skip
    opened = AlertIncident.objects.create(
        rule="gpus_idle", job=job, team=team, started_at=now - timedelta(minutes=40), opened_at=now,
        last_seen_at=now, finding=finding, finding_code="idle_gpus", title="2 of 8 GPUs idle for 40 min",
        evidence=[{"label": "GPUs idle", "value": 2, "unit": "GPUs"}],
    )  # fmt: skip
    resolved = AlertIncident.objects.create(
        rule="xid_errors", job=job, team=team, started_at=now - timedelta(hours=2), opened_at=now,
        last_seen_at=now, resolved_at=now - timedelta(hours=1), title="XID errors on 1 GPU(s)",
    )  # fmt: skip
    sub = AlertSubscription.objects.create(team=team, channel="email", email="oncall@example.com")
    AlertDelivery.objects.create(
        incident=opened, subscription=sub, event="opened", channel="email", destination=sub.destination,
        status="sent", attempts=1, sent_at=now,
    )  # fmt: skip
    other_job = Job.objects.create(external_id="88002", team=other, gpu_count=1, started_at=now)
    AlertIncident.objects.create(
        rule="ingestion_stale", job=other_job, team=other, started_at=now, opened_at=now, last_seen_at=now,
        title="No new metrics",
    )  # fmt: skip
    return {"team": team, "user": user, "job": job, "opened": opened, "resolved": resolved}


@pytest.mark.django_db
def test_job_page_shows_the_open_and_resolved_incidents(client, scene):
    client.force_login(scene["user"])
    page = client.get("/jobs/88001/").content.decode()
    assert 'id="alerts"' in page and "1 open" in page
    assert f'data-incident="{scene["opened"].pk}"' in page and "2 of 8 GPUs idle for 40 min" in page
    assert f'data-incident="{scene["resolved"].pk}"' in page
    assert "#finding-idle_gpus" in page


@pytest.mark.django_db
def test_job_list_marks_jobs_with_open_alerts(client, scene):
    client.force_login(scene["user"])
    page = client.get("/").content.decode()
    assert page.count('class="alert-mark"') == 2  # 88001 and 88002, one open incident each
    assert 'href="/jobs/88001/#alerts" data-open-alerts="1"' in page


@pytest.mark.django_db
def test_team_alerts_page_lists_open_recent_and_the_delivery_log(client, scene):
    client.force_login(scene["user"])
    page = client.get("/teams/llm/alerts/").content.decode()
    assert "2 of 8 GPUs idle for 40 min" in page and "XID errors on 1 GPU(s)" in page
    assert "No new metrics" not in page  # another team's
    assert "oncall@example.com" in page and "Sent" in page
    assert "pretrain &lt;b&gt;7b&lt;/b&gt;" in page  # escaped
    assert 'action="/teams/llm/alerts/subscriptions/"' in page  # a member may add subscriptions


@pytest.mark.django_db
def test_my_alerts_adds_a_personal_subscription(client, scene):
    client.force_login(scene["user"])
    response = client.post("/alerts/mine/", {"channel": "email"})
    assert response.status_code == 302
    sub = AlertSubscription.objects.get(user=scene["user"])
    assert sub.team is None and sub.channel == "email"
    page = client.get("/alerts/mine/").content.decode()
    assert "2 of 8 GPUs idle for 40 min" in page  # incidents of the jobs alice owns


@pytest.mark.django_db
def test_api_lists_open_incidents_of_a_team_with_finding_and_deliveries(api_client_for, scene):
    api = api_client_for(scene["user"])
    data = api.get("/api/v1/alerts/?team=llm&state=open").json()
    [row] = data["results"]
    assert row["rule"] == "gpus_idle" and row["job"] == "88001" and row["state"] == "open"
    assert row["finding"] == {"code": "idle_gpus", "title": "2 of 8 GPUs idle", "waste_per_day_usd": 412.0}
    assert row["deliveries"][0]["status"] == "sent" and row["deliveries"][0]["channel"] == "email"
    assert row["since"].startswith(str(scene["opened"].started_at.date()))
    resolved = api.get("/api/v1/alerts/?team=llm&state=resolved").json()["results"]
    assert [r["rule"] for r in resolved] == ["xid_errors"] and resolved[0]["finding"] is None
    assert len(api.get("/api/v1/alerts/?state=all").json()["results"]) == 3
    assert api.get("/api/v1/alerts/?state=bogus").status_code == 400
    assert api.get("/api/v1/alerts/?team=nope").status_code == 400


@pytest.mark.django_db
def test_alerts_api_is_in_the_openapi_schema(api_client_for, scene):
    schema = api_client_for(scene["user"]).get("/api/schema/?format=json").json()
    assert "/api/v1/alerts/" in schema["paths"]
    names = set(schema["components"]["schemas"])
    assert {"AlertIncident", "AlertDelivery", "AlertFinding"} <= names


@pytest.mark.django_db
def test_an_alert_without_a_finding_says_why_in_words_not_codes(client, scene):
    """Issue 28 item 2: the alerts page showed raw codes (`throttling`) and nothing said why an alert had no
    finding."""
    now = timezone.now()
    AlertIncident.objects.create(
        rule="throttling", job=scene["job"], team=scene["team"], started_at=now - timedelta(minutes=30),
        opened_at=now, last_seen_at=now, finding_code="throttling", title="Busy GPUs throttled for 30 min",
    )  # fmt: skip
    AlertSubscription.objects.create(
        team=scene["team"], channel="email", email="ops@example.com", rules=["throttling", "gpus_idle"]
    )
    client.force_login(scene["user"])
    page = client.get("/teams/llm/alerts/").content.decode()
    assert "no “Clock throttling” finding on the job now" in page
    assert "<code>throttling</code>" not in page
    assert "Throttling, GPUs idle" in page  # the subscription's rules by name
    job_page = client.get("/jobs/88001/").content.decode()
    assert "no “Clock throttling” finding on the job now" in job_page
    assert "#finding-idle_gpus" in job_page  # the alert with a finding links to it
