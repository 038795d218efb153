"""Runs promoted into a baseline "anyway" (PromotionOverride) are shown with who promoted them, when, which
findings they had and the reason: on the baselines page, on the job page's baseline section and as a count on
the team page."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from html import unescape
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from jobs.models import Baseline, PromotionOverride
from tests.test_compare import make_run


@pytest.fixture
def setup(catalog, make_team, make_user):
    team = make_team("llm", "LLM pretraining")
    alice = make_user("alice", teams=[team])
    healthy = make_run(team, "base-1", mfu=0.40, tps=20000.0, sm=0.5)
    flaky = make_run(team, "base-2", mfu=0.42, tps=20500.0, sm=0.5, offset_h=2)
    other = make_run(team, "base-3", mfu=0.41, tps=20200.0, sm=0.5, offset_h=4)
    baseline = Baseline.objects.create(
        fingerprint=healthy.config_fingerprint,
        model_name="llama-7b-lora",
        team=team,
        stats={"mfu": {"median": 0.41, "mad": 0.01, "n": 2}},
    )
    baseline.runs.add(healthy, flaky)
    override = PromotionOverride.objects.create(
        baseline=baseline,
        job=flaky,
        user=alice,
        finding_codes=["xid_error"],
        reason="XID 13 was a one-off in a user kernel, fixed since",
    )
    when = datetime(2026, 11, 3, 9, 30, tzinfo=UTC)
    PromotionOverride.objects.filter(pk=override.pk).update(created_at=when)
    return SimpleNamespace(
        team=team, alice=alice, baseline=baseline, healthy=healthy, flaky=flaky, other=other
    )


def _text(response) -> str:
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", response.content.decode())).split())


@pytest.mark.django_db
def test_baselines_page_lists_the_run_promoted_anyway_with_reason_and_who(client, setup):
    s = setup
    client.force_login(s.alice)
    response = client.get(reverse("baseline-list"))
    text = _text(response)
    expected = (
        "promoted anyway lora base-2 by alice on 2026-11-03 09:30 UTC, despite xid_error: "
        "XID 13 was a one-off in a user kernel, fixed since"
    )
    assert expected in text
    assert f'id="baseline-{s.baseline.pk}"' in response.content.decode()
    assert text.count("promoted anyway") == 1  # base-1 was promoted as healthy


@pytest.mark.django_db
def test_baselines_page_query_count_does_not_grow_with_overrides(client, setup):
    s = setup
    client.force_login(s.alice)
    client.get(reverse("baseline-list"))
    with CaptureQueriesContext(connection) as one:
        client.get(reverse("baseline-list"))
    PromotionOverride.objects.create(baseline=s.baseline, job=s.healthy, user=None, reason="second")
    with CaptureQueriesContext(connection) as two:
        text = _text(client.get(reverse("baseline-list")))
    # The overrides come in one prefetch with their job and user, however many there are.
    assert len(two.captured_queries) == len(one.captured_queries)
    assert "by a deleted user" in text  # an override whose user is gone still says so


@pytest.mark.django_db
def test_job_page_baseline_section_shows_overrides_and_marks_this_job(client, setup):
    s = setup
    client.force_login(s.alice)
    text = _text(client.get(reverse("job-detail", args=[s.flaky.external_id])))
    section = text[text.index("Against the baseline") :]
    assert "Promoted anyway" in section
    assert "lora base-2 (this job) by alice on 2026-11-03 09:30 UTC, despite xid_error" in section
    # A run compared with the same baseline sees the override too, not marked as itself.
    text = _text(client.get(reverse("job-detail", args=[s.other.external_id])))
    assert "lora base-2 by alice" in text and "(this job)" not in text


@pytest.mark.django_db
def test_team_page_counts_overrides_per_baseline(client, setup):
    s = setup
    client.force_login(s.alice)
    text = _text(client.get(reverse("team-detail", args=[s.team.slug])))
    assert "over 2 runs, 1 promoted anyway" in text
