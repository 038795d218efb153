"""A team's month-to-date spend and waste against its monthly budget: the team page and the leaderboard API
(jobs.outputs.budget over the month's TeamRow from jobs.outputs.leaderboard.period_rows)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal
from html import unescape

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs.evaluation.costs import Amount
from jobs.models import GpuModel, Job, PriceEntry
from jobs.outputs.budget import budget_use

# "Now" for these tests: 2026-11-20 12:00 UTC, so the month is November (from 2026-11-01 00:00 UTC).
NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def _at(month: int, day: int, hour: int) -> datetime:
    return datetime(2026, month, day, hour, 0, tzinfo=UTC)


@pytest.fixture
def now(monkeypatch):
    monkeypatch.setattr(timezone, "now", lambda: NOW)
    return NOW


@pytest.fixture
def team(make_team):
    return make_team("llm", "LLM pretraining")


@pytest.fixture
def member(make_user, team):
    return make_user("alice", teams=[team])


def _gpu() -> GpuModel:
    """A GPU model whose price book matches these tests' rates on 8 GPUs: on-demand $2.50/GPU-h ($480/day),
    spot $1.25 ($240/day), reserved $5.2083 (~$1,000/day). Period costs come from the book
    (jobs.evaluation.totals.cost_inside), so the stored rates and the book must agree for the sums below."""
    gpu, created = GpuModel.objects.get_or_create(name="Budget test GPU")
    if created:
        for tier, usd in (("on_demand", "2.50"), ("spot", "1.25"), ("reserved", "5.2083")):
            PriceEntry.objects.create(
                gpu_model=gpu, tier=tier, usd_per_gpu_hour=Decimal(usd), effective_from=_at(1, 1, 0)
            )
    return gpu


def _job(team, external_id: str, start: datetime, end: datetime, **kw) -> Job:
    hours = (end - start).total_seconds() / 3600
    fields = dict(
        team=team, external_id=external_id, name=external_id, started_at=start, ended_at=end, gpu_count=8,
        gpu_model=_gpu(),
        gpu_hours=8 * hours, mfu=0.3, cost_per_day_usd=480.0, waste_per_day_usd=160.0,
        waste_lower_bound_per_day_usd=160.0, status=Job.Status.FINALIZED,
    )  # fmt: skip
    fields.update(kw)
    return Job.objects.create(**fields)


@pytest.fixture
def november_jobs(team, now):
    """Inside November: job a, 12 h at $480/day cost and $160/day waste = $240 and $80; job b, 12 h from
    Oct 31 18:00, of which 6 h in November at $240/day and $48/day = $60 and $12; job c only in October
    (not counted). Month to date: $240 + $60 = $300 spent, $80 + $12 = $92 wasted."""
    return [
        _job(team, "a", _at(11, 10, 0), _at(11, 10, 12)),
        _job(
            team,
            "b",
            _at(10, 31, 18),
            _at(11, 1, 6),
            cost_per_day_usd=240.0,
            waste_per_day_usd=48.0,
            waste_lower_bound_per_day_usd=48.0,
            price_tier="spot",
        ),
        _job(
            team,
            "c",
            _at(10, 10, 0),
            _at(10, 11, 0),
            cost_per_day_usd=1000.0,
            waste_per_day_usd=500.0,
            price_tier="reserved",
        ),
    ]


def _text(response) -> str:
    """The page's text without tags, whitespace collapsed."""
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", response.content.decode())).split())


# ------------------------------------------------------------------------------------------- pure


def test_budget_share_is_spend_over_budget_with_what_is_left():
    use = budget_use(Amount(300.0), Decimal("1000.00"))
    assert use is not None
    assert use.share == pytest.approx(0.3) and use.share_text == "30.0 %"
    assert use.remaining_usd == pytest.approx(700.0) and not use.over and use.over_by_usd is None


def test_budget_share_of_a_lower_bound_spend_is_a_lower_bound():
    use = budget_use(Amount(300.0, lower_bound=True, reason="no price for 1 of 3 jobs"), Decimal("1000"))
    assert use is not None and use.share_is_lower_bound
    assert use.share_text == "at least 30.0 %"


def test_budget_over_when_the_spend_exceeds_it_and_unknown_spend_has_no_share():
    over = budget_use(Amount(300.0), Decimal("250"))
    assert over is not None and over.over and over.over_by_usd == pytest.approx(50.0)
    assert over.share_text == "120.0 %"  # 300 / 250
    unknown = budget_use(Amount(None, reason="no price"), Decimal("250"))
    assert unknown is not None and unknown.share is None and unknown.share_text == "unknown"
    assert not unknown.over
    zero = budget_use(Amount(300.0), Decimal("0"))
    assert zero is not None and zero.share is None and zero.over  # $0 allowed, $300 spent


def test_no_budget_means_no_budget_use():
    assert budget_use(Amount(300.0), None) is None


# ------------------------------------------------------------------------------------------- page


def test_team_page_shows_month_to_date_spend_waste_and_budget_share(client, member, team, november_jobs):
    team.monthly_budget_usd = Decimal("1000.00")
    team.save()
    client.force_login(member)
    text = _text(client.get(reverse("team-detail", args=[team.slug])))
    assert "Spend · 2026-11 to date" in text and "$300 this month" in text
    assert "Waste · 2026-11 to date" in text and "$92.00 this month" in text
    assert "30.0 % used" in text  # $300 of $1,000
    assert "of the team's budget of $1,000 per calendar month (UTC); $700 left" in text


def test_team_page_budget_share_is_a_lower_bound_when_a_job_has_no_price(client, member, team, november_jobs):
    # A third November job without a price: the spend is at least $300, so at least 30 % is used and at
    # most $700 is left; never a $0.00 cost for it.
    _job(team, "d", _at(11, 12, 0), _at(11, 12, 6), cost_per_day_usd=None, waste_per_day_usd=None)
    team.monthly_budget_usd = Decimal("1000")
    team.save()
    client.force_login(member)
    text = _text(client.get(reverse("team-detail", args=[team.slug])))
    assert "at least 30.0 % used" in text
    assert "at least $300 this month" in text and "at most $700 left" in text
    assert "no price for 1 of 3 jobs" in text


def test_team_page_says_over_budget(client, member, team, november_jobs):
    team.monthly_budget_usd = Decimal("250")
    team.save()
    client.force_login(member)
    response = client.get(reverse("team-detail", args=[team.slug]))
    text = _text(response)
    assert "120.0 % used" in text and "over by $50.00" in text  # $300 - $250
    assert 'class="kpi budget over"' in response.content.decode()


def _lead(make_user, team, name: str = "lena"):
    from jobs.models import Membership

    user = make_user(name, teams=[team])
    Membership.objects.filter(team=team, user=user).update(role=Membership.Role.LEAD)
    return user


def _budget_messages(response) -> list[str]:
    """The texts of the messages placed next to the budget form (the page's #budget-messages list)."""
    html = response.content.decode()
    block = re.search(r'<ul class="messages" role="status" id="budget-messages">(.*?)</ul>', html, re.S)
    if block is None:
        return []
    return [unescape(m).strip() for m in re.findall(r"<li[^>]*>(.*?)</li>", block.group(1), re.S)]


def test_team_page_without_a_budget_says_so_and_offers_the_form_to_leads_only(
    client, member, team, make_user, now
):
    client.force_login(member)
    response = client.get(reverse("team-detail", args=[team.slug]))
    assert "no budget" in _text(response)
    assert 'id="budget-form"' not in response.content.decode()  # a member sets no budget
    client.force_login(_lead(make_user, team))
    html = client.get(reverse("team-detail", args=[team.slug])).content.decode()
    assert 'id="budget-form"' in html and reverse("team-budget", args=[team.slug]) in html


def test_a_lead_sets_and_clears_the_budget_with_the_message_next_to_the_form(client, team, make_user, now):
    client.force_login(_lead(make_user, team))
    url = reverse("team-budget", args=[team.slug])
    response = client.post(url, {"monthly_budget_usd": "1250.50"})
    assert response.status_code == 302 and response["Location"].endswith("#budget")
    team.refresh_from_db()
    assert team.monthly_budget_usd == Decimal("1250.50")
    page = client.get(response["Location"])
    assert _budget_messages(page) == ["Budget set to $1,250.50 per calendar month."]
    assert 'value="1250.50"' in page.content.decode()  # the form shows the stored budget
    client.post(url, {"monthly_budget_usd": ""})
    team.refresh_from_db()
    assert team.monthly_budget_usd is None
    assert _budget_messages(client.get(reverse("team-detail", args=[team.slug]))) == ["Budget cleared."]


@pytest.mark.parametrize("value", ["-5", "lots", "12345678901234"])
def test_a_bad_budget_is_refused_next_to_the_form_and_the_stored_one_kept(
    client, team, make_user, now, value
):
    team.monthly_budget_usd = Decimal("900")
    team.save()
    client.force_login(_lead(make_user, team))
    response = client.post(reverse("team-budget", args=[team.slug]), {"monthly_budget_usd": value})
    assert response.status_code == 302
    team.refresh_from_db()
    assert team.monthly_budget_usd == Decimal("900")
    (text,) = _budget_messages(client.get(response["Location"]))
    assert text.startswith("Budget not saved: ")


def test_only_leads_and_staff_may_set_a_budget(client, member, team, make_user, make_team, now, settings):
    url = reverse("team-budget", args=[team.slug])
    client.force_login(member)
    assert client.post(url, {"monthly_budget_usd": "10"}).status_code == 403
    settings.READ_SCOPE = "team"
    other = make_team("vision", "Vision")
    client.force_login(_lead(make_user, other, "olga"))
    assert client.post(url, {"monthly_budget_usd": "10"}).status_code == 404  # another team: not even seen
    team.refresh_from_db()
    assert team.monthly_budget_usd is None
    client.force_login(make_user("root", staff=True))
    assert client.post(url, {"monthly_budget_usd": "10"}).status_code == 302
    team.refresh_from_db()
    assert team.monthly_budget_usd == Decimal("10")
    client.force_login(member)
    assert client.get(url).status_code == 405  # a change is a POST (with its CSRF token)


# ------------------------------------------------------------------------------------------- API


def test_leaderboard_api_month_carries_the_budget_and_its_share(client, member, team, november_jobs):
    team.monthly_budget_usd = Decimal("1000")
    team.save()
    client.force_login(member)
    body = client.get("/api/v1/leaderboard/?period=month&month=2026-11").json()
    (row,) = body["teams"]
    assert row["cost_usd"] == pytest.approx(300.0)
    assert row["monthly_budget_usd"] == pytest.approx(1000.0)
    assert row["budget_used_share"] == pytest.approx(0.3)
    week = client.get("/api/v1/leaderboard/?period=week&week=2026-W46").json()  # Nov 9-15: job a only
    (row,) = week["teams"]
    assert row["cost_usd"] == pytest.approx(240.0)
    assert row["monthly_budget_usd"] == pytest.approx(1000.0) and row["budget_used_share"] is None


def test_leaderboard_schema_documents_the_budget_fields(client, member):
    client.force_login(member)
    schema = client.get("/api/schema/", {"format": "json"}).json()
    row = schema["components"]["schemas"]["LeaderboardRow"]
    assert {"monthly_budget_usd", "budget_used_share"} <= set(row["properties"])
    assert row["properties"]["budget_used_share"].get("nullable") is True


def test_month_end_projection_adds_the_running_jobs_rate_for_the_days_left():
    from jobs.outputs.budget import month_end_projection

    # $300 spent by Nov 20 12:00; two running jobs at $480 and $240/day; 10.5 days left: 300 + 720 x 10.5.
    p = month_end_projection(Amount(300.0), [480.0, 240.0], 10.5 * 86400, Decimal("5000"))
    assert p is not None and p.usd == pytest.approx(7860.0) and not p.lower_bound
    assert p.share == pytest.approx(7860.0 / 5000) and p.text == "$7,860"
    # A running job without a price: its part is unknown, the projection a lower bound.
    unknown = month_end_projection(Amount(300.0), [480.0, None], 86400, None)
    assert unknown is not None and unknown.lower_bound and unknown.usd == pytest.approx(780.0)
    assert unknown.share is None and unknown.text == "at least $780"
    assert month_end_projection(Amount(None, reason="no price"), [480.0], 86400, Decimal("1")) is None


@pytest.mark.django_db
def test_team_page_projects_the_month_end_at_todays_rate(client, member, team, november_jobs):
    """Issue 28 item 10: '148.4 % used' with no month-end projection."""
    team.monthly_budget_usd = Decimal("1000.00")
    team.save()
    Job.objects.create(
        team=team, external_id="live", started_at=_at(11, 19, 12), gpu_count=8, cost_per_day_usd=480.0,
        status=Job.Status.RUNNING, gpu_model=_gpu(),
    )  # fmt: skip
    client.force_login(member)
    text = _text(client.get(reverse("team-detail", args=[team.slug])))
    # Spent: $300 (a, b) + the running job's 24 h so far at $480/day = $780; 10.5 days left at $480/day.
    assert "Month end at today's rate: $5,820 (582 % of the budget)" in text
    assert "the running jobs' $480/day for the 10.5 days left" in text
