"""The job page's per-view costs (issue 26 item 4): compare links from the cache until a job or a
membership changes, the alert block naming findings the view already read, sessions read from the cache
(logout still ends them), and the page's statement count with all of them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.sessions.backends.cached_db import SessionStore
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import AlertIncident, Baseline, Finding, Job, Membership, Team
from jobs.templatetags import compare_links
from jobs.templatetags.alerts import job_alerts
from jobs.views import job_page_cache

pytestmark = pytest.mark.django_db
FP = "c" * 64


@pytest.fixture
def llm(make_team: Any) -> Team:
    return make_team("llm")


@pytest.fixture
def member(make_user: Any, llm: Team) -> Any:
    return make_user("alice", teams=[llm])


def run(team: Any, external_id: str, hours_ago: float, **fields: Any) -> Job:
    start = timezone.now() - timedelta(hours=hours_ago)
    values = {"config_fingerprint": FP, "model_name": "llama-7b", **fields}
    return Job.objects.create(
        external_id=external_id, team=team, gpu_count=8, started_at=start,
        ended_at=start + timedelta(hours=1), **values,
    )  # fmt: skip


def compare_section(client: Any, job: Job) -> str:
    html = client.get(f"/jobs/{job.external_id}/").content.decode()
    section = html[html.index('id="compare"') :]
    return section[: section.index("</section>")]


def statements(client: Any, url: str) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return [q["sql"] for q in ctx.captured_queries]


def test_compare_links_come_from_the_cache_until_a_job_is_registered(
    client: Any, member: Any, llm: Team
) -> None:
    run(llm, "r1", 30)
    job = run(llm, "r3", 10)
    client.force_login(member)
    assert "r1" in compare_section(client, job)
    # Warm: no UNION of the four neighbour queries.
    assert not any("UNION" in sql for sql in statements(client, f"/jobs/{job.external_id}/"))
    # A run registered between r1 and r3 becomes the previous run at once.
    run(llm, "r2", 20)
    section = compare_section(client, job)
    assert "previous run with this config: " in section and "r2" in section and "r1" not in section
    # Renaming it (a save of a link column) shows the new name; deleting it brings r1 back.
    r2 = Job.objects.get(external_id="r2")
    r2.name = "second try"
    r2.save()
    assert "second try" in compare_section(client, job)
    r2.delete()
    assert "r1" in compare_section(client, job)


def test_a_poll_save_of_other_columns_keeps_the_cached_links(member: Any, llm: Team) -> None:
    job = run(llm, "r1", 10)
    compare_links.bump_generation()
    before = compare_links.cache.get(compare_links.GENERATION_KEY)
    job.last_polled_at = timezone.now()
    job.save(update_fields=["last_polled_at", "updated_at"])  # as the poll saves (jobs.pipeline.poll)
    assert compare_links.cache.get(compare_links.GENERATION_KEY) == before
    job.started_at -= timedelta(minutes=5)
    job.save(update_fields=["started_at"])
    assert compare_links.cache.get(compare_links.GENERATION_KEY) != before


def test_compare_links_follow_the_viewers_memberships(
    client: Any, settings: Any, member: Any, llm: Team, make_team: Any
) -> None:
    settings.READ_SCOPE = "team"
    vision = make_team("vision")
    run(vision, "vis-1", 30)
    job = run(llm, "llm-2", 10)
    client.force_login(member)
    assert "vis-1" not in compare_section(client, job)  # another team's run is neither named nor linked
    membership = Membership.objects.create(team=vision, user=member)
    assert "vis-1" in compare_section(client, job)
    membership.delete()
    assert "vis-1" not in compare_section(client, job)


def test_baseline_runs_of_unreadable_teams_stay_hidden_from_a_cached_entry(
    client: Any, settings: Any, member: Any, llm: Team, make_team: Any
) -> None:
    settings.READ_SCOPE = "team"
    vision = make_team("vision")
    job = run(llm, "llm-2", 10)
    other = run(vision, "vis-base", 50, model_name="other-model", config_fingerprint="")
    mine = run(llm, "llm-base", 60, model_name="other-model", config_fingerprint="")
    baseline = Baseline.objects.create(fingerprint=FP, model_name="llama-7b", team=llm)
    baseline.runs.add(other, mine)
    client.force_login(member)
    for _ in range(2):  # computed, then from the cache
        section = compare_section(client, job)
        assert "baseline run: " in section and "llm-base" in section and "vis-base" not in section


def test_the_alert_block_names_the_finding_the_page_already_read(client: Any, member: Any, llm: Team) -> None:
    job = run(llm, "r1", 10)
    now = timezone.now()
    finding = Finding.objects.create(job=job, code="throttling", severity="warning", confidence=0.9,
                                     title="Clocks throttled", recommendation="cool it")  # fmt: skip
    AlertIncident.objects.create(rule=AlertIncident.Rule.choices[0][0], job=job, team=llm, started_at=now,
                                 opened_at=now, last_seen_at=now, finding=finding, finding_code="throttling",
                                 title="throttled for 10 min")  # fmt: skip
    client.force_login(member)
    url = f"/jobs/{job.external_id}/"
    html = client.get(url).content.decode()
    block = html[html.index('id="alerts"') :]
    assert '<a href="#finding-throttling">Clocks throttled</a>' in block[: block.index("</section>")]
    # The incidents are read without joining the findings again, when the body is rendered (not kept: the
    # job statement's content stamp hashes the incidents with their findings, and is left out here).
    job_page_cache.bodies().clear()
    alerts_sql = [
        sql
        for sql in statements(client, url)
        if "jobs_alertincident" in sql and not sql.startswith('SELECT "jobs_job"')
    ]
    assert len(alerts_sql) == 1 and "jobs_finding" not in alerts_sql[0]
    # A finding the page did not read (created after it read its findings) is read, not left out.
    with CaptureQueriesContext(connection) as ctx:
        shown = job_alerts(job, {})
    assert shown["open"][0].finding == finding and len(ctx.captured_queries) == 2
    assert job_alerts(job, {finding.pk: finding})["open"][0].finding is finding


def test_sessions_are_read_from_the_cache_and_logout_ends_them(client: Any, member: Any, llm: Team) -> None:
    assert settings.SESSION_ENGINE == "django.contrib.sessions.backends.cached_db"
    job = run(llm, "r1", 10)
    client.force_login(member)
    url = f"/jobs/{job.external_id}/"
    client.get(url)
    assert not any("django_session" in sql for sql in statements(client, url))
    key = client.cookies[settings.SESSION_COOKIE_NAME].value
    assert SessionStore(session_key=key).get("_auth_user_id") == str(member.pk)
    client.post("/logout/")
    # The old cookie no longer logs anyone in: gone from the cache and from the database.
    assert SessionStore(session_key=key).load() == {}
    client.cookies[settings.SESSION_COOKIE_NAME] = key
    response = client.get(url)
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_a_warm_job_page_with_neighbours_a_baseline_and_alerts_takes_nine_statements(
    client: Any, member: Any, llm: Team, django_assert_num_queries: Any
) -> None:
    job = run(llm, "r2", 10)
    run(llm, "r1", 20)
    baseline = Baseline.objects.create(fingerprint=FP, model_name="llama-7b", team=llm)
    baseline.runs.add(job)
    now = timezone.now()
    AlertIncident.objects.create(rule=AlertIncident.Rule.choices[0][0], job=job, team=llm, started_at=now,
                                 opened_at=now, last_seen_at=now, title="idle")  # fmt: skip
    client.force_login(member)
    url = f"/jobs/{job.external_id}/"
    client.get(url)
    # user, the job with its content stamp, the user's teams (write check): 3. The body (findings,
    # artifacts, baseline, its runs and overrides, alerts) from memory (jobs.views.job_page_cache), no
    # session (cache), no compare-link UNION nor read-scope teams (cache): 12 before, 9 without the body's.
    with django_assert_num_queries(3):
        assert client.get(url).status_code == 200
