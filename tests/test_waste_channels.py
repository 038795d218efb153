"""Unknown is never zero, in every channel: a team with one job whose waste is known and one whose MFU is
unknown (only its idle waste is known) shows the same "at least" figure on the leaderboard page, the team
page, the job list, the weekly email, the leaderboard API and /metrics. Expected values are derived by
hand below from the definitions (the job's GPU-equivalents × its dated price × hours inside the period for
the cost, its waste share (waste ÷ cost per day) of that for the waste; with one price in force, as here,
that is the job's $/day ÷ 24 × hours inside)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.evaluation.schema import Evaluation, encode
from jobs.models import Finding, GpuModel, Job, PriceEntry
from jobs.outputs import exporter
from jobs.outputs.leaderboard import iso_week, team_rows
from jobs.outputs.report_content import build_report
from jobs.outputs.report_render import render_report

# Job A: 8 GPUs, 24 h inside the week, MFU known, waste $160/day  -> $160 × 24/24 = $160 in the week.
# Job B: 4 GPUs, 10 h inside the week, MFU unknown, idle waste (the lower bound) $48/day -> $48 × 10/24 = $20.
# Team: waste unknown (one job lacks MFU), at least $160 + $20 = $180.
# Cost: A $480/day × 24/24 = $480; B $240/day × 10/24 = $100; total $580 (both have prices: $2.50/GPU-h,
# the test GPU's on-demand book, × 8 and 4 GPUs × 24 h).
EXPECTED_LOWER_BOUND = 180.0
EXPECTED_COST = 580.0
REASON = "MFU unknown (no throughput: push progress)"


@pytest.fixture
def week():
    return iso_week(timezone.now().date() - timedelta(days=14))


@pytest.fixture
def jobs(db, make_team, week):
    team = make_team("llm", "LLM")
    start = week.start + timedelta(days=1)
    gpu = GpuModel.objects.create(name="Waste test GPU")
    PriceEntry.objects.create(
        gpu_model=gpu, tier="on_demand", usd_per_gpu_hour=2.5, effective_from=week.start - timedelta(days=30)
    )
    a = Job.objects.create(
        team=team, external_id="A-1", name="known", started_at=start, ended_at=start + timedelta(hours=24),
        gpu_count=8, gpu_model=gpu, gpu_hours=192.0, cost_usd=480.0, mfu=0.3, cost_per_day_usd=480.0,
        waste_per_day_usd=160.0,
        waste_lower_bound_per_day_usd=160.0, efficiency_waste_per_day_usd=160.0, idle_waste_per_day_usd=0.0,
        status=Job.Status.FINALIZED, evaluation=encode(Evaluation(duration_s=86_400.0, gpu_hours=192.0)),
    )  # fmt: skip
    b = Job.objects.create(
        team=team, external_id="B-2", name="no-mfu", started_at=start, ended_at=start + timedelta(hours=10),
        gpu_count=4, gpu_model=gpu, gpu_hours=40.0, cost_usd=100.0, mfu=None, cost_per_day_usd=240.0,
        waste_per_day_usd=None,
        waste_lower_bound_per_day_usd=48.0, idle_waste_per_day_usd=48.0, waste_unknown_reason=REASON,
        status=Job.Status.FINALIZED, evaluation=encode(Evaluation(duration_s=36_000.0, gpu_hours=40.0)),
    )  # fmt: skip
    Finding.objects.create(
        job=b, code="launch_overhead", severity="warning", confidence=0.7, title="Tiny kernels",
        recommendation="CUDA graphs", waste_per_day_usd=None,
    )  # fmt: skip
    Finding.objects.create(
        job=b, code="idle_gpus", severity="warning", confidence=0.9, title="1 of 4 GPUs idle",
        recommendation="Release it", waste_per_day_usd=48.0,
    )  # fmt: skip
    return team, a, b


def test_team_row_is_a_stated_lower_bound_when_a_job_lacks_mfu(jobs, week):
    team, _, _ = jobs
    row = next(r for r in team_rows(week) if r.team_id == team.pk)
    assert row.waste_usd is None
    assert row.waste_lower_bound_usd == pytest.approx(EXPECTED_LOWER_BOUND)
    assert row.cost_usd == pytest.approx(EXPECTED_COST)
    assert row.jobs_waste_unknown == 1 and row.jobs_mfu_unknown == 1 and row.jobs_cost_unknown == 0
    assert row.waste_unknown_reason == "waste unknown for 1 of 2 jobs: MFU unknown for 1"
    assert row.waste.text() == "at least $180 (waste unknown for 1 of 2 jobs: MFU unknown for 1)"
    # MFU weighted over the jobs that have one only: A alone.
    assert row.weighted_mfu == pytest.approx(0.3)


def test_leaderboard_and_team_pages_say_at_least_not_zero(jobs, week, client, make_user):
    team, _, _ = jobs
    client.force_login(make_user("lead", teams=[team]))
    page = client.get(f"/leaderboard/?week={week.label}").content.decode()
    assert "at least $180" in page
    assert "$0.00" not in page
    # The job list shows B's total waste as a lower bound ($48/day × 10 h = $20, "at least") and its
    # total cost ($240/day × 10 h = $100); its causes without a computed impact say unknown.
    listing = client.get("/").content.decode()
    assert "at least $20.00 total" in listing and "$100 total" in listing
    detail = client.get("/jobs/B-2/").content.decode()
    assert "impact unknown" in detail
    assert "$48.00/day" in detail  # idle_gpus' dollars need no MFU


def test_weekly_email_equals_the_leaderboard_and_never_says_zero(jobs, week):
    team, _, _ = jobs
    subject, text, html = render_report(build_report(team, week))
    assert "at least $180 wasted of $580" in subject
    for body in (text, html):
        assert "at least $180" in body
        assert "waste unknown for 1 of 2 jobs" in body
        assert "No job wasted money" not in body


def test_leaderboard_api_gives_null_with_lower_bound_and_reason(jobs, week, make_user, api_client_for):
    team, _, _ = jobs
    client = api_client_for(make_user("bot", teams=[team]))
    body = client.get(f"/api/v1/leaderboard/?period=week&week={week.label}").json()
    assert body["period"] == week.label
    (row,) = body["teams"]
    assert row["waste_usd"] is None
    assert row["waste_lower_bound_usd"] == pytest.approx(EXPECTED_LOWER_BOUND)
    assert row["jobs_waste_unknown"] == 1
    assert row["waste_unknown_reason"].startswith("waste unknown for 1 of 2 jobs")
    assert client.get("/api/v1/leaderboard/?period=week&week=2026-49").status_code == 400
    assert client.get("/api/v1/leaderboard/?period=year").status_code == 400


def test_job_summary_api_has_null_waste_and_its_lower_bound(jobs, make_user, api_client_for):
    team, _, _ = jobs
    client = api_client_for(make_user("bot", teams=[team]))
    metrics = client.get("/api/v1/jobs/B-2/").json()["metrics"]
    assert metrics["waste_per_day_usd"] is None
    assert metrics["waste_lower_bound_per_day_usd"] == 48.0
    assert metrics["waste_unknown_reason"] == REASON


def test_metrics_export_omits_unknown_waste_and_exports_its_lower_bound(jobs, settings):
    settings.METRICS_TOKEN = ""
    Job.objects.update(ended_at=timezone.now())  # recent enough to be exported
    text = exporter.render()
    lines = {line.split(" ")[0]: line.split(" ")[1] for line in text.splitlines() if not line.startswith("#")}
    b = [k for k in lines if 'job_id="B-2"' in k]
    assert not any(k.startswith("efficiency_job_waste_usd_per_day{") for k in b)
    assert any(
        k.startswith("efficiency_job_waste_lower_bound_usd_per_day{") and float(lines[k]) == 48 for k in b
    )
    assert any(k.startswith("efficiency_job_waste_known{") and float(lines[k]) == 0 for k in b)
    a = [k for k in lines if 'job_id="A-1"' in k]
    assert any(k.startswith("efficiency_job_waste_usd_per_day{") and float(lines[k]) == 160 for k in a)


def test_every_channel_counts_the_jobs_whose_means_rest_on_part_of_their_window(
    jobs, week, client, make_user, api_client_for
):
    team, a, b = jobs
    # A: GPU_UTIL samples for 95 % of its window (>= 90 %: not counted); B: for 55 % (counted). A third
    # job without a stored coverage is unknown, which is counted too: 2 of 3.
    Job.objects.filter(pk=a.pk).update(util_coverage=0.95)
    Job.objects.filter(pk=b.pk).update(util_coverage=0.55)
    Job.objects.create(
        team=team, external_id="C-3", started_at=a.started_at, ended_at=a.started_at + timedelta(hours=1),
        gpu_count=1, status=Job.Status.FINALIZED,
    )  # fmt: skip
    (row,) = [r for r in team_rows(week) if r.team_id == team.pk]
    assert row.jobs_low_coverage == 2
    api = api_client_for(make_user("bot", teams=[team]))
    assert (
        api.get(f"/api/v1/leaderboard/?period=week&week={week.label}").json()["teams"][0]["jobs_low_coverage"]
        == 2
    )
    client.force_login(make_user("lead", teams=[team]))
    page = client.get(f"/leaderboard/?week={week.label}").content.decode()
    assert "2 jobs have GPU utilisation samples for less than 90 % of their time" in page
    _, text, html = render_report(build_report(team, week))
    for body in (" ".join(text.split()), html):  # the text part is wrapped at 78 columns
        assert "2 job(s) have GPU utilisation samples for less than 90 % of their time" in body
