"""READ_SCOPE: with "team" (the default) a member reads only their teams' jobs on pages, the API, CSV
exports, the weekly email and alert notifications; another team's job answers 404; staff read all;
leaderboards keep every team's aggregates but name only readable teams' jobs. READ_SCOPE=all reads all."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.access.permissions import readable_team_ids
from jobs.alerts.incidents import subscriptions_for
from jobs.models import AlertIncident, AlertSubscription, GpuModel, Job, PriceEntry, Team
from jobs.outputs.leaderboard import iso_week
from jobs.outputs.report_content import build_report
from jobs.outputs.report_render import render_report

pytestmark = pytest.mark.django_db


def _gpu() -> GpuModel:
    """$2.50/GPU-h on demand, so 8 GPUs cost the $480/day the jobs store: the leaderboard and the weekly
    email price a job from its dated book and list only jobs with a priced waste."""
    gpu, created = GpuModel.objects.get_or_create(name="Scope test GPU")
    if created:
        PriceEntry.objects.create(
            gpu_model=gpu,
            tier="on_demand",
            usd_per_gpu_hour=2.5,
            effective_from=timezone.now() - timedelta(days=90),
        )
    return gpu


def _job(team: Team, external_id: str, owner: str = "") -> Job:
    start = timezone.now() - timedelta(hours=6)
    return Job.objects.create(
        team=team,
        gpu_model=_gpu(),
        external_id=external_id,
        name=f"name-{external_id}",
        owner=owner,
        model_name=f"model-{external_id}",
        gpu_count=8,
        gpus=[{"hostname": "node-a", "gpu": str(i)} for i in range(8)],
        started_at=start,
        mfu=0.3,
        cost_per_day_usd=480.0,
        waste_per_day_usd=100.0,
        waste_lower_bound_per_day_usd=100.0,
    )


@pytest.fixture
def world(make_team, make_user, settings):
    """Two teams with one job each; alice in llm, bob in vision, carol staff in neither."""
    settings.READ_SCOPE = "team"
    llm, vision = make_team("llm"), make_team("vision")
    alice = make_user("alice", teams=[llm])
    bob = make_user("bob", teams=[vision])
    carol = make_user("carol", staff=True)
    return {
        "llm": llm,
        "vision": vision,
        "alice": alice,
        "bob": bob,
        "carol": carol,
        "mine": _job(llm, "llm-001"),
        "theirs": _job(vision, "vis-001"),
    }


def test_readable_teams_are_the_members_teams_all_for_staff_and_all_with_scope_all(world, settings):
    assert readable_team_ids(world["alice"]) == {world["llm"].pk}
    assert readable_team_ids(world["carol"]) is None
    settings.READ_SCOPE = "all"
    assert readable_team_ids(world["alice"]) is None


def test_job_list_page_shows_only_the_members_teams_jobs(world, client):
    client.force_login(world["alice"])
    html = client.get("/").content.decode()
    assert "llm-001" in html
    assert "vis-001" not in html
    assert "model-vis-001" not in html  # the model filter's choices come from readable jobs too


def _another_teams_read_paths() -> list[str]:
    """Every read (GET) route, page or API, that addresses one job or team by id or slug, built from the
    URL configuration (tests/test_route_matrix.py), pointed at vision's job and team: not a hand list."""
    from tests.test_route_matrix import EXPECTED, HIDDEN, all_routes

    kwargs = {"external_id": "vis-001", "slug": "vision", "week": "2026-W48"}
    paths = []
    for route in all_routes():
        names = set(re.findall(r"\{(\w+)\}", route.template))
        row = EXPECTED.get((route.base, "GET"))
        if names and names <= set(kwargs) and row is not None and row["other"] == HIDDEN:
            paths.append(route.path(kwargs))
    return paths


def test_the_generated_read_paths_include_the_ones_once_listed_by_hand():
    paths = _another_teams_read_paths()
    hand_listed = ["/jobs/vis-001/", "/jobs/vis-001/figures.json", "/jobs/vis-001/series.csv"]
    hand_listed += ["/teams/vision/", "/teams/vision/alerts/", "/teams/vision/reports/2026-W48/"]
    assert set(hand_listed) <= set(paths)
    assert "/api/v1/jobs/vis-001/" in paths and "/api/v1/jobs/vis-001/artifacts/" in paths


@pytest.mark.parametrize("path", [*_another_teams_read_paths(), "/jobs/compare/?a=llm-001&b=vis-001"])
def test_another_teams_job_and_team_pages_answer_404(world, client, path):
    client.force_login(world["alice"])
    assert client.get(path).status_code == 404


def test_another_teams_job_is_404_on_writes_too_so_existence_is_not_leaked(world, client):
    client.force_login(world["alice"])
    assert client.post("/jobs/vis-001/promote/").status_code == 404
    assert client.post("/jobs/vis-001/artifacts/1/reparse/").status_code == 404


def test_staff_and_read_scope_all_read_another_teams_job_page(world, client, settings):
    client.force_login(world["carol"])
    assert client.get("/jobs/vis-001/figures.json?only=status").status_code == 200
    client.force_login(world["alice"])
    settings.READ_SCOPE = "all"
    assert client.get("/jobs/vis-001/figures.json?only=status").status_code == 200


def test_job_list_csv_exports_only_readable_jobs(world, client):
    client.force_login(world["alice"])
    body = b"".join(client.get("/jobs.csv").streaming_content).decode()
    assert "llm-001" in body
    assert "vis-001" not in body


def test_leaderboard_keeps_other_teams_aggregates_but_names_only_readable_jobs(world, client):
    client.force_login(world["alice"])
    html = client.get("/leaderboard/").content.decode()
    assert 'data-team="vision"' in html  # the aggregate row is there
    assert 'href="/teams/vision/"' not in html  # but not a link to the team's page
    assert "vis-001" not in html  # nor its jobs among the most wasteful
    assert "llm-001" in html
    csv = b"".join(client.get("/leaderboard.csv").streaming_content).decode()
    assert "vision" in csv


def test_api_lists_and_reads_only_readable_jobs_with_a_token(world, api_client_for):
    api = api_client_for(world["alice"])
    listed = api.get("/api/v1/jobs/").json()
    assert [j["external_id"] for j in listed["results"]] == ["llm-001"]
    assert api.get("/api/v1/jobs/llm-001/").status_code == 200
    assert api.get("/api/v1/jobs/vis-001/").status_code == 404
    assert api.get("/api/v1/jobs/vis-001/artifacts/").status_code == 404
    assert api.patch("/api/v1/jobs/vis-001/", {"name": "x"}, format="json").status_code == 404
    assert api.get("/api/v1/jobs/compare/?a=llm-001&b=vis-001").status_code == 404
    assert api.post("/api/v1/baselines/", {"job": "vis-001"}, format="json").status_code == 404
    staff = api_client_for(world["carol"])
    assert staff.get("/api/v1/jobs/vis-001/").status_code == 200
    assert {j["external_id"] for j in staff.get("/api/v1/jobs/").json()["results"]} == {"llm-001", "vis-001"}


def test_api_alerts_and_artifacts_are_scoped_to_readable_teams(world, api_client_for):
    now = timezone.now()
    for job in (world["mine"], world["theirs"]):
        AlertIncident.objects.create(
            rule="gpus_idle",
            job=job,
            team=job.team,
            started_at=now,
            opened_at=now,
            last_seen_at=now,
            title="t",
        )
    api = api_client_for(world["alice"])
    assert [i["job"] for i in api.get("/api/v1/alerts/").json()["results"]] == ["llm-001"]
    assert api.get("/api/v1/artifacts/").json()["results"] == []


def test_weekly_email_of_a_team_names_only_that_teams_jobs(world):
    period = iso_week(timezone.now().date())
    report = build_report(world["llm"], period)
    _subject, text, html = render_report(report)
    assert "llm-001" in text or "name-llm-001" in text
    assert "vis-001" not in text and "vis-001" not in html
    assert report.recipients == ("alice@example.com",)


def test_a_personal_subscription_gets_no_alert_of_another_teams_job_even_as_its_owner(world):
    # The owner field is free text: bob's team registered the job with owner "alice".
    theirs = _job(world["vision"], "vis-002", owner="alice")
    mine = _job(world["llm"], "llm-002", owner="alice")
    personal = AlertSubscription.objects.create(user=world["alice"], channel="email", email="a@example.com")
    team_sub = AlertSubscription.objects.create(team=world["vision"], channel="email", email="v@example.com")
    now = timezone.now()

    def incident(job: Job) -> AlertIncident:
        return AlertIncident.objects.create(
            rule="gpus_idle",
            job=job,
            team=job.team,
            started_at=now,
            opened_at=now,
            last_seen_at=now,
            title="t",
        )

    assert subscriptions_for(incident(theirs)) == [team_sub]
    assert subscriptions_for(incident(mine)) == [personal]


def test_the_deployed_default_is_team(monkeypatch):
    import os

    import efficiency.settings as configured

    if "READ_SCOPE" in os.environ:
        pytest.skip("READ_SCOPE is set in this environment")
    assert configured.READ_SCOPE == "team"


def test_the_job_page_offers_no_other_teams_run_to_compare_with(world, client):
    # Same config fingerprint in both teams: the vision run is llm's "previous run with this config".
    Job.objects.filter(external_id__in=["llm-001", "vis-001"]).update(config_fingerprint="f" * 64)
    Job.objects.filter(external_id="vis-001").update(started_at=timezone.now() - timedelta(hours=9))
    client.force_login(world["alice"])
    html = client.get("/jobs/llm-001/").content.decode()
    assert "vis-001" not in html
    client.force_login(world["carol"])
    assert "vis-001" in client.get("/jobs/llm-001/").content.decode()  # staff are offered it
